//! A network that blocks multicast. A bootstrap and three masters in namespaces
//! on a bridge whose nftables rule drops every multicast frame (the test checks that it
//! does), each running `keelson-agent run` with vrrp, members and the Ignition server and
//! the `cluster.json` `keelson build` writes for the example install-config (unicast VRRP
//! and unicast members, its default), only the timers shortened (100 ms adverts, 1 s
//! renewals, 4 s expiry). In every phase exactly one node ends up holding the API VIP,
//! and the time it took is printed:
//!
//! formation with the bootstrap first; the pivot (bootstrap stops); the holder's death;
//! a cold restart of every master with what they remembered, and with nothing remembered
//! (the appliance keeps no state); a 1-vs-2 partition, healed (lone node a backup, then
//! the lone node the holder); formation with the masters first and the bootstrap later.
//!
//! Then keepalived in unicast (`unicast_src_ip` / `unicast_peer`) as one of the routers,
//! listed as a peer in `cluster.json`, with two keelson masters that find each other
//! through members.
//!
//! Needs root (namespaces), nftables, and keepalived for the second test.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunNet, master_down, start_keepalived};
use keelson_testkit::{Segment, in_netns, require, require_root, wait_for};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

const VIP: &str = "10.0.0.5";
/// Advert interval of the test (ms).
const ADVERT_MS: u64 = 100;
/// Members renewal interval of the test (s).
const RENEW_S: u64 = 1;
/// Members expiry of the test (s).
const EXPIRY_S: u64 = 4;

/// The bound the issue sets for every phase: Master_Down plus one renewal interval,
/// plus slack for process start-up and the TLS handshakes on a busy 2-core machine.
fn bound(slack: Duration) -> Duration {
    master_down(ADVERT_MS, 1) + Duration::from_secs(RENEW_S) + slack
}

/// The claim grace of the test's cluster.json (4 adverts + 1 renewal).
fn grace() -> Duration {
    Duration::from_millis(4 * ADVERT_MS) + Duration::from_secs(RENEW_S)
}

/// `keelson build`'s cluster.json for examples/install-config.yaml, timers shortened.
fn cluster_json() -> serde_json::Value {
    keelson_testkit::agent::example_cluster_json(ADVERT_MS, RENEW_S, EXPIRY_S)
}

/// What [`Phases::converge`] saw.
struct Converged {
    holder: usize,
    after_event: Duration,
    after_ready: Option<Duration>,
    /// When the sole holder was first seen.
    seen: Instant,
}

/// The cluster: nodes with `roles` (named `bootstrap` or `<role>-<index>`) on a bridge that
/// drops multicast, running vrrp, members and the Ignition server.
fn new_cluster(prefix: &str, roles: &[&str], cluster: serde_json::Value) -> RunNet {
    // Subnet 0: the example's machine network 10.0.0.0/16, inside our own namespaces.
    let seg = Segment::new(prefix, roles.len(), 0);
    seg.drop_multicast();
    let names: Vec<String> = roles
        .iter()
        .enumerate()
        .map(|(i, role)| match *role {
            "bootstrap" => "bootstrap".into(),
            role => format!("{role}-{i}"),
        })
        .collect();
    let nodes: Vec<(&str, &str)> = names
        .iter()
        .map(String::as_str)
        .zip(roles.iter().copied())
        .collect();
    // As `keelson build`: member records are authenticated.
    RunNet::new(AGENT, seg, cluster, &nodes, "vrrp,members,ignition")
}

/// Kills `nodes`, deletes what they remembered, starts them all again, and waits for one
/// of them to hold the VIP (`limit` after all are ready).
fn restart_forgetting(
    c: &mut RunNet,
    nodes: &[usize],
    phase: &str,
    limit: Duration,
    settle: Duration,
) -> Converged {
    for &m in nodes {
        c.kill(m);
        c.forget(m);
    }
    for &m in nodes {
        c.start(m);
    }
    c.converge(phase, nodes, limit, settle, nodes)
}

/// Cuts node `lone` off from the others long enough for the members to expire (each side
/// then holds the VIP), heals, and waits for one holder among `nodes` again.
fn split_and_heal(
    c: &RunNet,
    lone: usize,
    nodes: &[usize],
    phase: &str,
    slack: Duration,
) -> Converged {
    c.seg.partition(&[lone]);
    std::thread::sleep(Duration::from_secs(EXPIRY_S + 2));
    let holders = c.holders();
    assert!(
        holders.len() == 2 && holders.contains(&lone),
        "[{phase}] each side holds the VIP while split: {holders:?}"
    );
    c.seg.heal();
    c.converge(phase, nodes, bound(slack), Duration::from_secs(2), &[])
}

/// What this test watches on the cluster: who holds the VIP, and the member lists.
trait Phases {
    fn holders(&self) -> Vec<usize>;
    fn converge(
        &self,
        phase: &str,
        expect: &[usize],
        limit: Duration,
        settle: Duration,
        started: &[usize],
    ) -> Converged;
    fn assert_holders(&self, phase: &str, holders: &[usize], dur: Duration);
    fn members_converge(&self, phase: &str, limit: Duration) -> Duration;
}

impl Phases for RunNet {
    /// The running nodes holding the VIP.
    fn holders(&self) -> Vec<usize> {
        self.running()
            .into_iter()
            .filter(|&i| self.seg.holds(i, VIP))
            .collect()
    }

    /// Waits until exactly one running node holds the VIP, one of `expect` (any when
    /// empty), and it stays so for `settle`. The time is counted from now (the event:
    /// a start, a stop, a kill, a heal); when nodes were started (`started`), the bound
    /// `limit` applies from the moment they are all ready, because the debug agent reads
    /// and hashes its own 200 MB binary before its Ignition server (and so its registry)
    /// listens, which takes seconds on a loaded machine.
    fn converge(
        &self,
        phase: &str,
        expect: &[usize],
        limit: Duration,
        settle: Duration,
        started: &[usize],
    ) -> Converged {
        let t = Instant::now();
        let mut ready: Option<Duration> = started.is_empty().then_some(Duration::ZERO);
        let mut checked = Duration::ZERO;
        let mut sole_since: Option<(usize, Duration)> = None;
        loop {
            // The holders first, then the clock: a holder seen by this poll took the VIP
            // before its end, not before its start (a poll takes a few hundred ms on a
            // loaded machine; timed from its start, "claimed before the grace" failed once
            // by 64 ms when the claim was on time).
            let h = self.holders();
            let now = t.elapsed();
            if ready.is_none() && now >= checked + Duration::from_millis(100) {
                checked = now;
                if started.iter().all(|&i| self.is_ready(i)) {
                    ready = Some(now);
                }
            }
            match (h.as_slice(), sole_since) {
                ([one], Some((who, _))) if *one == who => {}
                ([one], _) if expect.is_empty() || expect.contains(one) => {
                    sole_since = Some((*one, now));
                }
                _ => sole_since = None,
            }
            if let (Some((who, at)), Some(r)) = (sole_since, ready)
                && now >= at.max(r) + settle
            {
                let after_ready = at.saturating_sub(r);
                eprintln!(
                    "[{phase}] exactly one holder ({}) {:.2} s after the event{} (stable {settle:?})",
                    self.name(who),
                    at.as_secs_f64(),
                    if started.is_empty() {
                        String::new()
                    } else {
                        format!(
                            ", {:.2} s after every started node was ready (ready at {:.2} s)",
                            after_ready.as_secs_f64(),
                            r.as_secs_f64()
                        )
                    }
                );
                return Converged {
                    holder: who,
                    after_event: at,
                    after_ready: (!started.is_empty()).then_some(after_ready),
                    seen: t + at,
                };
            }
            let deadline = match ready {
                Some(r) => r + limit + settle,
                None => Duration::from_secs(60),
            };
            if now > deadline {
                self.dump();
                panic!(
                    "[{phase}] expected exactly one holder of {VIP} among {expect:?} within {limit:?} (ready at {ready:?}); holders {h:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts that the holders stay exactly `holders` for `dur`.
    fn assert_holders(&self, phase: &str, holders: &[usize], dur: Duration) {
        let t = Instant::now();
        while t.elapsed() < dur {
            let h = self.holders();
            if h != holders {
                self.dump();
                panic!(
                    "[{phase}] holders {h:?} at {:?}, expected {holders:?}",
                    t.elapsed()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every running node lists exactly the running nodes as members.
    fn members_converge(&self, phase: &str, limit: Duration) -> Duration {
        let t = Instant::now();
        let mut want: Vec<String> = self
            .running()
            .iter()
            .map(|&i| self.name(i).to_string())
            .collect();
        want.sort();
        loop {
            let lists: Vec<Vec<String>> = self
                .running()
                .iter()
                .map(|&i| self.member_names(i))
                .collect();
            if lists.iter().all(|l| *l == want) {
                eprintln!(
                    "[{phase}] members agree ({}) after {:.2} s",
                    want.join(", "),
                    t.elapsed().as_secs_f64()
                );
                return t.elapsed();
            }
            if t.elapsed() > limit {
                self.dump();
                panic!("[{phase}] member lists {lists:?}, expected {want:?} on every node");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A UDP datagram to a multicast group from node `from` never reaches a member of the
/// group on node `to`, and the bridge counted it dropped.
fn assert_multicast_blocked(seg: &Segment, from: usize, to: usize) {
    let before = seg.multicast_dropped();
    let group = Ipv4Addr::new(239, 1, 2, 3);
    let (to_addr, from_addr) = (seg.ip4(to), seg.ip4(from));
    let listen_ns = seg.nodes[to].clone();
    let receiver = in_netns(&listen_ns, move || {
        let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5999)).unwrap();
        sock.join_multicast_v4(&group, &to_addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut buf = [0u8; 64];
        sock.recv(&mut buf).is_ok()
    });
    std::thread::sleep(Duration::from_millis(200));
    let send_ns = seg.nodes[from].clone();
    in_netns(&send_ns, move || {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        sock.set_multicast_if_v4(&from_addr).unwrap();
        sock.bind(&SocketAddrV4::new(from_addr, 0).into()).unwrap();
        let sock: UdpSocket = sock.into();
        for _ in 0..5 {
            sock.send_to(b"multicast?", SocketAddrV4::new(group, 5999))
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .join()
    .unwrap();
    assert!(
        !receiver.join().unwrap(),
        "a multicast datagram crossed the bridge: the test would prove nothing"
    );
    let after = seg.multicast_dropped();
    assert!(
        after >= before + 5,
        "the bridge rule counted {} dropped frames for 5 sent",
        after - before
    );
}

#[test]
fn unicast_cluster_converges_in_every_phase_without_multicast() {
    if !require_root() || !require("nft") {
        return;
    }
    let (b, m0, m1, m2) = (0, 1, 2, 3);
    let masters = [m0, m1, m2];
    let mut c = new_cluster(
        "kvu-c",
        &["bootstrap", "master", "master", "master"],
        cluster_json(),
    );
    assert_multicast_blocked(&c.seg, m0, m1);
    let slack = Duration::from_secs(2);
    let settle = Duration::from_secs(1);
    let mut times: Vec<(&str, Converged)> = Vec::new();

    // 1. Formation, bootstrap first: alone, it waits out the grace and takes the VIP
    // (counted from before the start: the agent's own clock starts after it).
    let starting = Instant::now();
    c.start(b);
    let r = c.converge(
        "formation: bootstrap alone",
        &[b],
        grace() + slack,
        settle,
        &[],
    );
    let claimed = r.seen - starting;
    assert!(
        claimed >= grace(),
        "claimed before the grace period: {claimed:?}"
    );
    times.push(("formation: bootstrap alone (the grace)", r));
    // The masters join: they register through the VIP with the bootstrap, hear it, and
    // never claim, from their start until well after they are ready.
    c.wait_ready(&[b]);
    for m in masters {
        c.start(m);
    }
    c.assert_holders(
        "formation: masters join",
        &[b],
        grace() * 2 + Duration::from_secs(1),
    );
    let ready = c.wait_ready(&masters);
    c.assert_holders(
        "formation: masters ready",
        &[b],
        grace() + Duration::from_secs(1),
    );
    let t = c.members_converge("formation: masters join", Duration::from_secs(10));
    eprintln!(
        "masters ready {:.2} s after start; members agreed {:.2} s later",
        ready.as_secs_f64(),
        t.as_secs_f64()
    );
    for m in masters {
        let st = c.status(m);
        let gate = &vrrp_api(&st)["claimGate"];
        assert!(
            gate == "heard" || gate == "peerKnown",
            "{} claim gate: {st}",
            c.name(m)
        );
    }

    // 2. Pivot: the bootstrap stops (priority 0); one master takes over.
    c.stop(b);
    let r = c.converge("pivot", &masters, bound(slack), settle, &[]);
    times.push(("pivot: the bootstrap stops", r));

    // 3. The holder dies (SIGKILL, its port cut off at the bridge).
    let holder = c.holders()[0];
    c.kill(holder);
    c.seg.partition(&[holder]);
    let others: Vec<usize> = masters.into_iter().filter(|&m| m != holder).collect();
    let r = c.converge("holder death", &others, bound(slack), settle, &[]);
    times.push(("the holder dies", r));
    c.seg.heal();
    c.start(holder); // it comes back: its stale VIP is removed, one holder stays
    let r = c.converge(
        "dead holder returns",
        &masters,
        bound(slack),
        Duration::from_secs(2),
        &[holder],
    );
    times.push(("the dead holder returns", r));
    c.members_converge("dead holder returns", Duration::from_secs(10));

    // 4. Cold restart of every master (no bootstrap), with the masters they remembered.
    for m in masters {
        c.kill(m);
        assert!(
            c.files.state_dir(m).join("members.json").exists(),
            "{} remembered no masters",
            c.name(m)
        );
    }
    for m in masters {
        c.start(m);
    }
    let r = c.converge(
        "cold restart, remembered",
        &masters,
        bound(slack),
        settle,
        &masters,
    );
    times.push(("cold restart of all masters, peers remembered", r));

    // 5. Cold restart with nothing remembered (the appliance keeps no state): they wait
    // out the grace; the first to claim answers the others' ARP probes, so they wait on
    // until they hear it (or, claiming at the same moment, see each other through ARP and
    // all but one yield).
    let r = restart_forgetting(
        &mut c,
        &masters,
        "cold restart, nothing remembered",
        grace() + bound(slack),
        settle,
    );
    times.push(("cold restart of all masters, nothing remembered", r));
    c.members_converge("cold restart, nothing remembered", Duration::from_secs(10));

    // 6. Partition 1 vs 2, long enough for the members to expire, then healed. Lone node a
    // backup first: it takes the VIP on its side while the pair keeps its holder.
    let holder = c.holders()[0];
    let lone = masters.into_iter().find(|&m| m != holder).unwrap();
    let r = split_and_heal(&c, lone, &masters, "partition healed (lone backup)", slack);
    times.push(("1-vs-2 partition healed, the lone node was a backup", r));
    c.members_converge("partition healed (lone backup)", Duration::from_secs(10));
    // Lone node the holder: the pair elects a new one.
    let holder = c.holders()[0];
    let r = split_and_heal(
        &c,
        holder,
        &masters,
        "partition healed (lone holder)",
        slack,
    );
    times.push(("1-vs-2 partition healed, the lone node was the holder", r));

    // 7. Formation, masters first, bootstrap later (a fresh cluster: nothing remembered).
    let r = restart_forgetting(
        &mut c,
        &masters,
        "formation: masters first",
        grace() + bound(slack),
        settle,
    );
    times.push(("formation: masters first", r));
    c.forget(b);
    c.start(b);
    let r = c.converge(
        "formation: bootstrap later",
        &[b],
        grace() + bound(slack),
        Duration::from_secs(2),
        &[b],
    );
    times.push(("formation: the bootstrap later (it preempts)", r));
    c.members_converge("formation: bootstrap later", Duration::from_secs(10));

    let dropped = c.seg.multicast_dropped();
    eprintln!(
        "\ntime to exactly one holder of {VIP} (adverts {ADVERT_MS} ms, renewal {RENEW_S} s, expiry {EXPIRY_S} s, grace {:?}, Master_Down + renewal {:?}):",
        grace(),
        bound(Duration::ZERO)
    );
    eprintln!(
        "  {:<55} {:>12} {:>12}",
        "phase", "after event", "after ready"
    );
    for (phase, r) in &times {
        eprintln!(
            "  {phase:<55} {:>10.2} s {:>12}",
            r.after_event.as_secs_f64(),
            r.after_ready
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        );
        let _ = r.holder;
    }
    eprintln!("multicast frames dropped at the bridge: {dropped}");
    for i in c.running() {
        let st = c.status(i);
        eprintln!("{}: vrrp api counters {}", c.name(i), vrrp_api(&st));
    }
    // Member records were authenticated all along (cluster.json names the key), and no
    // genuine record was refused through every phase (restarts, partitions, the pivot) for
    // its MAC, key, time or address. A `replay` is tolerated: a registration still in
    // flight at one of a registry's addresses (the VIP, the node's own) can arrive after
    // the next round's at the other, older by its sequence number; it renews nothing and
    // the newer one was taken (seen once in make test; the closing note of 2026-11-25).
    for i in c.running() {
        let auth = &c.status(i)["discovery"]["auth"];
        assert_eq!(auth["authenticated"], true, "{}: {auth}", c.name(i));
        for reason in ["noMac", "badMac", "unknownKey", "stale", "addressMismatch"] {
            assert_eq!(
                auth["drops"][reason],
                0,
                "{}: genuine records dropped ({reason}): {auth}",
                c.name(i)
            );
        }
    }
}

/// keepalived in unicast mode and two keelson masters elect one holder. keelson lists only
/// keepalived in `unicastPeers`; the keelson nodes find each other through members once
/// one of them holds the VIP (before, keepalived holds it and serves no registry).
#[test]
fn keepalived_unicast_peer_and_keelson_elect_one_holder() {
    if !require_root() || !require("nft") || !require("keepalived") {
        return;
    }
    let (m0, m1, ka) = (0, 1, 2);
    let mut cluster = cluster_json();
    let ka_ip = "10.0.0.12";
    for inst in cluster["vrrp"]["instances"].as_array_mut().unwrap() {
        inst["unicastPeers"] = serde_json::json!([ka_ip]);
    }
    let mut c = new_cluster(
        "kvu-k",
        &["master", "master", "keepalived"],
        cluster.clone(),
    );
    assert_multicast_blocked(&c.seg, m0, ka);
    let vrid = cluster["vrrp"]["instances"][0]["vrid"].as_u64().unwrap();
    let conf = |prio: u8| {
        format!(
            "global_defs {{\n    router_id kvu-ka\n    vrrp_garp_master_delay 0\n}}\n\
             vrrp_instance api {{\n    state BACKUP\n    interface eth0\n    version 3\n    \
             virtual_router_id {vrid}\n    priority {prio}\n    advert_int 0.1\n    \
             unicast_src_ip {ka_ip}\n    unicast_peer {{\n        10.0.0.10\n        10.0.0.11\n    }}\n    \
             virtual_ipaddress {{\n        {VIP}/32 dev eth0\n    }}\n}}\n"
        )
    };
    let dir = c.files.dir.path().to_path_buf();
    let slack = Duration::from_secs(2);
    // keelson masters: 40 + 10 (Ignition server running) = 50.
    let ka_holds = |c: &RunNet| c.seg.holds(ka, VIP);
    let keelson_holders = |c: &RunNet| c.holders();

    // keepalived at 100 first, then the keelson masters: they hear it and stay backups.
    let mut kap = start_keepalived(&c.seg, &dir, ka, &conf(100));
    wait_for(
        "keepalived holds",
        master_down(ADVERT_MS, 100) + slack,
        || ka_holds(&c),
    );
    c.start(m0);
    c.start(m1);
    c.wait_ready(&[m0, m1]);
    let t = Instant::now();
    while t.elapsed() < grace() * 2 + Duration::from_secs(1) {
        assert!(
            ka_holds(&c) && keelson_holders(&c).is_empty(),
            "keelson claimed under keepalived's 100"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for m in [m0, m1] {
        let st = c.status(m);
        assert_eq!(vrrp_api(&st)["master"], ka_ip, "{st}");
    }

    // keepalived stops (priority 0): one keelson master takes over. They have not met
    // yet (no registry holds the VIP, and only keepalived is configured): both claim,
    // see each other through ARP, one yields and registers with the other through the VIP.
    kap.term();
    let r = c.converge(
        "keepalived stops",
        &[m0, m1],
        bound(slack),
        Duration::from_secs(1),
        &[],
    );
    let holder = r.holder;
    c.members_converge("keepalived stops: keelson members", Duration::from_secs(10));

    // keepalived back at 45: stays backup under keelson's 50.
    let mut kap = start_keepalived(&c.seg, &dir, ka, &conf(45));
    let t = Instant::now();
    while t.elapsed() < master_down(ADVERT_MS, 45) * 3 {
        assert!(
            !ka_holds(&c),
            "keepalived at 45 took the VIP from keelson at 50"
        );
        assert_eq!(keelson_holders(&c), vec![holder]);
        std::thread::sleep(Duration::from_millis(20));
    }

    // The keelson holder dies: the other keelson master (50) beats keepalived (45).
    c.kill(holder);
    c.seg.partition(&[holder]);
    let other = if holder == m0 { m1 } else { m0 };
    c.converge(
        "keelson holder dies",
        &[other],
        bound(slack),
        Duration::from_secs(1),
        &[],
    );
    assert!(!ka_holds(&c));

    // It dies too: keepalived takes over.
    c.kill(other);
    c.seg.heal();
    c.seg.partition(&[holder, other]);
    wait_for(
        "keepalived takes over",
        master_down(ADVERT_MS, 45) + slack,
        || ka_holds(&c),
    );
    kap.term();
}

/// The `api` instance's section of a status document (`vrrp` lists the instances).
fn vrrp_api(st: &serde_json::Value) -> serde_json::Value {
    st["vrrp"]
        .as_array()
        .and_then(|v| v.iter().find(|i| i["name"] == "api").cloned())
        .unwrap_or_default()
}
