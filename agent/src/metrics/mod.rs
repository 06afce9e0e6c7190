//! `/metrics`: the agent's Prometheus endpoint (`docs/metrics.md`) on `metrics.port`
//! (22625) of every address, open to the networks allowed to fetch Ignition configs
//! (`ignition.allowedNetworks`, the machine networks by default) and to loopback, like
//! `:22623`; everyone else gets 403.
//!
//! Every scrape renders the status document of that moment ([`crate::status::collect`]),
//! so `/metrics` and `keelson-agent status` always tell the same facts. The text format
//! 0.0.4 by default, OpenMetrics 1.0 when the `Accept` header asks for it.

pub mod render;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use keelson_ignition::server::{AccessList, default_allowed_networks};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
pub use render::{Format, render};

/// Answers one request (pure but for reading the status): `GET|HEAD /metrics` from an
/// allowed client.
pub fn respond(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    peer: IpAddr,
    access: &AccessList,
    status: impl FnOnce() -> crate::status::model::AgentStatus,
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
    if path != "/metrics" {
        return text(StatusCode::NOT_FOUND, "not found: try /metrics\n".into());
    }
    let format = Format::negotiate(accept);
    let mut r = Response::new(Full::new(Bytes::from(render(&status(), format))));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    r
}

/// Binds `[::]:port` (every address, IPv4 too), or `0.0.0.0:port` where the kernel has no
/// IPv6.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    match crate::proxy::listen(
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
        false,
    ) {
        Ok(l) => Ok(l),
        Err(_) => crate::proxy::listen(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            false,
        ),
    }
}

/// Serves `/metrics` on cluster.json's `metrics.port` until `stop` (nothing when it is 0).
/// A port that cannot be bound (taken) is retried every 5 s with a warning: metrics must
/// never take the node's real services down with them.
pub async fn serve(ctx: AgentContext, started: Instant, stop: CancellationToken) {
    let port = ctx.cluster.metrics.port;
    if port == 0 {
        tracing::info!("metrics: off (metrics.port is 0)");
        return;
    }
    let listener = loop {
        match bind(port) {
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
    serve_on(listener, ctx, started, stop).await;
}

/// Serves `/metrics` on `listener` until `stop`.
pub async fn serve_on(
    listener: TcpListener,
    ctx: AgentContext,
    started: Instant,
    stop: CancellationToken,
) {
    let access = AccessList::new(default_allowed_networks(&ctx.cluster), true);
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
            || crate::status::collect(&ctx, started),
        )
    });
    serve_http(listener, handler, stop).await;
}

/// Answers one request from a client (its address, IPv4 unmapped).
pub type Handler =
    Arc<dyn Fn(&Request<hyper::body::Incoming>, IpAddr) -> Response<Full<Bytes>> + Send + Sync>;

/// Serves plain HTTP/1.1 on `listener` with `handler` until `stop`. Shared by `/metrics`
/// and the proxy's monitor: one copy of hyper's connection code for both in the static
/// agent (each service type instantiates all of it).
pub async fn serve_http(listener: TcpListener, handler: Handler, stop: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A v4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
        let peer_ip = match peer.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let (handler, stop) = (handler.clone(), stop.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = handler(&req, peer_ip);
                async move { Ok::<_, Infallible>(r) }
            });
            // Bounded like every server the agent runs (docs/agent.md, "Limits"): headers
            // within 16 KiB and 10 s; no bodies are read.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}
