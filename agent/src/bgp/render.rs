//! The routing daemon's configuration for a [`NodePlan`] (pure, stable: same plan, same
//! bytes): BIRD 2 (`bird.conf`) and FRR 8.4+ (`frr.conf`).
//!
//! Both do the same thing: read the VIP host routes the agent writes to the keelson kernel
//! table (BIRD: a `kernel` protocol on that table with `learn`; FRR: `ip import-table` +
//! `redistribute table`), announce exactly the configured VIPs out of it (a filter /
//! route-map names each prefix, so nothing else someone puts into the table leaks), with
//! the role's AS-path prepend and the communities, import nothing, and run BFD on every
//! session. Every string that reaches the file was checked by `cluster.json` validation
//! (addresses are typed, passwords have no quotes or spaces).

use std::fmt::Write as _;
use std::net::IpAddr;

use keelson_cluster::bgp::Community;

use super::plan::{NodePlan, PeerPlan, VipPlan};

/// The BIRD table name of an address family.
fn bird_table(v4: bool) -> &'static str {
    if v4 { "keelson_v4" } else { "keelson_v6" }
}

fn family(v4: bool) -> &'static str {
    if v4 { "ipv4" } else { "ipv6" }
}

fn host_prefix(vip: IpAddr) -> String {
    match vip {
        IpAddr::V4(v) => format!("{v}/32"),
        IpAddr::V6(v) => format!("{v}/128"),
    }
}

/// The families that have VIPs on this node, IPv4 first.
fn families(plan: &NodePlan) -> Vec<bool> {
    [true, false]
        .into_iter()
        .filter(|v4| plan.vips.iter().any(|v| v.vip.is_ipv4() == *v4))
        .collect()
}

/// `bird.conf` for `plan`.
pub fn bird_conf(plan: &NodePlan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# BIRD 2 configuration written by keelson-agent from cluster.json (bgp); rewritten at\n\
         # every start: change cluster.json, not this file. keelson-agent writes the VIP host\n\
         # routes to kernel table {}; BIRD announces them, with BFD, and imports nothing.",
        plan.table
    );
    let _ = writeln!(s, "router id {};", plan.router_id);
    s.push_str("log stderr { info, remote, warning, error, auth, fatal, bug };\n\n");
    let fams = families(plan);
    for &v4 in &fams {
        let _ = writeln!(s, "{} table {};", family(v4), bird_table(v4));
    }
    s.push_str("\nprotocol device {\n}\n");
    for &v4 in &fams {
        let _ = write!(
            s,
            "\n# The agent's routes (it adds them while the VIP's checks pass). Netlink\n\
             # notifications carry each change at once; the scan is only a safety net.\n\
             protocol kernel keelson_table_{fam} {{\n\
             \tkernel table {table};\n\
             \tlearn;\n\
             \tscan time 10;\n\
             \t{channel} {{ table {t}; import all; export none; }};\n\
             }}\n",
            fam = if v4 { "v4" } else { "v6" },
            channel = family(v4),
            table = plan.table,
            t = bird_table(v4),
        );
    }
    if plan.bfd.enabled && !plan.peers.is_empty() {
        let timers = format!(
            "\t\tmin rx interval {iv} ms;\n\t\tmin tx interval {iv} ms;\n\t\tmultiplier {m};\n",
            iv = plan.bfd.interval_ms,
            m = plan.bfd.multiplier
        );
        let _ = write!(
            s,
            "\nprotocol bfd keelson_bfd {{\n\tinterface \"*\" {{\n{timers}\t}};\n"
        );
        if plan.peers.iter().any(|p| p.multihop.is_some()) {
            let _ = write!(s, "\tmultihop {{\n{timers}\t}};\n");
        }
        s.push_str("}\n");
    }
    for &v4 in &fams {
        let _ = write!(
            s,
            "\nfilter keelson_export_{} {{\n",
            if v4 { "v4" } else { "v6" }
        );
        for vip in plan.vips.iter().filter(|v| v.vip.is_ipv4() == v4) {
            let _ = writeln!(s, "\t# {}", vip.name);
            let _ = writeln!(s, "\tif net = {} then {{", host_prefix(vip.vip));
            for _ in 0..vip.prepend {
                let _ = writeln!(s, "\t\tbgp_path.prepend({});", plan.local_asn);
            }
            for c in &plan.communities {
                match c {
                    Community::Standard(a, b) => {
                        let _ = writeln!(s, "\t\tbgp_community.add(({a},{b}));");
                    }
                    Community::Large(a, b, c) => {
                        let _ = writeln!(s, "\t\tbgp_large_community.add(({a},{b},{c}));");
                    }
                }
            }
            s.push_str("\t\taccept;\n\t}\n");
        }
        s.push_str("\treject;\n}\n");
    }
    for peer in &plan.peers {
        let v4 = peer.address.is_ipv4();
        if !fams.contains(&v4) {
            continue;
        }
        bird_peer(&mut s, plan, peer, v4);
    }
    s
}

fn bird_peer(s: &mut String, plan: &NodePlan, peer: &PeerPlan, v4: bool) {
    let _ = write!(
        s,
        "\nprotocol bgp {name} {{\n\
         \tlocal {local} as {asn};\n\
         \tneighbor {addr} as {peer_asn};\n",
        name = peer.name,
        local = peer.local,
        asn = plan.local_asn,
        addr = peer.address,
        peer_asn = peer.asn,
    );
    match peer.multihop {
        Some(hops) => {
            let _ = writeln!(s, "\tmultihop {hops};");
        }
        None => s.push_str("\tdirect;\n"),
    }
    let _ = writeln!(
        s,
        "\thold time {};\n\tkeepalive time {};",
        plan.hold_time_secs,
        (plan.hold_time_secs / 3).max(1)
    );
    // A peer that is not up yet, or that went away, is tried again within seconds (BIRD's
    // defaults wait minutes after an error).
    s.push_str("\tconnect retry time 5;\n\terror wait time 1, 10;\n");
    if plan.bfd.enabled {
        s.push_str("\tbfd on;\n");
    }
    if let Some(p) = &peer.password {
        let _ = writeln!(s, "\tpassword \"{p}\";");
    }
    let _ = write!(
        s,
        "\t{fam} {{\n\
         \t\ttable {t};\n\
         \t\timport none;\n\
         \t\texport filter keelson_export_{short};\n\
         \t\tnext hop self;\n\
         \t}};\n}}\n",
        fam = family(v4),
        t = bird_table(v4),
        short = if v4 { "v4" } else { "v6" },
    );
}

/// The route-map that announces `vips` (one family) with their prepends and communities.
fn frr_route_map(s: &mut String, plan: &NodePlan, v4: bool, vips: &[&VipPlan]) {
    let fam = if v4 { "v4" } else { "v6" };
    let ip = if v4 { "ip" } else { "ipv6" };
    for (i, vip) in vips.iter().enumerate() {
        let _ = writeln!(
            s,
            "{ip} prefix-list keelson-{fam}-{n} seq 5 permit {p}",
            n = i + 1,
            p = host_prefix(vip.vip)
        );
    }
    for (i, vip) in vips.iter().enumerate() {
        let _ = writeln!(
            s,
            "route-map keelson-export-{fam} permit {seq}\n ! {name}\n match {ip} address prefix-list keelson-{fam}-{n}",
            seq = (i + 1) * 10,
            name = vip.name,
            n = i + 1
        );
        if vip.prepend > 0 {
            let path = vec![plan.local_asn.to_string(); usize::from(vip.prepend)].join(" ");
            let _ = writeln!(s, " set as-path prepend {path}");
        }
        let std: Vec<String> = plan
            .communities
            .iter()
            .filter_map(|c| match c {
                Community::Standard(a, b) => Some(format!("{a}:{b}")),
                Community::Large(..) => None,
            })
            .collect();
        if !std.is_empty() {
            let _ = writeln!(s, " set community {} additive", std.join(" "));
        }
        let large: Vec<String> = plan
            .communities
            .iter()
            .filter_map(|c| match c {
                Community::Large(a, b, c) => Some(format!("{a}:{b}:{c}")),
                Community::Standard(..) => None,
            })
            .collect();
        if !large.is_empty() {
            let _ = writeln!(s, " set large-community {} additive", large.join(" "));
        }
        s.push_str("exit\n");
    }
    let _ = writeln!(s, "route-map keelson-export-{fam} deny 65535\nexit");
}

/// `frr.conf` for `plan` (FRR 8.4+: `zebra`, `bgpd` and `bfdd` read it).
pub fn frr_conf(plan: &NodePlan, hostname: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "! FRR configuration written by keelson-agent from cluster.json (bgp): keelson-agent\n\
         ! writes the VIP host routes to kernel table {t}; zebra imports that table and bgpd\n\
         ! announces exactly the VIPs from it, with BFD, importing nothing.\n\
         frr defaults datacenter\n\
         hostname {hostname}\n\
         log stdout informational\n\
         !",
        t = plan.table,
    );
    let fams = families(plan);
    if fams.contains(&true) {
        // FRR 8.4 has no IPv6 form of this (nor of `redistribute table`).
        let _ = writeln!(s, "ip import-table {}", plan.table);
    }
    s.push_str("!\n");
    for &v4 in &fams {
        let vips: Vec<&VipPlan> = plan.vips.iter().filter(|v| v.vip.is_ipv4() == v4).collect();
        frr_route_map(&mut s, plan, v4, &vips);
        s.push_str("!\n");
    }
    s.push_str("route-map keelson-import deny 10\nexit\n!\n");
    if plan.bfd.enabled && !plan.peers.is_empty() {
        let _ = writeln!(
            s,
            "bfd\n profile keelson\n  detect-multiplier {m}\n  receive-interval {iv}\n  transmit-interval {iv}\n exit\n exit\n!",
            m = plan.bfd.multiplier,
            iv = plan.bfd.interval_ms
        );
    }
    let peers: Vec<&PeerPlan> = plan
        .peers
        .iter()
        .filter(|p| fams.contains(&p.address.is_ipv4()))
        .collect();
    let _ = writeln!(
        s,
        "router bgp {asn}\n bgp router-id {rid}\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax",
        asn = plan.local_asn,
        rid = plan.router_id
    );
    for p in &peers {
        let a = p.address;
        let _ = writeln!(s, " neighbor {a} remote-as {}", p.asn);
        let _ = writeln!(s, " neighbor {a} update-source {}", p.local);
        let _ = writeln!(
            s,
            " neighbor {a} timers {} {}",
            (plan.hold_time_secs / 3).max(1),
            plan.hold_time_secs
        );
        let _ = writeln!(s, " neighbor {a} timers connect 5");
        if let Some(hops) = p.multihop {
            let _ = writeln!(s, " neighbor {a} ebgp-multihop {hops}");
        }
        if let Some(pass) = &p.password {
            let _ = writeln!(s, " neighbor {a} password {pass}");
        }
        if plan.bfd.enabled {
            let _ = writeln!(s, " neighbor {a} bfd profile keelson");
        }
    }
    for &v4 in &fams {
        let fam = if v4 { "v4" } else { "v6" };
        let _ = writeln!(s, " !\n address-family {} unicast", family(v4));
        if v4 {
            let _ = writeln!(
                s,
                "  redistribute table {} route-map keelson-export-{fam}",
                plan.table
            );
        }
        // The VIP's address on lo is a connected route to zebra, which wins over the
        // imported table route (distance 0 against 15), and zebra redistributes only the
        // routes it selects: so the VIP also goes out as a connected route, through the same
        // route-map. The agent adds the address only while it announces the VIP.
        let _ = writeln!(s, "  redistribute connected route-map keelson-export-{fam}");
        for p in peers.iter().filter(|p| p.address.is_ipv4() == v4) {
            let a = p.address;
            // The redistribution's route-map already picks the VIPs and sets the prepend
            // and communities; nothing else is in BGP (every import is denied).
            let _ = writeln!(
                s,
                "  neighbor {a} activate\n  neighbor {a} route-map keelson-import in"
            );
        }
        s.push_str(" exit-address-family\n");
    }
    s.push_str("exit\n!\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bgp::plan::plan;
    use crate::node::NodeIdentity;
    use keelson_cluster::{ClusterConfig, Role};

    fn node_plan(role: Role) -> NodePlan {
        let mut c = ClusterConfig::from_json(include_bytes!("testdata/cluster.json")).unwrap();
        c.bgp.as_mut().unwrap().vips = vec!["api".into(), "api-v6".into()];
        let node = NodeIdentity {
            name: "master-0".parse().unwrap(),
            role,
            interface: "eth0".into(),
            addresses: vec![
                "10.1.0.11/24".parse().unwrap(),
                "fd01::11/64".parse().unwrap(),
            ],
        };
        plan(&c, &node).unwrap()
    }

    #[test]
    fn bird_conf_for_a_master() {
        insta::assert_snapshot!(bird_conf(&node_plan(Role::Master)));
    }

    #[test]
    fn frr_conf_for_a_master() {
        insta::assert_snapshot!(frr_conf(&node_plan(Role::Master), "master-0"));
    }

    #[test]
    fn the_bootstrap_does_not_prepend() {
        let conf = bird_conf(&node_plan(Role::Bootstrap));
        assert!(!conf.contains("bgp_path.prepend"), "{conf}");
        let conf = frr_conf(&node_plan(Role::Bootstrap), "bootstrap");
        assert!(!conf.contains("as-path prepend"), "{conf}");
    }

    #[test]
    fn without_bfd_no_bfd() {
        let mut p = node_plan(Role::Master);
        p.bfd.enabled = false;
        assert!(!bird_conf(&p).contains("bfd"));
        assert!(!frr_conf(&p, "m").contains("bfd"));
    }

    #[test]
    fn a_node_without_vips_announces_nothing() {
        let mut p = node_plan(Role::Master);
        p.vips.clear();
        let conf = bird_conf(&p);
        assert!(!conf.contains("protocol bgp"), "{conf}");
        assert!(!conf.contains("protocol kernel"), "{conf}");
    }

    #[test]
    fn same_plan_same_bytes() {
        assert_eq!(
            bird_conf(&node_plan(Role::Master)),
            bird_conf(&node_plan(Role::Master))
        );
    }

    /// The real daemons parse what we render: `bird -p` and FRR's `vtysh -C` (both from
    /// `scripts/setup.sh`), for a master (prepends, communities, both families, a multihop
    /// peer, a password) and a bootstrap.
    #[test]
    fn the_daemons_accept() {
        if !keelson_testkit::require("bird") || !keelson_testkit::require("vtysh") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for role in [Role::Master, Role::Bootstrap] {
            let plan = node_plan(role);
            let bird = dir.path().join("bird.conf");
            std::fs::write(&bird, bird_conf(&plan)).unwrap();
            let out = std::process::Command::new("bird")
                .arg("-p")
                .arg("-c")
                .arg(&bird)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "bird -p: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let frr = dir.path().join("frr.conf");
            std::fs::write(&frr, frr_conf(&plan, "master-0")).unwrap();
            let out = std::process::Command::new("vtysh")
                .arg("-C")
                .arg("-f")
                .arg(&frr)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "vtysh -C: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
