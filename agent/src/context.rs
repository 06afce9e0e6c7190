//! What the agent's subsystems share: the configuration, this node's identity and files,
//! the watch channels through which one subsystem's state reaches the others, and the
//! members registry (kept by `members`, served by `ignition_server`).
//!
//! Producers own one channel each: `members` publishes the member list, `proxy` whether it
//! has a healthy backend, `vrrp` which VIPs this node holds, `ignition_server` whether it
//! runs. Everyone may publish a JSON status snapshot under its own name for `status`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use keelson_ignition::{ClusterConfig, Role};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::node::NodeIdentity;

/// One node of the cluster as members discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Node name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Addresses on the machine network.
    pub addresses: Vec<IpAddr>,
    /// Agent version the node runs.
    pub version: String,
}

/// The live member list, sorted by name; this node included.
pub type MemberList = Arc<Vec<Member>>;

/// The watch channels between subsystems.
#[derive(Debug)]
pub struct Bus {
    /// Live members (published by `members`).
    pub members: watch::Sender<MemberList>,
    /// The local API proxy has at least one healthy backend (published by `proxy`).
    pub proxy_healthy: watch::Sender<bool>,
    /// The local Ignition server is serving (published by `ignition_server`).
    pub ignition_running: watch::Sender<bool>,
    /// VIPs this node holds right now (published by `vrrp`).
    pub vips_held: watch::Sender<BTreeSet<IpAddr>>,
    /// DNS upstreams learned from metadata or DHCP (published by `net`/`metadata`).
    pub dns_upstreams: watch::Sender<Vec<IpAddr>>,
    /// Status snapshots by subsystem name (published by everyone, read by `status`).
    pub status: watch::Sender<BTreeMap<String, serde_json::Value>>,
    /// Services that are up (bound their sockets, started their loops); the supervisor
    /// logs the `keelson-agent ready:` line once every started service is here.
    pub ready: watch::Sender<BTreeSet<String>>,
}

impl Default for Bus {
    fn default() -> Self {
        Self {
            members: watch::Sender::new(Arc::new(Vec::new())),
            proxy_healthy: watch::Sender::new(false),
            ignition_running: watch::Sender::new(false),
            vips_held: watch::Sender::new(BTreeSet::new()),
            dns_upstreams: watch::Sender::new(Vec::new()),
            status: watch::Sender::new(BTreeMap::new()),
            ready: watch::Sender::new(BTreeSet::new()),
        }
    }
}

impl Bus {
    /// Marks service `name` as up.
    pub fn mark_ready(&self, name: &str) {
        self.ready
            .send_if_modified(|set| set.insert(name.to_string()));
    }

    /// Publishes `value` as subsystem `name`'s status snapshot.
    pub fn publish_status(&self, name: &str, value: serde_json::Value) {
        self.status.send_modify(|map| {
            map.insert(name.to_string(), value);
        });
    }
}

/// Where the node's TLS files are (written by its Ignition config).
pub const TLS_DIR: &str = "/etc/keelson/tls";

/// Where the agent keeps state across restarts.
pub const STATE_DIR: &str = "/var/lib/keelson";

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
    /// The unicast members registry: filled by `members`, served by `ignition_server`
    /// (unicast transport). Outlives restarts of either.
    pub member_registry: Arc<crate::members::registry::Registry>,
}

impl AgentContext {
    /// A context with a fresh bus and the default paths.
    pub fn new(cluster: ClusterConfig, node: NodeIdentity) -> Self {
        let expiry = std::time::Duration::from_secs(u64::from(cluster.members.expiry_secs.max(1)));
        let mut registry = crate::members::registry::Registry::new(&cluster.zone(), expiry)
            .with_own(crate::members::member_of(&node));
        if cluster.members.key_id.is_some() {
            registry = registry.awaiting_keys();
        }
        Self {
            cluster: Arc::new(cluster),
            node: Arc::new(node),
            paths: Arc::new(NodePaths::default()),
            bus: Arc::new(Bus::default()),
            member_registry: Arc::new(registry),
        }
    }

    /// Uses `paths` instead of the defaults.
    pub fn with_paths(mut self, paths: NodePaths) -> Self {
        self.paths = Arc::new(paths);
        self
    }
}
