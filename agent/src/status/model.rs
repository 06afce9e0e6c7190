//! The status document: one typed struct that the agent builds on request from its
//! subsystems' live views, that the status socket serves as JSON, that `keelson-agent
//! status` reads back into the same struct, and that `/metrics` exports. One source for
//! both, so the screen and the scrape always show the same facts.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::histogram::HistogramSnapshot;
use crate::member::Member;

/// Everything the running agent knows about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// This node.
    pub node: NodeStatus,
    /// The agent build.
    pub build: BuildInfo,
    /// The agent process.
    pub process: ProcessStatus,
    /// Services that are up.
    pub ready: Vec<String>,
    /// Services and operator processes restarted by the supervisor, by name.
    #[serde(default)]
    pub restarts: BTreeMap<String, Restarts>,
    /// VIPs this node holds.
    pub vips_held: Vec<IpAddr>,
    /// The local proxy has a healthy backend.
    pub proxy_healthy: bool,
    /// The local Ignition server is serving.
    pub ignition_running: bool,
    /// DNS upstreams learned from metadata or DHCP.
    pub dns_upstreams: Vec<IpAddr>,
    /// Live members, this node included.
    pub members: Vec<Member>,
    /// VRRP instances this node takes part in.
    #[serde(default)]
    pub vrrp: Vec<VrrpInstance>,
    /// The API proxy, when it runs here.
    #[serde(default)]
    pub proxy: Option<ProxyStatus>,
    /// The DNS server, when it runs here.
    #[serde(default)]
    pub dns: Option<DnsStatus>,
    /// Member discovery's counters, when it runs here.
    #[serde(default)]
    pub discovery: Option<DiscoveryStatus>,
    /// The Ignition server, when it runs here.
    #[serde(default)]
    pub ignition: Option<IgnitionStatus>,
    /// Sections kept under `other`, where the JSON document has always had them.
    #[serde(default)]
    pub other: OtherSections,
}

/// The sections under `other` in the JSON document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtherSections {
    /// BGP, when VIPs are announced by BGP here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpStatus>,
}

/// Who this node is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Node name.
    pub name: String,
    /// Role.
    pub role: keelson_cluster::Role,
    /// Interface on the machine network.
    pub interface: String,
    /// Addresses on it.
    pub addresses: Vec<IpNet>,
    /// The cluster zone (`<name>.<baseDomain>`).
    pub cluster: String,
    /// Why the node's address cannot be followed now (docs/agent.md, "The node's
    /// address"): it is on no link, or on one `nodeAddress.interface` excludes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_problem: Option<AddressProblem>,
    /// Times the node's address moved to another link (or the addresses beside it changed)
    /// and the services bound to the link followed.
    #[serde(default)]
    pub address_moves: u64,
}

/// A finding about the node's address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressProblem {
    /// What is wrong.
    pub problem: String,
    /// Seconds since it was found.
    pub seconds: f64,
}

/// What was built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildInfo {
    /// Crate version.
    pub version: String,
    /// Git commit the agent was built from (`unknown` outside a checkout).
    pub commit: String,
}

impl BuildInfo {
    /// This binary's.
    pub fn current() -> Self {
        Self {
            version: crate::VERSION.to_string(),
            commit: env!("KEELSON_COMMIT").to_string(),
        }
    }
}

/// The agent process (from `/proc/self`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStatus {
    /// Seconds since the agent started serving.
    pub uptime_seconds: f64,
    /// When the process started, Unix seconds.
    pub start_time_seconds: f64,
    /// Resident memory.
    pub resident_memory_bytes: u64,
    /// Virtual memory.
    pub virtual_memory_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The descriptor limit (`RLIMIT_NOFILE`, soft).
    pub max_fds: u64,
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Threads.
    pub threads: u64,
}

/// VRRP state of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VrrpState {
    /// Not started, or stopped.
    Initialize,
    /// Listening to a master.
    Backup,
    /// Holding the VIP.
    Master,
}

impl VrrpState {
    /// Every state, in a fixed order (for one-hot export).
    pub const ALL: [VrrpState; 3] = [VrrpState::Initialize, VrrpState::Backup, VrrpState::Master];

    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            VrrpState::Initialize => "initialize",
            VrrpState::Backup => "backup",
            VrrpState::Master => "master",
        }
    }
}

/// One VRRP instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VrrpInstance {
    /// Instance name (`api`, `ingress`, ...).
    pub name: String,
    /// Its VIP.
    pub vip: IpAddr,
    /// The VIPs held with it: those of the instances that follow it (`follows`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companion_vips: Vec<IpAddr>,
    /// Virtual router ID.
    pub vrid: u8,
    /// Current state.
    pub state: VrrpState,
    /// Seconds in the current state.
    pub state_seconds: f64,
    /// Base priority.
    pub base_priority: u8,
    /// Effective priority (base plus passing checks' weights).
    pub priority: u8,
    /// The master last heard (or this node).
    pub master: Option<IpAddr>,
    /// Its priority.
    pub master_priority: Option<u8>,
    /// State changes.
    pub transitions: u64,
    /// Valid adverts received.
    pub adverts_received: u64,
    /// Adverts sent (one per destination).
    pub adverts_sent: u64,
    /// Gratuitous ARPs / unsolicited NAs sent.
    pub announcements: u64,
    /// Unicast: ARP frames showing another holder of the VIP that sends no adverts.
    #[serde(default)]
    pub arp_conflicts: u64,
    /// Unicast: times this node gave the VIP up to such a holder.
    #[serde(default)]
    pub conflict_yields: u64,
    /// Unicast: times the claim grace ran out with no peer heard (claimed alone).
    #[serde(default)]
    pub lone_claims: u64,
    /// Times a silent master's VIP holder answered ARP / neighbour solicitation when
    /// Master_Down ran out, so this backup did not claim (docs/vrrp.md, "Fast failover
    /// without flapping").
    #[serde(default)]
    pub claims_held: u64,
    /// Times this master gave the VIP up to a router that could not hear it.
    #[serde(default)]
    pub deaf_yields: u64,
    /// Adverts on this VRID from another virtual router (not a member, other VIPs).
    #[serde(default)]
    pub foreign_adverts: u64,
    /// Routers heard that were forgotten early to keep the list within its bound.
    #[serde(default)]
    pub heard_forgotten: u64,
    /// Unicast: whether this node may claim the VIP yet, and why (`notGated` for multicast).
    #[serde(default)]
    pub claim_gate: GateState,
    /// Where adverts go: the unicast peers, or the multicast group.
    #[serde(default)]
    pub destinations: Vec<IpAddr>,
    /// Packets dropped, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Health checks moving its priority.
    pub checks: Vec<HealthCheck>,
    /// Cloud port security problems found (docs/vrrp.md, "Port security").
    #[serde(default)]
    pub port_security: Vec<PortSecurityFinding>,
    /// Other virtual routers heard on this VRID within the last minute (docs/vrrp.md,
    /// "VRIDs"): another cluster on the segment uses it.
    #[serde(default)]
    pub foreign_routers: Vec<ForeignRouter>,
}

/// Another virtual router heard on an instance's VRID: a host that is not a member of this
/// cluster advertising other VIPs (or another version or authentication) under it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForeignRouter {
    /// Its address.
    pub source: IpAddr,
    /// The VRID (the instance's).
    pub vrid: u8,
    /// The VIPs it advertises.
    pub addresses: Vec<IpAddr>,
    /// Its adverts heard.
    pub adverts: u64,
    /// Seconds since its first advert.
    pub seconds: f64,
    /// Seconds since its last one.
    pub last_seconds: f64,
}

impl ForeignRouter {
    /// What to do about it.
    pub const FIX: &'static str = "another cluster on this segment uses this VRID: give one of the two clusters other VRIDs (keelson build --vrid api=N --vrid ingress=M; cluster.json vrrp.instances[].vrid)";
}

/// A port security problem a VRRP instance found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortSecurityFinding {
    /// What is wrong.
    pub problem: PortProblem,
    /// Seconds since it was found.
    pub seconds: f64,
    /// The likely fix (an `openstack` command).
    pub fix: String,
}

/// What is wrong with a node's cloud port or its security group, as a VRRP instance found it
/// (`vrrp/portsec.rs`, docs/vrrp.md "Port security").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PortProblem {
    /// Traffic from the VIP leaves this node's port dropped: the VIP is not one of the
    /// port's allowed address pairs.
    VipNotAllowed,
    /// Another host holds the VIP, members know the peers, and no advert arrives: the
    /// security group drops VRRP (IP protocol 112).
    VrrpBlocked,
}

impl PortProblem {
    /// Every problem, for metrics (a 0 for each one not seen).
    pub const ALL: [PortProblem; 2] = [PortProblem::VipNotAllowed, PortProblem::VrrpBlocked];

    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PortProblem::VipNotAllowed => "vip_not_allowed",
            PortProblem::VrrpBlocked => "vrrp_blocked",
        }
    }

    /// The likely fix, as the command an OpenStack user runs. `vip` is the instance's VIP,
    /// `mac` this node's NIC (the port is found by it).
    pub fn fix(self, vip: IpAddr, mac: &str) -> String {
        match self {
            PortProblem::VipNotAllowed => format!(
                "openstack port set --allowed-address ip-address={vip} $(openstack port list --mac-address {mac} -f value -c ID)"
            ),
            PortProblem::VrrpBlocked => "openstack security group rule create --protocol 112 <the security group of the nodes' ports>".to_owned(),
        }
    }
}

/// One health check of a VRRP instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Check name.
    pub name: String,
    /// Whether it passes.
    pub passing: bool,
    /// Weight added while it passes.
    pub weight: i32,
    /// Times it changed between passing and failing.
    pub transitions: u64,
}

/// The API proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// At least one backend is up.
    pub healthy: bool,
    /// Listening addresses and what came in on each.
    pub frontends: Vec<FrontendStatus>,
    /// `VIP:6443` addresses redirected to the node frontend with nftables (their clients
    /// are counted on the node frontend).
    pub vip_redirects: Vec<SocketAddr>,
    /// Backends and their health and traffic.
    pub backends: Vec<BackendSnapshot>,
    /// Client connections still open when a stop began (let finish).
    pub drained: u64,
    /// Of those, cut at the drain deadline.
    pub drain_cut: u64,
}

/// How a frontend listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontendKind {
    /// `:9445` on every address.
    Node,
    /// `VIP:6443`, bound while this node holds the VIP.
    Vip,
}

impl FrontendKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::Node => "node",
            FrontendKind::Vip => "vip",
        }
    }
}

/// One frontend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendStatus {
    /// The address clients connect to.
    pub addr: SocketAddr,
    /// How it listens.
    pub kind: FrontendKind,
    /// Clients accepted.
    pub accepted: u64,
    /// Accepted clients closed at once because no backend answered.
    pub refused: u64,
    /// Client connections open now.
    pub active: u64,
}

/// The DNS server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsStatus {
    /// The zone served.
    pub zone: String,
    /// Node names in it.
    pub nodes: u64,
    /// Listening addresses.
    pub listen: Vec<SocketAddr>,
    /// Upstreams, in order.
    pub upstreams: Vec<SocketAddr>,
    /// Requests received.
    pub received: u64,
    /// Decoded queries by question type (A, AAAA, ... and `other`).
    pub queries: BTreeMap<String, u64>,
    /// Responses by code (NOERROR, NXDOMAIN, ... and `other`).
    pub responses: BTreeMap<String, u64>,
    /// Answered from the zone.
    pub authoritative: u64,
    /// Sent upstream (or answered from the cache).
    pub forwarded: u64,
    /// Forwarded queries no upstream answered.
    pub forward_failures: u64,
    /// Answered from the forward cache.
    pub cache_hits: u64,
    /// Upstream round trips.
    pub forward_latency: HistogramSnapshot,
    /// Requests dropped, by reason (`short`, `response`).
    pub dropped: BTreeMap<String, u64>,
    /// UDP responses truncated.
    pub truncated: u64,
    /// TCP connections refused (too many).
    pub tcp_refused: u64,
    /// The etcd names, when the cluster serves them (docs/dns.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdNamesStatus>,
}

/// The etcd names the DNS server serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdNamesStatus {
    /// `etcd-<i>` -> the master it names.
    pub names: BTreeMap<String, String>,
    /// Whether `_etcd-server-ssl._tcp` (and `_etcd-client-ssl._tcp`) are answered: every
    /// master of the control plane is a member.
    pub srv_ready: bool,
    /// The control plane size the SRV sets wait for.
    pub masters: u32,
    /// Masters whose name has no index (no etcd name).
    pub unindexed: Vec<String>,
    /// Masters whose index a master first by name already has (no etcd name).
    pub duplicates: Vec<String>,
}

/// Member discovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryStatus {
    /// `mdns` or `unicast`.
    pub transport: String,
    /// Packets (mDNS) or registrations (unicast) received.
    pub received: u64,
    /// Records or packets dropped, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Unicast: registrations a registry refused or answered with something unusable.
    #[serde(default)]
    pub refused: u64,
    /// Unicast: the outcome of the last registration with each registry, by address.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub registries: BTreeMap<String, String>,
    /// Authenticated membership (docs/members.md): absent until the keys are loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<MembersAuth>,
    /// Unicast: this node's registry (docs/members.md, "Bounds").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryStatus>,
}

/// A unicast members registry: what it holds, what it took in and refused, what it served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryStatus {
    /// Members held (registered here or merged from other registries; this node aside).
    pub entries: u64,
    /// The most it holds.
    pub limit: u64,
    /// Registrations received.
    pub registrations: u64,
    /// Registrations refused before they were believed, by reason (`full`, `address`,
    /// `rate`).
    pub refused: BTreeMap<String, u64>,
    /// Entries of other registries' answers not taken because the registry was full.
    pub merge_skipped: u64,
    /// Answers served to registrations and `GET`s (lists and "unchanged").
    pub answers: u64,
    /// Their bytes (the body, before TLS).
    pub answer_bytes: u64,
    /// Of the answers, those that said "unchanged since the list you hold" (`304`) instead
    /// of sending the list. Absent in an older agent's status.
    #[serde(default)]
    pub unchanged: u64,
    /// Addresses the per-address rate limit keeps.
    pub sources: u64,
}

/// Authenticated membership: whether records are signed and checked, and what was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MembersAuth {
    /// Records are signed and checked (`cluster.json` names a key).
    pub authenticated: bool,
    /// Records dropped, by reason (`noMac`, `badMac`, `unknownKey`, `addressMismatch`, `stale`, `replay`).
    pub drops: BTreeMap<String, u64>,
}

/// The Ignition server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnitionStatus {
    /// TLS listener.
    pub tls: Option<SocketAddr>,
    /// Plain listener.
    pub plain: Option<SocketAddr>,
    /// Bootstrap mode (`/config/worker` answers 500).
    pub bootstrap: bool,
    /// Who may fetch configs (loopback always may).
    pub allowed_networks: Vec<IpNet>,
    /// Requests answered, by what was asked and how it went.
    pub requests: Vec<IgnitionRequests>,
}

/// A count of Ignition server requests with the same route, pool, served spec and status.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnitionRequests {
    /// `config`, `asset`, `healthz`, `keelson` or `other`.
    pub route: String,
    /// `master`, `worker`, `other` for configs; empty otherwise.
    pub pool: String,
    /// The Ignition spec version served (configs answered 200), empty otherwise.
    pub spec: String,
    /// HTTP status.
    pub status: u16,
    /// How many.
    pub count: u64,
}

/// How often a service or process was restarted, and why last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restarts {
    /// Restarts so far.
    pub restarts: u64,
    /// Why it ended the last time.
    pub last_error: String,
}

/// A unicast VRRP instance's claim gate (`vrrp::gate`): why it is open, or that it is not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GateState {
    /// Waiting for a peer until the deadline.
    Waiting,
    /// An advert was heard.
    Heard,
    /// A participating member is known.
    PeerKnown,
    /// The grace period ran out with no peer: claimed alone.
    GraceOver,
    /// Multicast instance: no gate.
    #[default]
    NotGated,
}

/// What `/stats` and `status` show for one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendSnapshot {
    /// Backend address.
    pub addr: SocketAddr,
    /// `up` or `down`.
    pub state: String,
    /// When the last check finished (Unix milliseconds), if ever.
    pub last_check_unix_ms: Option<u64>,
    /// Why the last check failed.
    pub last_error: Option<String>,
    /// Open connections.
    pub active: u64,
    /// Connections since start.
    pub total: u64,
    /// Failed connect attempts.
    pub connect_failures: u64,
    /// Bytes client → backend.
    pub bytes_in: u64,
    /// Bytes backend → client.
    pub bytes_out: u64,
    /// Times another backend was tried alongside because this one was silent.
    pub staggers: u64,
    /// Client connections closed when it was marked down.
    pub sessions_shut_down: u64,
    /// Active checks passed.
    pub checks_passed: u64,
    /// Active checks failed.
    pub checks_failed: u64,
    /// Times it went up or down.
    pub transitions: u64,
    /// How long the last active check took, seconds.
    pub last_check_seconds: Option<f64>,
    /// Durations of active checks.
    pub check_latency: HistogramSnapshot,
    /// Its share of new connections, percent (below 100 while in slowstart; 0 when down).
    pub weight_percent: u8,
}

/// One BGP session as status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    /// The peer's address.
    pub peer: IpAddr,
    /// The peer's ASN.
    pub asn: u32,
    /// The daemon's state for it (`Established`, `Active`...), `None` when unknown.
    pub state: Option<String>,
    /// Whether it is established.
    pub established: bool,
}

/// One VIP as status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VipStatus {
    /// The `vrrp.instances[]` name.
    pub name: String,
    /// The VIP.
    pub vip: IpAddr,
    /// Whether the host route is in the keelson table (the checks pass).
    pub route_installed: bool,
    /// Whether this node announces it: route installed and a session of its family up
    /// (for a daemon the agent cannot ask, the route alone).
    pub announced: bool,
    /// Why not, when not announced (empty when it is).
    pub why_not: Vec<String>,
    /// Extra copies of the local ASN on the announcement (role order).
    pub prepend: u8,
    /// The checks and whether they pass.
    pub checks: Vec<CheckStateStatus>,
}

/// A check's state (the serialisable mirror of `health::CheckState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckStateStatus {
    /// Check name.
    pub name: String,
    /// Whether it passes.
    pub passing: bool,
}

/// The `bgp` status snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BgpStatus {
    /// The kernel table of the VIP routes.
    pub table: u32,
    /// `bird` or `frr`.
    pub daemon: String,
    /// Whether the agent runs the daemon (`agent`) or someone else does (`external`).
    pub daemon_run: String,
    /// Why the daemon could not be asked about its sessions, if it could not.
    pub daemon_error: Option<String>,
    /// BGP router ID.
    pub router_id: String,
    /// The sessions this node opens.
    pub sessions: Vec<SessionStatus>,
    /// The VIPs this node's role takes part in.
    pub vips: Vec<VipStatus>,
}
