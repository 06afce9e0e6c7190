//! The decision core alone (exact decisions at exact times), and several cores over a
//! simulated segment ([`sim`]): loss, jitter, stalled agents, dead nodes, partitions and
//! one-way loss, with the properties the failover promises checked over random runs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use keelson_cluster::Role;
use keelson_cluster::cluster::{RolePriorities, VrrpInstanceConfig, VrrpTransport, VrrpVersion};

use super::*;
use crate::vrrp::codec::{Auth, GROUP_V4, Version};
use crate::vrrp::conflict::ArpFrame;

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

const VIP: [u8; 4] = [10, 0, 0, 5];

fn vip() -> IpAddr {
    IpAddr::from(VIP)
}

fn addr(i: usize) -> IpAddr {
    IpAddr::from([10, 0, 0, 10 + i as u8])
}

fn mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, 10 + i as u8]
}

fn config(interval_ms: u32, transport: VrrpTransport) -> VrrpInstanceConfig {
    VrrpInstanceConfig {
        name: "api".into(),
        vip: vip(),
        vrid: 7,
        version: VrrpVersion::V3,
        advert_interval_ms: interval_ms,
        transport,
        unicast_peers: vec![],
        claim_grace_ms: None,
        auth_pass: None,
        preempt: true,
        garp_refresh_secs: 60,
        handback_secs: 0,
        priorities: RolePriorities {
            bootstrap: None,
            master: Some(120),
            worker: None,
        },
        checks: vec![],
        required_checks: vec![],
        follows: None,
    }
}

/// Node `i` of a segment of masters at priority 120, advertising every `interval_ms`.
fn router(i: usize, interval_ms: u32, transport: VrrpTransport) -> Router {
    Router::new(
        Setup {
            spec: Spec {
                config: config(interval_ms, transport),
                base: 120,
                iface: "eth0".into(),
                primary: addr(i),
                own: vec![addr(i)],
                companions: vec![],
            },
            node: DnsLabel::new(format!("m{i}")).unwrap(),
            mac: mac(i),
            weight: 0,
            claim_grace: ms(1400),
            heard_retention: Duration::from_secs(30),
            port_check_port: 22625,
        },
        Duration::ZERO,
    )
}

fn member(i: usize) -> Member {
    Member {
        name: DnsLabel::new(format!("m{i}")).unwrap(),
        role: Role::Master,
        addresses: vec![addr(i)],
        version: "test".into(),
    }
}

fn adv(priority: u8, interval_ms: u16) -> Advert {
    Advert {
        version: Version::V3,
        vrid: 7,
        priority,
        interval_cs: interval_ms / 10,
        addresses: vec![vip()],
        auth: Auth::None,
    }
}

/// An ARP reply for the VIP from node `i`.
fn answer(i: usize) -> ArpFrame {
    ArpFrame {
        op: 2,
        sender_mac: mac(i),
        sender_ip: VIP.into(),
        target_ip: Ipv4Addr::new(10, 0, 0, 11),
    }
}

/// Runs `r`'s timers from `from` up to `to` (every wake-up on the way), collecting effects
/// with the time each came.
fn run_timers(r: &mut Router, from: Duration, to: Duration) -> Vec<(Duration, Effect)> {
    let mut out = Vec::new();
    let mut now = from;
    while let Some(t) = r.next_wakeup().filter(|t| *t <= to) {
        now = t.max(now);
        for e in r.on_timer(now) {
            out.push((now, e));
        }
    }
    out
}

fn claimed_at(effects: &[(Duration, Effect)]) -> Option<Duration> {
    effects
        .iter()
        .find(|(_, e)| *e == Effect::AddVip)
        .map(|(t, _)| *t)
}

fn probes(effects: &[(Duration, Effect)]) -> Vec<Duration> {
    effects
        .iter()
        .filter(|(_, e)| *e == Effect::Probe)
        .map(|(t, _)| *t)
        .collect()
}

/// A backup (node 1) that follows node 0, whose last advert arrives at 1 s.
fn follower() -> Router {
    let mut r = router(1, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    for t in (100..=1000).step_by(100) {
        r.on_advert(ms(t), addr(0), &adv(120, 100));
    }
    r
}

#[test]
fn a_silent_master_is_claimed_once_nobody_answers_for_its_vip() {
    let mut r = follower();
    let effects = run_timers(&mut r, ms(1000), ms(2000));
    // 1.3 intervals without an advert: a probe at once, then every 25 ms until the claim.
    let sent = probes(&effects);
    assert_eq!(sent[..3], [ms(1130), ms(1155), ms(1180)]);
    assert_eq!(sent.len(), 9, "{sent:?}");
    // At Master_Down (353 ms), as the RFC says: nobody answered in the 223 ms asked.
    assert_eq!(claimed_at(&effects), Some(Duration::from_micros(1_353_125)));
    assert!(effects.iter().any(|(_, e)| matches!(
        e,
        Effect::Note(Note::ConfirmedDead { master: Some(m), .. }) if *m == addr(0)
    )));
    assert!(
        effects.iter().any(|(_, e)| *e == Effect::PeerDown(addr(0))),
        "the proxy hears that node 0 is gone"
    );
    assert_eq!(r.machine().state(), State::Master);
}

#[test]
fn a_silent_master_whose_vip_answers_keeps_it() {
    let mut r = follower();
    let effects = run_timers(&mut r, ms(1000), ms(1140));
    assert_eq!(probes(&effects), [ms(1130)]);
    // Its kernel answers (the agent is stalled, or its adverts are lost).
    assert!(r.on_arp(ms(1131), &answer(0)).is_empty());
    let effects = run_timers(&mut r, ms(1140), ms(1400));
    assert_eq!(claimed_at(&effects), None);
    assert!(probes(&effects).is_empty(), "answered: no more probes");
    assert!(effects.iter().any(|(_, e)| matches!(
        e,
        Effect::Note(Note::ClaimHeld { master: Some(m), .. }) if *m == addr(0)
    )));
    // Held at Master_Down (1.353 s): decided again a Master_Down on, after a round.
    let effects = run_timers(&mut r, ms(1400), ms(1560));
    assert_eq!(probes(&effects), [ms(1556) + Duration::from_micros(250)]);
    r.on_arp(ms(1557), &answer(0));
    // Held again at 1.706 s: from now on once a second.
    let effects = run_timers(&mut r, ms(1560), ms(2500));
    assert_eq!(claimed_at(&effects), None);
    assert!(probes(&effects).is_empty(), "{effects:?}");
    assert_eq!(r.snapshot(ms(2500)).counters.claims_held, 1, "one silence");
    let effects = run_timers(&mut r, ms(2500), ms(2560));
    assert_eq!(probes(&effects), [ms(2556) + Duration::from_micros(250)]);
    // Its adverts come back: nothing moved.
    r.on_advert(ms(2560), addr(0), &adv(120, 100));
    let effects = run_timers(&mut r, ms(2560), ms(2680));
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(r.machine().state(), State::Backup);
    assert_eq!(r.machine().transitions(), 1);
}

#[test]
fn an_answer_from_before_the_round_or_from_ourselves_proves_nothing() {
    let mut r = follower();
    r.on_arp(ms(1100), &answer(0));
    let mut own = answer(1);
    own.sender_mac = mac(1);
    let effects = run_timers(&mut r, ms(1000), ms(1160));
    assert_eq!(probes(&effects), [ms(1130), ms(1155)]);
    r.on_arp(ms(1158), &own);
    let effects = run_timers(&mut r, ms(1160), ms(2000));
    assert_eq!(claimed_at(&effects), Some(Duration::from_micros(1_353_125)));
}

#[test]
fn a_goodbye_is_taken_over_without_asking() {
    let mut r = follower();
    r.on_advert(ms(1050), addr(0), &adv(0, 100));
    let effects = run_timers(&mut r, ms(1050), ms(2000));
    assert!(probes(&effects).is_empty(), "{effects:?}");
    // Skew_Time (53 ms at 120) and the tie-break of .11 (20 steps of a 500 ms rank step / 200).
    assert_eq!(
        claimed_at(&effects),
        Some(ms(1050) + Duration::from_micros(53_125) + ms(50))
    );
}

#[test]
fn preempting_a_live_lower_master_asks_nobody() {
    let mut r = router(1, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    let mut effects = Vec::new();
    let mut t = ms(0);
    while r.machine().state() == State::Backup && t < ms(2000) {
        t += ms(100);
        r.on_advert(t, addr(0), &adv(100, 100));
        effects.extend(run_timers(&mut r, t, t + ms(99)));
    }
    assert!(probes(&effects).is_empty(), "{effects:?}");
    assert_eq!(claimed_at(&effects), Some(Duration::from_micros(353_125)));
}

#[test]
fn a_master_gives_way_to_a_router_that_cannot_hear_it() {
    // Node 2 (higher address, equal priority) is master; node 1 cannot hear it, claims,
    // and its adverts reach node 2.
    let mut r = router(2, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    run_timers(&mut r, ms(0), ms(600));
    assert_eq!(r.machine().state(), State::Master);
    // The first: answered (an advert and an announcement), as when two claimed at once.
    let first = r.on_advert(ms(1000), addr(1), &adv(120, 100));
    assert!(
        first.contains(&Effect::SendAdvert { priority: 120 }),
        "{first:?}"
    );
    assert!(first.contains(&Effect::Announce));
    let again = r.on_advert(ms(1100), addr(1), &adv(120, 100));
    assert!(again.contains(&Effect::Announce), "still answered");
    let last = r.on_advert(ms(1200), addr(1), &adv(120, 100));
    assert!(
        last.contains(&Effect::RemoveVip { handed_over: false }),
        "its third advert after our answer: it cannot hear us ({last:?})"
    );
    assert_eq!(r.machine().state(), State::Backup);
    assert_eq!(r.snapshot(ms(1200)).counters.deaf_yields, 1);
    // As a backup it follows node 1 though it could preempt it on the address...
    for t in (1300..5000).step_by(100) {
        r.on_advert(ms(t), addr(1), &adv(120, 100));
        assert!(claimed_at(&run_timers(&mut r, ms(t), ms(t + 99))).is_none());
    }
    // ...and even at a lower priority, until the retry.
    for t in (5000..8000).step_by(100) {
        r.on_advert(ms(t), addr(1), &adv(110, 100));
        assert!(claimed_at(&run_timers(&mut r, ms(t), ms(t + 99))).is_none());
    }
}

#[test]
fn a_contest_resolved_by_the_rfc_yield_is_no_deafness() {
    let mut r = router(2, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    run_timers(&mut r, ms(0), ms(600));
    r.on_advert(ms(1000), addr(1), &adv(120, 100));
    // Node 1 heard our answer and yielded; much later it claims again (node 2 died and
    // came back, say): a new contest, answered again.
    let later = r.on_advert(ms(9000), addr(1), &adv(120, 100));
    assert!(later.contains(&Effect::Announce), "{later:?}");
    assert_eq!(r.machine().state(), State::Master);
}

#[test]
fn at_fast_adverts_a_rank_is_worth_half_a_second() {
    // Three backups at 120 hear node 0's last advert at 1 s; node 2 ranks first.
    let mut rs: Vec<Router> = (1..=3)
        .map(|i| router(i, 100, VrrpTransport::Unicast))
        .collect();
    let members: Vec<Member> = (0..=3).map(member).collect();
    for r in &mut rs {
        r.start(ms(0));
        r.set_members(ms(0), &members);
        r.on_advert(ms(1000), addr(0), &adv(120, 100));
    }
    let claims: Vec<Option<Duration>> = rs
        .iter_mut()
        .map(|r| claimed_at(&run_timers(r, ms(1000), ms(3000))))
        .collect();
    // Node 3 (highest address) first at Master_Down; node 2 a rank step (500 ms) and its
    // tie-break (19 x 2.5 ms) later; node 1 two steps and its tie-break later.
    let md = Duration::from_micros(1_353_125);
    assert_eq!(claims[2], Some(md));
    assert_eq!(
        claims[1],
        Some(md + ms(500) + Duration::from_micros(47_500))
    );
    assert_eq!(claims[0], Some(md + ms(1000) + ms(50)));
}

#[test]
fn a_unicast_backup_waits_for_its_gate_before_asking() {
    let mut r = router(1, 100, VrrpTransport::Unicast);
    r.start(ms(0));
    // Nobody known: the gate's own watch asks once a second, the confirmation does not.
    let effects = run_timers(&mut r, ms(0), ms(1300));
    assert_eq!(probes(&effects), [ms(0), ms(1000)]);
    assert_eq!(claimed_at(&effects), None);
    // The grace runs out (1.4 s) with nobody answering: claims alone after a round.
    let effects = run_timers(&mut r, ms(1300), ms(3000));
    assert_eq!(r.snapshot(ms(3000)).counters.lone_claims, 1);
    assert_eq!(claimed_at(&effects), Some(ms(1550)));
}

#[test]
fn the_port_check_runs_while_master_only() {
    let mut r = router(1, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    r.set_members(ms(0), &[member(0), member(1)]);
    let effects = run_timers(&mut r, ms(0), ms(5600));
    let rounds: Vec<_> = effects
        .iter()
        .filter_map(|(t, e)| match e {
            Effect::PortRound(targets) => Some((*t, targets.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(rounds.len(), 1);
    assert_eq!(
        rounds[0].0,
        Duration::from_micros(353_125) + PORT_CHECK_FIRST
    );
    assert_eq!(
        rounds[0].1,
        vec![
            SocketAddr::new(addr(0), 22625),
            SocketAddr::new(Ipv4Addr::new(169, 254, 169, 254).into(), 80)
        ]
    );
}

#[test]
fn adverts_are_reported_blocked_after_ten_seconds_of_holding_back() {
    let mut r = router(1, 100, VrrpTransport::Unicast);
    r.start(ms(0));
    r.set_members(ms(0), &[member(0), member(1)]);
    r.on_advert(ms(500), addr(0), &adv(120, 100));
    // From now on no advert arrives, and node 0 answers every probe at once.
    let mut t = ms(500);
    let mut reported = None;
    while t < Duration::from_secs(20) && reported.is_none() {
        let next = r.next_wakeup().unwrap();
        t = next.max(t);
        for e in r.on_timer(t) {
            match e {
                Effect::Probe => {
                    r.on_arp(t + ms(1), &answer(0));
                }
                Effect::Note(Note::VrrpBlocked { .. }) => reported = Some(t),
                Effect::AddVip => panic!("claimed beside a live holder at {t:?}"),
                _ => {}
            }
        }
    }
    // The first hold at Master_Down (0.853 s), the report on the first recheck 10 s after.
    let at = reported.expect("never reported");
    assert!(
        at >= ms(853) + Duration::from_secs(10) && at <= ms(853) + Duration::from_secs(12),
        "reported at {at:?}"
    );
}

/// `advert` from `src` as the socket hands it over (multicast, TTL 255, arrived now).
fn packet(advert: &Advert, src: IpAddr) -> Received {
    let dst = IpAddr::from(GROUP_V4);
    Received {
        src,
        dst,
        ttl: 255,
        payload: crate::vrrp::codec::encode(advert, src, dst).unwrap(),
        age: Duration::ZERO,
    }
}

fn foreign_notes(effects: &[Effect]) -> Vec<IpAddr> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Note(Note::ForeignRouter { src, .. }) => Some(*src),
            _ => None,
        })
        .collect()
}

#[test]
fn another_virtual_router_on_our_vrid_is_named_once_counted_and_moves_nothing() {
    let mut r = router(0, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    r.set_members(ms(0), &[member(0), member(1)]);
    run_timers(&mut r, ms(0), ms(1000));
    assert_eq!(r.machine().state(), State::Master);
    let stranger: IpAddr = [10, 0, 0, 99].into();
    let mut theirs = adv(250, 100);
    theirs.addresses = vec![[10, 9, 9, 9].into()];
    let mut notes = Vec::new();
    for k in 0..20u64 {
        let effects = r.on_packet(ms(1000 + k * 100), &packet(&theirs, stranger));
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::RemoveVip { .. })),
            "{effects:?}"
        );
        notes.extend(foreign_notes(&effects));
    }
    // Named once, counted every time, dropped as ever, and the VIP stays.
    assert_eq!(notes, vec![stranger]);
    let snap = r.snapshot(ms(3000));
    assert_eq!(snap.counters.foreign_adverts, 20);
    assert_eq!(snap.counters.drops.get("address"), Some(&20));
    assert_eq!(snap.state, State::Master);
    let seen = &snap.foreign[&stranger];
    assert_eq!(
        (seen.adverts, seen.first, seen.last),
        (20, ms(1000), ms(2900))
    );
    assert_eq!(seen.addresses, theirs.addresses);
    // A second stranger is named too; another version on our VRID counts the same.
    let other: IpAddr = [10, 0, 0, 98].into();
    let mut v2 = theirs.clone();
    v2.version = Version::V2;
    v2.interval_cs = 100;
    let effects = r.on_packet(ms(3000), &packet(&v2, other));
    assert_eq!(foreign_notes(&effects), vec![other]);
    assert_eq!(r.snapshot(ms(3000)).counters.drops.get("version"), Some(&1));
}

#[test]
fn a_member_or_static_peer_configured_otherwise_is_no_foreign_router() {
    let mut r = router(0, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    r.set_members(ms(0), &[member(0), member(1)]);
    let mut wrong_vip = adv(120, 100);
    wrong_vip.addresses = vec![[10, 9, 9, 9].into()];
    // A member advertising another VIP: dropped, not foreign.
    let effects = r.on_packet(ms(100), &packet(&wrong_vip, addr(1)));
    assert!(foreign_notes(&effects).is_empty(), "{effects:?}");
    // Our own virtual router from a host that is no member (yet): an advert like any.
    let effects = r.on_packet(ms(200), &packet(&adv(120, 100), addr(5)));
    assert!(foreign_notes(&effects).is_empty(), "{effects:?}");
    // Another VRID altogether: not ours to judge.
    let mut elsewhere = wrong_vip.clone();
    elsewhere.vrid = 8;
    let effects = r.on_packet(ms(300), &packet(&elsewhere, addr(6)));
    assert!(foreign_notes(&effects).is_empty(), "{effects:?}");
    let snap = r.snapshot(ms(300));
    assert_eq!(snap.counters.foreign_adverts, 0);
    assert!(snap.foreign.is_empty());
    assert_eq!(snap.counters.adverts_in, 1);
    // A static unicast peer is a member too.
    let mut cfg = config(100, VrrpTransport::Unicast);
    cfg.unicast_peers = vec![addr(7)];
    let mut u = Router::new(
        Setup {
            spec: Spec {
                config: cfg,
                base: 120,
                iface: "eth0".into(),
                primary: addr(0),
                own: vec![addr(0)],
                companions: vec![],
            },
            node: DnsLabel::new("m0").unwrap(),
            mac: mac(0),
            weight: 0,
            claim_grace: ms(1400),
            heard_retention: Duration::from_secs(30),
            port_check_port: 22625,
        },
        Duration::ZERO,
    );
    u.start(ms(0));
    let effects = u.on_packet(ms(100), &packet(&wrong_vip, addr(7)));
    assert!(foreign_notes(&effects).is_empty(), "{effects:?}");
    assert_eq!(u.snapshot(ms(100)).counters.foreign_adverts, 0);
}

#[test]
fn foreign_sources_are_remembered_up_to_a_bound_and_counted_beyond() {
    let mut r = router(0, 100, VrrpTransport::Multicast);
    r.start(ms(0));
    let mut theirs = adv(100, 100);
    theirs.addresses = vec![[10, 9, 9, 9].into()];
    let mut named = 0;
    for k in 0..(FOREIGN_SOURCES_MAX as u8 + 10) {
        let effects = r.on_packet(ms(u64::from(k)), &packet(&theirs, [10, 1, 0, k].into()));
        named += foreign_notes(&effects).len();
    }
    assert_eq!(named, FOREIGN_SOURCES_MAX);
    let snap = r.snapshot(ms(100));
    assert_eq!(snap.foreign.len(), FOREIGN_SOURCES_MAX);
    assert_eq!(
        snap.counters.foreign_adverts,
        FOREIGN_SOURCES_MAX as u64 + 10
    );
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::config())]
    /// Whatever mix of our adverts, a member's with another VIP and strangers' arrives: the
    /// strangers' with other VIPs are counted exactly, each stranger named once.
    #[test]
    fn foreign_adverts_are_counted_exactly_and_named_once(
        packets in proptest::collection::vec((0u8..8, proptest::bool::ANY, 1u8..255), 1..60)
    ) {
        let mut r = router(0, 100, VrrpTransport::Multicast);
        r.start(ms(0));
        r.set_members(ms(0), &[member(0), member(1)]);
        let (mut expected, mut named) = (0u64, Vec::new());
        let mut strangers = std::collections::BTreeSet::new();
        for (k, (from, ours, priority)) in packets.into_iter().enumerate() {
            // 0: the member node 1; others: strangers.
            let src = if from == 0 { addr(1) } else { IpAddr::from([10, 1, 0, from]) };
            let mut a = adv(priority, 100);
            if !ours {
                a.addresses = vec![[10, 9, 9, 9].into()];
                if from != 0 {
                    expected += 1;
                    strangers.insert(src);
                }
            }
            named.extend(foreign_notes(&r.on_packet(ms(10 * k as u64), &packet(&a, src))));
        }
        let snap = r.snapshot(ms(1000));
        proptest::prop_assert_eq!(snap.counters.foreign_adverts, expected);
        proptest::prop_assert_eq!(named.len(), strangers.len());
        proptest::prop_assert_eq!(snap.foreign.keys().copied().collect::<std::collections::BTreeSet<_>>(), strangers);
    }
}

mod sim;

/// Adverts from more addresses than [`MAX_HEARD`]: the router keeps the newest, forgets
/// (and counts) the oldest, and its fan-out stays within the bound; past the retention a
/// new router takes the place of stale ones without counting.
#[test]
fn routers_heard_are_bounded() {
    let mut r = router(0, 100, VrrpTransport::Unicast);
    let src = |i: usize| IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
    let n = MAX_HEARD + 10;
    for i in 0..n {
        r.on_advert(ms(i as u64), src(i), &adv(100, 100));
    }
    let now = ms(n as u64);
    let dsts = r.destinations(now);
    assert_eq!(dsts.len(), MAX_HEARD);
    assert!(!dsts.contains(&src(0)) && !dsts.contains(&src(9)));
    assert!(dsts.contains(&src(10)) && dsts.contains(&src(n - 1)));
    assert_eq!(r.snapshot(now).counters.heard_forgotten, 10);
    let later = now + Duration::from_secs(31);
    r.on_advert(later, src(n), &adv(100, 100));
    assert_eq!(r.destinations(later), vec![src(n)]);
    assert_eq!(r.snapshot(later).counters.heard_forgotten, 10);
}
