//! Interop with a real keepalived (Debian package): two keelson agents and one keepalived
//! in one virtual router elect the master the priorities name, and fail over both ways,
//! with VRRPv3 multicast, VRRPv2 + PASS multicast, and VRRPv3 unicast.
//!
//! Needs root (namespaces) and keepalived.

use std::path::Path;
use std::time::Duration;

use keelson_testkit::agent::{
    master_down, start_keepalived, start_vrrp_agent, vrrp_cluster_json, vrrp_instance,
};
use keelson_testkit::timing::WAIT_MARGIN;
use keelson_testkit::{Segment, require, require_root, wait_for_ok};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

#[derive(Clone, Copy)]
enum Mode {
    V3Multicast,
    V2Pass,
    V3Unicast,
    V6Multicast,
}

fn keepalived_conf(seg: &Segment, mode: Mode, vip: &str, vrid: u8, prio: u8) -> String {
    let (version, advert, auth, unicast) = match mode {
        Mode::V3Multicast | Mode::V6Multicast => (3, "0.1", String::new(), String::new()),
        Mode::V3Unicast => (
            3,
            "0.1",
            String::new(),
            format!(
                "unicast_src_ip {}\n    unicast_peer {{\n        {}\n        {}\n    }}",
                ip(&seg.v4(2)),
                ip(&seg.v4(0)),
                ip(&seg.v4(1))
            ),
        ),
        Mode::V2Pass => (
            2,
            "1",
            "authentication {\n        auth_type PASS\n        auth_pass kvrpass\n    }".into(),
            String::new(),
        ),
    };
    format!(
        "global_defs {{\n    router_id kvr-ka\n    vrrp_garp_master_delay 0\n}}\n\
         vrrp_instance api {{\n    state BACKUP\n    interface eth0\n    version {version}\n    \
         virtual_router_id {vrid}\n    priority {prio}\n    advert_int {advert}\n    \
         {auth}\n    {unicast}\n    virtual_ipaddress {{\n        {vip}/{plen} dev eth0\n    }}\n}}\n",
        plen = if vip.contains(':') { 128 } else { 32 }
    )
}

fn ip(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

fn keelson_instance(seg: &Segment, mode: Mode, vip: &str, vrid: u8) -> serde_json::Value {
    let mut inst = vrrp_instance("api", vip, vrid);
    match mode {
        Mode::V3Multicast | Mode::V6Multicast => {}
        Mode::V2Pass => {
            inst["version"] = "2".into();
            inst["advertIntervalMs"] = 1000.into();
            inst["authPass"] = "kvrpass".into();
        }
        Mode::V3Unicast => {
            inst["transport"] = "unicast".into();
            inst["unicastPeers"] =
                serde_json::json!([ip(&seg.v4(0)), ip(&seg.v4(1)), ip(&seg.v4(2))]);
        }
    }
    inst
}

/// Node 0: keelson bootstrap (70); node 1: keelson master (40); node 2: keepalived.
fn scenario(prefix: &str, subnet: u8, mode: Mode) {
    let seg = Segment::new(prefix, 3, subnet);
    let dir = tempfile::tempdir().unwrap();
    let vip = match mode {
        Mode::V6Multicast => format!("fd{subnet:02x}::100"),
        _ => seg.vip4(100),
    };
    let vrid = 40 + subnet % 50;
    let interval_ms = match mode {
        Mode::V2Pass => 1000,
        _ => 100,
    };
    // Every bound below is a wait for a takeover or an election: the RFC's time plus the
    // harness's margin for waits (timing.rs; 2 s once ran out in CI beside a build).
    let slack = WAIT_MARGIN;
    let cluster = vrrp_cluster_json(serde_json::json!([keelson_instance(
        &seg, mode, &vip, vrid
    )]));
    let dirp: &Path = dir.path();

    // 1. keepalived at 100 beats both keelson nodes.
    let mut ka = start_keepalived(&seg, dirp, 2, &keepalived_conf(&seg, mode, &vip, vrid, 100));
    let a0 = start_vrrp_agent(AGENT, &seg, dirp, &cluster, 0, "bootstrap");
    let _a1 = start_vrrp_agent(AGENT, &seg, dirp, &cluster, 1, "master");
    seg.wait_sole_holder(2, &vip, master_down(interval_ms, 100) * 2 + slack);
    seg.assert_stable(2, &vip, Duration::from_millis(3 * interval_ms));
    // The VIP on keepalived says nothing of node 0's start-up: its status names
    // keepalived only once it heard an advert after starting.
    wait_for_ok(
        "node 0 a backup of keepalived",
        master_down(interval_ms, 70) * 2 + slack,
        || {
            let st = a0.instance("api");
            let master = st["master"].as_str().unwrap_or_default();
            let from_keepalived = match mode {
                // keepalived advertises from its link-local address, as RFC 5798 wants.
                Mode::V6Multicast => master.starts_with("fe80:"),
                _ => master == ip(&seg.v4(2)),
            };
            if st["state"] == "backup" && from_keepalived && st["masterPriority"] == 100 {
                Ok(())
            } else {
                Err(st.to_string())
            }
        },
    );

    // 2. keepalived stops (priority 0): keelson node 0 (70) takes over.
    ka.term();
    seg.wait_sole_holder(0, &vip, master_down(interval_ms, 70) + slack);

    // 3. keepalived back at 50: it stays backup under keelson's 70.
    let mut ka = start_keepalived(&seg, dirp, 2, &keepalived_conf(&seg, mode, &vip, vrid, 50));
    seg.assert_stable(0, &vip, master_down(interval_ms, 50) * 2);

    // 4. keelson node 0 dies: keepalived (50) beats keelson node 1 (40).
    drop(a0);
    seg.wait_sole_holder(2, &vip, master_down(interval_ms, 50) + slack);
    seg.assert_stable(2, &vip, Duration::from_millis(3 * interval_ms));

    // 5. keepalived dies hard (SIGKILL, link cut): keelson node 1 takes over.
    ka.kill9();
    seg.set_link(2, false);
    let t = std::time::Instant::now();
    loop {
        if seg.holds(1, &vip) && !seg.holds(0, &vip) {
            break;
        }
        assert!(
            t.elapsed() < master_down(interval_ms, 40) + slack,
            "node 1 did not take over"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Root for the namespaces, keepalived for the peer.
fn can_run() -> bool {
    require_root() && require("keepalived")
}

#[test]
fn keepalived_interop_v3_multicast() {
    if !can_run() {
        return;
    }
    scenario("kvr-k3", 64, Mode::V3Multicast);
}

#[test]
fn keepalived_interop_v2_pass() {
    if !can_run() {
        return;
    }
    scenario("kvr-k2", 65, Mode::V2Pass);
}

#[test]
fn keepalived_interop_v3_unicast() {
    if !can_run() {
        return;
    }
    scenario("kvr-ku", 66, Mode::V3Unicast);
}

#[test]
fn keepalived_interop_v6_multicast() {
    if !can_run() {
        return;
    }
    scenario("kvr-k6", 68, Mode::V6Multicast);
}
