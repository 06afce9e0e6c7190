//! A preemption among masters of equal priority moves the VIP once. Three
//! `keelson-agent run` nodes (members and VRRP, unicast as `keelson build` writes, 1 s
//! adverts) in network namespaces on a bridge, the API instance with one HTTP check of
//! the node's own stand-in (a local server), as the `localApiserver` check is in a real
//! cluster. The holder's check is refused (nftables): its priority falls, it keeps
//! advertising at the lower one, and both backups — equal priority, equal address
//! tie-break (.10, .42, .74: equal modulo 32) — let Master_Down run out from its last
//! advert at full priority. Without the rank a backup takes at Master_Down they claim
//! together, both announce the VIP, and one then yields: a client that believed it loses
//! its connection. Real packets; nothing mocked.
//!
//! Needs root (namespaces) and nftables.

use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunCluster, RunNode, master_down, member_names};
use keelson_testkit::http::HttpServer;
use keelson_testkit::netns::bind_tcp_in;
use keelson_testkit::segment::nft;
use keelson_testkit::{Segment, require, require_root, sh, wait_for_ok};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const VIP: &str = "10.0.0.5";
/// The check's port on each node's loopback.
const CHECK_PORT: u16 = 18080;
/// What the check adds to the priority while it passes.
const WEIGHT: u64 = 20;
/// The nftables table that refuses a node's own check.
const TABLE: &str = "kpo_check";

/// The API instance's status on node `i` (null when it has none; fails when the node does
/// not answer).
fn api_status(files: &RunCluster, i: usize) -> serde_json::Value {
    files.status(i)["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api").cloned())
        .unwrap_or_default()
}

/// Freezes the backups `others` (SIGSTOP) until `until`, then lets both go on together
/// (one SIGCONT): a loaded or virtualised host running two timers late. Both find their
/// Master_Down over at once, and no advert from the other yet.
fn freeze_until(nodes: &[Option<RunNode>], others: &[usize], until: Instant) {
    let pids: Vec<String> = others
        .iter()
        .map(|&i| nodes[i].as_ref().unwrap().proc.pid().to_string())
        .collect();
    let mut args = vec!["kill", "-STOP"];
    args.extend(pids.iter().map(String::as_str));
    sh(&args);
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    args[1] = "-CONT";
    sh(&args);
}

/// Each round: the holder's own check refused; one of the two equal backups preempts it,
/// and the other never leaves Backup (its transition count) nor is ever seen holding the
/// VIP. The backups are frozen through their Master_Down ([`freeze_until`]), so without
/// the rank both claim in every round. Then the check passes again, every master is back
/// at full priority (no preemption of an equal), and the new holder stays.
#[test]
fn a_preemption_among_equal_masters_moves_the_vip_once() {
    if !require_root() || !require("nft") {
        return;
    }
    let seg = Segment::ipv4_only_same_tiebreak("kpo", 3, 0);
    seg.drop_multicast();
    // Member records live 10 s, over the backups' 4 s freeze: with 4 s the stalled nodes
    // woke with every other member expired, no rival to rank behind, and both claimed
    // (a stall longer than `expirySecs`, 30 s by default, is not what this test is about).
    let mut cluster = keelson_testkit::agent::example_cluster_json(1000, 1, 10);
    let mut api = cluster["vrrp"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "api")
        .unwrap()
        .clone();
    assert_eq!(api["preempt"], true, "{api}");
    api["checks"] = serde_json::json!([{
        "name": "own-server",
        "check": {"type": "http", "url": format!("http://127.0.0.1:{CHECK_PORT}/"), "expectStatus": 200},
        "intervalMs": 200, "rise": 1, "fall": 1, "weight": WEIGHT
    }]);
    let full = api["priorities"]["master"].as_u64().unwrap() + WEIGHT;
    cluster["vrrp"]["instances"] = serde_json::json!([api]);
    cluster["dns"]["manageResolvConf"] = false.into();
    let _servers: Vec<HttpServer> = (0..3)
        .map(|i| {
            let l = bind_tcp_in(&seg.nodes[i], ([127, 0, 0, 1], CHECK_PORT).into());
            HttpServer::start(l, [("/", "ok")])
        })
        .collect();
    let files = RunCluster::new(AGENT, cluster);
    let names: Vec<String> = (0..3).map(|i| format!("master-{i}")).collect();
    let nodes: Vec<Option<RunNode>> = (0..3)
        .map(|i| {
            Some(files.start(
                &seg.nodes[i],
                i,
                (&names[i], "master", &seg.v4(i)),
                "members,vrrp,ignition",
            ))
        })
        .collect();
    let dump = || {
        for (i, n) in nodes.iter().enumerate() {
            if let Some(n) = n {
                eprintln!("---- {} \n{}", names[i], n.log_tail(40));
            }
        }
    };
    // Every node ready, listing all three (the ranks come from members), at full priority.
    wait_for_ok(
        "three masters listing each other at full priority",
        Duration::from_secs(60),
        || {
            let ready = nodes
                .iter()
                .all(|n| n.as_ref().is_some_and(RunNode::is_ready));
            if !ready {
                // A node serves its status once ready.
                return Err("not every node ready".into());
            }
            let lists: Vec<usize> = (0..3)
                .map(|i| member_names(&files.status(i)).len())
                .collect();
            let prios: Vec<serde_json::Value> = (0..3)
                .map(|i| api_status(&files, i)["priority"].clone())
                .collect();
            if ready && lists == [3, 3, 3] && prios.iter().all(|p| *p == full) {
                Ok(())
            } else {
                Err(format!(
                    "ready {ready}, members {lists:?}, priorities {prios:?}"
                ))
            }
        },
    );
    let steady = 2 * master_down(1000, full);
    let mut holder = seg.wait_steady_holder(VIP, steady, Duration::from_secs(60));
    for round in 0..3 {
        let others: Vec<usize> = (0..3).filter(|&i| i != holder).collect();
        let before: Vec<u64> = others
            .iter()
            .map(|&i| api_status(&files, i)["transitions"].as_u64().unwrap())
            .collect();
        let watch = seg.watch_holders(VIP, &others);
        let t = Instant::now();
        nft(
            &seg.nodes[holder],
            &format!(
                "table inet {TABLE} {{ chain out {{ type filter hook output priority 0; tcp dport {CHECK_PORT} reject with tcp reset; }}; }}\n"
            ),
        );
        // The holder advertises its lower priority at once; its last advert at full
        // priority went out at most an interval before.
        wait_for_ok(
            "the holder's priority falling",
            Duration::from_secs(10),
            || {
                let p = api_status(&files, holder)["priority"].clone();
                if p == full - WEIGHT {
                    Ok(())
                } else {
                    Err(format!("priority {p}"))
                }
            },
        );
        let fell = Instant::now();
        // Frozen from here until both backups' Master_Down (counted from that last advert,
        // which came before `fell`) has surely run out.
        freeze_until(
            &nodes,
            &others,
            fell + master_down(1000, full) + Duration::from_millis(300),
        );
        let new_holder = seg.wait_sole_holder_among(VIP, &others, Duration::from_secs(20));
        let took = t.elapsed();
        // Long enough for a second claimant: past every rank's wait.
        std::thread::sleep(master_down(1000, full));
        let seen = watch.stop();
        let after: Vec<u64> = others
            .iter()
            .map(|&i| api_status(&files, i)["transitions"].as_u64().unwrap())
            .collect();
        let old = api_status(&files, holder);
        eprintln!(
            "round {round}: {} preempted, {} holds {VIP} after {took:?}; seen holding: {seen:?}; transitions {before:?} -> {after:?}; old holder {} at {}",
            names[holder], names[new_holder], old["state"], old["priority"]
        );
        if seen != [new_holder] || after.iter().zip(&before).map(|(a, b)| a - b).sum::<u64>() != 1 {
            dump();
        }
        assert_eq!(
            seen,
            [new_holder],
            "round {round}: only one backup may claim {VIP} when {} is preempted",
            names[holder]
        );
        for (k, &i) in others.iter().enumerate() {
            assert_eq!(
                after[k],
                before[k] + u64::from(i == new_holder),
                "round {round}: {} changed state {} times (1 for the new holder, 0 for the other)",
                names[i],
                after[k] - before[k]
            );
        }
        // Preempted, not dead: the old holder follows the new one.
        assert_eq!(old["state"], "backup", "{old}");
        sh(&[
            "ip",
            "netns",
            "exec",
            &seg.nodes[holder],
            "nft",
            "delete",
            "table",
            "inet",
            TABLE,
        ]);
        wait_for_ok(
            "every master at full priority again",
            Duration::from_secs(30),
            || {
                let prios: Vec<serde_json::Value> = (0..3)
                    .map(|i| api_status(&files, i)["priority"].clone())
                    .collect();
                if prios.iter().all(|p| *p == full) {
                    Ok(())
                } else {
                    Err(format!("priorities {prios:?}"))
                }
            },
        );
        seg.assert_stable(new_holder, VIP, Duration::from_secs(2));
        holder = new_holder;
    }
    drop(nodes);
}
