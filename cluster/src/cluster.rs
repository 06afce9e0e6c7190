//! `cluster.json`: the agent's cluster-wide configuration (docs/cluster-json.md).
//!
//! Written by `keelson build`, carried inside every full Ignition config as
//! `/etc/keelson/cluster.json`, and read by every agent. Versioned (`"version": 1`);
//! unknown fields are rejected so a typo never silently falls back to a default.
//! Documented field by field in `docs/cluster-json.md`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::bgp::BgpSettings;

mod check;

/// The only `cluster.json` version this code reads and writes.
pub const CLUSTER_JSON_VERSION: u32 = 1;

/// A node's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The temporary node that serves the first Ignition configs and holds the API VIP
    /// until the masters are up.
    Bootstrap,
    /// A control-plane node: runs kube-apiserver (:6443), the API proxy, and serves configs.
    Master,
    /// A compute node: runs the ingress router.
    Worker,
}

impl Role {
    /// All roles, in a fixed order.
    pub const ALL: [Role; 3] = [Role::Bootstrap, Role::Master, Role::Worker];

    /// The lowercase name used in files, URLs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Bootstrap => "bootstrap",
            Role::Master => "master",
            Role::Worker => "worker",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = ClusterConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bootstrap" => Ok(Role::Bootstrap),
            "master" => Ok(Role::Master),
            "worker" => Ok(Role::Worker),
            other => Err(ClusterConfigError::Invalid {
                field: "role".into(),
                expected: "one of bootstrap, master, worker".into(),
                got: other.into(),
            }),
        }
    }
}

/// Errors reading or checking a `cluster.json`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterConfigError {
    /// The document is not valid JSON for this schema (the message names the field).
    #[error("cluster.json: {0}")]
    Parse(#[from] serde_json::Error),
    /// A field has a value outside what is allowed.
    #[error("cluster.json: {field}: expected {expected}, got {got}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What was expected.
        expected: String,
        /// What was found.
        got: String,
    },
}

/// The whole of `cluster.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Format version; always [`CLUSTER_JSON_VERSION`].
    pub version: u32,
    /// Cluster name (`metadata.name` of the install-config), e.g. `ocp4`.
    pub name: String,
    /// Base domain, e.g. `osd2019.local`; the cluster zone is `<name>.<baseDomain>`.
    pub base_domain: String,
    /// The machine networks (`networking.machineNetwork[].cidr`).
    pub machine_networks: Vec<IpNet>,
    /// API virtual IPs (one per address family at most).
    pub api_vips: Vec<IpAddr>,
    /// Ingress virtual IPs (one per address family at most).
    pub ingress_vips: Vec<IpAddr>,
    /// One VRRP instance per VIP.
    pub vrrp: VrrpSettings,
    /// The API load balancer.
    pub api: ApiSettings,
    /// The cluster DNS server.
    pub dns: DnsSettings,
    /// The Ignition config server (:22623 / :22624).
    pub ignition: IgnitionServerSettings,
    /// Member discovery.
    pub members: MembersSettings,
    /// The Prometheus metrics endpoint.
    #[serde(default)]
    pub metrics: MetricsSettings,
    /// SSH public keys for user `core` (the install-config's `sshKey`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_authorized_keys: Vec<String>,
    /// Extra processes the appliance supervisor runs (operator-defined).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSpec>,
    /// VIPs announced by BGP instead of VRRP (`docs/bgp.md`); absent: every VIP uses VRRP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpSettings>,
    /// Which of the node's addresses is its own, and which link it follows
    /// (docs/cluster-json.md, "`nodeAddress`"); absent: the address inside the machine
    /// networks.
    #[serde(default, skip_serializing_if = "NodeAddressSettings::is_default")]
    pub node_address: NodeAddressSettings,
    /// Who owns the VIPs (install-config `platform.*.loadBalancer.type`); absent: keelson.
    #[serde(default, skip_serializing_if = "LoadBalancerSettings::is_default")]
    pub load_balancer: LoadBalancerSettings,
}

/// How a node finds its own address (OpenShift's `NODEIP_HINT` and more): by default the
/// address inside the machine networks; a hint narrows it to one subnet, an interface to
/// one link. The agent follows that address when it moves to another link (docs/agent.md,
/// "The node's address").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAddressSettings {
    /// An address (the node's address is the one whose subnet holds it, as OpenShift's
    /// `NODEIP_HINT`: the gateway's address does) or a CIDR (the node's address is inside
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<AddressHint>,
    /// Only addresses on this link count (`br-ex`, `bond0`, `bond0.100`); the agent then
    /// follows no move to another link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

impl NodeAddressSettings {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `nodeAddress.hint`: an address or a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressHint {
    /// The node's address is the one whose on-link subnet contains this address.
    Address(IpAddr),
    /// The node's address is inside this network.
    Network(IpNet),
}

impl AddressHint {
    /// Whether `addr` (an address with its on-link prefix) is what the hint asks for.
    pub fn matches(&self, addr: &IpNet) -> bool {
        match self {
            AddressHint::Address(a) => addr.trunc().contains(a),
            AddressHint::Network(n) => n.contains(&addr.addr()),
        }
    }

    /// Whether the hint lies inside (or overlaps) one of `networks`.
    pub fn within(&self, networks: &[IpNet]) -> bool {
        match self {
            AddressHint::Address(a) => networks.iter().any(|n| n.contains(a)),
            AddressHint::Network(h) => networks
                .iter()
                .any(|n| n.contains(&h.network()) || h.contains(&n.network())),
        }
    }
}

impl std::fmt::Display for AddressHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddressHint::Address(a) => a.fmt(f),
            AddressHint::Network(n) => n.fmt(f),
        }
    }
}

impl std::str::FromStr for AddressHint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(a) = s.parse::<IpAddr>() {
            return Ok(AddressHint::Address(a));
        }
        s.parse::<IpNet>()
            .map(|n| AddressHint::Network(n.trunc()))
            .map_err(|_| format!("an IP address or a CIDR, got {s:?}"))
    }
}

impl Serialize for AddressHint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AddressHint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Who owns the VIPs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerSettings {
    /// `keelson` (VRRP and the API proxy for the VIPs) or `userManaged` (an external load
    /// balancer holds them; keelson keeps DNS, members and the Ignition server).
    #[serde(rename = "type")]
    pub kind: LoadBalancerType,
}

impl LoadBalancerSettings {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether an external load balancer owns the VIPs.
    pub fn user_managed(&self) -> bool {
        self.kind == LoadBalancerType::UserManaged
    }
}

/// `loadBalancer.type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LoadBalancerType {
    /// keelson holds the VIPs (VRRP or BGP) and balances the API (OpenShift's
    /// `OpenShiftManagedDefault`).
    #[default]
    Keelson,
    /// The operator's load balancer holds the VIPs (OpenShift's `UserManaged`).
    UserManaged,
}

/// VRRP settings for all instances.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "VrrpSettingsDoc")]
pub struct VrrpSettings {
    /// The instances, typically `api` (and `api-v6`) and `ingress`.
    pub instances: Vec<VrrpInstanceConfig>,
}

/// `vrrp` as a document may give it: the instances, and fields that set one value on every
/// instance at once. A merge patch replaces arrays whole (RFC 7396), so without these an
/// operator changing one field on every instance had to copy the generated list; with them
/// `{"vrrp": {"handbackSecs": 30}}` does it. They are folded into the instances when read
/// and never written: the document a build writes names each instance's value.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VrrpSettingsDoc {
    instances: Vec<VrrpInstanceConfig>,
    /// Every instance's [`VrrpInstanceConfig::transport`].
    #[serde(default)]
    transport: Option<VrrpTransport>,
    /// Every instance's [`VrrpInstanceConfig::handback_secs`].
    #[serde(default)]
    handback_secs: Option<u32>,
}

impl From<VrrpSettingsDoc> for VrrpSettings {
    fn from(doc: VrrpSettingsDoc) -> Self {
        let mut instances = doc.instances;
        for inst in &mut instances {
            if let Some(t) = doc.transport {
                inst.transport = t;
            }
            if let Some(secs) = doc.handback_secs {
                inst.handback_secs = secs;
            }
        }
        Self { instances }
    }
}

/// VRRP protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VrrpVersion {
    /// RFC 3768 (IPv4 only, second intervals, optional simple-password auth).
    #[serde(rename = "2")]
    V2,
    /// RFC 5798 (IPv4 and IPv6, centisecond intervals).
    #[serde(rename = "3")]
    V3,
}

/// How adverts reach the other routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VrrpTransport {
    /// 224.0.0.18 / ff02::12.
    Multicast,
    /// To each peer's address (static `unicastPeers`, live members of the cluster, and
    /// routers heard from).
    Unicast,
}

/// Base priority of each role in one instance; a role without a priority does not
/// take part in that instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolePriorities {
    /// Bootstrap node's base priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<u8>,
    /// Masters' base priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<u8>,
    /// Workers' base priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u8>,
}

impl RolePriorities {
    /// Base priority for `role`, or `None` when the role does not take part.
    pub fn for_role(&self, role: Role) -> Option<u8> {
        match role {
            Role::Bootstrap => self.bootstrap,
            Role::Master => self.master,
            Role::Worker => self.worker,
        }
    }
}

/// One VRRP virtual router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VrrpInstanceConfig {
    /// Instance name: `api`, `ingress` (and `api-v6`, `ingress-v6` for a second family).
    pub name: String,
    /// The virtual IP.
    pub vip: IpAddr,
    /// Virtual router ID, 1..=255.
    #[serde(deserialize_with = "vrid")]
    pub vrid: u8,
    /// Protocol version.
    pub version: VrrpVersion,
    /// Advertisement interval in milliseconds (10 ms steps for v3, whole seconds for v2).
    pub advert_interval_ms: u32,
    /// Multicast or unicast adverts.
    pub transport: VrrpTransport,
    /// Static unicast peers (members add the others at run time). Also registries the
    /// unicast members transport registers with (docs/members.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unicast_peers: Vec<IpAddr>,
    /// Unicast transport: milliseconds a node waits, hearing no peer, before it claims the
    /// VIP alone (docs/members.md). Default: 4 advert intervals plus one members renewal
    /// interval ([`VrrpInstanceConfig::claim_grace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_grace_ms: Option<u32>,
    /// VRRPv2 simple password (`auth_type PASS`, at most 8 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_pass: Option<String>,
    /// Whether a higher-priority backup preempts a lower-priority master.
    pub preempt: bool,
    /// Seconds between repeated gratuitous ARP / unsolicited NA while master (0 = never).
    pub garp_refresh_secs: u32,
    /// Seconds a clean hand-over carries the old holder's open TCP connections for
    /// (docs/vrrp.md, "Connections across a clean hand-over"): the new holder forwards
    /// segments of connections it did not open to the old one, which keeps the VIP
    /// unannounced and goes on serving them. 0 (the default) = off: the new holder resets
    /// them. Needs a segment that lets a node send frames with a client's source address
    /// (bare metal, a bridge; not a Neutron port with port security).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub handback_secs: u32,
    /// Base priority per role.
    pub priorities: RolePriorities,
    /// Health checks whose weights add to the base priority while they pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<HealthCheckConfig>,
    /// Checks that decide whether the node takes part at all: while one fails, the node
    /// sends no adverts and never holds the VIP (a holder hands it over first), like a
    /// keepalived `track_script` without weight. Their `weight` is not used. The ingress
    /// instance's router check (docs/vrrp.md, "Ingress follows the routers").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_checks: Vec<HealthCheckConfig>,
    /// The instance whose election this one's VIP follows: no virtual router of its own;
    /// the VIP is held, announced and given up with that instance's (keepalived's
    /// `virtual_ipaddress_excluded`). A role's second-family VIP follows its first, so the
    /// IPv4 and IPv6 VIPs of the role are always on one node (docs/decisions.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<String>,
}

impl VrrpInstanceConfig {
    /// The unicast claim grace period: `claimGraceMs`, or by default four advert intervals
    /// (Master_Down at its longest skew) plus one members renewal interval, so that a node
    /// whose first registration fails still hears the holder before it would claim.
    pub fn claim_grace(&self, members: &MembersSettings) -> std::time::Duration {
        match self.claim_grace_ms {
            Some(ms) => std::time::Duration::from_millis(u64::from(ms)),
            None => {
                std::time::Duration::from_millis(4 * u64::from(self.advert_interval_ms))
                    + std::time::Duration::from_secs(u64::from(members.renew_interval_secs.max(1)))
            }
        }
    }
}

/// A health check that moves a VRRP priority (like keepalived's `track_script`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// Name for logs and status.
    pub name: String,
    /// What is checked.
    pub check: HealthCheckKind,
    /// Milliseconds between checks.
    pub interval_ms: u32,
    /// Consecutive successes that make a failing check pass.
    pub rise: u32,
    /// Consecutive failures that make a passing check fail.
    pub fall: u32,
    /// Added to the priority while the check passes (may be negative).
    pub weight: i32,
    /// Milliseconds one probe may take before it counts as a failure; an answer within it
    /// counts as healthy however slow (docs/vrrp.md, "Slow is not dead"). Absent: the
    /// interval, clamped to 1–5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
}

impl HealthCheckConfig {
    /// How long one probe may take: `timeoutMs`, or the interval clamped to 1–5 s (a TLS
    /// handshake on a loaded machine needs about a second; a check that waits longer than
    /// 5 s by default would hide a dead target).
    pub fn timeout(&self) -> std::time::Duration {
        use std::time::Duration;
        match self.timeout_ms {
            Some(ms) => Duration::from_millis(u64::from(ms)),
            None => Duration::from_millis(u64::from(self.interval_ms.max(1)))
                .clamp(Duration::from_secs(1), Duration::from_secs(5)),
        }
    }
}

/// The kinds of health check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum HealthCheckKind {
    /// A TCP connect to `address` succeeds.
    Tcp {
        /// Where to connect.
        address: SocketAddr,
    },
    /// An HTTP(S) GET answers with `expectStatus` (no certificate verification).
    Http {
        /// Full URL with an IP literal host (no name lookups in the static agent).
        url: String,
        /// The status code that counts as healthy.
        expect_status: u16,
    },
    /// The local API proxy has at least one healthy backend.
    ProxyHealthyBackend,
    /// The local Ignition server is running.
    IgnitionServer,
    /// This node's kube-apiserver answers `GET /readyz` with 200 over TLS (not verified), at
    /// the node's own address of the VIP's family and `api.backendPort`: the proxy's backend
    /// check, aimed at this node alone. Give it a generous `timeoutMs`: a slow answer is
    /// an apiserver under load, not a dead one (docs/vrrp.md).
    LocalApiserver,
}

/// The API load balancer (docs/proxy.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiSettings {
    /// Frontend port on every address of the node (9445; 7443 in OpenShift 4.2).
    pub frontend_port: u16,
    /// Extra frontend on the API VIP while this node holds it (6443).
    pub vip_port: u16,
    /// Port of kube-apiserver on every master (6443).
    pub backend_port: u16,
    /// The `/healthz` monitor port (50936, as haproxy's `monitor-uri`).
    pub monitor_port: u16,
    /// Static backends, used in addition to the masters from members.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_backends: Vec<SocketAddr>,
    /// Backend health check.
    pub check: BackendCheck,
    /// Milliseconds between backend checks.
    pub check_interval_ms: u32,
    /// Consecutive failures that mark a backend down.
    pub fall: u32,
    /// Consecutive successes that mark a backend up.
    pub rise: u32,
    /// Milliseconds between checks of a backend whose state is in doubt (failing but still
    /// up, or passing but still down): haproxy's `fastinter`.
    #[serde(default = "default_fast_check_interval_ms")]
    pub fast_check_interval_ms: u32,
    /// Milliseconds over which a backend that came back up grows to its full share of new
    /// connections (haproxy's `slowstart`); 0: at once.
    #[serde(default = "default_slowstart_ms")]
    pub slowstart_ms: u32,
    /// Close client connections to a backend when it is marked down (haproxy's
    /// `on-marked-down shutdown-sessions`).
    #[serde(default = "default_true")]
    pub shutdown_sessions: bool,
    /// Backend connect timeout, milliseconds.
    pub connect_timeout_ms: u32,
    /// Idle timeout of a proxied connection, seconds.
    pub idle_timeout_secs: u32,
    /// Maximum concurrent client connections.
    pub max_connections: u32,
}

fn default_fast_check_interval_ms() -> u32 {
    1000
}

fn default_slowstart_ms() -> u32 {
    10_000
}

fn default_true() -> bool {
    true
}

/// The Prometheus metrics endpoint (`docs/metrics.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsSettings {
    /// TCP port of `/metrics` on every node (22625); 0 turns it off. Reachable from
    /// `ignition.allowedNetworks` (the machine networks by default) and loopback only.
    pub port: u16,
}

/// The default metrics port: next to the Ignition server's 22623/22624, clear of every
/// port OpenShift's nodes use (9000-9999 and 10250-10259 host services, 2379-2380 etcd,
/// 6443, 22623-22624, 30000-32767 node ports, 50936 and 9444/9445 of the on-prem haproxy).
pub const METRICS_PORT: u16 = 22625;

impl Default for MetricsSettings {
    fn default() -> Self {
        Self { port: METRICS_PORT }
    }
}

/// How the proxy checks a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendCheck {
    /// No check: every backend is up.
    None,
    /// TCP connect.
    Tcp,
    /// TLS `GET /readyz` expecting 200, no certificate verification.
    TlsReadyz,
}

/// The cluster DNS server (docs/dns.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DnsSettings {
    /// Port to answer on (53).
    pub port: u16,
    /// TTL of the records the server is authoritative for.
    pub ttl: u32,
    /// Upstream resolvers, tried in order, before those learned from metadata or DHCP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<SocketAddr>,
    /// Point the node's `/etc/resolv.conf` at the local server (appliance).
    pub manage_resolv_conf: bool,
    /// The etcd discovery names of the OpenShift 4.1-4.3 era (`etcd-<i>.<zone>`,
    /// `_etcd-server-ssl._tcp.<zone>`; docs/dns.md). Absent: on when `ignition.spec` is 2.x,
    /// for 3 masters ([`ClusterConfig::etcd_records`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdRecords>,
}

/// The etcd names the cluster DNS serves (docs/dns.md): `etcd-<i>.<zone>` for the master
/// whose name ends in `-<i>`, and the SRV sets etcd's `--discovery-srv` reads once every
/// master is a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdRecords {
    /// Serve the names at all.
    pub enabled: bool,
    /// The control plane's size (`controlPlane.replicas`): the SRV sets are answered only
    /// once this many masters are members, so no etcd forms a partial cluster.
    pub masters: u32,
}

impl EtcdRecords {
    /// The control plane size OpenShift 4.2 supported (and the default when a cluster.json
    /// written before this field names none).
    pub const DEFAULT_MASTERS: u32 = 3;

    /// The default for a build of Ignition spec `spec` with `masters` masters: on for spec
    /// 2.x payloads (RHCOS 4.2-4.5, whose etcd finds its peers by SRV), off for 3.x.
    pub fn for_spec(spec: &str, masters: u32) -> Self {
        Self {
            enabled: spec.starts_with("2."),
            masters,
        }
    }
}

/// The Ignition config server (docs/ignition-server.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IgnitionServerSettings {
    /// TLS port (22623).
    pub tls_port: u16,
    /// Plain-HTTP port (22624).
    pub plain_port: u16,
    /// Clients allowed to fetch configs; loopback is always allowed. Defaults to the
    /// machine networks: a served config holds the cluster's secrets.
    pub allowed_networks: Vec<IpNet>,
    /// Ignition spec version of the pointer configs and of configs served to clients that
    /// do not ask for one (e.g. `3.2.0`).
    pub spec: String,
}

/// How members find each other (docs/members.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MembersTransport {
    /// mDNS (RFC 6762/6763) on the node's segment.
    Mdns,
    /// Register over TLS with every control-plane node's Ignition server that is known
    /// (learned, remembered, configured, or reached through the API VIP).
    Unicast,
}

/// Member discovery settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MembersSettings {
    /// Transport.
    pub transport: MembersTransport,
    /// Seconds between announcements / registrations.
    pub renew_interval_secs: u32,
    /// Seconds after which a member that stopped renewing is dropped.
    pub expiry_secs: u32,
    /// The ID of the membership key that signs member records (`tls/membership.key`,
    /// written by `keelson build`). Absent: records are not authenticated (clusters built
    /// before the key existed; the agent warns loudly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// How far, in seconds, a signed member record's time may be from the receiver's clock
    /// (default 120). Wider tolerates worse clocks; narrower shortens the time in which a
    /// captured record can be replayed to a node that has not heard it yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_clock_skew_secs: Option<u32>,
    /// Seconds after which a master that is no longer heard is forgotten: it leaves the
    /// unicast peer set (the addresses this node registers with) and `members.json`
    /// (default 86400, one day). Counted from its last sighting, or from the agent's start
    /// when that is later (a cluster shut down for a weekend still finds its masters).
    /// The live lists (DNS, proxy backends, VRRP peers) drop it much earlier, at
    /// `expirySecs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forget_after_secs: Option<u32>,
}

impl MembersSettings {
    /// The default of [`MembersSettings::forget_after_secs`]: one day.
    pub const DEFAULT_FORGET_AFTER_SECS: u32 = 86_400;

    /// [`MembersSettings::forget_after_secs`] or its default.
    pub fn forget_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.forget_after_secs
                .unwrap_or(Self::DEFAULT_FORGET_AFTER_SECS),
        ))
    }

    /// The default of [`MembersSettings::max_clock_skew_secs`].
    pub const DEFAULT_MAX_CLOCK_SKEW_SECS: u32 = 120;

    /// [`MembersSettings::max_clock_skew_secs`] or its default.
    pub fn max_clock_skew(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.max_clock_skew_secs
                .unwrap_or(Self::DEFAULT_MAX_CLOCK_SKEW_SECS),
        ))
    }
}

/// When the supervisor restarts an operator service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Always restart, with backoff.
    #[default]
    Always,
    /// Restart only after a non-zero exit or a signal.
    OnFailure,
    /// Never restart.
    Never,
}

/// An operator-defined process the appliance supervisor runs (`services` in cluster.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    /// Name for logs and status.
    pub name: String,
    /// Absolute path of the executable.
    pub path: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Restart policy.
    #[serde(default)]
    pub restart: RestartPolicy,
    /// Roles it runs on; empty means every role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<Role>,
    /// The executable is an asset of the build (`keelson build --asset`): masters and
    /// workers it runs on get it at `path` from the Ignition server's `/assets/<name>`,
    /// sha512-verified, as they get the agent. The bootstrap must already have it (the
    /// appliance image, or the operator's own means on RHCOS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset: Option<ServiceAsset>,
}

impl ServiceSpec {
    /// Whether the service runs on a node of `role`.
    pub fn runs_on(&self, role: Role) -> bool {
        self.roles.is_empty() || self.roles.contains(&role)
    }
}

/// A service's executable served by the Ignition servers under `/assets/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAsset {
    /// File name under `/assets/` (and under `out/assets/` of the build).
    pub name: String,
    /// Lowercase hex sha512 of the file (written by `keelson build`).
    pub sha512: String,
}

/// Whether `name` may name an asset: a plain file name, no path, not hidden.
pub fn is_asset_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl ClusterConfig {
    /// Parses and checks a `cluster.json` document.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ClusterConfigError> {
        let config: ClusterConfig = serde_json::from_slice(bytes)?;
        config.check()?;
        Ok(config)
    }

    /// Serialises as pretty JSON with a trailing newline (stable: same config, same bytes).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("cluster config serialises");
        out.push(b'\n');
        out
    }

    /// Applies a JSON merge patch (RFC 7396) and checks the result like a parsed document,
    /// so a misspelt field in the patch is an error naming it.
    pub fn with_merge_patch(&self, patch: &serde_json::Value) -> Result<Self, ClusterConfigError> {
        if !patch.is_object() {
            return Err(ClusterConfigError::Invalid {
                field: "patch".into(),
                expected: "a JSON object (RFC 7396 merge patch)".into(),
                got: match patch {
                    serde_json::Value::Array(_) => "an array".into(),
                    other => other.to_string(),
                },
            });
        }
        let mut doc = serde_json::to_value(self)?;
        json_patch::merge(&mut doc, patch);
        let patched: ClusterConfig = serde_json::from_value(doc)?;
        patched.check()?;
        Ok(patched)
    }

    /// The etcd names to serve: `dns.etcd`, or when absent the default for `ignition.spec`
    /// with [`EtcdRecords::DEFAULT_MASTERS`].
    pub fn etcd_records(&self) -> EtcdRecords {
        self.dns.etcd.unwrap_or_else(|| {
            EtcdRecords::for_spec(&self.ignition.spec, EtcdRecords::DEFAULT_MASTERS)
        })
    }

    /// The cluster's DNS zone, `<name>.<baseDomain>`.
    pub fn zone(&self) -> String {
        format!("{}.{}", self.name, self.base_domain)
    }

    /// Whether the VIP of `vrrp.instances[]` entry `name` is announced by BGP (not VRRP).
    pub fn bgp_mode(&self, name: &str) -> bool {
        self.bgp.as_ref().is_some_and(|b| b.announces(name))
    }

    /// The instance named `name`, if any.
    pub fn instance(&self, name: &str) -> Option<&VrrpInstanceConfig> {
        self.vrrp.instances.iter().find(|i| i.name == name)
    }
}

/// Fletcher-8 checksum over `s`, as OpenShift's baremetal-runtimecfg derives VRIDs
/// (`<cluster>-api`, `<cluster>-ingress`): two running sums mod 15 packed in a byte.
/// The sums are 8-bit with wrap-around before the modulo, exactly as that Go code.
pub fn fletcher8(s: &str) -> u8 {
    let (mut sum1, mut sum2) = (0u8, 0u8);
    for b in s.bytes() {
        sum1 = sum1.wrapping_add(b) % 15;
        sum2 = sum2.wrapping_add(sum1) % 15;
    }
    (sum2 << 4) | sum1
}

/// Default VRIDs for the API and ingress instances of cluster `name`: Fletcher-8 + 1 each,
/// the ingress one bumped when they are equal (as OpenShift does).
pub fn default_vrids(name: &str) -> (u8, u8) {
    let api = fletcher8(&format!("{name}-api")).wrapping_add(1).max(1);
    let mut ingress = fletcher8(&format!("{name}-ingress")).wrapping_add(1).max(1);
    if ingress == api {
        ingress = ingress.wrapping_add(1).max(1);
    }
    (api, ingress)
}

/// A VRID, 1..=255, with an error that says so (a plain `u8` would say "expected u8").
fn vrid<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let n = i64::deserialize(d)?;
    u8::try_from(n)
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| serde::de::Error::custom(format!("vrid: expected 1..=255, got {n}")))
}

/// Whether `name` can name a Linux network interface (`dev_valid_name`: 1-15 bytes, not `.`
/// or `..`, no `/`, `:` or white space).
pub fn is_interface_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace())
}

/// Whether `n` is 0 (a field left out of the JSON when it is).
fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests;
