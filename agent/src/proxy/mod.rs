//! The L4 API load balancer with backend health checks (docs/proxy.md).
//!
//! - [`backend`]: pure bookkeeping — health rise/fall, round-robin order with slowstart,
//!   counters, the marked-down signal.
//! - [`backend_check`]: one check of a backend (TCP connect, or TLS `GET /readyz` without
//!   verification, through the agent's HTTP client).
//! - `check_tasks`: one checking task per backend, with the fast interval while in doubt.
//! - `connect`: connection setup with retries, the connect stagger, passive health.
//! - [`lazy_timer`]: per-connection timeouts that arm a timer only for connections that
//!   outlive a shared tick.
//! - [`forward`]: byte moving with `splice(2)` or a buffered copy, half-close aware.
//! - `accept`: the accept loops and serving one client.
//! - [`monitor`]: `/healthz` and `/stats`.
//! - [`frontend`]: the `VIP:6443` frontend, bound or redirected with nftables.
//! - `agent`: the proxy in the agent — backends from the members, VRRP's hints, the VIP
//!   frontend following the VIP, the bus ([`run`]).
//! - `cli`: `keelson-agent proxy`, the proxy alone ([`cli()`]).
//! - this module: the configuration, listeners and their counters, closing sessions of a
//!   backend marked down, graceful drain.

mod accept;
mod agent;
pub mod backend;
pub mod backend_check;
mod check_tasks;
mod cli;
mod connect;
pub mod forward;
pub mod frontend;
pub mod lazy_timer;
pub mod monitor;

pub use agent::{backends_from_members, mark_node_down, run};
pub use cli::{ProxyArgs, cli};

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::cluster::{ApiSettings, BackendCheck};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::status::model::{FrontendKind, FrontendStatus, ProxyStatus};
use backend::{Backend, HealthPolicy, Pool, Tuning};
use forward::Meter;

/// Everything the proxy needs besides its backends.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Frontends bound at start.
    pub frontends: Vec<SocketAddr>,
    /// The `/healthz` + `/stats` monitor, if any.
    pub monitor: Option<SocketAddr>,
    /// Backend health check.
    pub check: BackendCheck,
    /// Time between checks of one backend.
    pub check_interval: Duration,
    /// Time between checks while a backend's state is in doubt (haproxy's `fastinter`).
    pub fast_check_interval: Duration,
    /// A backend that comes back up takes a growing share of new connections over this
    /// long (haproxy's `slowstart`); zero: its full share at once.
    pub slowstart: Duration,
    /// Close the client connections of a backend when it is marked down, so long-lived
    /// clients reconnect to a live one (haproxy's `on-marked-down shutdown-sessions`).
    pub shutdown_sessions: bool,
    /// Rise/fall.
    pub policy: HealthPolicy,
    /// Backend connect timeout (haproxy `timeout connect`).
    pub connect_timeout: Duration,
    /// Idle timeout of a proxied connection (haproxy `timeout client/server/tunnel`).
    pub idle_timeout: Duration,
    /// Maximum concurrent client connections; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// How long live connections may run on after stop.
    pub drain_timeout: Duration,
    /// Other backends tried after a failed connect (haproxy `retries`).
    pub retries: usize,
    /// After this long without an answer to a backend connect, the next backend is tried
    /// alongside (see [`connect`]); zero tries backends strictly one after another.
    pub connect_stagger: Duration,
    /// Forward with `splice(2)` (falls back to copying where the kernel refuses).
    pub splice: bool,
}

impl Default for ProxyConfig {
    /// OpenShift's haproxy settings.
    fn default() -> Self {
        Self {
            frontends: vec![SocketAddr::from(([0, 0, 0, 0], 9445))],
            monitor: Some(SocketAddr::from(([0, 0, 0, 0], 50936))),
            check: BackendCheck::TlsReadyz,
            check_interval: Duration::from_secs(5),
            fast_check_interval: Duration::from_secs(1),
            slowstart: Duration::from_secs(10),
            shutdown_sessions: true,
            policy: HealthPolicy { rise: 1, fall: 3 },
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(86400),
            max_connections: 20000,
            drain_timeout: Duration::from_secs(30),
            retries: 3,
            connect_stagger: connect::DEFAULT_STAGGER,
            splice: true,
        }
    }
}

impl ProxyConfig {
    /// The configuration `cluster.json`'s `api` section asks for (frontend on every address).
    pub fn from_settings(api: &ApiSettings) -> Self {
        Self {
            frontends: vec![SocketAddr::from((Ipv6Addr::UNSPECIFIED, api.frontend_port))],
            monitor: Some(SocketAddr::from((Ipv6Addr::UNSPECIFIED, api.monitor_port))),
            check: api.check,
            check_interval: Duration::from_millis(api.check_interval_ms.max(1).into()),
            fast_check_interval: Duration::from_millis(api.fast_check_interval_ms.max(1).into()),
            slowstart: Duration::from_millis(api.slowstart_ms.into()),
            shutdown_sessions: api.shutdown_sessions,
            policy: HealthPolicy {
                rise: api.rise.max(1),
                fall: api.fall.max(1),
            },
            connect_timeout: Duration::from_millis(api.connect_timeout_ms.max(1).into()),
            idle_timeout: Duration::from_secs(api.idle_timeout_secs.max(1).into()),
            max_connections: api.max_connections.max(1) as usize,
            ..Self::default()
        }
    }
}

impl Meter for Backend {
    fn add(&self, up: bool, n: u64) {
        let c = if up {
            &self.stats.bytes_in
        } else {
            &self.stats.bytes_out
        };
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counters of one frontend (kept for the life of the proxy, also after a VIP frontend is
/// removed, so counters never go backwards when the VIP comes back).
#[derive(Debug)]
struct FrontendStats {
    addr: SocketAddr,
    kind: FrontendKind,
    accepted: AtomicU64,
    refused: AtomicU64,
    active: AtomicU64,
}

impl FrontendStats {
    fn new(addr: SocketAddr, kind: FrontendKind) -> Arc<Self> {
        Arc::new(Self {
            addr,
            kind,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            active: AtomicU64::new(0),
        })
    }

    fn status(&self) -> FrontendStatus {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FrontendStatus {
            addr: self.addr,
            kind: self.kind,
            accepted: g(&self.accepted),
            refused: g(&self.refused),
            active: g(&self.active),
        }
    }
}

/// A frontend added at run time.
struct DynamicFrontend {
    bound: SocketAddr,
    /// Stops its accept loop.
    stop: CancellationToken,
    /// The listening socket, duplicated: [`Proxy::remove_frontend`] shuts it down at once,
    /// so the port is closed when it returns, not whenever the accept loop next runs.
    socket: std::os::fd::OwnedFd,
}

impl DynamicFrontend {
    /// Stops accepting on it now: shutdown(2) on a listening socket makes Linux stop
    /// listening at once (new SYNs are refused) and wakes the accept loop, which then sees
    /// EINVAL and ends.
    fn close(self) {
        self.stop.cancel();
        let _ = socket2::SockRef::from(&self.socket).shutdown(std::net::Shutdown::Read);
        tracing::info!(bound = %self.bound, "frontend removed");
    }
}

struct Shared {
    cfg: ProxyConfig,
    pool: Arc<Pool>,
    limit: Arc<Semaphore>,
    /// Stops the accept loops (first step of a stop).
    accept_stop: CancellationToken,
    /// Kills live connections (when the drain deadline passes).
    conn_kill: CancellationToken,
    accepts: TaskTracker,
    conns: TaskTracker,
    /// Frontends added at run time (the VIP), by address.
    dynamic: Mutex<BTreeMap<SocketAddr, DynamicFrontend>>,
    /// Every frontend's counters, by the address asked for.
    frontends: Mutex<BTreeMap<SocketAddr, Arc<FrontendStats>>>,
    /// Connections open when a stop began.
    drained: AtomicU64,
    /// Of those, cut at the drain deadline.
    drain_cut: AtomicU64,
    /// The shared tick of the connections' timeouts.
    ticker: lazy_timer::Ticker,
}

impl Shared {
    /// The counters of the frontend at `addr` (created on first use).
    fn frontend_stats(&self, addr: SocketAddr, kind: FrontendKind) -> Arc<FrontendStats> {
        self.frontends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_insert_with(|| FrontendStats::new(addr, kind))
            .clone()
    }
}

/// A bound proxy: cheap to clone; [`Proxy::serve`] runs it.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
    listeners: Arc<Mutex<Vec<TcpListener>>>,
    monitor: Arc<Mutex<Option<TcpListener>>>,
    local: Vec<SocketAddr>,
    monitor_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("frontends", &self.local)
            .field("monitor", &self.monitor_addr)
            .finish()
    }
}

impl Proxy {
    /// Binds the frontends and the monitor of `cfg`, with `backends` as the initial set.
    pub fn bind(cfg: ProxyConfig, backends: &[SocketAddr]) -> anyhow::Result<Self> {
        let mut listeners = Vec::new();
        let mut local = Vec::new();
        for &a in &cfg.frontends {
            let l = crate::net::listen::tcp(a, false)
                .with_context(|| format!("binding frontend {a}"))?;
            local.push(l.local_addr()?);
            listeners.push(l);
        }
        let (monitor, monitor_addr) = match cfg.monitor {
            Some(a) => {
                let l = crate::net::listen::tcp(a, false)
                    .with_context(|| format!("binding monitor {a}"))?;
                let addr = l.local_addr()?;
                (Some(l), Some(addr))
            }
            None => (None, None),
        };
        let tuning = Tuning {
            policy: cfg.policy,
            slowstart: cfg.slowstart,
        };
        let pool = Arc::new(Pool::with_tuning(tuning, cfg.check == BackendCheck::None));
        pool.set_backends(backends);
        let shared = Arc::new(Shared {
            limit: Arc::new(Semaphore::new(cfg.max_connections.max(1))),
            cfg,
            pool,
            accept_stop: CancellationToken::new(),
            conn_kill: CancellationToken::new(),
            accepts: TaskTracker::new(),
            conns: TaskTracker::new(),
            dynamic: Mutex::new(BTreeMap::new()),
            frontends: Mutex::new(BTreeMap::new()),
            drained: AtomicU64::new(0),
            drain_cut: AtomicU64::new(0),
            ticker: lazy_timer::Ticker::default(),
        });
        for &a in &local {
            shared.frontend_stats(a, FrontendKind::Node);
        }
        Ok(Self {
            shared,
            listeners: Arc::new(Mutex::new(listeners)),
            monitor: Arc::new(Mutex::new(monitor)),
            local,
            monitor_addr,
        })
    }

    /// The bound frontend addresses (with the ports the kernel chose for `:0`).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local
    }

    /// The bound monitor address.
    pub fn monitor_addr(&self) -> Option<SocketAddr> {
        self.monitor_addr
    }

    /// The backend pool (to change backends, read health and counters).
    pub fn pool(&self) -> Arc<Pool> {
        self.shared.pool.clone()
    }

    /// Open client connections.
    pub fn active_connections(&self) -> usize {
        self.shared.conns.len()
    }

    /// The proxy's typed status section; `vip_redirects` are the VIPs redirected to the
    /// node frontend with nftables.
    pub fn status(&self, vip_redirects: Vec<SocketAddr>) -> ProxyStatus {
        let sh = &self.shared;
        ProxyStatus {
            healthy: sh.pool.is_healthy(),
            frontends: sh
                .frontends
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .map(|f| f.status())
                .collect(),
            vip_redirects,
            backends: sh.pool.snapshot(),
            drained: sh.drained.load(Ordering::Relaxed),
            drain_cut: sh.drain_cut.load(Ordering::Relaxed),
        }
    }

    /// Adds a frontend at run time (`freebind` for an address that may not be local yet);
    /// returns the bound address. Adding one that exists returns it again.
    pub fn add_frontend(&self, addr: SocketAddr, freebind: bool) -> io::Result<SocketAddr> {
        let mut dynamic = self
            .shared
            .dynamic
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = dynamic.get(&addr) {
            return Ok(f.bound);
        }
        let l = crate::net::listen::tcp(addr, freebind)?;
        let bound = l.local_addr()?;
        let socket = std::os::fd::AsFd::as_fd(&l).try_clone_to_owned()?;
        let token = self.shared.accept_stop.child_token();
        dynamic.insert(
            addr,
            DynamicFrontend {
                bound,
                stop: token.clone(),
                socket,
            },
        );
        let sh = self.shared.clone();
        let stats = sh.frontend_stats(addr, FrontendKind::Vip);
        self.shared
            .accepts
            .spawn(accept::accept_loop(sh, l, stats, token));
        tracing::info!(%bound, "frontend added");
        Ok(bound)
    }

    /// Closes a frontend added with [`Proxy::add_frontend`]; live connections go on.
    pub fn remove_frontend(&self, addr: SocketAddr) {
        let mut dynamic = self
            .shared
            .dynamic
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = dynamic.remove(&addr) {
            f.close();
        }
    }

    /// Runs the accept loops, health checks and monitor until `stop`; then stops accepting,
    /// lets live connections finish for up to the drain timeout, and closes the rest.
    pub async fn serve(&self, stop: CancellationToken) -> anyhow::Result<()> {
        let sh = &self.shared;
        let listeners =
            std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|p| p.into_inner()));
        for l in listeners {
            let bound = l.local_addr()?;
            let stats = sh.frontend_stats(bound, FrontendKind::Node);
            sh.accepts.spawn(accept::accept_loop(
                sh.clone(),
                l,
                stats,
                sh.accept_stop.child_token(),
            ));
        }
        let aux_stop = CancellationToken::new();
        let mut aux = Vec::new();
        // Connections' timeouts wait for its ticks: it stops only after the last one ends.
        aux.push(tokio::spawn({
            let (sh, stop) = (sh.clone(), aux_stop.clone());
            async move { sh.ticker.run(stop).await }
        }));
        if let Some(m) = self
            .monitor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            aux.push(tokio::spawn(monitor::serve(
                m,
                sh.pool.clone(),
                aux_stop.clone(),
            )));
        }
        aux.push(tokio::spawn(check_tasks::health_supervisor(
            sh.clone(),
            aux_stop.clone(),
        )));

        stop.cancelled().await;
        tracing::info!(
            live = sh.conns.len(),
            "proxy stopping: no new connections, draining"
        );
        sh.accept_stop.cancel();
        // The map holds a copy of each added frontend's socket: close them, or they would
        // keep listening (clients queued, never accepted) for as long as the proxy lives.
        let added = std::mem::take(&mut *sh.dynamic.lock().unwrap_or_else(|p| p.into_inner()));
        added.into_values().for_each(DynamicFrontend::close);
        sh.accepts.close();
        sh.accepts.wait().await;
        sh.drained
            .fetch_add(sh.conns.len() as u64, Ordering::Relaxed);
        sh.conns.close();
        if tokio::time::timeout(sh.cfg.drain_timeout, sh.conns.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = sh.conns.len(),
                "drain deadline passed; closing connections"
            );
            sh.drain_cut
                .fetch_add(sh.conns.len() as u64, Ordering::Relaxed);
            sh.conn_kill.cancel();
            sh.conns.wait().await;
        }
        aux_stop.cancel();
        for t in aux {
            let _ = t.await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn accepted_clients_inherit_nodelay_from_the_listener() {
        let l = crate::net::listen::tcp(SocketAddr::from(([127, 0, 0, 1], 0)), false).unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(s.nodelay().unwrap());
    }

    /// What an open connection costs in the proxy's memory is mostly its task: the future
    /// of `handle` (connect, then forward) lives in one allocation for the connection's life.
    /// 792 bytes in a debug build with Rust 1.95 (784 before the client's first bytes were
    /// read at accept, `forward::First`; 3,376 while the forwarding was two nested async
    /// functions per direction; `forward::Forward` alone is 312): a buffer, a readiness
    /// future or a second copy of the forwarding state slipping into it would multiply
    /// every open connection's memory.
    #[tokio::test]
    async fn an_open_connection_task_stays_small() {
        let cfg = ProxyConfig {
            frontends: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            monitor: None,
            check: BackendCheck::None,
            ..ProxyConfig::default()
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy::bind(cfg, &[l.local_addr().unwrap()]).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (_s, peer) = l.accept().await.unwrap();
        let task = accept::handle(&proxy.shared, c.into_std().unwrap(), peer);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1024, "a connection's task takes {size} bytes");
    }
}
