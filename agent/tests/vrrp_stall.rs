//! A stalled backup does not take a live master for silent: while a backup's process is
//! stopped (SIGSTOP, as a descheduled guest or a starved host stops it) the master's adverts
//! queue on its socket and its Master_Down timer runs out; when it runs again, both are
//! ready at once, and the backup must read the adverts before it acts on the timer, each
//! counted from when it arrived (its kernel timestamp), not from when it was read. Without
//! that, the loop's `select!` takes the timer first in a share of the wake-ups and the
//! backup claims the VIP beside its master for a moment (seen on OpenStack with TCG
//! guests: the clients' connections to the brief claimant were reset).
//!
//! Needs root (namespaces).

use std::time::Duration;

use keelson_testkit::agent::{master_down, start_vrrp_agent, vrrp_cluster_json, vrrp_instance};
use keelson_testkit::{Segment, require_root, wait_for_ok};
use nix::sys::signal::{Signal, kill};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

/// Stalls this many times: the race the test guards against is lost in one wake-up out of
/// the loop's few branches, so one stall alone would rarely show it.
const STALLS: usize = 10;

#[test]
fn a_stalled_backup_reads_the_queued_adverts_before_its_timer() {
    if !require_root() {
        return;
    }
    let seg = Segment::new("kvs", 2, 66);
    let dir = tempfile::tempdir().unwrap();
    let vip = seg.vip4(100);
    let cluster = vrrp_cluster_json(serde_json::json!([vrrp_instance("api", &vip, 30)]));
    let master = start_vrrp_agent(AGENT, &seg, dir.path(), &cluster, 0, "bootstrap");
    let backup = start_vrrp_agent(AGENT, &seg, dir.path(), &cluster, 1, "master");
    seg.wait_sole_holder(0, &vip, Duration::from_secs(5));
    wait_for_ok("node 1 a backup of node 0", Duration::from_secs(5), || {
        let st = backup.instance("api");
        if st["state"] == "backup" && st["master"] == seg.ip4(0).to_string() {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
    let transitions = || backup.instance("api")["counters"]["transitions"].as_u64();
    let before = transitions();

    // Watch node 1 for the VIP the whole time.
    let watch = seg.watch_holders(&vip, &[1]);
    // Stalled for twice its Master_Down_Interval (adverts every 100 ms: ~20 queue up),
    // then running long enough to hear a few more before the next stall.
    let stall = master_down(100, 40) * 2;
    for _ in 0..STALLS {
        kill(backup.proc.pid(), Signal::SIGSTOP).unwrap();
        std::thread::sleep(stall);
        kill(backup.proc.pid(), Signal::SIGCONT).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(300));
    let seen = watch.stop();
    assert!(seg.holds(0, &vip), "the master lost {vip}");
    assert!(
        seen.is_empty(),
        "node 1 claimed {vip} after a stall while node 0 advertised throughout"
    );
    assert_eq!(
        transitions(),
        before,
        "node 1 changed state after a stall: {}",
        backup.instance("api")
    );
    drop(master);
}
