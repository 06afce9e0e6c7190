//! The L4 API load balancer with backend health checks (DESIGN §4.4).
//!
//! - [`backend`]: pure bookkeeping — health rise/fall, round-robin order, counters.
//! - [`health`]: the checks (TCP connect, TLS `GET /readyz` without verification).
//! - [`forward`]: byte moving with `splice(2)` or a buffered copy, half-close aware.
//! - [`monitor`]: `/healthz` and `/stats`.
//! - [`vip`]: the `VIP:6443` frontend, bound or redirected with nftables.
//! - this module: listeners, the accept loops, connection setup with retries, the health
//!   supervisor, graceful drain, and the agent wiring (members, VIP frontend, bus).

pub mod backend;
pub mod forward;
pub mod health;
pub mod monitor;
pub mod vip;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use keelson_ignition::cluster::{ApiSettings, BackendCheck};
use keelson_ignition::{ClusterConfig, Role};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::{AgentContext, Member};
use backend::{Backend, HealthPolicy, Pool};
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
            policy: HealthPolicy { rise: 1, fall: 3 },
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(86400),
            max_connections: 20000,
            drain_timeout: Duration::from_secs(30),
            retries: 3,
            connect_stagger: Duration::from_secs(1),
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

/// Binds a listening TCP socket; `freebind` allows an address this host does not have (yet).
/// An unspecified IPv6 address is bound dual-stack, falling back to IPv4 where IPv6 is off.
pub fn listen(addr: SocketAddr, freebind: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let bind = |addr: SocketAddr| -> io::Result<TcpListener> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        // Accepted sockets inherit TCP_NODELAY on Linux: one setsockopt per client saved.
        s.set_tcp_nodelay(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(false)?;
            if freebind {
                s.set_freebind_v6(true)?;
            }
        } else if freebind {
            s.set_freebind_v4(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(4096)?;
        TcpListener::from_std(s.into())
    };
    match bind(addr) {
        Err(e) if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            tracing::debug!(error = %e, "no IPv6; binding the IPv4 wildcard");
            bind(SocketAddr::from(([0, 0, 0, 0], addr.port())))
        }
        r => r,
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
            let l = listen(a, false).with_context(|| format!("binding frontend {a}"))?;
            local.push(l.local_addr()?);
            listeners.push(l);
        }
        let (monitor, monitor_addr) = match cfg.monitor {
            Some(a) => {
                let l = listen(a, false).with_context(|| format!("binding monitor {a}"))?;
                let addr = l.local_addr()?;
                (Some(l), Some(addr))
            }
            None => (None, None),
        };
        let pool = Arc::new(Pool::new(cfg.policy, cfg.check == BackendCheck::None));
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
        });
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
        let l = listen(addr, freebind)?;
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
        self.shared.accepts.spawn(accept_loop(sh, l, token));
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
            sh.accepts
                .spawn(accept_loop(sh.clone(), l, sh.accept_stop.child_token()));
        }
        let aux_stop = CancellationToken::new();
        let mut aux = Vec::new();
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
        aux.push(tokio::spawn(health_supervisor(
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
        sh.conns.close();
        if tokio::time::timeout(sh.cfg.drain_timeout, sh.conns.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = sh.conns.len(),
                "drain deadline passed; closing connections"
            );
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
fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn accept_loop(sh: Arc<Shared>, listener: TcpListener, stop: CancellationToken) {
    let mut pressure = 0u32;
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => return,
            p = sh.limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => r,
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
                    () = stop.cancelled() => return,
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
        let sh2 = sh.clone();
        sh.conns.spawn(async move {
            handle(&sh2, client, peer).await;
            drop(permit);
        });
    }
}

/// How one backend connect attempt ended.
enum Attempt {
    Connected(TcpStream),
    /// The backend refused, reset, was unreachable or did not answer in time.
    Failed(String),
    /// No descriptors for the socket until the connect timeout: says nothing of the backend.
    Starved,
}

/// One connect to `b`, up to the connect timeout.
///
/// A connect that fails for lack of local resources (`EMFILE` and friends: the socket could
/// not even be created) says nothing about the backend: it is retried on the same backend
/// until the connect timeout, as the accept loop waits for descriptors.
async fn attempt(sh: &Shared, b: Arc<Backend>) -> (Arc<Backend>, Attempt) {
    let mut starved = false;
    let tries = async {
        loop {
            match TcpStream::connect(b.addr).await {
                Err(e) if is_resource_error(&e) => {
                    forward::release_spare_pipes();
                    if !starved {
                        tracing::warn!(backend = %b.addr, error = %e, "connect: out of resources; retrying");
                        starved = true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                r => return r,
            }
        }
    };
    let outcome = match tokio::time::timeout(sh.cfg.connect_timeout, tries).await {
        Ok(Ok(s)) => Attempt::Connected(s),
        Ok(Err(e)) => Attempt::Failed(e.to_string()),
        Err(_) if starved => Attempt::Starved,
        Err(_) => Attempt::Failed(format!("timed out after {:?}", sh.cfg.connect_timeout)),
    };
    (b, outcome)
}

/// Connects to the first backend that answers, trying up to `retries` others: the next one
/// when an attempt fails (haproxy's `retries` + `option redispatch`), and also — alongside
/// the pending one — when an attempt has had no answer for `connect_stagger`.
///
/// The stagger is keelson's addition. A master that died (powered off, partitioned) answers
/// nothing: its connects hang until ARP gives up or the 10 s connect timeout, and every
/// client sent there in the meantime waits that long. On a LAN a live backend answers a SYN
/// in well under a millisecond and the first SYN retransmission comes after 1 s, so an
/// attempt pending past the stagger is as good as lost: the client gets the next backend
/// instead, and the silent one is counted as failing (passive health), which takes it out
/// after `fall` such clients instead of `fall` check intervals.
async fn connect(sh: &Shared) -> Option<(Arc<Backend>, TcpStream)> {
    use futures::StreamExt as _;
    let mut candidates = sh.pool.pick().into_iter().take(sh.cfg.retries + 1);
    let mut pending = futures::stream::FuturesUnordered::new();
    // (backend, when its attempt started), to blame the ones still silent when another wins.
    let mut started: Vec<(Arc<Backend>, tokio::time::Instant)> = Vec::new();
    let mut start_next =
        |pending: &mut futures::stream::FuturesUnordered<_>,
         started: &mut Vec<(Arc<Backend>, tokio::time::Instant)>| {
            let Some(b) = candidates.next() else {
                return false;
            };
            started.push((b.clone(), tokio::time::Instant::now()));
            pending.push(attempt(sh, b));
            true
        };
    let stagger = sh.cfg.connect_stagger;
    let mut more = start_next(&mut pending, &mut started);
    loop {
        let next_stagger = tokio::time::sleep(stagger);
        tokio::select! {
            done = pending.next() => {
                let (b, outcome) = done?;
                started.retain(|(s, _)| !Arc::ptr_eq(s, &b));
                match outcome {
                    Attempt::Connected(s) => {
                        observe(sh, &b, Ok(()));
                        for (silent, since) in started {
                            if since.elapsed() >= stagger {
                                connect_failed(sh, &silent, format!(
                                    "no answer in {stagger:?} while another backend answered"
                                ));
                            }
                        }
                        return Some((b, s));
                    }
                    Attempt::Failed(error) => connect_failed(sh, &b, error),
                    Attempt::Starved => {
                        tracing::warn!("no descriptors for a backend connection; closing client");
                        return None;
                    }
                }
                if more {
                    more = start_next(&mut pending, &mut started);
                }
                if pending.is_empty() {
                    return None;
                }
            }
            () = next_stagger, if more && !stagger.is_zero() => {
                tracing::debug!(?stagger, "backend slow to answer; trying the next alongside");
                more = start_next(&mut pending, &mut started);
            }
        }
    }
}

/// A client connect to `b` failed (or stayed silent while another backend answered): count
/// it and tell passive health.
fn connect_failed(sh: &Shared, b: &Backend, error: String) {
    b.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(backend = %b.addr, %error, "connect failed; next backend");
    observe(sh, b, Err(error));
}

/// Passive health: a client connect's outcome counts towards the backend's health when
/// backends are checked (without checks nothing would ever bring a backend back).
fn observe(sh: &Shared, b: &Backend, result: Result<(), String>) {
    if sh.cfg.check == BackendCheck::None {
        return;
    }
    if let Some(up) = b.record_connect(result, sh.pool.policy()) {
        if !up {
            let error = b.health().last_error.unwrap_or_default();
            tracing::warn!(backend = %b.addr, %error, "backend down");
        }
        sh.pool.refresh_healthy();
    }
}

async fn handle(sh: &Shared, client: TcpStream, peer: SocketAddr) {
    let Some((b, server)) = connect(sh).await else {
        tracing::debug!(%peer, "no backend reachable; closing client");
        return;
    };
    // The client inherited TCP_NODELAY from the listener.
    let _ = server.set_nodelay(true);
    b.stats.active.fetch_add(1, Ordering::Relaxed);
    b.stats.total.fetch_add(1, Ordering::Relaxed);
    tokio::select! {
        r = forward::forward(&client, &server, sh.cfg.idle_timeout, sh.cfg.splice, &*b) => match r {
            Ok((forward::End::Idle, _)) => tracing::debug!(%peer, "idle timeout"),
            Ok(_) => {}
            Err(e) => tracing::debug!(%peer, backend = %b.addr, error = %e, "connection ended"),
        },
        () = sh.conn_kill.cancelled() => {}
    }
    b.stats.active.fetch_sub(1, Ordering::Relaxed);
}

/// One checking task per backend, following backend set changes.
async fn health_supervisor(sh: Arc<Shared>, stop: CancellationToken) {
    if sh.cfg.check == BackendCheck::None {
        return;
    }
    let timeout = sh
        .cfg
        .check_interval
        .clamp(Duration::from_secs(1), Duration::from_secs(10));
    let checker = health::Checker::new(sh.cfg.check, timeout);
    let mut rx = sh.pool.subscribe_backends();
    // Keyed by address, but a task checks one `Backend` object: a backend removed and
    // added back between two wake-ups is a new object (fresh state) and needs a new task.
    let mut tasks: HashMap<SocketAddr, (Arc<Backend>, CancellationToken)> = HashMap::new();
    loop {
        let current = rx.borrow_and_update().clone();
        tasks.retain(|a, (checked, t)| {
            let keep = current
                .iter()
                .any(|b| b.addr == *a && Arc::ptr_eq(b, checked));
            if !keep {
                t.cancel();
            }
            keep
        });
        for b in current.iter() {
            if let std::collections::hash_map::Entry::Vacant(slot) = tasks.entry(b.addr) {
                let t = stop.child_token();
                slot.insert((b.clone(), t.clone()));
                tokio::spawn(check_loop(sh.clone(), checker.clone(), b.clone(), t));
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

async fn check_loop(
    sh: Arc<Shared>,
    checker: health::Checker,
    b: Arc<Backend>,
    stop: CancellationToken,
) {
    // Checks start every interval (haproxy's `inter`), however long the last one took: a
    // dead backend whose checks time out is still down after `fall` intervals. A failed
    // client connect asks for a check at once.
    let mut tick = tokio::time::interval(sh.cfg.check_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = b.check_now.notified() => tick.reset(),
        }
        let r = tokio::select! {
            () = stop.cancelled() => return,
            r = checker.check(b.addr) => r.map_err(|e| e.to_string()),
        };
        if let Some(up) = b.record_check(r.clone(), sh.pool.policy()) {
            match &r {
                Ok(()) => tracing::info!(backend = %b.addr, "backend up"),
                Err(e) => tracing::warn!(backend = %b.addr, error = %e, up, "backend down"),
            }
            sh.pool.refresh_healthy();
        }
    }
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

/// The status snapshot published on the bus.
pub fn status_json(pool: &Pool, vip_frontends: &[(SocketAddr, vip::VipMode)]) -> serde_json::Value {
    let list = |mode| {
        vip_frontends
            .iter()
            .filter(|(_, m)| *m == mode)
            .map(|(a, _)| *a)
            .collect::<Vec<_>>()
    };
    serde_json::json!({
        "healthy": pool.is_healthy(),
        "vipFrontends": list(vip::VipMode::Bound),
        "vipRedirects": list(vip::VipMode::Redirected),
        "backends": pool.snapshot(),
    })
}

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
    let mut healthy = pool.subscribe_healthy();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut vip_frontends = vip::VipFrontends::new(ctx.cluster.api.frontend_port);
    vip_frontends.remove_stale_redirects().await;
    loop {
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
        let vf = vip_frontends.active();
        ctx.bus.publish_status("proxy", status_json(&pool, &vf));
        tokio::select! {
            () = stop.cancelled() => break,
            _ = members.changed() => {}
            _ = vips.changed() => {}
            _ = healthy.changed() => {}
            _ = tick.tick() => {}
        }
    }
    vip_frontends.sync(&proxy, &BTreeSet::new()).await;
    inner_stop.cancel();
    let r = serve.await.context("proxy task")?;
    ctx.bus.proxy_healthy.send_replace(false);
    r
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
    #[arg(long, default_value_t = 1000)]
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
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
    }
    proxy.serve(stop).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_clients_inherit_nodelay_from_the_listener() {
        let l = listen(SocketAddr::from(([127, 0, 0, 1], 0)), false).unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(s.nodelay().unwrap());
    }
}
