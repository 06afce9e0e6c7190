//! Plain HTTP/1.1 serving for the agent's small endpoints (`/metrics`, the proxy's monitor):
//! one copy of hyper's connection code for all of them in the static agent (each service
//! type instantiates all of it), bounded like every server the agent runs.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Answers one request from a client (its address, IPv4 unmapped).
pub type Handler =
    Arc<dyn Fn(&Request<hyper::body::Incoming>, IpAddr) -> Response<Full<Bytes>> + Send + Sync>;

/// Serves plain HTTP/1.1 on `listener` with `handler` until `stop`.
pub async fn serve(listener: TcpListener, handler: Handler, stop: CancellationToken) {
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
