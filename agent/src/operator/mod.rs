//! The operator status port (docs/architecture.md, "Security: what a node exposes";
//! `keelson_cluster::operator`): on the control plane, [`keelson_cluster::operator::PORT`]
//! over TLS with the node's server certificate, answering only a client whose certificate
//! chains to the cluster CA and is made for client authentication — which no node holds:
//! `keelson status` signs one with `tls/ca.key` on the operator's machine. It is how an
//! operator sees the whole cluster from outside, through the API's floating IP (which lands
//! on the VIP's holder) or a bastion, with no shell on any node.
//!
//! `GET /v1/node`: this node's status document. `GET /v1/cluster`: every live member's,
//! gathered now from their metrics ports (`/status`, open to the machine network as
//! `/metrics` is) and this node's own, in one [`ClusterReport`].
//!
//! Like `/metrics` it runs beside the supervised services, not among them: it is never in
//! the ready line, and a port it cannot bind must not hold the node's services back.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use keelson_cluster::operator::{CLUSTER_PATH, ClusterReport, NODE_PATH, NodeReport, PORT};
use keelson_cluster::{Role, tls_files};
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::status::model::AgentStatus;

/// Connections served at once; more wait (an operator's tool opens one per run).
const MAX_CONNECTIONS: usize = 16;
/// How long a member has to answer for its status.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest status document taken from a member.
const MEMBER_BODY_LIMIT: usize = 4 << 20;

/// Whether `role` serves the operator port: the roles holding the server certificate.
pub fn serves(role: Role) -> bool {
    matches!(role, Role::Bootstrap | Role::Master)
}

/// The TLS settings: the node's server pair, and client certificates required, chained to
/// the cluster CA in `tls_dir`.
pub fn tls_config(tls_dir: &std::path::Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |name: &str| {
        let path = tls_dir.join(name);
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read(tls_files::CA_CERT)?) {
        roots.add(ca.context("tls/ca.crt")?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("the client certificate verifier")?;
    let certs = CertificateDer::pem_slice_iter(&read(tls_files::SERVER_CERT)?)
        .collect::<Result<Vec<_>, _>>()
        .context("tls/server.crt")?;
    let key =
        PrivateKeyDer::from_pem_slice(&read(tls_files::SERVER_KEY)?).context("tls/server.key")?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves the operator port until `stop`, on the control plane; nothing elsewhere. A port
/// that cannot be bound, or TLS files that cannot be read, are retried every 5 s with a
/// warning.
pub async fn serve(ctx: AgentContext, started: Instant, stop: CancellationToken) {
    if !serves(ctx.node.role) {
        return;
    }
    let (listener, tls) = loop {
        let ready = tls_config(&ctx.paths.tls_dir).and_then(|tls| {
            let addr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), PORT);
            let listener = crate::net::listen::tcp(addr, false)
                .with_context(|| format!("listening on :{PORT}"))?;
            Ok((listener, tls))
        });
        match ready {
            Ok(x) => break x,
            Err(e) => {
                tracing::warn!("operator status: {e:#}; retrying in 5 s");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    };
    tracing::info!(
        port = PORT,
        "operator status: serving (client certificate required)"
    );
    serve_on(listener, tls, ctx, started, stop).await;
}

/// Serves on `listener` with `tls` until `stop`.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ctx: AgentContext,
    started: Instant,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, ctx, stop) = (acceptor.clone(), ctx.clone(), stop.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    // Most often a client without the operator's certificate.
                    Ok(Err(e)) => {
                        tracing::info!(%peer, "operator status: refused: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(respond(&req, &ctx, started, peer).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(tls), svc);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

fn json(code: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn respond(
    req: &Request<hyper::body::Incoming>,
    ctx: &AgentContext,
    started: Instant,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let error = |code: StatusCode, message: &str| {
        json(
            code,
            serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap_or_default(),
        )
    };
    if req.method() != Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "use GET");
    }
    tracing::info!(%peer, path = req.uri().path(), "operator status: answered");
    match req.uri().path() {
        NODE_PATH => json(
            StatusCode::OK,
            serde_json::to_vec_pretty(&ctx.status(started)).unwrap_or_default(),
        ),
        CLUSTER_PATH => json(
            StatusCode::OK,
            serde_json::to_vec_pretty(&gather(ctx, started).await).unwrap_or_default(),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("not found: try {CLUSTER_PATH} or {NODE_PATH}"),
        ),
    }
}

/// The members to ask, by name, with the address to ask each at (its first on the machine
/// networks), this node left out.
pub fn targets(own: &AgentStatus, machine: &[ipnet::IpNet]) -> Vec<(String, Option<IpAddr>)> {
    own.members
        .iter()
        .filter(|m| m.name != own.node.name)
        .map(|m| {
            let address = m
                .addresses
                .iter()
                .find(|a| machine.iter().any(|n| n.contains(*a)))
                .or(m.addresses.first())
                .copied();
            (m.name.to_string(), address)
        })
        .collect()
}

/// Every member's status now: this node's own, the others' from their metrics ports, all at
/// once, each within [`MEMBER_TIMEOUT`].
pub async fn gather(ctx: &AgentContext, started: Instant) -> ClusterReport {
    let own = ctx.status(started);
    let port = ctx.cluster.metrics.port;
    let asks = targets(&own, &ctx.cluster.machine_networks)
        .into_iter()
        .map(|(name, address)| async move {
            let Some(address) = address else {
                return NodeReport {
                    name,
                    address: None,
                    status: None,
                    error: Some("no address".into()),
                };
            };
            let (status, error) = if port == 0 {
                (None, Some("metrics.port is 0: no /status to ask".into()))
            } else {
                let host = match address {
                    IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                };
                let url = format!(
                    "http://{host}:{port}{}",
                    keelson_cluster::operator::STATUS_PATH
                );
                let client = crate::net::http_client::HttpClient::new()
                    .timeouts(MEMBER_TIMEOUT, MEMBER_TIMEOUT, MEMBER_TIMEOUT)
                    .body_limit(MEMBER_BODY_LIMIT);
                match client.get(&url).await {
                    Ok(r) if r.status.is_success() => match serde_json::from_slice(&r.body) {
                        Ok(v) => (Some(v), None),
                        Err(e) => (None, Some(format!("{url}: not a status document: {e}"))),
                    },
                    Ok(r) => (None, Some(format!("{url}: HTTP {}", r.status))),
                    Err(e) => (None, Some(e.to_string())),
                }
            };
            NodeReport {
                name,
                address: Some(address),
                status,
                error,
            }
        });
    let mut nodes = futures::future::join_all(asks).await;
    let address = own
        .node
        .addresses
        .iter()
        .map(|n| n.addr())
        .find(|a| ctx.cluster.machine_networks.iter().any(|n| n.contains(a)));
    nodes.push(NodeReport {
        name: own.node.name.clone(),
        address,
        status: serde_json::to_value(&own).ok(),
        error: None,
    });
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    ClusterReport {
        answered_by: own.node.name,
        nodes,
    }
}
