//! One HTTP(S) GET for a health check, through the agent's HTTP client: HTTPS without
//! certificate verification (health endpoints use self-signed or cluster-CA certificates;
//! the check is about the local service answering, not about authenticating it), and only
//! the status is read.

use crate::net::http_client::{HttpClient, HttpError, Request, Trust};

/// GETs `url` (`http(s)://<ip>[:port]/path`) and returns the status code. The caller bounds
/// the time.
pub async fn get_status(url: &str) -> Result<u16, HttpError> {
    let long = std::time::Duration::from_secs(3600);
    let client = HttpClient::new()
        .trust(Trust::Any)
        .timeouts(long, long, long);
    Ok(client.status(Request::get(url)).await?.as_u16())
}
