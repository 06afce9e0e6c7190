//! Fast failover without flapping, where the network misbehaves: three `keelson-agent run`
//! masters with the VRRP settings `keelson build` writes (unicast, 100 ms adverts, a silent
//! master's death confirmed by ARP for the VIP before anyone claims; docs/vrrp.md) in
//! namespaces on a bridge, the faults made by nftables rules on the bridge:
//!
//! 1. the holder cut off from the others for 2 s (alive: it keeps the VIP, as any holder
//!    cut off does), then healed: one holder within 1 s of healing, and it stays;
//! 2. adverts lost one way (protocol 112 from the holder to one backup dropped; ARP
//!    passes): that backup's Master_Down runs out again and again, the holder answers its
//!    ARP probe every time, and it never holds the VIP;
//! 3. everything lost one way (adverts and ARP from the holder to one backup): that backup
//!    confirms a death that did not happen and claims; the holder hears it go on
//!    advertising as master after its answers, gives the VIP up to it, and the two hold it
//!    together for no longer than the confirmation window (the backup's Master_Down).
//!
//! And for an IPv6 VIP, whose second path is neighbour solicitation: phases 2 and 3 with
//! two `keelson-agent vrrp` routers.
//!
//! Real packets; nothing mocked. Needs root (namespaces) and nftables.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunNet, example_cluster_json};
use keelson_testkit::segment::ns_holds;
use keelson_testkit::{Segment, require, require_root, wait_for_ok};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const VIP: &str = "10.0.0.5";

/// The API instance's status on node `i` (null when it does not answer).
fn api(net: &RunNet, i: usize) -> serde_json::Value {
    net.status(i)["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api").cloned())
        .unwrap_or_default()
}

/// Watches nodes `a` and `b` until stopped: the longest stretch in which both held the VIP
/// (sampled every few milliseconds, each sample reading both).
struct DualWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl DualWatch {
    fn start(seg: &Segment, a: usize, b: usize) -> Self {
        let (na, nb) = (seg.nodes[a].clone(), seg.nodes[b].clone());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut longest, mut since) = (Duration::ZERO, None::<Instant>);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                if ns_holds(&na, VIP) && ns_holds(&nb, VIP) {
                    let s = *since.get_or_insert(t);
                    longest = longest.max(t - s);
                } else {
                    since = None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            longest
        });
        DualWatch { stop, thread }
    }

    fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("watch")
    }
}

#[test]
fn partitions_and_one_way_loss_end_with_one_holder() {
    if !require_root() || !require("nft") {
        return;
    }
    let seg = Segment::ipv4_only("kpa", 3, 0);
    seg.drop_multicast();
    let advert_ms = u64::from(keelson_cluster::install_config::ADVERT_INTERVAL_MS);
    let mut cluster = example_cluster_json(advert_ms, 1, 30);
    cluster["dns"]["manageResolvConf"] = false.into();
    let names = [
        ("master-0", "master"),
        ("master-1", "master"),
        ("master-2", "master"),
    ];
    let mut net = RunNet::new(AGENT, seg, cluster, &names, "members,vrrp,ignition");
    for i in 0..3 {
        net.start(i);
    }
    net.wait_ready(&[0, 1, 2]);
    wait_for_ok(
        "three masters listing each other",
        Duration::from_secs(60),
        || {
            let lists: Vec<usize> = (0..3).map(|i| net.member_names(i).len()).collect();
            if lists == [3, 3, 3] {
                Ok(())
            } else {
                Err(format!("members listed {lists:?}"))
            }
        },
    );

    // 1. The holder cut off for 2 s, then healed.
    let h = net
        .seg
        .wait_steady_holder(VIP, Duration::from_secs(2), Duration::from_secs(30));
    let others: Vec<usize> = (0..3).filter(|&i| i != h).collect();
    net.seg.partition(&[h]);
    let cut = Instant::now();
    net.wait(
        "another master takes over from the one cut off",
        Duration::from_secs(2),
        || others.iter().any(|&i| net.seg.holds(i, VIP)),
    );
    std::thread::sleep(Duration::from_secs(2).saturating_sub(cut.elapsed()));
    net.seg.heal();
    let healed = Instant::now();
    let after = net
        .seg
        .wait_sole_holder_among(VIP, &[0, 1, 2], Duration::from_secs(5));
    let took = healed.elapsed();
    assert!(
        took <= Duration::from_secs(1),
        "one holder ({after}) only {took:?} after healing"
    );
    net.seg.assert_stable(after, VIP, Duration::from_secs(2));

    // 2. Adverts from the holder to one backup lost; ARP passes.
    let h = after;
    let b = (h + 1) % 3;
    let held_before = api(&net, b)["claimsHeld"].as_u64().unwrap_or(0);
    let watch = net.seg.watch_holders(VIP, &[b]);
    net.seg.cut_one_way(h, b, "ip protocol 112");
    std::thread::sleep(Duration::from_secs(3));
    net.seg.heal_one_way();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        watch.stop().is_empty(),
        "node {b} held {VIP} while only adverts were lost"
    );
    assert_eq!(net.seg.holders(VIP), vec![h]);
    let held = api(&net, b)["claimsHeld"].as_u64().unwrap_or(0);
    assert!(
        held > held_before,
        "node {b}'s Master_Down never ran out on the silent holder (claimsHeld {held})"
    );

    // 3. Everything from the holder to one backup lost. The confirmation window: the
    // backup's Master_Down at its priority (the checks as built: no proxy runs here).
    let priority = api(&net, b)["priority"].as_u64().expect("priority");
    let confirm_window = keelson_testkit::agent::master_down(advert_ms, priority);
    let dual = DualWatch::start(&net.seg, h, b);
    net.seg.cut_one_way(h, b, "");
    net.wait(
        "the backup that no longer hears the holder claims",
        Duration::from_secs(3),
        || net.seg.holds(b, VIP),
    );
    let single = net
        .seg
        .wait_sole_holder_among(VIP, &[0, 1, 2], Duration::from_secs(3));
    std::thread::sleep(Duration::from_secs(1));
    net.seg.heal_one_way();
    std::thread::sleep(Duration::from_millis(500));
    let longest = dual.stop();
    assert_eq!(
        single, b,
        "the router that cannot hear the holder keeps the VIP"
    );
    assert!(
        longest <= confirm_window,
        "two holders for {longest:?}, over the confirmation window {confirm_window:?}"
    );
    assert!(
        api(&net, h)["deafYields"].as_u64().unwrap_or(0) >= 1,
        "node {h} did not give the VIP up as to a router that cannot hear it: {}",
        api(&net, h)
    );
    net.seg.assert_stable(b, VIP, Duration::from_secs(2));
}

/// The same second path for an IPv6 VIP (neighbour solicitation, `keelson-agent vrrp`,
/// multicast, 100 ms adverts): a bootstrap (70) holds, a master (40) backs it up.
/// Adverts from the holder to the backup dropped: the holder answers the backup's
/// solicitations, and the backup never holds the VIP. Then everything from the holder to
/// the backup dropped (its advertisements too): the backup finds nobody answering and
/// claims, and the holder, hearing it go on, gives the VIP up to it.
#[test]
fn an_ipv6_holder_answers_neighbour_solicitation() {
    if !require_root() || !require("nft") {
        return;
    }
    let seg = Segment::new("kp6", 2, 41);
    let dir = tempfile::tempdir().unwrap();
    let vip = "fd29::100";
    let cluster = keelson_testkit::agent::vrrp_cluster_json(serde_json::json!([
        keelson_testkit::agent::vrrp_instance("api6", vip, 61)
    ]));
    let holder =
        keelson_testkit::agent::start_vrrp_agent(AGENT, &seg, dir.path(), &cluster, 0, "bootstrap");
    let backup =
        keelson_testkit::agent::start_vrrp_agent(AGENT, &seg, dir.path(), &cluster, 1, "master");
    seg.wait_sole_holder(0, vip, Duration::from_secs(10));
    wait_for_ok("node 1 a backup of node 0", Duration::from_secs(10), || {
        let st = backup.instance("api6");
        if st["state"] == "backup" && st["masterPriority"] == 70 {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
    let watch = seg.watch_holders(vip, &[1]);
    seg.cut_one_way(0, 1, "ip6 nexthdr 112");
    std::thread::sleep(Duration::from_secs(3));
    seg.heal_one_way();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        watch.stop().is_empty(),
        "node 1 held {vip} beside a live holder"
    );
    let held = backup.instance("api6")["counters"]["claimsHeld"].as_u64();
    assert!(
        held >= Some(1),
        "Master_Down never ran out: {}",
        backup.instance("api6")
    );

    seg.cut_one_way(0, 1, "");
    seg.wait_sole_holder(1, vip, Duration::from_secs(3));
    assert_eq!(
        holder.instance("api6")["counters"]["deafYields"].as_u64(),
        Some(1),
        "{}",
        holder.instance("api6")
    );
    seg.heal_one_way();
}
