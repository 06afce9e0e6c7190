//! The :22623/:22624 Ignition config service on a node (docs/ignition-server.md). The server itself is
//! `keelson_cluster::server`, the same code `keelson serve` runs; this module wires it to
//! the node: TLS from `/etc/keelson/tls/`, ports and allowed networks from cluster.json,
//! bootstrap mode on the bootstrap node, the agent's own binary as `/assets/keelson-agent`,
//! and the bus (`ignition_running`, the `ignition` ready mark and status snapshot).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use bytes::Bytes;
use keelson_cluster::Role;
use keelson_cluster::routes::ExtraRoutes;
use keelson_cluster::server::{
    Assets, BoundServer, ConfigSource, IgnitionServer, RenderSource, RequestObserver,
    RequestRecord, ServerOptions, default_allowed_networks, tls_config_from_files,
};
use tokio_util::sync::CancellationToken;

use crate::context::{AgentContext, Bus};

/// Where the node's TLS files are (written by its Ignition config).
pub const TLS_DIR: &str = crate::context::TLS_DIR;

/// Name of the asset that serves the running agent's own binary.
pub const AGENT_ASSET: &str = "keelson-agent";

/// Where the service finds its files on the node (overridable for tests).
#[derive(Debug, Clone)]
pub struct Paths {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server key (PEM).
    pub key: PathBuf,
    /// Extra files served under `/assets/` (missing directory: none).
    pub assets_dir: PathBuf,
    /// Serve this process's own executable under this asset name (RHCOS masters fetch
    /// the agent from here, verified against the sha512 in their config).
    pub self_asset: Option<String>,
}

impl Default for Paths {
    fn default() -> Self {
        Self::in_tls_dir(std::path::Path::new(TLS_DIR))
    }
}

impl Paths {
    /// The node's defaults with the certificate and key in `tls_dir`.
    pub fn in_tls_dir(tls_dir: &std::path::Path) -> Self {
        Self {
            cert: tls_dir.join(keelson_cluster::tls_files::SERVER_CERT),
            key: tls_dir.join(keelson_cluster::tls_files::SERVER_KEY),
            assets_dir: PathBuf::from(keelson_cluster::paths::ASSETS_DIR),
            self_asset: Some(AGENT_ASSET.to_string()),
        }
    }
}

/// What one count of [`RequestCounts`] is for: route, pool, served spec, status.
type RequestKey = (&'static str, &'static str, String, u16);

/// Requests answered, by route, pool, served spec and status (all bounded).
#[derive(Debug, Default)]
pub struct RequestCounts(Mutex<BTreeMap<RequestKey, u64>>);

impl RequestObserver for RequestCounts {
    fn observe(&self, r: &RequestRecord) {
        let spec = r.spec.map(|s| s.to_string()).unwrap_or_default();
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((r.route, r.pool, spec, r.status))
            .or_default() += 1;
    }
}

impl RequestCounts {
    /// The counts, sorted.
    pub fn list(&self) -> Vec<crate::status::model::IgnitionRequests> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(
                |((route, pool, spec, status), count)| crate::status::model::IgnitionRequests {
                    route: route.to_string(),
                    pool: pool.to_string(),
                    spec: spec.clone(),
                    status: *status,
                    count: *count,
                },
            )
            .collect()
    }
}

/// The Ignition service, with the config source the caller provides.
pub struct IgnitionService {
    source: Arc<dyn ConfigSource>,
    paths: Paths,
    extra: Option<Arc<dyn ExtraRoutes>>,
    listen_ip: Option<IpAddr>,
}

impl std::fmt::Debug for IgnitionService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IgnitionService")
            .field("paths", &self.paths)
            .field("extra", &self.extra.is_some())
            .field("listen_ip", &self.listen_ip)
            .finish_non_exhaustive()
    }
}

impl IgnitionService {
    /// A service serving configs from `source`.
    pub fn new(source: impl ConfigSource) -> Self {
        Self {
            source: Arc::new(source),
            paths: Paths::default(),
            extra: None,
            listen_ip: None,
        }
    }

    /// Uses `paths` instead of the node's defaults.
    pub fn with_paths(mut self, paths: Paths) -> Self {
        self.paths = paths;
        self
    }

    /// Sends `/keelson/...` requests (member registration) to `extra`.
    pub fn with_extra_routes(mut self, extra: Arc<dyn ExtraRoutes>) -> Self {
        self.extra = Some(extra);
        self
    }

    /// Listens on `ip` only (default: every address, IPv6 and IPv4).
    pub fn with_listen_ip(mut self, ip: IpAddr) -> Self {
        self.listen_ip = Some(ip);
        self
    }

    fn assets(&self, cluster: &keelson_cluster::ClusterConfig) -> anyhow::Result<Assets> {
        let mut assets = Assets::from_dir(&self.paths.assets_dir)?;
        if let Some(name) = &self.paths.self_asset
            && assets.get(name).is_none()
        {
            let exe = std::env::current_exe().context("locating the agent's own binary")?;
            let bytes =
                std::fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?;
            assets.insert(name, Bytes::from(bytes))?;
        }
        // A node that runs a service serves its executable too, as it serves the agent:
        // after the bootstrap is gone the masters hand it to the nodes that join later.
        for svc in &cluster.services {
            let Some(asset) = &svc.asset else { continue };
            if assets.get(&asset.name).is_some() {
                continue;
            }
            match std::fs::read(&svc.path) {
                Ok(bytes) => assets.insert(&asset.name, Bytes::from(bytes))?,
                Err(e) => tracing::debug!(
                    asset = asset.name,
                    path = svc.path,
                    error = %e,
                    "not serving this asset: not on this node"
                ),
            }
        }
        Ok(assets)
    }

    async fn bind(
        self,
        ctx: &AgentContext,
        counts: Arc<RequestCounts>,
    ) -> anyhow::Result<BoundServer> {
        let tls = tls_config_from_files(&self.paths.cert, &self.paths.key)?;
        let assets = self.assets(&ctx.cluster)?;
        let settings = &ctx.cluster.ignition;
        let server = |ip: IpAddr| {
            let opts = ServerOptions {
                tls_listen: Some(SocketAddr::new(ip, settings.tls_port)),
                plain_listen: Some(SocketAddr::new(ip, settings.plain_port)),
                bootstrap: ctx.node.role == Role::Bootstrap,
                allowed_networks: default_allowed_networks(&ctx.cluster),
                ..ServerOptions::default()
            };
            let s = IgnitionServer::from_shared(self.source.clone(), assets.clone(), opts)
                .with_tls(tls.clone())
                .with_observer(counts.clone());
            match &self.extra {
                Some(x) => s.with_extra_routes(x.clone()),
                None => s,
            }
        };
        if let Some(ip) = self.listen_ip {
            return Ok(server(ip).bind().await?);
        }
        // [::] takes IPv4 too (v4-mapped) where the kernel has IPv6; the appliance kernel
        // may not, so fall back to 0.0.0.0.
        match server(IpAddr::V6(Ipv6Addr::UNSPECIFIED)).bind().await {
            Ok(b) => Ok(b),
            Err(e) => {
                tracing::info!(error = %e, "no IPv6 listener; listening on IPv4 only");
                Ok(server(IpAddr::V4(Ipv4Addr::UNSPECIFIED)).bind().await?)
            }
        }
    }

    /// Runs until `stop` is cancelled.
    pub async fn run(self, ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
        let counts = Arc::new(RequestCounts::default());
        let bound = self.bind(&ctx, counts.clone()).await?;
        let running = Running(ctx.bus.clone());
        ctx.bus.ignition_running.send_replace(true);
        let _view = {
            let (tls, plain) = (bound.tls_addr(), bound.plain_addr());
            let bootstrap = ctx.node.role == Role::Bootstrap;
            let allowed = default_allowed_networks(&ctx.cluster);
            ctx.bus
                .views
                .ignition
                .install(move || crate::status::model::IgnitionStatus {
                    tls,
                    plain,
                    bootstrap,
                    allowed_networks: allowed.clone(),
                    requests: counts.list(),
                })
        };
        ctx.bus.mark_ready("ignition");
        let result = bound.serve(stop).await;
        drop(running);
        Ok(result?)
    }
}

/// Clears `ignition_running` however the service ends (stop, error, panic).
struct Running(Arc<Bus>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.ignition_running.send_replace(false);
    }
}

/// Runs this subsystem until `stop` is cancelled; `members` (the unicast members registry)
/// answers the `/keelson/` routes.
pub async fn run(
    ctx: AgentContext,
    members: Option<Arc<dyn ExtraRoutes>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // The node renders what it serves from its own cluster.json and TLS files, with the
    // running agent as the binary masters and workers fetch.
    let exe = std::env::current_exe().context("locating the agent's own binary")?;
    let tls_dir = ctx.paths.tls_dir.clone();
    let source = RenderSource::from_files((*ctx.cluster).clone(), &tls_dir, &exe)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut service = IgnitionService::new(source).with_paths(Paths::in_tls_dir(&tls_dir));
    // Unicast members: every control-plane node is a registry (docs/members.md).
    if let Some(members) = members {
        service = service.with_extra_routes(members);
    }
    service.run(ctx, stop).await
}

#[cfg(test)]
mod tests;
