//! What this node announces and to whom, resolved from `cluster.json` and the node's
//! identity (pure): the VIPs its role takes part in, with their checks and AS-path prepends,
//! and the peers on its own networks.

use std::net::{IpAddr, Ipv4Addr};

use keelson_cluster::bgp::{BfdSettings, BgpSettings, Community, DaemonKind, DaemonRun};
use keelson_cluster::cluster::{HealthCheckConfig, HealthCheckKind, RolePriorities};
use keelson_cluster::{ClusterConfig, Role};

use crate::node::NodeIdentity;

/// One VIP this node may announce.
#[derive(Debug, Clone, PartialEq)]
pub struct VipPlan {
    /// The `vrrp.instances[]` name (`api`, `api-v6`...).
    pub name: String,
    /// The address.
    pub vip: IpAddr,
    /// Extra copies of the local ASN on this node's announcements: one per higher
    /// priority among the roles that take part, so a lower role's path is longer and the
    /// fabric prefers the higher role while it announces (the bootstrap before the pivot).
    pub prepend: u8,
    /// Checks that must all pass, with the node's values filled into their URLs.
    pub checks: Vec<HealthCheckConfig>,
}

/// One BGP session this node opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPlan {
    /// The daemon's name for the session (`peer_10_1_0_1`), also used in status.
    pub name: String,
    /// The peer's address.
    pub address: IpAddr,
    /// The peer's AS number.
    pub asn: u32,
    /// This node's address of the same family (the session's source).
    pub local: IpAddr,
    /// TCP MD5 password.
    pub password: Option<String>,
    /// Hops for a multihop session; `None` for a directly connected peer.
    pub multihop: Option<u8>,
}

/// Everything the node needs to announce its VIPs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePlan {
    /// The BGP router ID: the node's IPv4 address, else derived from its name.
    pub router_id: Ipv4Addr,
    /// The cluster's ASN.
    pub local_asn: u32,
    /// The VIPs this node's role takes part in.
    pub vips: Vec<VipPlan>,
    /// The sessions.
    pub peers: Vec<PeerPlan>,
    /// The kernel table of the VIP routes.
    pub table: u32,
    /// BFD.
    pub bfd: BfdSettings,
    /// Communities on every announcement.
    pub communities: Vec<Community>,
    /// BGP hold time, seconds.
    pub hold_time_secs: u16,
    /// The daemon.
    pub daemon: DaemonKind,
    /// Who runs it.
    pub run: DaemonRun,
}

/// The AS-path prepend count of `role` among `priorities` (see [`VipPlan::prepend`]), or
/// `None` when the role does not take part.
pub fn prepend_for(priorities: &RolePriorities, role: Role) -> Option<u8> {
    let mine = priorities.for_role(role)?;
    let mut higher: Vec<u8> = Role::ALL
        .iter()
        .filter_map(|r| priorities.for_role(*r))
        .filter(|p| *p > mine)
        .collect();
    higher.sort_unstable();
    higher.dedup();
    Some(higher.len() as u8)
}

/// The values a check URL may name (`${KEELSON_NODE_ADDRESS}`...), as for operator services.
fn expand_check(check: &HealthCheckConfig, node: &NodeIdentity) -> HealthCheckConfig {
    let mut out = check.clone();
    if let HealthCheckKind::Http { url, .. } = &mut out.check {
        let vars = crate::node::node_vars(node);
        // An IPv6 address in a URL needs brackets.
        let vars: Vec<(&'static str, String)> = vars
            .into_iter()
            .map(|(k, v)| {
                if k == "KEELSON_NODE_ADDRESS6" && !v.is_empty() {
                    (k, format!("[{v}]"))
                } else {
                    (k, v)
                }
            })
            .collect();
        *url = crate::node::expand(url, &vars);
    }
    out
}

/// A router ID for a node without IPv4: FNV-1a of its name (never 0).
fn router_id_from_name(name: &str) -> Ipv4Addr {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    Ipv4Addr::from(h.max(1))
}

/// The daemon's name for a session with `address`: letters, digits and `_` only.
pub fn peer_name(address: IpAddr) -> String {
    let text: String = address
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("peer_{text}")
}

/// Resolves `bgp` for `node`: `None` when the cluster has no `bgp` section.
pub fn plan(cluster: &ClusterConfig, node: &NodeIdentity) -> Option<NodePlan> {
    let bgp: &BgpSettings = cluster.bgp.as_ref()?;
    let mut vips = Vec::new();
    for name in &bgp.vips {
        let Some(inst) = cluster.instance(name) else {
            continue;
        };
        let Some(prepend) = prepend_for(&inst.priorities, node.role) else {
            continue;
        };
        vips.push(VipPlan {
            name: inst.name.clone(),
            vip: inst.vip,
            prepend,
            // Announced while every check passes: the required ones (a router that answers
            // for the ingress VIP) are checks like the others here.
            checks: inst
                .checks
                .iter()
                .chain(&inst.required_checks)
                .map(|c| expand_check(c, node))
                .collect(),
        });
    }
    let mut peers = Vec::new();
    for p in &bgp.peers {
        let own = node
            .addresses
            .iter()
            .filter(|a| a.addr().is_ipv4() == p.address.is_ipv4());
        let local = if p.multihop.is_some() {
            own.map(|a| a.addr()).next()
        } else {
            own.filter(|a| a.contains(&p.address) && a.addr() != p.address)
                .map(|a| a.addr())
                .next()
        };
        if let Some(local) = local {
            peers.push(PeerPlan {
                name: peer_name(p.address),
                address: p.address,
                asn: p.asn,
                local,
                password: p.password.clone(),
                multihop: p.multihop,
            });
        }
    }
    let router_id = node
        .addresses
        .iter()
        .find_map(|a| match a.addr() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .unwrap_or_else(|| router_id_from_name(&node.name));
    Some(NodePlan {
        router_id,
        local_asn: bgp.local_asn,
        vips,
        peers,
        table: bgp.table,
        bfd: bgp.bfd,
        communities: bgp.parsed_communities(),
        hold_time_secs: bgp.hold_time_secs,
        daemon: bgp.daemon.kind,
        run: bgp.daemon.run,
    })
}

impl NodePlan {
    /// The sessions that carry VIPs of `vip`'s family.
    pub fn peers_for(&self, vip: IpAddr) -> impl Iterator<Item = &PeerPlan> {
        self.peers
            .iter()
            .filter(move |p| p.address.is_ipv4() == vip.is_ipv4())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterConfig {
        let mut c: ClusterConfig =
            ClusterConfig::from_json(include_bytes!("testdata/cluster.json")).unwrap();
        c.check().unwrap();
        c.bgp.as_mut().unwrap().vips = vec!["api".into(), "api-v6".into()];
        c
    }

    fn node(role: Role, addrs: &[&str]) -> NodeIdentity {
        NodeIdentity {
            name: "master-0".parse().unwrap(),
            role,
            interface: "eth0".into(),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn the_bootstrap_path_is_shorter_than_the_masters() {
        let p = RolePriorities {
            bootstrap: Some(70),
            master: Some(40),
            worker: None,
        };
        assert_eq!(prepend_for(&p, Role::Bootstrap), Some(0));
        assert_eq!(prepend_for(&p, Role::Master), Some(1));
        assert_eq!(prepend_for(&p, Role::Worker), None);
        let ingress = RolePriorities {
            bootstrap: None,
            master: Some(20),
            worker: Some(20),
        };
        assert_eq!(prepend_for(&ingress, Role::Master), Some(0));
        assert_eq!(prepend_for(&ingress, Role::Worker), Some(0));
    }

    #[test]
    fn a_node_peers_with_the_routers_on_its_own_networks() {
        let c = cluster();
        let rack_a = plan(&c, &node(Role::Master, &["10.1.0.11/24", "fd01::11/64"])).unwrap();
        let names: Vec<_> = rack_a.peers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["peer_10_1_0_1", "peer_fd01__1", "peer_192_0_2_9"]);
        assert_eq!(
            rack_a.peers[0].local,
            "10.1.0.11".parse::<IpAddr>().unwrap()
        );
        assert_eq!(rack_a.peers[2].multihop, Some(4));
        assert_eq!(rack_a.router_id, Ipv4Addr::new(10, 1, 0, 11));
        let rack_b = plan(&c, &node(Role::Master, &["10.2.0.21/24"])).unwrap();
        let names: Vec<_> = rack_b.peers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["peer_10_2_0_1", "peer_192_0_2_9"]);
        assert_eq!(
            rack_b.peers_for("fd00::5".parse().unwrap()).count(),
            0,
            "no IPv6 session without an IPv6 address"
        );
    }

    #[test]
    fn roles_outside_the_instance_announce_nothing() {
        let c = cluster();
        let w = plan(&c, &node(Role::Worker, &["10.1.0.31/24"])).unwrap();
        assert!(w.vips.is_empty());
        let m = plan(&c, &node(Role::Master, &["10.1.0.11/24"])).unwrap();
        assert_eq!(
            m.vips
                .iter()
                .map(|v| (v.name.as_str(), v.prepend))
                .collect::<Vec<_>>(),
            [("api", 1), ("api-v6", 1)]
        );
        let b = plan(&c, &node(Role::Bootstrap, &["10.1.0.9/24"])).unwrap();
        assert_eq!(b.vips[0].prepend, 0);
    }

    #[test]
    fn check_urls_name_the_node() {
        let c = cluster();
        let m = plan(&c, &node(Role::Master, &["10.1.0.11/24", "fd01::11/64"])).unwrap();
        let urls: Vec<String> = m.vips[0]
            .checks
            .iter()
            .filter_map(|c| match &c.check {
                HealthCheckKind::Http { url, .. } => Some(url.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(urls, ["https://10.1.0.11:6443/readyz"]);
        let urls: Vec<String> = m.vips[1]
            .checks
            .iter()
            .filter_map(|c| match &c.check {
                HealthCheckKind::Http { url, .. } => Some(url.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(urls, ["https://[fd01::11]:6443/readyz"]);
    }

    #[test]
    fn an_ipv6_only_node_gets_a_stable_router_id() {
        let c = cluster();
        let a = plan(&c, &node(Role::Master, &["fd01::11/64"])).unwrap();
        let b = plan(&c, &node(Role::Master, &["fd01::11/64"])).unwrap();
        assert_eq!(a.router_id, b.router_id);
        assert_ne!(a.router_id, Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn no_bgp_section_no_plan() {
        let mut c = cluster();
        c.bgp = None;
        assert!(plan(&c, &node(Role::Master, &["10.1.0.11/24"])).is_none());
    }
}
