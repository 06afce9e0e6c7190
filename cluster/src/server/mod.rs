//! The Ignition config server (docs/ignition-server.md), shared by `keelson serve` and the agent's
//! `ignition_server`: `GET|HEAD /config/<pool>` (master, worker), `/healthz`,
//! `/assets/<name>` and `/keelson/...` (agent routes), over TLS (:22623) and plain HTTP
//! (:22624), like OpenShift's machine-config-server.
//!
//! Routing and the status-code rules live in [`router`] (no sockets); this module binds,
//! accepts, terminates TLS and drives hyper connections, and stops gracefully.
//!
//! ```no_run
//! # async fn demo(source: impl keelson_cluster::server::ConfigSource) -> Result<(), keelson_cluster::server::ServerError> {
//! use keelson_cluster::server::{Assets, IgnitionServer, ServerOptions};
//! let stop = tokio_util::sync::CancellationToken::new();
//! let opts = ServerOptions { tls_listen: None, ..ServerOptions::default() };
//! let bound = IgnitionServer::new(source, Assets::new(), opts).bind().await?;
//! bound.serve(stop).await
//! # }
//! ```

mod access;
mod assets;
mod router;
mod source;
mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use access::AccessList;
pub use assets::{AssetError, Assets, valid_asset_name};
pub use source::{ConfigSource, RenderSource, SourceError};
pub use tls::{TlsError, tls_config, tls_config_from_files};

use crate::routes::ExtraRoutes;
use crate::version::SpecVersion;
use router::Router;

/// One answered request as a [`RequestObserver`] sees it: bounded values only (no path, no
/// client address), fit for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// `config`, `asset`, `healthz`, `keelson` or `other`.
    pub route: &'static str,
    /// For configs: `master`, `worker` or `other`; empty otherwise.
    pub pool: &'static str,
    /// The spec version of a config served with 200.
    pub spec: Option<SpecVersion>,
    /// The HTTP status answered.
    pub status: u16,
}

/// Told about every answered request (the agent counts them for `/metrics`).
pub trait RequestObserver: std::fmt::Debug + Send + Sync + 'static {
    /// One request was answered.
    fn observe(&self, record: &RequestRecord);
}

/// The client networks allowed to fetch configs when the operator names none: the
/// cluster's `ignition.allowedNetworks`, or, when that is empty, its machine networks.
pub fn default_allowed_networks(cluster: &crate::ClusterConfig) -> Vec<IpNet> {
    if cluster.ignition.allowed_networks.is_empty() {
        cluster.machine_networks.clone()
    } else {
        cluster.ignition.allowed_networks.clone()
    }
}

/// Default TLS port.
pub const TLS_PORT: u16 = 22623;
/// Default plain-HTTP port.
pub const PLAIN_PORT: u16 = 22624;
/// Largest request body accepted on `/keelson/` routes.
pub const MAX_BODY: usize = 64 * 1024;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// TLS listen address (`None`: no TLS listener).
    pub tls_listen: Option<SocketAddr>,
    /// Plain-HTTP listen address (`None`: no plain listener).
    pub plain_listen: Option<SocketAddr>,
    /// Bootstrap mode: `/config/worker` answers 500 (docs/ignition-server.md).
    pub bootstrap: bool,
    /// Client networks allowed to fetch configs and assets (`/healthz` is open).
    pub allowed_networks: Vec<IpNet>,
    /// Whether loopback clients are allowed too. Always on outside tests.
    pub allow_loopback: bool,
    /// Time a client gets to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time open connections get to finish after stop before they are cut.
    pub drain_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            tls_listen: Some(SocketAddr::from(([0, 0, 0, 0], TLS_PORT))),
            plain_listen: Some(SocketAddr::from(([0, 0, 0, 0], PLAIN_PORT))),
            bootstrap: false,
            allowed_networks: Vec::new(),
            allow_loopback: true,
            handshake_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A listen address could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// A TLS listener was asked for without a TLS configuration.
    #[error("tls_listen {0} is set but no TLS certificate/key was given")]
    NoTls(SocketAddr),
}

/// A configured, not yet bound server.
#[derive(Debug)]
pub struct IgnitionServer {
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    opts: ServerOptions,
    observer: Option<Arc<dyn RequestObserver>>,
}

impl IgnitionServer {
    /// A server answering `/config/<pool>` from `source` (cached per pool and spec) and
    /// `/assets/<name>` from `assets`.
    pub fn new(source: impl ConfigSource, assets: Assets, opts: ServerOptions) -> Self {
        Self::from_shared(Arc::new(source), assets, opts)
    }

    /// [`IgnitionServer::new`] with a shared source.
    pub fn from_shared(source: Arc<dyn ConfigSource>, assets: Assets, opts: ServerOptions) -> Self {
        Self {
            router: Router {
                configs: source::Cache::new(source),
                assets,
                bootstrap: opts.bootstrap,
                access: AccessList::new(opts.allowed_networks.clone(), opts.allow_loopback),
                extra: None,
            },
            tls: None,
            opts,
            observer: None,
        }
    }

    /// Tells `observer` about every answered request.
    pub fn with_observer(mut self, observer: Arc<dyn RequestObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Serves TLS with `config` (see [`tls_config`]).
    pub fn with_tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Sends `/keelson/...` requests to `extra`.
    pub fn with_extra_routes(mut self, extra: Arc<dyn ExtraRoutes>) -> Self {
        self.router.extra = Some(extra);
        self
    }

    /// Binds the listeners (port 0 picks a free port; see [`BoundServer::tls_addr`]).
    pub async fn bind(self) -> Result<BoundServer, ServerError> {
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })
        };
        let tls = match self.opts.tls_listen {
            Some(addr) => {
                let config = self.tls.clone().ok_or(ServerError::NoTls(addr))?;
                Some((bind(addr).await?, TlsAcceptor::from(config)))
            }
            None => None,
        };
        let plain = match self.opts.plain_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(BoundServer {
            tls,
            plain,
            router: Arc::new(self.router),
            opts: self.opts,
            observer: self.observer,
        })
    }
}

/// A server whose listeners are bound; [`BoundServer::serve`] runs it.
pub struct BoundServer {
    tls: Option<(TcpListener, TlsAcceptor)>,
    plain: Option<TcpListener>,
    router: Arc<Router>,
    opts: ServerOptions,
    observer: Option<Arc<dyn RequestObserver>>,
}

impl std::fmt::Debug for BoundServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundServer")
            .field("tls", &self.tls_addr())
            .field("plain", &self.plain_addr())
            .finish_non_exhaustive()
    }
}

impl BoundServer {
    /// The bound TLS address.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The bound plain-HTTP address.
    pub fn plain_addr(&self) -> Option<SocketAddr> {
        self.plain.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves one connection the caller accepted itself, as plain HTTP from `peer`, with
    /// the same request handling as the listeners, until the client closes it. The fuzz
    /// targets (agent/fuzz) feed raw requests through it over an in-memory pipe.
    pub async fn serve_stream<S>(&self, stream: S, peer: SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ctx = ConnCtx {
            router: self.router.clone(),
            observer: self.observer.clone(),
            stop: CancellationToken::new(),
            cut: CancellationToken::new(),
            handshake_timeout: self.opts.handshake_timeout,
        };
        serve_conn(stream, peer, ctx).await;
    }

    /// Serves until `stop` is cancelled, then stops accepting, lets open connections
    /// finish their current request (idle keep-alive connections are closed at once) for
    /// up to the drain timeout, and returns.
    pub async fn serve(self, stop: CancellationToken) -> Result<(), ServerError> {
        let tracker = TaskTracker::new();
        // Cancelled when the drain timeout is over: cuts connections still open.
        let cut = CancellationToken::new();
        let conn = ConnCtx {
            router: self.router,
            observer: self.observer,
            stop: stop.clone(),
            cut: cut.clone(),
            handshake_timeout: self.opts.handshake_timeout,
        };
        if let Some((listener, acceptor)) = self.tls {
            tracker.spawn(accept_loop(
                listener,
                Some(acceptor),
                conn.clone(),
                tracker.clone(),
            ));
        }
        if let Some(listener) = self.plain {
            tracker.spawn(accept_loop(listener, None, conn.clone(), tracker.clone()));
        }
        stop.cancelled().await;
        tracker.close();
        if tokio::time::timeout(self.opts.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = tracker.len(),
                "connections still open after the drain timeout; cutting them"
            );
            cut.cancel();
            tracker.wait().await;
        }
        tracing::info!("ignition server stopped");
        Ok(())
    }
}

#[derive(Clone)]
struct ConnCtx {
    router: Arc<Router>,
    observer: Option<Arc<dyn RequestObserver>>,
    stop: CancellationToken,
    cut: CancellationToken,
    handshake_timeout: Duration,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    ctx: ConnCtx,
    tracker: TaskTracker,
) {
    let local = listener.local_addr().ok();
    tracing::info!(addr = ?local, tls = tls.is_some(), "ignition server listening");
    loop {
        let (stream, peer) = tokio::select! {
            _ = ctx.stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Responses go out in one write; don't let Nagle hold the last segment.
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        match tls.clone() {
            Some(acceptor) => tracker.spawn(async move {
                let handshake =
                    tokio::time::timeout(ctx.handshake_timeout, acceptor.accept(stream));
                let tls_stream = tokio::select! {
                    _ = ctx.stop.cancelled() => return,
                    r = handshake => match r {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    },
                };
                serve_conn(tls_stream, peer, ctx).await;
            }),
            None => tracker.spawn(serve_conn(stream, peer, ctx)),
        };
    }
}

async fn serve_conn<S>(stream: S, peer: SocketAddr, ctx: ConnCtx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let router = ctx.router.clone();
    let observer = ctx.observer.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let router = router.clone();
        let observer = observer.clone();
        async move {
            let (route, pool) = router::parse_route(req.uri().path()).labels();
            let resp = handle(&router, req, peer).await;
            if let Some(o) = &observer {
                o.observe(&RequestRecord {
                    route,
                    pool,
                    spec: resp.extensions().get::<router::ServedSpec>().map(|s| s.0),
                    status: resp.status().as_u16(),
                });
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        // Headers (request line included) within 64 KiB; bodies within MAX_BODY below.
        .max_buf_size(MAX_BODY)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = ctx.stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                _ = ctx.cut.cancelled() => return,
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

async fn handle(
    router: &Router,
    req: hyper::Request<Incoming>,
    peer: SocketAddr,
) -> hyper::Response<router::Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let body = if router.wants_body(path) {
        // Bounded in size and in time (a client trickling its body holds no task forever).
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            Limited::new(body, MAX_BODY).collect(),
        );
        match read
            .await
            .map_err(|_| "body not complete within 30 s".into())
            .and_then(|r| r)
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "request body refused");
                return router::respond(
                    http::StatusCode::PAYLOAD_TOO_LARGE,
                    "text/plain; charset=utf-8",
                    Bytes::from(format!(
                        "request body over {MAX_BODY} bytes, unreadable or too slow\n"
                    )),
                );
            }
        }
    } else {
        Bytes::new()
    };
    // Several Accept lines mean the same as one joined with commas (RFC 9110 §5.3).
    let mut accepts = parts.headers.get_all(http::header::ACCEPT).iter();
    let joined: Option<std::borrow::Cow<'_, [u8]>> = match (accepts.next(), accepts.next()) {
        (None, _) => None,
        (Some(one), None) => Some(one.as_bytes().into()),
        (Some(_), Some(_)) => Some(
            parts
                .headers
                .get_all(http::header::ACCEPT)
                .iter()
                .map(|v| v.as_bytes())
                .collect::<Vec<_>>()
                .join(&b", "[..])
                .into(),
        ),
    };
    let resp = router.handle(
        &parts.method,
        path,
        joined.as_deref(),
        peer,
        &parts.headers,
        body,
    );
    tracing::debug!(
        %peer,
        method = %parts.method,
        path,
        accept = ?parts.headers.get(http::header::ACCEPT),
        status = resp.status().as_u16(),
        "request"
    );
    resp
}
