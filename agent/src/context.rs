//! What the agent's subsystems share: the configuration, this node's identity and files,
//! and the watch channels through which one subsystem's state reaches the others.
//!
//! Producers own one channel each: `members` publishes the member list, `proxy` whether it
//! has a healthy backend, `vrrp` which VIPs this node holds, `ignition_server` whether it
//! runs. Each subsystem with a section in the status document ([`crate::status::model`])
//! installs a live view in [`Bus::views`], read whenever `status` or `/metrics` asks
//! ([`AgentContext::status`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use keelson_cluster::ClusterConfig;
use tokio::sync::watch;

use crate::member::MemberList;
use crate::node::NodeIdentity;
use crate::status::model::{
    AddressProblem, AgentStatus, BgpStatus, BuildInfo, DiscoveryStatus, DnsStatus, IgnitionStatus,
    NodeStatus, OtherSections, ProxyStatus, Restarts, VrrpInstance,
};

/// The watch channels between subsystems.
#[derive(Debug)]
pub struct Bus {
    /// Live members (published by `members`).
    pub members: watch::Sender<MemberList>,
    /// The local API proxy has at least one healthy backend (published by `proxy`).
    pub proxy_healthy: watch::Sender<bool>,
    /// The local API proxy is stopping and still has connections open (published by
    /// `proxy`): a stopping VRRP holder keeps its retired VIP that long.
    pub proxy_draining: watch::Sender<bool>,
    /// The local Ignition server is serving (published by `ignition_server`).
    pub ignition_running: watch::Sender<bool>,
    /// VIPs this node holds right now (published by `vrrp`).
    pub vips_held: watch::Sender<BTreeSet<IpAddr>>,
    /// The last VRRP master whose adverts stopped (its Master_Down timer ran out here):
    /// a hint that the node is gone, for the proxy (published by `vrrp`).
    pub vrrp_peer_down: watch::Sender<Option<IpAddr>>,
    /// DNS upstreams learned from metadata or DHCP (published by `net`/`metadata`).
    pub dns_upstreams: watch::Sender<Vec<IpAddr>>,
    /// Services that are up (bound their sockets, started their loops); the supervisor
    /// logs the `keelson-agent ready:` line once every started service is here.
    pub ready: watch::Sender<BTreeSet<String>>,
    /// Live views of the subsystems' state (typed status sections).
    pub views: Views,
    /// Restarts of services and operator processes by name (published by the supervisor).
    pub restarts: watch::Sender<BTreeMap<String, Restarts>>,
    /// This node's identity since its address moved to another link (published by the
    /// address watcher, `node_address`); `None`: the identity the agent started with. The
    /// supervisor restarts the services bound to the link on it.
    pub node: watch::Sender<Option<Arc<NodeIdentity>>>,
    /// The address watcher's findings and count of moves.
    pub node_address: watch::Sender<crate::node_address::AddressWatch>,
}

/// A function that reads one subsystem's state now.
type ViewFn<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// One subsystem's live view: installed while it runs, read on request.
pub struct ViewSlot<T>(Mutex<Option<(u64, ViewFn<T>)>>);

impl<T> Default for ViewSlot<T> {
    fn default() -> Self {
        Self(Mutex::new(None))
    }
}

impl<T> std::fmt::Debug for ViewSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.lock().is_some() {
            "ViewSlot(installed)"
        } else {
            "ViewSlot(empty)"
        })
    }
}

impl<T> ViewSlot<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, ViewFn<T>)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Installs `view` until the returned guard is dropped (a restarted subsystem installs
    /// its new view; the old guard's drop then leaves it alone).
    pub fn install(self: &Arc<Self>, view: impl Fn() -> T + Send + Sync + 'static) -> ViewGuard<T>
    where
        T: 'static,
    {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.lock() = Some((id, Arc::new(view)));
        ViewGuard {
            slot: self.clone(),
            id,
        }
    }

    /// Reads the view, if one is installed.
    pub fn read(&self) -> Option<T> {
        let view = self.lock().as_ref().map(|(_, f)| f.clone());
        view.map(|f| f())
    }
}

/// Removes a view when its subsystem stops.
pub struct ViewGuard<T: 'static> {
    slot: Arc<ViewSlot<T>>,
    id: u64,
}

impl<T> std::fmt::Debug for ViewGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewGuard").field("id", &self.id).finish()
    }
}

impl<T> Drop for ViewGuard<T> {
    fn drop(&mut self) {
        let mut slot = self.slot.lock();
        if slot.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *slot = None;
        }
    }
}

/// The live views, one per subsystem with a typed status section.
#[derive(Debug, Default)]
pub struct Views {
    /// VRRP instances (`vrrp`).
    pub vrrp: Arc<ViewSlot<Vec<VrrpInstance>>>,
    /// The API proxy (`proxy`).
    pub proxy: Arc<ViewSlot<ProxyStatus>>,
    /// The DNS server (`dns`).
    pub dns: Arc<ViewSlot<DnsStatus>>,
    /// Member discovery (`members`).
    pub discovery: Arc<ViewSlot<DiscoveryStatus>>,
    /// The Ignition server (`ignition`).
    pub ignition: Arc<ViewSlot<IgnitionStatus>>,
    /// VIPs announced by BGP (`bgp`).
    pub bgp: Arc<ViewSlot<BgpStatus>>,
}

impl Default for Bus {
    fn default() -> Self {
        Self {
            members: watch::Sender::new(Arc::new(Vec::new())),
            proxy_healthy: watch::Sender::new(false),
            ignition_running: watch::Sender::new(false),
            vips_held: watch::Sender::new(BTreeSet::new()),
            proxy_draining: watch::Sender::new(false),
            vrrp_peer_down: watch::Sender::new(None),
            dns_upstreams: watch::Sender::new(Vec::new()),
            ready: watch::Sender::new(BTreeSet::new()),
            views: Views::default(),
            restarts: watch::Sender::new(BTreeMap::new()),
            node: watch::Sender::new(None),
            node_address: watch::Sender::new(Default::default()),
        }
    }
}

impl Bus {
    /// Marks service `name` as up.
    pub fn mark_ready(&self, name: &str) {
        self.ready
            .send_if_modified(|set| set.insert(name.to_string()));
    }

    /// Records that service or process `name` ended (`why`) and is restarted for the
    /// `restarts`-th time.
    pub fn record_restart(&self, name: &str, restarts: u64, why: &str) {
        self.restarts.send_modify(|map| {
            map.insert(
                name.to_string(),
                Restarts {
                    restarts,
                    last_error: why.to_string(),
                },
            );
        });
    }
}

pub use keelson_cluster::paths::{STATE_DIR, TLS_DIR};

/// The node's directories (overridable so several agents share one host in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePaths {
    /// The cluster CA and the Ignition server's certificate and key.
    pub tls_dir: PathBuf,
    /// State kept across restarts (the unicast members' remembered masters).
    pub state_dir: PathBuf,
}

impl Default for NodePaths {
    fn default() -> Self {
        Self {
            tls_dir: PathBuf::from(TLS_DIR),
            state_dir: PathBuf::from(STATE_DIR),
        }
    }
}

/// Everything a subsystem needs to run.
#[derive(Debug, Clone)]
pub struct AgentContext {
    /// The cluster-wide configuration.
    pub cluster: Arc<ClusterConfig>,
    /// This node.
    pub node: Arc<NodeIdentity>,
    /// The node's directories.
    pub paths: Arc<NodePaths>,
    /// The shared channels.
    pub bus: Arc<Bus>,
}

impl AgentContext {
    /// A context with a fresh bus and the default paths.
    pub fn new(cluster: ClusterConfig, node: NodeIdentity) -> Self {
        Self {
            cluster: Arc::new(cluster),
            node: Arc::new(node),
            paths: Arc::new(NodePaths::default()),
            bus: Arc::new(Bus::default()),
        }
    }

    /// This node's identity now: where its address moved to, or as at start.
    pub fn current_node(&self) -> Arc<NodeIdentity> {
        self.bus
            .node
            .borrow()
            .clone()
            .unwrap_or_else(|| self.node.clone())
    }

    /// The same context with `node` as this node's identity (a service restarted on the
    /// link the node's address moved to).
    pub fn with_node(&self, node: Arc<NodeIdentity>) -> Self {
        Self {
            node,
            ..self.clone()
        }
    }

    /// Uses `paths` instead of the defaults.
    pub fn with_paths(mut self, paths: NodePaths) -> Self {
        self.paths = Arc::new(paths);
        self
    }

    /// The status document now: the bus's values and every installed view, read at this
    /// moment; `started` is when the agent started serving (uptime). What the status socket
    /// serves and `/metrics` exports.
    pub fn status(&self, started: std::time::Instant) -> AgentStatus {
        let bus = &self.bus;
        let node = self.current_node();
        let watch = bus.node_address.borrow().clone();
        let mut process = crate::status::process::read();
        process.uptime_seconds = started.elapsed().as_secs_f64();
        AgentStatus {
            node: NodeStatus {
                name: node.name.to_string(),
                role: node.role,
                interface: node.interface.clone(),
                addresses: node.addresses.clone(),
                cluster: self.cluster.zone(),
                address_problem: watch.problem.map(|(why, since)| AddressProblem {
                    problem: why,
                    seconds: since.elapsed().as_secs_f64(),
                }),
                address_moves: watch.moves,
            },
            build: BuildInfo::current(),
            process,
            ready: bus.ready.borrow().iter().cloned().collect(),
            restarts: bus.restarts.borrow().clone(),
            vips_held: bus.vips_held.borrow().iter().copied().collect(),
            proxy_healthy: *bus.proxy_healthy.borrow(),
            ignition_running: *bus.ignition_running.borrow(),
            dns_upstreams: bus.dns_upstreams.borrow().clone(),
            members: bus.members.borrow().to_vec(),
            vrrp: bus.views.vrrp.read().unwrap_or_default(),
            proxy: bus.views.proxy.read(),
            dns: bus.views.dns.read(),
            discovery: bus.views.discovery.read(),
            ignition: bus.views.ignition.read(),
            other: OtherSections {
                bgp: bus.views.bgp.read(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use crate::status::{fetch, model, serve, summary};

    #[tokio::test]
    /// The context's status document, served on the socket, reads back typed.
    async fn served_status_reads_back_typed() {
        let cluster =
            keelson_cluster::ClusterConfig::from_json(include_bytes!("dns/testdata/cluster.json"))
                .unwrap();
        let node = crate::node::NodeIdentity {
            name: "master-1".parse().unwrap(),
            role: keelson_cluster::Role::Master,
            interface: "eth0".into(),
            addresses: vec!["10.0.0.12/24".parse().unwrap()],
        };
        let ctx = super::AgentContext::new(cluster, node);
        ctx.bus.mark_ready("dns");
        let view = ctx.bus.views.discovery.install(|| model::DiscoveryStatus {
            transport: "mdns".into(),
            received: 7,
            drops: [("malformed".to_string(), 1)].into(),
            refused: 0,
            registries: Default::default(),
            auth: None,
            registry: None,
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let stop = CancellationToken::new();
        let started = std::time::Instant::now();
        let server = {
            let ctx = ctx.clone();
            tokio::spawn(serve(
                path.clone(),
                move || ctx.status(started),
                stop.clone(),
            ))
        };
        let mut doc = None;
        for _ in 0..50 {
            if let Ok(d) = fetch(&path).await {
                doc = Some(d);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let doc = doc.unwrap();
        assert_eq!(doc.node.name, "master-1");
        assert_eq!(doc.ready, vec!["dns".to_string()]);
        assert!(doc.other.bgp.is_none());
        assert_eq!(doc.discovery.as_ref().unwrap().received, 7);
        assert_eq!(doc.build.version, crate::VERSION);
        assert!(doc.process.resident_memory_bytes > 0);
        let text = summary(&doc);
        assert!(
            text.contains("node master-1 (master)") && text.contains("10.0.0.12/24"),
            "{text}"
        );
        assert!(text.contains("malformed 1"), "{text}");
        // A subsystem that stopped takes its view with it.
        drop(view);
        assert!(ctx.status(started).discovery.is_none());
        stop.cancel();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "socket removed on stop");
        let err = fetch(&path).await.unwrap_err().to_string();
        assert!(err.contains("is keelson-agent running"), "{err}");
    }
}
