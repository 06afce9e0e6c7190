//! `openstack.json`: what an OpenStack deployment of the cluster needs that `cluster.json`
//! does not say, derived by `keelson build` from the same install-config (docs/openstack.md):
//! the nodes and their user_data, the subnet's allocation pool (the VIPs kept out), the
//! floating IPs and the external network, and the security group's rules with the source of
//! each. `examples/openstack/create-cluster.sh` reads it beside `cluster.json`, and the Heat
//! template (`openstack.yaml`) is written from it, so the script, the template and the
//! payloads cannot disagree.
//!
//! Least privilege: only 6443 (the API), 80 and 443 (ingress) face a source the operator
//! names (anywhere by default, as OpenShift), the operator status port the operator's own
//! (the API's by default), SSH only a source the operator names; everything else — VRRP,
//! DNS, the Ignition and metrics ports, the router's stats, mDNS — only the machine network.

use std::net::{IpAddr, Ipv4Addr};

use keelson_cluster::ClusterConfig;
use keelson_cluster::cluster::MembersTransport;
use keelson_cluster::install_config::InstallConfig;
use serde::Serialize;

/// The file's name in `--out`.
pub const FILE: &str = "openstack.json";

/// How far into the machine network the allocation pool starts at the earliest: the first
/// addresses are where VIPs and routers usually sit.
const POOL_FIRST: u32 = 10;

/// The router's stats and readiness port on the workers (OpenShift's ingress router), which
/// OpenShift's installer opens to the machine network only.
pub const ROUTER_STATS_PORT: u16 = 1936;

/// The tag every resource of cluster `name` carries (and is found and deleted by).
pub fn tag(name: &str) -> String {
    format!("keelson-cluster={name}")
}

/// Where a rule lets traffic in from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The machine network.
    Machine,
    /// The API's clients (`API_SOURCE`, Heat's `api_source`; default anywhere).
    Api,
    /// Ingress clients (`INGRESS_SOURCE`, `ingress_source`; default anywhere).
    Ingress,
    /// The operator's machine (`STATUS_SOURCE`, `status_source`; default the API's).
    Status,
    /// SSH clients (`SSH_SOURCE`, `ssh_source`): no rule unless named.
    Ssh,
}

impl Source {
    /// Its name in the script's environment and the template's parameters, lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Machine => "machine",
            Source::Api => "api",
            Source::Ingress => "ingress",
            Source::Status => "status",
            Source::Ssh => "ssh",
        }
    }
}

/// One rule of the security group. A rule open to a source other than the machine network
/// is open to the machine network too (the cluster's own traffic), unless that source is
/// anywhere already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// `tcp`, `udp` or an IP protocol number (`112`, VRRP).
    pub protocol: String,
    /// First port; none for a protocol without ports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_min: Option<u16>,
    /// Last port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_max: Option<u16>,
    /// Where from.
    pub from: Vec<Source>,
    /// What it is for.
    pub what: String,
}

/// A node of the deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Server name (`bootstrap`, `master-0`, `worker-1`).
    pub name: String,
    /// Role.
    pub role: String,
    /// Its user_data, a file in `--out`.
    pub user_data: String,
}

/// The allocation pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pool {
    /// First address.
    pub start: Ipv4Addr,
    /// Last address.
    pub end: Ipv4Addr,
}

/// `openstack.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Format version.
    pub version: u32,
    /// The cluster's name: every resource's name starts with it.
    pub cluster: String,
    /// The tag every resource carries ([`tag`]).
    pub tag: String,
    /// `<name>.<baseDomain>`.
    pub zone: String,
    /// The machine network (the subnet's range).
    pub machine_network: ipnet::IpNet,
    /// The subnet's allocation pool.
    pub allocation_pool: Option<Pool>,
    /// API VIPs.
    pub api_vips: Vec<IpAddr>,
    /// Ingress VIPs.
    pub ingress_vips: Vec<IpAddr>,
    /// `platform.openstack.externalNetwork`: the router's gateway network.
    pub external_network: Option<String>,
    /// `apiFloatingIP` (4.2: `lbFloatingIP`), attached to the API VIP's port.
    pub api_floating_ip: Option<IpAddr>,
    /// `ingressFloatingIP`, attached to the ingress VIP's port.
    pub ingress_floating_ip: Option<IpAddr>,
    /// The operator status port ([`keelson_cluster::operator::PORT`]).
    pub status_port: u16,
    /// The nodes, bootstrap first.
    pub nodes: Vec<Node>,
    /// The security group's rules.
    pub rules: Vec<Rule>,
}

/// The allocation pool of `cidr` that leaves out the network's first addresses, every VIP
/// inside it and the broadcast address: from after the last VIP (or [`POOL_FIRST`]) to the
/// second-to-last address. `None` for IPv6 or a network too small for one.
pub fn allocation_pool(cidr: &ipnet::IpNet, vips: &[IpAddr]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let ipnet::IpNet::V4(net) = cidr else {
        return None;
    };
    let base = u32::from(net.network());
    let last = u32::from(net.broadcast()).checked_sub(1)?;
    let after_vips = vips
        .iter()
        .filter_map(|v| match v {
            IpAddr::V4(v) if net.contains(v) => Some(u32::from(*v) + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let start = (base + POOL_FIRST).max(after_vips);
    (start <= last).then(|| (Ipv4Addr::from(start), Ipv4Addr::from(last)))
}

/// `ports` (sorted, deduplicated) as inclusive ranges of consecutive ports.
fn ranges(mut ports: Vec<u16>) -> Vec<(u16, u16)> {
    ports.sort_unstable();
    ports.dedup();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for p in ports {
        match out.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(p) => *end = p,
            _ => out.push((p, p)),
        }
    }
    out
}

/// The security group's rules for `cluster`.
pub fn rules(cluster: &ClusterConfig) -> Vec<Rule> {
    use Source::*;
    let rule = |protocol: &str, ports: Option<(u16, u16)>, from: &[Source], what: &str| Rule {
        protocol: protocol.into(),
        port_min: ports.map(|p| p.0),
        port_max: ports.map(|p| p.1),
        from: from.to_vec(),
        what: what.into(),
    };
    let mut out = vec![rule("112", None, &[Machine], "VRRP adverts")];
    // The API through its VIP; the VIP holder's proxy reaches the masters' apiservers on the
    // backend port from the machine network.
    out.push(rule(
        "tcp",
        Some((cluster.api.vip_port, cluster.api.vip_port)),
        &[Api, Machine],
        "the API",
    ));
    let mut internal = vec![
        cluster.api.frontend_port,
        cluster.api.backend_port,
        cluster.ignition.tls_port,
        cluster.ignition.plain_port,
        ROUTER_STATS_PORT,
        53,
    ];
    if cluster.metrics.port != 0 {
        internal.push(cluster.metrics.port);
    }
    // Beside openshift-install keelson's server moved aside for the machine-config-server,
    // which the nodes' pointers still reach on its own ports.
    if cluster.ignition.tls_port == keelson_cluster::render::openshift::KEELSON_TLS_PORT {
        internal.extend([
            keelson_cluster::render::openshift::MCS_PORT,
            keelson_cluster::render::openshift::MCS_PORT + 1,
        ]);
    }
    internal.retain(|p| *p != cluster.api.vip_port);
    for (min, max) in ranges(internal) {
        out.push(rule(
            "tcp",
            Some((min, max)),
            &[Machine],
            "cluster services: the API proxy, Ignition, /metrics and /status, the router's stats, DNS",
        ));
    }
    out.push(rule("udp", Some((53, 53)), &[Machine], "DNS"));
    if cluster.members.transport == MembersTransport::Mdns {
        out.push(rule("udp", Some((5353, 5353)), &[Machine], "mDNS members"));
    }
    for port in [80, 443] {
        out.push(rule(
            "tcp",
            Some((port, port)),
            &[Ingress, Machine],
            "ingress",
        ));
    }
    let status = keelson_cluster::operator::PORT;
    out.push(rule(
        "tcp",
        Some((status, status)),
        &[Status, Machine],
        "the operator status port (client certificate required)",
    ));
    out.push(rule("tcp", Some((22, 22)), &[Ssh], "SSH"));
    out
}

/// The plan for `ic` and the `cluster.json` built from it.
pub fn plan(ic: &InstallConfig, cluster: &ClusterConfig) -> anyhow::Result<Plan> {
    let machine_network = *ic
        .machine_networks
        .first()
        .ok_or_else(|| anyhow::anyhow!("install-config networking.machineNetwork: expected one"))?;
    let vips: Vec<IpAddr> = ic
        .api_vips
        .iter()
        .chain(&ic.ingress_vips)
        .copied()
        .collect();
    let node = |name: String, role: &str, user_data: &str| Node {
        name,
        role: role.into(),
        user_data: user_data.into(),
    };
    let mut nodes = vec![node("bootstrap".into(), "bootstrap", "bootstrap.ign")];
    nodes.extend((0..ic.masters).map(|i| node(format!("master-{i}"), "master", "master.ign")));
    nodes.extend((0..ic.workers).map(|i| node(format!("worker-{i}"), "worker", "worker.ign")));
    Ok(Plan {
        version: 1,
        cluster: ic.name.clone(),
        tag: tag(&ic.name),
        zone: cluster.zone(),
        machine_network,
        allocation_pool: allocation_pool(&machine_network, &vips)
            .map(|(start, end)| Pool { start, end }),
        api_vips: ic.api_vips.clone(),
        ingress_vips: ic.ingress_vips.clone(),
        external_network: ic.external_network.clone(),
        api_floating_ip: ic.api_floating_ip,
        ingress_floating_ip: ic.ingress_floating_ip,
        status_port: keelson_cluster::operator::PORT,
        nodes,
        rules: rules(cluster),
    })
}

/// Writes `openstack.json` and the Heat template into `dir`, where `bootstrap.ign` already
/// is; returns their names.
pub fn write_files(
    dir: &std::path::Path,
    ic: &InstallConfig,
    cluster: &ClusterConfig,
) -> anyhow::Result<Vec<String>> {
    let plan = plan(ic, cluster)?;
    let bootstrap = std::fs::read(dir.join("bootstrap.ign"))?;
    let fits = keelson_cluster::render::check_user_data("bootstrap.ign", &bootstrap).is_ok();
    std::fs::write(dir.join(FILE), to_json(&plan))?;
    std::fs::write(
        dir.join(crate::heat::FILE),
        crate::heat::template(&plan, fits)?,
    )?;
    Ok(vec![FILE.into(), crate::heat::FILE.into()])
}

/// The plan as the file's text (pretty, one trailing newline).
pub fn to_json(plan: &Plan) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(plan).unwrap_or_default();
    text.push(b'\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(extra: &str) -> (InstallConfig, ClusterConfig) {
        let text = include_str!("../../examples/install-config.yaml").replace(
            "    cloud: openstack\n",
            &format!("    cloud: openstack\n{extra}"),
        );
        let ic = InstallConfig::parse(&text).unwrap();
        let cluster = ic.cluster_config();
        (ic, cluster)
    }

    #[test]
    fn the_pool_leaves_the_vips_and_the_edges_out() {
        let net: ipnet::IpNet = "10.0.0.0/16".parse().unwrap();
        let vips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "10.0.0.7".parse().unwrap()];
        assert_eq!(
            allocation_pool(&net, &vips),
            Some((
                "10.0.0.10".parse().unwrap(),
                "10.0.255.254".parse().unwrap()
            ))
        );
        // A VIP further in pushes the start past it.
        let far: Vec<IpAddr> = vec!["10.0.0.100".parse().unwrap()];
        assert_eq!(
            allocation_pool(&net, &far).unwrap().0,
            Ipv4Addr::new(10, 0, 0, 101)
        );
        // A VIP outside the network changes nothing.
        let out: Vec<IpAddr> = vec!["192.168.0.9".parse().unwrap()];
        assert_eq!(
            allocation_pool(&net, &out).unwrap().0,
            Ipv4Addr::new(10, 0, 0, 10)
        );
        assert_eq!(allocation_pool(&"10.0.0.0/29".parse().unwrap(), &[]), None);
        assert_eq!(allocation_pool(&"fd00::/64".parse().unwrap(), &[]), None);
    }

    #[test]
    fn only_the_api_ingress_status_and_ssh_face_the_world() {
        let (_, cluster) = example("");
        let rules = rules(&cluster);
        let open: Vec<(Option<u16>, &Vec<Source>)> = rules
            .iter()
            .filter(|r| r.from.iter().any(|s| *s != Source::Machine))
            .map(|r| (r.port_min, &r.from))
            .collect();
        assert_eq!(
            open,
            [
                (Some(6443), &vec![Source::Api, Source::Machine]),
                (Some(80), &vec![Source::Ingress, Source::Machine]),
                (Some(443), &vec![Source::Ingress, Source::Machine]),
                (Some(22628), &vec![Source::Status, Source::Machine]),
                (Some(22), &vec![Source::Ssh]),
            ]
        );
        // DNS, the Ignition ports, /metrics, the proxy, the router's stats: the machine
        // network's; 22623-22625 one range.
        let tcp: Vec<(u16, u16)> = rules
            .iter()
            .filter(|r| r.protocol == "tcp" && r.from == [Source::Machine])
            .map(|r| (r.port_min.unwrap(), r.port_max.unwrap()))
            .collect();
        assert_eq!(tcp, [(53, 53), (1936, 1936), (9445, 9445), (22623, 22625)]);
        assert!(
            rules
                .iter()
                .any(|r| r.protocol == "112" && r.from == [Source::Machine])
        );
        // No mDNS port with unicast members; with mDNS members, from the machine network.
        assert!(!rules.iter().any(|r| r.port_min == Some(5353)));
        let mut mdns = cluster.clone();
        mdns.members.transport = MembersTransport::Mdns;
        assert!(super::rules(&mdns).iter().any(|r| r.port_min == Some(5353)
            && r.protocol == "udp"
            && r.from == [Source::Machine]));
    }

    #[test]
    fn beside_openshift_the_machine_config_server_stays_reachable() {
        let (_, mut cluster) = example("");
        cluster.ignition.tls_port = keelson_cluster::render::openshift::KEELSON_TLS_PORT;
        cluster.ignition.plain_port = keelson_cluster::render::openshift::KEELSON_PLAIN_PORT;
        let tcp: Vec<(u16, u16)> = rules(&cluster)
            .iter()
            .filter(|r| r.protocol == "tcp" && r.from == [Source::Machine])
            .map(|r| (r.port_min.unwrap(), r.port_max.unwrap()))
            .collect();
        // The machine-config-server's 22623-22624, /metrics, keelson's 22626-22627: one range.
        assert_eq!(tcp, [(53, 53), (1936, 1936), (9445, 9445), (22623, 22627)]);
    }

    #[test]
    fn the_plan_carries_what_cluster_json_does_not() {
        let (ic, cluster) = example(
            "    externalNetwork: public\n    apiFloatingIP: 172.24.4.50\n    ingressFloatingIP: 172.24.4.51\n",
        );
        let plan = plan(&ic, &cluster).unwrap();
        assert_eq!(plan.tag, "keelson-cluster=ocp4");
        assert_eq!(plan.external_network.as_deref(), Some("public"));
        assert_eq!(plan.api_floating_ip, Some("172.24.4.50".parse().unwrap()));
        assert_eq!(
            plan.ingress_floating_ip,
            Some("172.24.4.51".parse().unwrap())
        );
        let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bootstrap",
                "master-0",
                "master-1",
                "master-2",
                "worker-0",
                "worker-1"
            ]
        );
        let doc: serde_json::Value = serde_json::from_slice(&to_json(&plan)).unwrap();
        assert_eq!(doc["allocationPool"]["start"], "10.0.0.10");
        assert_eq!(doc["machineNetwork"], "10.0.0.0/16");
        assert_eq!(doc["rules"][0]["from"][0], "machine");
        assert_eq!(doc["statusPort"], 22628);
    }
}
