//! VIPs by BGP through a real routing daemon (docs/bgp.md), in namespaces: two
//! racks behind top-of-rack routers with BGP and BFD, a spine with the client, three
//! masters (two in rack A, one in rack B) each running keelson-agent and a stand-in
//! apiserver. See `keelson_qemu_tests::fabric` for the topology. Once with BIRD 2 on every
//! router (the masters' started by the agent), once with FRR (bgpd + bfdd + zebra; the
//! masters' started beside the agent from the configuration it writes, as on RHCOS).
//!
//! Each test walks the whole story in order (building the fabric takes seconds): spread
//! over all three masters, a failing check withdraws, a dead master is routed around, it
//! comes back only once its checks pass and without a flap, the stale routes a dead agent
//! left are removed, a stopped agent withdraws — for the IPv4 and the IPv6 API VIP alike.
//! It asserts behaviour; `bench/bgp_failover.sh` measures the times. The fabric's
//! namespaces have fixed names (`kbg-*`): the two tests take turns.

use std::time::{Duration, Instant};

use keelson_testkit::wait_for;

use keelson_qemu_tests::fabric::{
    self, Daemon, Fabric, Prober, SPINE, VIP4, VIP6, count_by_node, vip_addr,
};

const PERIOD: Duration = Duration::from_millis(50);
const TIMEOUT: Duration = Duration::from_secs(1);
const CONVERGE: Duration = Duration::from_secs(30);

/// Root for the namespaces, and the routing daemon.
fn can_run(daemon: Daemon) -> bool {
    use keelson_testkit::{require, require_file, require_root};
    require_root()
        && match daemon {
            Daemon::Bird => require("bird") && require("birdc"),
            Daemon::Frr => {
                require("vtysh")
                    && ["zebra", "bfdd", "bgpd"]
                        .iter()
                        .all(|d| require_file(format!("/usr/lib/frr/{d}"), &format!("FRR's {d}")))
            }
        }
}

/// One fabric at a time in this process: its namespaces have fixed names.
static FABRIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn bgp_anycast_vips_through_bird() {
    scenario(Daemon::Bird);
}

#[test]
fn bgp_anycast_vips_through_frr() {
    scenario(Daemon::Frr);
}

/// The routes of table 198 (the agent's) in namespace `ns`, IPv4 then IPv6. A table the
/// kernel never made is empty; any other failure of `ip` fails the test: "routes
/// withdrawn" must be an empty table `ip` printed, never an `ip` that printed nothing.
fn table(ns: &str) -> String {
    let mut text = String::new();
    for family in ["-4", "-6"] {
        let out = std::process::Command::new("ip")
            .args([family, "-n", ns, "route", "show", "table", "198"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("FIB table does not exist"),
            "ip {family} -n {ns} route show table 198 failed ({}): {err}",
            out.status
        );
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    text
}

fn vip_status(f: &Fabric, i: usize, name: &str) -> serde_json::Value {
    let doc = f.status(i).unwrap();
    doc["other"]["bgp"]["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no bgp status for {name} on m{i}: {doc}"))
}

/// Both VIPs routed through every master: ToR A through m0 and m1, ToR B through m2, the
/// spine through both ToRs.
fn wait_all_three(f: &Fabric) {
    for (vip, a, b, s) in [
        (
            VIP4,
            ["10.71.1.10", "10.71.1.11"],
            "10.71.2.10",
            ["10.71.10.2", "10.71.20.2"],
        ),
        (
            VIP6,
            ["fd71:1::10", "fd71:1::11"],
            "fd71:2::10",
            ["fd71:10::2", "fd71:20::2"],
        ),
    ] {
        f.wait_nexthops("kbg-ta", vip, &a, CONVERGE).unwrap();
        f.wait_nexthops("kbg-tb", vip, &[b], CONVERGE).unwrap();
        f.wait_nexthops(SPINE, vip, &s, CONVERGE).unwrap();
    }
}

fn scenario(daemon: Daemon) {
    if !can_run(daemon) {
        return;
    }
    let _turn = FABRIC.lock().unwrap_or_else(|p| p.into_inner());
    let agent = fabric::find_agent().expect("keelson-agent built (make agent, or cargo build)");
    let f = Fabric::build(
        daemon,
        &agent,
        std::path::Path::new(env!("CARGO_BIN_EXE_kube-standin")),
    )
    .unwrap();
    for i in 0..3 {
        f.start_master(i).unwrap();
    }
    wait_all_three(&f);

    // 1. The VIPs answer from the client, spread over all three masters.
    for vip in [VIP4, VIP6] {
        let p = Prober::start(SPINE, vip_addr(vip), Duration::from_millis(10), TIMEOUT);
        std::thread::sleep(Duration::from_secs(2));
        let answers = p.finish();
        let counts = count_by_node(&answers);
        eprintln!(
            "{vip}: {} requests, answered per master {counts:?}",
            answers.len()
        );
        assert!(
            answers.iter().all(|a| a.sample.ok),
            "{vip}: a request failed"
        );
        for m in ["m0", "m1", "m2"] {
            assert!(
                counts.get(m).copied().unwrap_or(0) > 0,
                "{vip}: {m} got none: {counts:?}"
            );
        }
    }
    for i in 0..3 {
        for name in ["api", "api-v6"] {
            let s = vip_status(&f, i, name);
            assert_eq!(s["announced"], true, "m{i} {name}: {s}");
        }
    }

    // 2. m0's apiserver stops: its checks fail, its routes are withdrawn, no new
    //    connection goes there, none fails.
    f.stop_apiserver(0);
    f.wait_nexthops("kbg-ta", VIP4, &["10.71.1.11"], CONVERGE)
        .unwrap();
    f.wait_nexthops("kbg-ta", VIP6, &["fd71:1::11"], CONVERGE)
        .unwrap();
    assert_eq!(
        table("kbg-m0").trim(),
        "",
        "m0 withdrew both routes from its table"
    );
    let s = vip_status(&f, 0, "api");
    assert_eq!(s["announced"], false, "{s}");
    assert!(
        s["whyNot"][0].as_str().unwrap().contains("check failing"),
        "{s}"
    );
    for vip in [VIP4, VIP6] {
        let p = Prober::start(SPINE, vip_addr(vip), Duration::from_millis(10), TIMEOUT);
        std::thread::sleep(Duration::from_secs(1));
        let answers = p.finish();
        let counts = count_by_node(&answers);
        assert!(
            answers.iter().all(|a| a.sample.ok),
            "{vip}: a request failed"
        );
        assert!(!counts.contains_key("m0"), "{vip}: m0 still got {counts:?}");
    }
    f.start_apiserver(0).unwrap();
    wait_all_three(&f);

    // 3. m2 (alone in rack B) dies: link cut, every process killed. BFD at ToR B takes its
    //    routes away, the spine sends everything to rack A; requests fail only after the
    //    cut, and stop failing.
    f.wait_bfd(CONVERGE).unwrap();
    let probes = [VIP4, VIP6].map(|v| Prober::start(SPINE, vip_addr(v), PERIOD, TIMEOUT));
    std::thread::sleep(Duration::from_secs(2));
    let cut = f.kill_master(2).unwrap();
    f.wait_nexthops(SPINE, VIP4, &["10.71.10.2"], CONVERGE)
        .unwrap();
    f.wait_nexthops(SPINE, VIP6, &["fd71:10::2"], CONVERGE)
        .unwrap();
    let withdrawn = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    for (vip, p) in [VIP4, VIP6].into_iter().zip(probes) {
        let answers = p.finish();
        let samples: Vec<_> = answers.iter().map(|a| a.sample).collect();
        let o = keelson_qemu_tests::probe::outage(&samples, cut);
        eprintln!("{vip}: m2 died: {o:?}");
        assert_eq!(o.failures_before, 0, "{vip}: failures before the cut");
        assert!(
            o.failures_after > 0,
            "{vip}: the cut did not show (was m2 serving?)"
        );
        // Requests sent a timeout after the spine withdrew the route all answered.
        let late: Vec<_> = answers
            .iter()
            .filter(|a| a.sample.sent > withdrawn + TIMEOUT)
            .collect();
        assert!(!late.is_empty());
        assert!(
            late.iter().all(|a| a.sample.ok),
            "{vip}: failures after the withdrawal"
        );
        assert!(late.iter().all(|a| a.node.as_deref() != Some("m2")));
    }
    // What the dead agent left behind: routes in its table, VIPs on lo.
    let leftovers = table("kbg-m2");
    assert!(
        leftovers.contains(VIP4) && leftovers.contains(VIP6),
        "{leftovers}"
    );

    // 4. m2 comes back: its agent starts before its apiserver. It removes the stale routes
    //    and announces nothing until the checks pass; then it is announced once and stays.
    f.restore_link(2).unwrap();
    let probes = [VIP4, VIP6].map(|v| Prober::start(SPINE, vip_addr(v), PERIOD, TIMEOUT));
    f.start_agent(2).unwrap();
    wait_for("m2's agent emptied its table", CONVERGE, || {
        table("kbg-m2").trim().is_empty()
    });
    std::thread::sleep(Duration::from_secs(3));
    // ToR B reaches the VIP through the spine (rack A), not through m2.
    assert_eq!(
        f.tor_nexthops(1, VIP4),
        ["10.71.20.1"],
        "m2 announced before its checks pass"
    );
    assert_eq!(
        f.tor_nexthops(1, VIP6),
        ["fd71:20::1"],
        "m2 announced before its checks pass"
    );
    assert_eq!(f.spine_nexthops(VIP4), ["10.71.10.2"]);
    let s = vip_status(&f, 2, "api");
    assert_eq!(s["announced"], false, "{s}");
    f.start_apiserver(2).unwrap();
    // When the spine's ECMP set grows back to two paths (one poll apart), per VIP: the
    // 5-tuple hash then moves some flows to rack B, and a connection in flight at that
    // moment whose packets now reach m2 is reset by it. That is the fabric's ECMP (no
    // resilient hashing here, as on most fabrics), not keelson: every other request must
    // answer.
    let rehashed = [VIP4, VIP6].map(|vip| {
        let mut before = Instant::now();
        let t = Instant::now();
        while t.elapsed() < CONVERGE {
            if f.spine_nexthops(vip).len() == 2 {
                return (before, Instant::now());
            }
            before = Instant::now();
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("{vip}: the spine never took m2's path back");
    });
    wait_all_three(&f);
    // No flap: once back, the spine keeps both paths.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        assert_eq!(f.spine_nexthops(VIP4), ["10.71.10.2", "10.71.20.2"], "flap");
        assert_eq!(f.spine_nexthops(VIP6), ["fd71:10::2", "fd71:20::2"], "flap");
        std::thread::sleep(Duration::from_millis(20));
    }
    for ((vip, p), (from, to)) in [VIP4, VIP6].into_iter().zip(probes).zip(rehashed) {
        let answers = p.finish();
        let in_flight_at_rehash =
            |a: &&keelson_qemu_tests::fabric::Answer| a.sample.sent <= to && a.sample.done >= from;
        let failed: Vec<_> = answers
            .iter()
            .filter(|a| !a.sample.ok && !in_flight_at_rehash(a))
            .collect();
        let rehash_failed = answers
            .iter()
            .filter(|a| !a.sample.ok && in_flight_at_rehash(a))
            .count();
        eprintln!("{vip}: m2 back; failed while in flight at the ECMP change: {rehash_failed}");
        let counts = count_by_node(&answers);
        assert!(
            failed.is_empty(),
            "{vip}: requests failed while m2 came back (not in flight at the spine's ECMP change {:?} after the change began): {failed:?}",
            to - from
        );
        assert!(
            counts.get("m2").copied().unwrap_or(0) > 0,
            "{vip}: m2 back: {counts:?}"
        );
    }

    // 5. A stopped agent withdraws: m1's agent gets SIGTERM.
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", "kbg-m1"])
        .output()
        .unwrap();
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains("keelson-agent") {
            let pid: i32 = pid.parse().unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
        }
    }
    f.wait_nexthops("kbg-ta", VIP4, &["10.71.1.10"], CONVERGE)
        .unwrap();
    f.wait_nexthops("kbg-ta", VIP6, &["fd71:1::10"], CONVERGE)
        .unwrap();
    wait_for("m1's table emptied", CONVERGE, || {
        table("kbg-m1").trim().is_empty()
    });
}
