//! The L4 API load balancer with backend health checks (docs/proxy.md).
//!
//! - [`backend`]: pure bookkeeping — health rise/fall, round-robin order with slowstart,
//!   counters, the marked-down signal.
//! - [`health`]: the checks (TCP connect, TLS `GET /readyz` without verification).
//! - `checks`: one checking task per backend, with the fast interval while in doubt.
//! - `connect`: connection setup with retries, the connect stagger, passive health.
//! - [`lazy_timer`]: per-connection timeouts that arm a timer only for connections that
//!   outlive a shared tick.
//! - [`forward`]: byte moving with `splice(2)` or a buffered copy, half-close aware.
//! - [`monitor`]: `/healthz` and `/stats`.
//! - [`vip`]: the `VIP:6443` frontend, bound or redirected with nftables.
//! - this module: listeners and their counters, the accept loops, closing sessions of a
//!   backend marked down, graceful drain, and the agent wiring (members, VRRP hints, VIP
//!   frontend, bus).

pub mod backend;
mod checks;
mod connect;
pub mod forward;
pub mod health;
pub mod lazy_timer;
pub mod monitor;
pub mod vip;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::cluster::{ApiSettings, BackendCheck};
use keelson_cluster::{ClusterConfig, Role};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::AgentContext;
use crate::member::Member;
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
        self.shared.accepts.spawn(accept_loop(sh, l, stats, token));
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
            sh.accepts.spawn(accept_loop(
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
        aux.push(tokio::spawn(checks::health_supervisor(
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

/// Accept errors that mean "out of a resource for now": wait and retry; the pending client
/// stays in the backlog and is accepted once descriptors or memory are free again.
pub(crate) fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn accept_loop(
    sh: Arc<Shared>,
    listener: TcpListener,
    stats: Arc<FrontendStats>,
    stop: CancellationToken,
) {
    // Clients are accepted raw (not registered with the runtime by the accept) so that a
    // client's first bytes can be read before it is registered: `forward::First`.
    let listener = match listener.into_std().and_then(|l| {
        // SAFETY: the std listener owns its descriptor, which stays open and the same until
        // the AsyncFd (which owns the listener) is dropped.
        unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))
    }) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "frontend: cannot watch the listening socket");
            return;
        }
    };
    let mut pressure = 0u32;
    // One wait for the stop for the loop's life: a new one per client would take the
    // token's lock to join and leave its wait list each time.
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut stopped => return,
            p = sh.limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            () = &mut stopped => return,
            r = accept(&listener) => r,
        };
        let (client, peer) = match accepted {
            Ok(x) => {
                if pressure > 0 {
                    tracing::info!(retries = pressure, "accept works again");
                    pressure = 0;
                }
                x
            }
            Err(e) if is_resource_error(&e) => {
                forward::release_spare_pipes();
                if pressure == 0 {
                    tracing::warn!(error = %e, "accept: out of resources; retrying");
                }
                pressure += 1;
                tokio::select! {
                    () = &mut stopped => return,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                continue;
            }
            // The listener was shut down (a removed frontend).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => {
                // ECONNABORTED and friends: that client is gone; the next one is fine.
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.active.fetch_add(1, Ordering::Relaxed);
        let sh2 = sh.clone();
        let stats = stats.clone();
        sh.conns.spawn(async move {
            if !handle(&sh2, client, peer).await {
                stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            stats.active.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// The next client of `listener`: a non-blocking socket, not registered with the runtime.
async fn accept(
    listener: &AsyncFd<std::net::TcpListener>,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    loop {
        let mut ready = listener.readable().await?;
        let r = ready.try_io(|l| {
            // SAFETY: accept4 writes at most `len` bytes of address into the storage
            // try_init provides, and returns a new descriptor we then own.
            let (fd, addr) = unsafe {
                socket2::SockAddr::try_init(|storage, len| {
                    let fd = libc::accept4(
                        l.as_raw_fd(),
                        storage.cast(),
                        len,
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    );
                    if fd < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(fd)
                    }
                })
            }?;
            // SAFETY: a descriptor accept4 just returned, owned by nothing else.
            let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
            let peer = addr
                .as_socket()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            Ok((stream, peer))
        });
        match r {
            Ok(r) => return r,
            // Nothing to accept after all: readiness cleared, wait for the next.
            Err(_would_block) => continue,
        }
    }
}

/// Serves one client; false when no backend could be reached (the client is closed).
async fn handle(sh: &Shared, client: std::net::TcpStream, peer: SocketAddr) -> bool {
    // The client's first bytes, if they are there already: the backend connect then
    // carries its last handshake ACK on them.
    let mut first = match forward::First::read(client.as_fd()) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "client gone before its backend was chosen");
            return true;
        }
    };
    let client = match TcpStream::from_std(client) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "cannot register the client");
            return true;
        }
    };
    let delay_ack = first.delays_ack();
    // Not boxed: the connect state and the forwarding state never live at once, so they
    // share the task's memory (the task is as big as the larger, forwarding).
    let Some((b, server)) = connect::connect(sh, delay_ack).await else {
        tracing::debug!(%peer, "no backend reachable; closing client");
        return false;
    };
    first.set_delayed_ack(delay_ack);
    // The client inherited TCP_NODELAY from the listener; `connect::dial` set the server's.
    b.stats.active.fetch_add(1, Ordering::Relaxed);
    b.stats.total.fetch_add(1, Ordering::Relaxed);
    let mut downs = b.subscribe_downs();
    let marked_down = async {
        if sh.cfg.shutdown_sessions {
            let _ = downs.changed().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = forward::forward(&client, &server, sh.cfg.idle_timeout, &sh.ticker, sh.cfg.splice, &*b, first) => match r {
            Ok((forward::End::Idle, _)) => tracing::debug!(%peer, "idle timeout"),
            Ok(_) => {}
            Err(e) => tracing::debug!(%peer, backend = %b.addr, error = %e, "connection ended"),
        },
        () = marked_down => {
            // Dropping both sockets closes them: the client sees the connection end and
            // reconnects, and gets a backend that is up.
            b.stats.sessions_shut_down.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, backend = %b.addr, "backend marked down; closing the session");
        }
        () = sh.conn_kill.cancelled() => {}
    }
    b.stats.active.fetch_sub(1, Ordering::Relaxed);
    true
}

/// Backends from the member list: one address per bootstrap/master node (the one on the
/// machine network if any) at `port`. The bootstrap node counts: its temporary
/// kube-apiserver serves the API until the masters' are up, and its check fails once it
/// is gone.
pub fn backends_from_members(cluster: &ClusterConfig, members: &[Member]) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = cluster.api.static_backends.clone();
    for m in members {
        if !matches!(m.role, Role::Master | Role::Bootstrap) {
            continue;
        }
        let ip = m
            .addresses
            .iter()
            .find(|a| cluster.machine_networks.iter().any(|n| n.contains(*a)))
            .or_else(|| m.addresses.first());
        if let Some(ip) = ip {
            out.push(SocketAddr::new(*ip, cluster.api.backend_port));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Marks down the backends at `ip`: VRRP saw that node's adverts stop (its Master_Down
/// timer ran out), which a dead node shows seconds before its checks or its clients' connect
/// stagger would. Returns how many backends flipped.
pub fn mark_node_down(pool: &Pool, ip: IpAddr) -> usize {
    let mut flipped = 0;
    for b in pool.backends().iter().filter(|b| b.addr.ip() == ip) {
        if b.mark_down(format!("VRRP: adverts from {ip} stopped")) {
            tracing::warn!(backend = %b.addr, "backend down: its node's VRRP adverts stopped");
            flipped += 1;
        }
    }
    pool.refresh_healthy();
    flipped
}

/// How long a stopping proxy keeps serving the VIP for VRRP to hand it over (VRRP waits
/// at most Master_Down_Interval, under 4 s at the default 1 s adverts).
const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    let cfg = ProxyConfig::from_settings(&ctx.cluster.api);
    let initial = backends_from_members(&ctx.cluster, &ctx.bus.members.borrow());
    let proxy = Proxy::bind(cfg, &initial)?;
    tracing::info!(frontends = ?proxy.local_addrs(), backends = ?initial, "proxy listening");
    let inner_stop = CancellationToken::new();
    let serve = {
        let p = proxy.clone();
        let s = inner_stop.clone();
        tokio::spawn(async move { p.serve(s).await })
    };
    ctx.bus.mark_ready("proxy");

    let pool = proxy.pool();
    let mut members = ctx.bus.members.subscribe();
    let mut vips = ctx.bus.vips_held.subscribe();
    let mut peers_down = ctx.bus.vrrp_peer_down.subscribe();
    let redirects: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    let _view = {
        let (proxy, redirects) = (proxy.clone(), redirects.clone());
        ctx.bus.views.proxy.install(move || {
            let r = redirects.lock().unwrap_or_else(|p| p.into_inner()).clone();
            proxy.status(r)
        })
    };
    let mut healthy = pool.subscribe_healthy();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut vip_frontends = vip::VipFrontends::new(ctx.cluster.api.frontend_port);
    vip_frontends.remove_stale_redirects().await;
    loop {
        // Before anything else, so a hint that came with the VIP is applied before the VIP
        // frontend opens.
        if peers_down.has_changed().unwrap_or(false)
            && let Some(ip) = *peers_down.borrow_and_update()
        {
            mark_node_down(&pool, ip);
        }
        pool.set_backends(&backends_from_members(
            &ctx.cluster,
            &members.borrow_and_update(),
        ));
        let is_healthy = *healthy.borrow_and_update();
        ctx.bus.proxy_healthy.send_if_modified(|h| {
            let changed = *h != is_healthy;
            *h = is_healthy;
            changed
        });
        let held = vips.borrow_and_update().clone();
        let want: BTreeSet<SocketAddr> = if is_healthy {
            ctx.cluster
                .api_vips
                .iter()
                .filter(|v| held.contains(v))
                .map(|v| SocketAddr::new(*v, ctx.cluster.api.vip_port))
                .collect()
        } else {
            BTreeSet::new()
        };
        vip_frontends.sync(&proxy, &want).await;
        *redirects.lock().unwrap_or_else(|p| p.into_inner()) = vip_frontends
            .active()
            .into_iter()
            .filter(|(_, m)| *m == vip::VipMode::Redirected)
            .map(|(a, _)| a)
            .collect();
        tokio::select! {
            () = stop.cancelled() => break,
            r = peers_down.changed() => {
                if r.is_ok() && let Some(ip) = *peers_down.borrow_and_update() {
                    mark_node_down(&pool, ip);
                }
            }
            _ = members.changed() => {}
            _ = vips.changed() => {}
            _ = healthy.changed() => {}
            _ = tick.tick() => {}
        }
    }
    // Before the VIP goes: a stopping VRRP holder that retires it waits on this.
    ctx.bus.proxy_draining.send_replace(true);
    // A clean stop: VRRP hands the VIP over before it removes it (see
    // `vrrp::instance`); until then clients still come here and are served.
    let api_vips: BTreeSet<IpAddr> = ctx.cluster.api_vips.iter().copied().collect();
    let released = vips.wait_for(|held| held.is_disjoint(&api_vips));
    if tokio::time::timeout(HANDOVER_WAIT, released).await.is_err() {
        tracing::warn!("the API VIP is still held {HANDOVER_WAIT:?} after stop; closing anyway");
    }
    vip_frontends.sync(&proxy, &BTreeSet::new()).await;
    inner_stop.cancel();
    let r = serve.await.context("proxy task");
    ctx.bus.proxy_draining.send_replace(false);
    ctx.bus.proxy_healthy.send_replace(false);
    r?
}

/// `keelson-agent proxy`: run the proxy alone (debugging, benchmarks).
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Frontend address to listen on (repeat for more).
    #[arg(long = "listen", default_value = "0.0.0.0:9445")]
    pub listen: Vec<SocketAddr>,
    /// A backend address (repeat for more).
    #[arg(long = "backend", required = true)]
    pub backends: Vec<SocketAddr>,
    /// Backend health check: none, tcp or tls-readyz.
    #[arg(long, default_value = "tls-readyz", value_parser = parse_check)]
    pub check: BackendCheck,
    /// Milliseconds between checks of one backend.
    #[arg(long, default_value_t = 5000)]
    pub check_interval_ms: u64,
    /// Monitor address (`/healthz`, `/stats`); `none` for no monitor.
    #[arg(long, default_value = "0.0.0.0:50936")]
    pub monitor: String,
    /// Maximum concurrent client connections.
    #[arg(long, default_value_t = 20000)]
    pub max_connections: usize,
    /// Idle timeout of a proxied connection, seconds.
    #[arg(long, default_value_t = 86400)]
    pub idle_timeout_secs: u64,
    /// Backend connect timeout, milliseconds.
    #[arg(long, default_value_t = 10000)]
    pub connect_timeout_ms: u64,
    /// Milliseconds without an answer from a backend before the next one is tried
    /// alongside; 0 tries backends one after another.
    #[arg(long, default_value_t = connect::DEFAULT_STAGGER.as_millis() as u64)]
    pub connect_stagger_ms: u64,
    /// Seconds live connections may run on after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,
    /// Copy through user space instead of `splice(2)`.
    #[arg(long)]
    pub no_splice: bool,
}

fn parse_check(s: &str) -> Result<BackendCheck, String> {
    match s {
        "none" => Ok(BackendCheck::None),
        "tcp" => Ok(BackendCheck::Tcp),
        "tls-readyz" => Ok(BackendCheck::TlsReadyz),
        _ => Err(format!("expected none, tcp or tls-readyz, got {s:?}")),
    }
}

/// Runs `keelson-agent proxy`.
pub async fn cli(args: ProxyArgs) -> anyhow::Result<()> {
    let monitor = match args.monitor.as_str() {
        "none" => None,
        m => Some(
            m.parse::<SocketAddr>()
                .with_context(|| format!("--monitor: expected ADDR:PORT or none, got {m:?}"))?,
        ),
    };
    let cfg = ProxyConfig {
        frontends: args.listen,
        monitor,
        check: args.check,
        check_interval: Duration::from_millis(args.check_interval_ms.max(1)),
        max_connections: args.max_connections.max(1),
        idle_timeout: Duration::from_secs(args.idle_timeout_secs.max(1)),
        connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
        connect_stagger: Duration::from_millis(args.connect_stagger_ms),
        drain_timeout: Duration::from_secs(args.drain_secs),
        splice: !args.no_splice,
        ..ProxyConfig::default()
    };
    let proxy = Proxy::bind(cfg, &args.backends)?;
    // The line tests and scripts wait for.
    eprintln!(
        "keelson-agent proxy listening on {:?} monitor {:?}",
        proxy.local_addrs(),
        proxy.monitor_addr()
    );
    let stop = CancellationToken::new();
    crate::signals::cancel_on_stop_signal(stop.clone())?;
    proxy.serve(stop).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let task = handle(&proxy.shared, c.into_std().unwrap(), peer);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1024, "a connection's task takes {size} bytes");
    }
}
