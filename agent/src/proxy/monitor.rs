//! The monitor endpoint (:50936): `/healthz` answers 200 while at least one backend is up
//! and 503 otherwise (haproxy's `monitor-uri` + `monitor fail if no backend`); `/stats`
//! shows every backend as JSON.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::backend::Pool;

/// Answers one monitor request.
pub fn respond(pool: &Pool, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz") => {
            if pool.is_healthy() {
                (StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n"))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    Bytes::from_static(b"no backend is up\n"),
                )
            }
        }
        (&Method::GET | &Method::HEAD, "/stats") => {
            let v =
                serde_json::json!({ "healthy": pool.is_healthy(), "backends": pool.snapshot() });
            (
                StatusCode::OK,
                "application/json",
                Bytes::from(v.to_string()),
            )
        }
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"method not allowed\n"),
        ),
    };
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

/// Serves the monitor on `listener` until `stop`.
pub async fn serve(listener: TcpListener, pool: Arc<Pool>, stop: CancellationToken) {
    let handler: crate::net::http_server::Handler =
        Arc::new(move |req, _| respond(&pool, req.method(), req.uri().path()));
    crate::net::http_server::serve(listener, handler, stop).await;
}

#[cfg(test)]
mod tests {
    use super::super::backend::HealthPolicy;
    use super::*;

    #[test]
    fn healthz_follows_pool_and_stats_lists_backends() {
        let pool = Pool::new(HealthPolicy { rise: 1, fall: 1 }, false);
        assert_eq!(respond(&pool, &Method::GET, "/healthz").status(), 503);
        pool.set_backends(&["127.0.0.1:1".parse().unwrap()]);
        pool.backends()[0].record_check(Ok(()), pool.policy());
        pool.refresh_healthy();
        assert_eq!(respond(&pool, &Method::GET, "/healthz").status(), 200);
        assert_eq!(respond(&pool, &Method::GET, "/nope").status(), 404);
        assert_eq!(respond(&pool, &Method::POST, "/healthz").status(), 405);
        assert_eq!(respond(&pool, &Method::GET, "/stats").status(), 200);
    }
}
