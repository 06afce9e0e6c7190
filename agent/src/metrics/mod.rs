//! `/metrics`: the agent's Prometheus endpoint (`docs/metrics.md`) on `metrics.port`
//! (22625) of every address, open to the networks allowed to fetch Ignition configs
//! (`ignition.allowedNetworks`, the machine networks by default) and to loopback, like
//! `:22623`; everyone else gets 403.
//!
//! Every scrape renders the status document of that moment (`AgentContext::status`),
//! so `/metrics` and `keelson-agent status` always tell the same facts. The text format
//! 0.0.4 by default, OpenMetrics 1.0 when the `Accept` header asks for it.

pub mod render;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode, header};
use keelson_cluster::server::AccessList;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::net::http_server::Handler;
use crate::status::model::AgentStatus;
pub use render::{Format, render};

/// Answers one request (pure but for reading the status): `GET|HEAD /metrics`, and the
/// status document as JSON at `/status`, from an allowed client.
pub fn respond(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    peer: IpAddr,
    access: &AccessList,
    status: impl FnOnce() -> AgentStatus,
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if !access.allows(peer) {
        return text(
            StatusCode::FORBIDDEN,
            format!("client {peer} is outside the allowed networks\n"),
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET or HEAD\n".into(),
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // The same document as JSON, for the node that gathers the cluster's status for the
    // operator (keelson_cluster::operator; docs/architecture.md, "Security").
    if path == keelson_cluster::operator::STATUS_PATH {
        let mut body = serde_json::to_vec(&status()).unwrap_or_default();
        body.push(b'\n');
        let mut r = Response::new(Full::new(Bytes::from(body)));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        return r;
    }
    if path != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /status\n".into(),
        );
    }
    let format = Format::negotiate(accept);
    let mut r = Response::new(Full::new(Bytes::from(render(&status(), format))));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    r
}

/// Serves `/metrics` on `port` of every address (`[::]`, IPv4 too, or `0.0.0.0` where the
/// kernel has no IPv6) until `stop`; nothing when `port` is 0. `access` says who may
/// scrape, `status` builds the document of the moment. A port that cannot be bound (taken)
/// is retried every 5 s with a warning: metrics must never take the node's real services
/// down with them.
pub async fn serve(
    port: u16,
    access: AccessList,
    status: impl Fn() -> AgentStatus + Send + Sync + 'static,
    stop: CancellationToken,
) {
    if port == 0 {
        tracing::info!("metrics: off (metrics.port is 0)");
        return;
    }
    let listener = loop {
        match crate::net::listen::tcp(
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            false,
        ) {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!(port, error = %e, "metrics: cannot listen; retrying in 5 s");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    };
    serve_on(listener, access, status, stop).await;
}

/// Serves `/metrics` on `listener` until `stop`.
pub async fn serve_on(
    listener: TcpListener,
    access: AccessList,
    status: impl Fn() -> AgentStatus + Send + Sync + 'static,
    stop: CancellationToken,
) {
    tracing::info!(addr = ?listener.local_addr().ok(), "metrics: serving /metrics");
    let handler: Handler = Arc::new(move |req, peer| {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok());
        respond(
            req.method(),
            req.uri().path(),
            accept,
            peer,
            &access,
            &status,
        )
    });
    crate::net::http_server::serve(listener, handler, stop).await;
}
