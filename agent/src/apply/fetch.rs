//! HTTPS (and plain HTTP) GET for pointer configs and remote file sources, trusting only the
//! CAs the Ignition config names (the cluster root CA), as Ignition itself does.

use std::time::Duration;

use crate::net::http_client::{HttpClient, HttpError, Request, Trust};

/// The Accept header Ignition 3.x sends, so the server negotiates the spec version.
pub const ACCEPT: &str = "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1";

/// Headers a resource asks to be sent (`httpHeaders`, spec 3.1 and later).
pub type Headers = [(http::HeaderName, http::HeaderValue)];

/// GETs `url` once with `headers`. `cas` are PEM certificates trusted for HTTPS; a body longer
/// than `limit` bytes is refused (for good: a longer answer will not get shorter); any
/// status but 2xx is an error (5xx worth a retry, as Ignition retries them).
pub async fn get(
    url: &str,
    headers: &Headers,
    cas: &[Vec<u8>],
    limit: usize,
) -> Result<Vec<u8>, HttpError> {
    let trust = Trust::roots_from_pem(cas).map_err(|e| HttpError::Trust {
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    if url.starts_with("https://") && matches!(trust, Trust::None) {
        return Err(HttpError::Trust {
            url: url.to_owned(),
            message: "https source but the config names no certificate authority \
                      (ignition.security.tls.certificateAuthorities)"
                .into(),
        });
    }
    let client = HttpClient::new()
        .trust(trust)
        .with_host_names()
        .timeouts(
            Duration::from_secs(10),
            Duration::from_secs(30),
            Duration::from_secs(60),
        )
        .body_limit(limit);
    let mut request = Request::get(url).header(http::header::ACCEPT, ACCEPT);
    request.headers.extend(headers.iter().cloned());
    let answer = client.send(request).await?;
    if !answer.status.is_success() {
        return Err(HttpError::Status {
            url: url.to_owned(),
            status: answer.status,
        });
    }
    Ok(answer.body.to_vec())
}

/// GETs with retries (the agent's retry policy: 0.5 s doubling to 10 s, with jitter) while
/// the failure is transient, until `timeout` (None: forever, as a booting node does). Each
/// retry says on the console what failed and when the next try is.
pub async fn get_with_retry(
    url: &str,
    headers: &Headers,
    cas: &[Vec<u8>],
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, HttpError> {
    let backoff = crate::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    crate::retry::retry("fetch", backoff, timeout, || get(url, headers, cas, limit)).await
}
