//! Cloud port security, played by nftables (docs/vrrp.md, "Port security"). A bootstrap
//! and a master in namespaces on one bridge run `keelson-agent run` (vrrp, members, the
//! Ignition server) with the `cluster.json` `keelson build` writes (unicast), timers
//! shortened. Then, as Neutron does:
//!
//! 1. The holder's port drops what it sends from the VIP (anti-spoofing) and its ARP
//!    replies for it (ARP protection), as when the VIP is not an allowed address pair:
//!    the holder must find it (status, `/metrics`-backing status field, log line naming
//!    the fix) and step down, so that the other node, whose port passes the VIP, holds it.
//! 2. The backup's port drops IP protocol 112 coming in (a security group without it): the
//!    backup must not claim the VIP beside its holder for as long as that lasts, must say
//!    so, and must clear the finding once adverts arrive again.
//!
//! Needs root (namespaces) and nftables.

use std::time::{Duration, Instant};

use keelson_testkit::agent::RunNet;
use keelson_testkit::segment::nft;
use keelson_testkit::{Segment, require, require_root, sh};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

const VIP: &str = "10.0.0.5";
/// The adverts of this test. Any interval works for the blocked-VRRP phase: a backup claims
/// a silent master's VIP only once ARP says nobody holds it, whenever its Master_Down runs
/// out; the phases' waits are timed for this one.
const ADVERT_MS: u64 = 300;

fn cluster_json() -> serde_json::Value {
    let text = include_str!("../../examples/install-config.yaml");
    let ic = keelson_cluster::install_config::InstallConfig::parse(text).unwrap();
    let mut c = serde_json::to_value(ic.cluster_config()).unwrap();
    for inst in c["vrrp"]["instances"].as_array_mut().unwrap() {
        inst["advertIntervalMs"] = ADVERT_MS.into();
    }
    c["members"]["renewIntervalSecs"] = 1.into();
    c["members"]["expirySecs"] = 4.into();
    c
}

/// Node `i`'s log.
fn log(net: &RunNet, i: usize) -> String {
    std::fs::read_to_string(&net.nodes[i].as_ref().unwrap().log).unwrap_or_default()
}

/// The `api` instance in node `i`'s status.
fn vrrp_api(net: &RunNet, i: usize) -> serde_json::Value {
    let st = net.status(i);
    st["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api"))
        .cloned()
        .unwrap_or_default()
}

/// The `api` instance's port security findings in node `i`'s status (`vipNotAllowed`,
/// `vrrpBlocked`).
fn findings(net: &RunNet, i: usize) -> Vec<String> {
    let st = net.status(i);
    st["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api"))
        .and_then(|v| v["portSecurity"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|f| f["problem"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Neutron's port security on node `i`'s port, in its namespace: ARP protection (only ARP
/// from the port's own address, and from the VIP while it is an allowed address pair, leaves
/// the port) and anti-spoofing (nothing sent from the VIP leaves unless it is allowed).
fn port(seg: &Segment, i: usize, vip_allowed: bool) {
    let ns = &seg.nodes[i];
    for table in ["arp kps_arp", "inet kps_spoof"] {
        let mut args = vec!["ip", "netns", "exec", ns, "nft", "delete", "table"];
        args.extend(table.split(' '));
        let _ = std::process::Command::new(args[0])
            .args(&args[1..])
            .output();
    }
    let node = seg.v4(i);
    let node = node.split('/').next().unwrap();
    let allowed = if vip_allowed {
        format!("{node}, {VIP}")
    } else {
        node.to_owned()
    };
    let mut rules = format!(
        "table arp kps_arp {{ chain out {{ type filter hook output priority 0; arp saddr ip != {{ {allowed} }} drop; }}; }}\n"
    );
    if !vip_allowed {
        rules.push_str(&format!(
            "table inet kps_spoof {{ chain out {{ type filter hook output priority 0; ip saddr {VIP} drop; }}; }}\n"
        ));
    }
    nft(ns, &rules);
}

/// A bootstrap and a master (segment `tag`), both ready, both ports as a correct cloud sets
/// them (the VIP an allowed address pair); the bootstrap's priority is the higher: it holds
/// the API VIP.
fn pair(tag: &str) -> RunNet {
    let seg = Segment::new(tag, 2, 0);
    let mut net = RunNet::new(
        AGENT,
        seg,
        cluster_json(),
        &[("bootstrap", "bootstrap"), ("master-1", "master")],
        "vrrp,members,ignition",
    );
    port(&net.seg, 0, true);
    port(&net.seg, 1, true);
    // The bootstrap first, as a cluster forms: it holds the VIP before the master starts
    // and registers through it. (Both started at once, each can claim the VIP alone after
    // its grace and register with itself through it; see the closing note of 2026-11-25.)
    net.start(0);
    net.wait("the bootstrap ready", Duration::from_secs(90), || {
        net.is_ready(0)
    });
    net.seg.wait_sole_holder(0, VIP, Duration::from_secs(30));
    net.start(1);
    net.wait("master-1 ready", Duration::from_secs(90), || {
        net.is_ready(1)
    });
    net.seg.wait_sole_holder(0, VIP, Duration::from_secs(30));
    net
}

/// Protocol 112 blocked on a cluster that runs as it should (a cloud port that drops VRRP): the
/// backup must not claim the VIP its holder keeps answering ARP for.
#[test]
fn a_backup_never_claims_beside_a_holder_whose_adverts_are_dropped() {
    if !require_root() || !require("nft") {
        return;
    }
    let mut net = pair("kpb");
    // Adverts flowing: the backup knows its master.
    net.wait(
        "master-1 hears the bootstrap",
        Duration::from_secs(30),
        || vrrp_api(&net, 1)["advertsReceived"].as_u64() > Some(0),
    );
    vrrp_blocked(&net, 0, 1);
    net.stop(0);
    net.stop(1);
}

#[test]
fn port_security_is_found_and_handled_safely() {
    if !require_root() || !require("nft") {
        return;
    }
    let mut net = pair("kps");

    // 1. The bootstrap's port without the VIP as a pair: what it sends from the VIP and its
    //    ARP for the VIP are dropped.
    port(&net.seg, 0, false);
    let found = net.wait(
        "the holder finds its port dropping the VIP",
        Duration::from_secs(60),
        || findings(&net, 0).contains(&"vipNotAllowed".to_owned()),
    );
    let moved = net.seg.wait_sole_holder(1, VIP, Duration::from_secs(20));
    let line = log(&net, 0)
        .lines()
        .find(|l| l.contains("does not leave this node's port"))
        .map(str::to_owned)
        .expect("a log line about the port");
    assert!(
        line.contains(&format!(
            "openstack port set --allowed-address ip-address={VIP}"
        )),
        "the fix is named: {line}"
    );
    eprintln!(
        "[vip not allowed] found in {:.1} s, the master held the VIP {:.1} s later",
        found.as_secs_f64(),
        moved.as_secs_f64()
    );
    // The fix is made (the pair is back); the master keeps the VIP, nothing flaps.
    port(&net.seg, 0, true);
    net.seg.assert_stable(1, VIP, Duration::from_secs(3));

    // 2. The security group of both ports without protocol 112 (the master holds the VIP).
    vrrp_blocked(&net, 1, 0);
    net.stop(0);
    net.stop(1);
}

/// Drops IP protocol 112 coming into both ports (a security group without it) while node
/// `holder` holds the VIP and `backup` is its backup, for 15 s, then lets it in again.
fn vrrp_blocked(net: &RunNet, holder: usize, backup: usize) {
    // No advert arrives anywhere. The backup's Master_Down runs out as if the master had
    // died, but the master still answers the ARP probes the backup sends once adverts go
    // quiet: the backup must not claim the VIP at all (not even for a moment: two holders
    // is the split brain this exists to prevent), holds its claim and reports. A backup that
    // claimed at the first Master_Down would leave the VIP, by the ARP conflict rule, with
    // the lower MAC: on OpenStack often the bootstrap's.
    let before = vrrp_api(net, backup);
    for ns in &net.seg.nodes {
        nft(
            ns,
            "table inet kps_sg { chain in { type filter hook input priority 0; ip protocol 112 drop; }; }",
        );
    }
    let t = Instant::now();
    let mut seen = None;
    while t.elapsed() < Duration::from_secs(15) {
        let h = net.seg.holders(VIP);
        assert_eq!(
            h,
            [holder],
            "{:.1} s after VRRP was blocked the VIP is held by {h:?}, expected {} alone",
            t.elapsed().as_secs_f64(),
            net.name(holder)
        );
        if seen.is_none() && findings(net, backup).contains(&"vrrpBlocked".to_owned()) {
            seen = Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = vrrp_api(net, backup);
    assert_eq!(
        after["state"],
        "backup",
        "{}'s api instance: {after}",
        net.name(backup)
    );
    assert_eq!(
        after["transitions"],
        before["transitions"],
        "{} changed state while VRRP was blocked (it claimed the VIP)",
        net.name(backup)
    );
    let seen = seen.expect("the backup reports that adverts do not arrive");
    assert!(
        log(net, backup)
            .lines()
            .any(|l| l.contains("no VRRP advert has arrived") && l.contains("--protocol 112")),
        "a log line naming protocol 112 in {}'s log:\n{}",
        net.name(backup),
        log(net, backup)
    );
    for ns in &net.seg.nodes {
        sh(&[
            "ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "kps_sg",
        ]);
    }
    let cleared = net.wait(
        "the finding clears once adverts arrive",
        Duration::from_secs(10),
        || !findings(net, backup).contains(&"vrrpBlocked".to_owned()),
    );
    std::thread::sleep(Duration::from_secs(1));
    let after = net.seg.holders(VIP);
    assert_eq!(after.len(), 1, "holders {after:?} once adverts flow again");
    eprintln!(
        "[vrrp blocked] {} alone throughout; {} found it in {:.1} s; cleared {:.1} s after the rule went",
        net.name(holder),
        net.name(backup),
        seen.as_secs_f64(),
        cleared.as_secs_f64()
    );
}
