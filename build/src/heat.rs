//! `openstack.yaml`: the cluster as one OpenStack Heat (HOT) template, written by
//! `keelson build` beside the Ignition configs (docs/openstack.md, "With Heat"). One
//! `openstack stack create -t out/openstack.yaml` makes what the README's script makes: the
//! machine network and subnet (the VIPs outside its allocation pool), the security group
//! (VRRP and the service ports), one port per node carrying both VIPs as allowed address
//! pairs, and the servers with their Ignition configs as user_data (`get_file`, so the
//! template stays next to them in `--out`).
//!
//! Pure text from the cluster's settings, so the same inputs give the same bytes.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use keelson_cluster::ClusterConfig;
use keelson_cluster::install_config::InstallConfig;

/// The template's file name in `--out`.
pub const FILE: &str = "openstack.yaml";

/// How far into the machine network the allocation pool starts at the earliest: the first
/// addresses are where VIPs and routers usually sit.
const POOL_FIRST: u32 = 10;

/// The allocation pool of `cidr` that leaves out the network's first addresses, every
/// VIP inside it and the broadcast address: from after the last VIP (or [`POOL_FIRST`]) to
/// the second-to-last address. `None` for IPv6 or a network too small for one.
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

/// The router's stats and readiness port on the workers (OpenShift's ingress router), which
/// OpenShift's installer opens to the machine network only.
pub const ROUTER_STATS_PORT: u16 = 1936;

/// The security group's rules: (protocol, port, machine network only), port 0 for "every
/// port of the protocol".
pub fn rules(cluster: &ClusterConfig) -> Vec<(&'static str, u16, bool)> {
    let mut tcp = vec![
        cluster.api.vip_port,
        cluster.api.frontend_port,
        cluster.ignition.tls_port,
        cluster.ignition.plain_port,
    ];
    if cluster.metrics.port != 0 {
        tcp.push(cluster.metrics.port);
    }
    tcp.push(53);
    // The ingress VIP's traffic: the applications' HTTP and HTTPS on the workers.
    tcp.extend([80, 443]);
    tcp.sort_unstable();
    tcp.dedup();
    let mut rules = vec![("112", 0, false)];
    rules.extend(tcp.into_iter().map(|p| ("tcp", p, false)));
    rules.push(("tcp", ROUTER_STATS_PORT, true));
    rules.push(("udp", 53, false));
    // mDNS members (docs/members.md); harmless with unicast members.
    rules.push(("udp", 5353, false));
    rules
}

/// The template.
pub fn template(ic: &InstallConfig, cluster: &ClusterConfig) -> anyhow::Result<String> {
    let cidr = ic
        .machine_networks
        .first()
        .ok_or_else(|| anyhow::anyhow!("install-config networking.machineNetwork: expected one"))?;
    let vips: Vec<IpAddr> = ic
        .api_vips
        .iter()
        .chain(&ic.ingress_vips)
        .copied()
        .collect();
    let mut t = String::new();
    let w = &mut t;
    writeln!(w, "heat_template_version: 2021-04-16")?;
    writeln!(
        w,
        "description: keelson cluster {} (written by keelson build; docs/openstack.md)",
        cluster.zone()
    )?;
    write_parameters(w)?;
    write_network(w, &ic.name, cidr, &vips, cluster)?;
    write_servers(w, ic, &vips)?;
    writeln!(w, "outputs:")?;
    writeln!(w, "  network:\n    value: {{get_resource: network}}")?;
    writeln!(
        w,
        "  bootstrap_address:\n    value: {{get_attr: [bootstrap_port, fixed_ips, 0, ip_address]}}"
    )?;
    Ok(t)
}

/// The template's parameters: images, flavors, config drive.
fn write_parameters(w: &mut String) -> std::fmt::Result {
    writeln!(w, "parameters:")?;
    for (param, default, what) in [
        (
            "keelson_image",
            "keelson",
            "the image of keelson.qcow2 (the bootstrap)",
        ),
        ("rhcos_image", "rhcos", "the masters' image"),
        ("worker_image", "rhcos", "the workers' image"),
        ("bootstrap_flavor", "m1.small", "the bootstrap's flavor"),
        ("master_flavor", "m1.xlarge", "the masters' flavor"),
        ("worker_flavor", "m1.large", "the workers' flavor"),
    ] {
        writeln!(
            w,
            "  {param}:\n    type: string\n    default: {default}\n    description: {what}"
        )?;
    }
    writeln!(
        w,
        "  config_drive:\n    type: boolean\n    default: false\n    description: boot with a config drive (else the metadata service serves user_data)"
    )?;
    Ok(())
}

/// The network, its subnet (its pool kept clear of the VIPs) and the security group.
fn write_network(
    w: &mut String,
    name: &str,
    cidr: &ipnet::IpNet,
    vips: &[IpAddr],
    cluster: &ClusterConfig,
) -> std::fmt::Result {
    writeln!(w, "resources:")?;
    writeln!(
        w,
        "  network:\n    type: OS::Neutron::Net\n    properties:\n      name: {name}"
    )?;
    writeln!(
        w,
        "  subnet:\n    type: OS::Neutron::Subnet\n    properties:\n      name: {name}\n      network: {{get_resource: network}}\n      cidr: {cidr}"
    )?;
    if let Some((start, end)) = allocation_pool(cidr, vips) {
        writeln!(
            w,
            "      allocation_pools:\n      - {{start: {start}, end: {end}}}"
        )?;
    }
    writeln!(
        w,
        "  security_group:\n    type: OS::Neutron::SecurityGroup\n    properties:\n      name: {name}\n      description: keelson cluster {name}, VRRP and the service ports\n      rules:"
    )?;
    for (protocol, port, machine_only) in rules(cluster) {
        let from = if machine_only {
            format!(", remote_ip_prefix: {cidr}")
        } else {
            String::new()
        };
        if port == 0 {
            writeln!(w, "      - {{protocol: '{protocol}'{from}}}")?;
        } else {
            writeln!(
                w,
                "      - {{protocol: {protocol}, port_range_min: {port}, port_range_max: {port}{from}}}"
            )?;
        }
    }
    Ok(())
}

/// A port (the VIPs as allowed address pairs) and a server for each node.
fn write_servers(w: &mut String, ic: &InstallConfig, vips: &[IpAddr]) -> std::fmt::Result {
    let name = &ic.name;
    let nodes = std::iter::once((
        "bootstrap".to_owned(),
        "keelson_image",
        "bootstrap_flavor",
        "bootstrap.ign",
    ))
    .chain((0..ic.masters).map(|i| {
        (
            format!("master-{i}"),
            "rhcos_image",
            "master_flavor",
            "master.ign",
        )
    }))
    .chain((0..ic.workers).map(|i| {
        (
            format!("worker-{i}"),
            "worker_image",
            "worker_flavor",
            "worker.ign",
        )
    }));
    for (node, image, flavor, user_data) in nodes {
        let res = node.replace('-', "_");
        writeln!(
            w,
            "  {res}_port:\n    type: OS::Neutron::Port\n    properties:\n      name: {name}-{node}\n      network: {{get_resource: network}}\n      fixed_ips:\n      - {{subnet: {{get_resource: subnet}}}}\n      security_groups:\n      - {{get_resource: security_group}}\n      allowed_address_pairs:"
        )?;
        for vip in vips {
            writeln!(w, "      - {{ip_address: {vip}}}")?;
        }
        writeln!(
            w,
            "  {res}:\n    type: OS::Nova::Server\n    properties:\n      name: {node}\n      image: {{get_param: {image}}}\n      flavor: {{get_param: {flavor}}}\n      networks:\n      - {{port: {{get_resource: {res}_port}}}}\n      config_drive: {{get_param: config_drive}}\n      user_data_format: RAW\n      user_data: {{get_file: {user_data}}}"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
