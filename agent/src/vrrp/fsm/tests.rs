//! The RFC transitions and keelson's ranks, each at exact times.

use super::*;
use crate::vrrp::codec::{Auth, Version};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn machine(prio: u8, preempt: bool, primary: &str) -> Machine {
    Machine::new(
        Params {
            interval_cs: 100,
            preempt,
            primary: ip(primary),
            full_priority: prio,
        },
        prio,
    )
}

fn adv(prio: u8) -> Advert {
    Advert {
        version: Version::V3,
        vrid: 1,
        priority: prio,
        interval_cs: 100,
        addresses: vec![ip("10.0.0.5")],
        auth: Auth::None,
    }
}

#[test]
fn skew_and_master_down_follow_rfc() {
    let m = machine(100, true, "10.0.0.1");
    // (256-100)*1s/256 = 609.375 ms; 3 s + that.
    assert_eq!(m.skew(), Duration::from_micros(609_375));
    assert_eq!(m.master_down_interval(), Duration::from_micros(3_609_375));
    let m = machine(254, true, "10.0.0.1");
    assert_eq!(m.skew(), Duration::from_micros(7_812));
}

#[test]
fn lone_backup_becomes_master_after_master_down() {
    let mut m = machine(100, true, "10.0.0.1");
    assert!(m.startup(ms(0)).is_empty());
    assert_eq!(m.state(), State::Backup);
    assert_eq!(m.next_deadline(), Some(Duration::from_micros(3_609_375)));
    assert!(m.on_timer(ms(3600)).is_empty(), "early timer does nothing");
    assert_eq!(
        m.on_timer(ms(3610)),
        vec![
            Action::AddVip,
            Action::SendAdvert { priority: 100 },
            Action::Announce
        ]
    );
    assert_eq!(m.state(), State::Master);
    assert_eq!(m.next_deadline(), Some(ms(4610)));
    assert_eq!(
        m.on_timer(ms(4610)),
        vec![Action::SendAdvert { priority: 100 }]
    );
    assert_eq!(m.next_deadline(), Some(ms(5610)));
}

#[test]
fn owner_goes_master_at_once() {
    let mut m = machine(255, true, "10.0.0.1");
    assert_eq!(
        m.startup(ms(0)),
        vec![
            Action::AddVip,
            Action::SendAdvert { priority: 255 },
            Action::Announce
        ]
    );
    assert_eq!(m.state(), State::Master);
}

#[test]
fn backup_stays_while_master_advertises() {
    let mut m = machine(100, true, "10.0.0.1");
    m.startup(ms(0));
    for t in (500..20_000).step_by(1000) {
        assert!(m.on_timer(ms(t)).is_empty());
        m.on_advert(ms(t), ip("10.0.0.2"), &adv(150));
    }
    assert_eq!(m.state(), State::Backup);
    assert_eq!(m.master(), Some((ip("10.0.0.2"), 150)));
}

#[test]
fn priority_zero_makes_backup_take_over_after_skew() {
    let mut m = machine(100, true, "10.0.0.1");
    m.startup(ms(0));
    m.on_advert(ms(1000), ip("10.0.0.2"), &adv(150));
    m.on_advert(ms(1500), ip("10.0.0.2"), &adv(0));
    // Skew_Time, plus 150 ms of tie-break for an address ending in 1 (5 ms a step at
    // 1 s adverts); no rival known, so no rank's wait.
    assert_eq!(
        m.next_deadline(),
        Some(ms(1500) + Duration::from_micros(609_375) + ms(150))
    );
    assert!(m.on_timer(ms(2110)).is_empty());
    assert!(m.on_timer(ms(2260)).contains(&Action::AddVip));
}

#[test]
fn equal_backups_do_not_take_over_together_after_a_goodbye() {
    let (mut lo, mut hi) = (
        machine(90, true, "10.0.0.11"),
        machine(90, true, "10.0.0.12"),
    );
    for m in [&mut lo, &mut hi] {
        m.startup(ms(0));
        m.on_advert(ms(1000), ip("10.0.0.10"), &adv(90));
        m.on_advert(ms(1500), ip("10.0.0.10"), &adv(0));
    }
    let (t_lo, t_hi) = (lo.next_deadline().unwrap(), hi.next_deadline().unwrap());
    // Neither knows the other: only the address tie-break separates them.
    assert_eq!(t_lo - t_hi, ms(5), "the higher address goes first");
    assert!(hi.on_timer(t_hi).contains(&Action::AddVip));
    // Its first advert reaches the other before the other's timer runs out.
    lo.on_advert(t_hi + ms(1), ip("10.0.0.12"), &adv(90));
    assert!(lo.on_timer(t_lo).is_empty());
    assert_eq!(lo.state(), State::Backup);
}

/// Backups of priority `prio` at `addrs`, each knowing the others and the master
/// `10.0.0.10` as rivals at `prio`, all hearing that master and then its goodbye at
/// 1.5 s.
fn after_goodbye(prio: u8, addrs: &[&str]) -> Vec<Machine> {
    after_last_advert(prio, addrs, Some(0))
}

#[test]
fn equal_backups_rank_by_address_after_a_goodbye() {
    // .12 and .44 get the same address tie-break (12 = 44 mod 32): only the rank
    // separates them, by a whole advert interval.
    let ms_ = after_goodbye(90, &["10.0.0.11", "10.0.0.12", "10.0.0.44"]);
    let leaving = ip("10.0.0.10");
    let ranks: Vec<u32> = ms_.iter().map(|m| m.goodbye_rank(leaving)).collect();
    assert_eq!(ranks, vec![2, 1, 0], "the highest address first");
    let t: Vec<Duration> = ms_.iter().map(|m| m.next_deadline().unwrap()).collect();
    assert_eq!(t[1] - t[2], ms(1000), "one interval a rank");
    assert_eq!(t[0] - t[1], ms(1005), "one interval and the tie-break");
    // Every wait is inside Master_Down, the failover bound.
    for m in &ms_ {
        assert!(m.goodbye_wait(leaving) < m.master_down_interval());
    }
}

#[test]
fn only_the_first_ranked_takes_over_even_when_its_advert_is_late() {
    let mut ms_ = after_goodbye(90, &["10.0.0.12", "10.0.0.44"]);
    let (first, second) = (
        ms_[1].next_deadline().unwrap(),
        ms_[0].next_deadline().unwrap(),
    );
    assert!(ms_[1].on_timer(first).contains(&Action::AddVip));
    // A host that runs late (a loaded or virtualised one): the new master's advert
    // reaches the other 900 ms after it took over, still before the other's timer.
    assert!(ms_[0].on_timer(first + ms(899)).is_empty());
    ms_[0].on_advert(first + ms(900), ip("10.0.0.44"), &adv(90));
    assert!(ms_[0].on_timer(second).is_empty());
    assert_eq!(ms_[0].state(), State::Backup);
    assert_eq!(ms_[0].master(), Some((ip("10.0.0.44"), 90)));
    assert_eq!(ms_[0].transitions(), 1, "never master");
}

/// Backups of priority `prio` at `addrs`, each knowing the others and the master
/// `10.0.0.10` as rivals at `prio`, all hearing that master at `prio` at 1 s and then,
/// at 1.5 s, at `then` (`None`: its adverts stop).
fn after_last_advert(prio: u8, addrs: &[&str], then: Option<u8>) -> Vec<Machine> {
    let mut all: Vec<&str> = addrs.to_vec();
    all.push("10.0.0.10");
    addrs
        .iter()
        .map(|a| {
            let mut m = machine(prio, true, a);
            m.set_rivals(all.iter().map(|r| (ip(r), prio)).collect());
            m.startup(ms(0));
            m.on_advert(ms(1000), ip("10.0.0.10"), &adv(prio));
            if let Some(p) = then {
                m.on_advert(ms(1500), ip("10.0.0.10"), &adv(p));
            }
            m
        })
        .collect()
}

/// Both backups' Master_Down runs out at once (they heard the same last advert): the
/// first-ranked claims then, the second waits an interval more and hears it.
fn only_one_claims_at_master_down(mut ms_: Vec<Machine>) {
    let t = ms_[0].next_deadline().unwrap();
    assert_eq!(t, ms(1000) + ms_[0].master_down_interval());
    assert_eq!(
        ms_[1].next_deadline(),
        Some(t),
        "equal priorities, one deadline"
    );
    // Both timers run out together (a loaded host runs both late, say).
    let late = t + ms(300);
    assert!(ms_[1].on_timer(late).contains(&Action::AddVip), "rank 0");
    // Rank 1: an interval, and the tie-break of an address ending in 12 (95 ms).
    assert_eq!(ms_[0].rank_wait(), Some(ms(1095)));
    assert!(ms_[0].on_timer(late).is_empty());
    assert_eq!(ms_[0].next_deadline(), Some(late + ms(1095)));
    ms_[0].on_advert(late + ms(900), ip("10.0.0.44"), &adv(90));
    assert!(ms_[0].on_timer(late + ms(1095)).is_empty());
    assert_eq!(ms_[0].state(), State::Backup);
    assert_eq!(ms_[0].master(), Some((ip("10.0.0.44"), 90)));
    assert_eq!(ms_[0].transitions(), 1, "never master");
}

#[test]
fn equal_backups_preempting_a_live_master_claim_one_at_a_time() {
    // The master lives but its priority fell below theirs (a check failed): both
    // backups let Master_Down run out from its last advert at 90.
    let ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], Some(70));
    assert_eq!(ms_[0].silent_master(ms(1600)), None, "alive");
    only_one_claims_at_master_down(ms_);
}

#[test]
fn equal_backups_claim_one_at_a_time_when_the_master_dies() {
    let ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], None);
    only_one_claims_at_master_down(ms_);
}

#[test]
fn a_ranked_backup_claims_after_its_wait_when_nobody_did() {
    let mut ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], Some(70));
    let t = ms_[0].next_deadline().unwrap();
    assert!(ms_[0].on_timer(t).is_empty());
    // The first-ranked never claims (dead too, or cut off): the wait is taken once.
    assert!(ms_[0].on_timer(t + ms(1095)).contains(&Action::AddVip));
    // A whole Master_Down later, every backup of a new master starts unranked again.
    let mut b = machine(90, true, "10.0.0.12");
    b.set_rivals(ms_[1].rivals.clone());
    b.startup(ms(0));
    assert_eq!(
        b.rank_wait(),
        None,
        "no master heard: startup claims at Master_Down"
    );
    assert!(
        b.on_timer(b.next_deadline().unwrap())
            .contains(&Action::AddVip)
    );
    // And a goodbye's wait already holds the rank: no second wait at its end.
    let mut g = after_goodbye(90, &["10.0.0.12", "10.0.0.44"]);
    let end = g[0].next_deadline().unwrap();
    assert!(g[0].on_timer(end).contains(&Action::AddVip));
}

#[test]
fn goodbye_rank_follows_priority_then_address_and_is_capped() {
    let leaving = ip("10.0.0.10");
    let mut m = machine(100, true, "10.0.0.20");
    let rivals = |list: &[(&str, u8)]| list.iter().map(|(a, p)| (ip(a), *p)).collect();
    // Nobody known: first.
    assert_eq!(m.goodbye_rank(leaving), 0);
    // The leaving router, ourselves and routers that said goodbye do not count; a
    // higher priority does whatever its address, a lower one does not.
    m.set_rivals(rivals(&[
        ("10.0.0.10", 200),
        ("10.0.0.20", 200),
        ("10.0.0.30", 0),
        ("10.0.0.2", 101),
        ("10.0.0.99", 99),
    ]));
    assert_eq!(m.goodbye_rank(leaving), 1);
    // Capped: five ahead of us wait no longer than two.
    m.set_rivals(rivals(&[
        ("10.0.0.21", 100),
        ("10.0.0.22", 100),
        ("10.0.0.23", 100),
        ("10.0.0.24", 150),
        ("10.0.0.25", 150),
    ]));
    assert_eq!(m.goodbye_rank(leaving), MAX_GOODBYE_RANK);
    assert!(m.goodbye_wait(leaving) < m.master_down_interval());
}

#[test]
fn a_backup_whose_checks_fail_goes_after_every_rival() {
    let leaving = ip("10.0.0.10");
    // Whole at 120, at 70 now (a check failing): the others assume it at 120.
    let mut m = Machine::new(
        Params {
            interval_cs: 100,
            preempt: true,
            primary: ip("10.0.0.99"),
            full_priority: 120,
        },
        70,
    );
    m.set_rivals([(ip("10.0.0.11"), 120)].into_iter().collect());
    assert_eq!(m.goodbye_rank(leaving), 2, "after the one rival's rank 1");
    // The rival ranks itself behind us (it assumes us whole, at a higher address): 1.
    let mut r = machine(120, true, "10.0.0.11");
    r.set_rivals([(ip("10.0.0.99"), 120)].into_iter().collect());
    assert_eq!(r.goodbye_rank(leaving), 1);
    // Alone, nobody to go after.
    m.set_rivals(BTreeMap::new());
    assert_eq!(m.goodbye_rank(leaving), 0);
}

#[test]
fn preemption_on_and_off() {
    // Backup with higher priority ignores a lower master and takes over on Master_Down.
    let mut m = machine(200, true, "10.0.0.1");
    m.startup(ms(0));
    let mut t = 0;
    while m.state() == State::Backup && t < 10_000 {
        t += 100;
        if t % 1000 == 0 {
            m.on_advert(ms(t), ip("10.0.0.2"), &adv(100));
        }
        m.on_timer(ms(t));
    }
    assert_eq!(m.state(), State::Master);
    // 3 * 1 s + (56/256) s = 3.22 s after start: the lower adverts did not reset it.
    assert_eq!(t, 3300);

    // Without preemption the lower master keeps it.
    let mut m = machine(200, false, "10.0.0.1");
    m.startup(ms(0));
    for t in (100..20_000).step_by(100) {
        if t % 1000 == 0 {
            m.on_advert(ms(t), ip("10.0.0.2"), &adv(100));
        }
        m.on_timer(ms(t));
    }
    assert_eq!(m.state(), State::Backup);
}

#[test]
fn master_yields_to_higher_and_to_equal_with_higher_address() {
    let mut m = machine(100, true, "10.0.0.5");
    m.startup(ms(0));
    m.on_timer(ms(4000));
    assert_eq!(m.state(), State::Master);
    // Lower priority: we stay master, advertise at once and announce the VIP again
    // (the other one may have just announced it with its own MAC).
    let reassert = vec![Action::SendAdvert { priority: 100 }, Action::Announce];
    assert_eq!(m.on_advert(ms(4100), ip("10.0.0.9"), &adv(50)), reassert);
    // Equal priority, lower address: we win the same way.
    assert_eq!(m.on_advert(ms(4200), ip("10.0.0.4"), &adv(100)), reassert);
    assert_eq!(m.state(), State::Master);
    // Equal priority, higher address: we yield (and hand the VIP over).
    assert_eq!(
        m.on_advert(ms(4300), ip("10.0.0.6"), &adv(100)),
        vec![Action::HandOverVip]
    );
    assert_eq!(m.state(), State::Backup);
    assert_eq!(m.transitions(), 3);
}

#[test]
fn master_answers_priority_zero_at_once() {
    let mut m = machine(100, true, "10.0.0.5");
    m.startup(ms(0));
    m.on_timer(ms(4000));
    assert_eq!(
        m.on_advert(ms(4100), ip("10.0.0.9"), &adv(0)),
        vec![Action::SendAdvert { priority: 100 }]
    );
    assert_eq!(m.next_deadline(), Some(ms(5100)));
}

#[test]
fn own_adverts_are_ignored() {
    let mut m = machine(100, true, "10.0.0.5");
    m.startup(ms(0));
    m.on_timer(ms(4000));
    assert!(m.on_advert(ms(4100), ip("10.0.0.5"), &adv(200)).is_empty());
    assert_eq!(m.state(), State::Master);
}

#[test]
fn shutdown_sends_priority_zero_and_removes_vip() {
    let mut m = machine(100, true, "10.0.0.5");
    m.startup(ms(0));
    m.on_timer(ms(4000));
    assert_eq!(
        m.shutdown(),
        vec![Action::SendAdvert { priority: 0 }, Action::RemoveVip]
    );
    assert_eq!(m.state(), State::Initialize);
    assert_eq!(m.next_deadline(), None);
    let mut b = machine(100, true, "10.0.0.5");
    b.startup(ms(0));
    assert!(b.shutdown().is_empty());
}

#[test]
fn learns_master_interval_for_master_down() {
    let mut m = machine(100, true, "10.0.0.1");
    m.startup(ms(0));
    let mut a = adv(150);
    a.interval_cs = 10;
    m.on_advert(ms(50), ip("10.0.0.2"), &a);
    // 3 * 100 ms + (156 * 100 ms / 256) = 300 + 60.9375 ms.
    assert_eq!(
        m.next_deadline(),
        Some(ms(50) + Duration::from_micros(360_937))
    );
}

#[test]
fn priority_change_on_master_is_advertised_and_moves_the_vip() {
    let mut a = machine(150, true, "10.0.0.1");
    let mut b = machine(100, true, "10.0.0.2");
    a.startup(ms(0));
    b.startup(ms(0));
    a.on_timer(ms(3500));
    assert_eq!(a.state(), State::Master);
    b.on_advert(ms(3500), ip("10.0.0.1"), &adv(150));
    // a's check fails: 150 - 60 = 90 < 100.
    let out = a.set_priority(ms(3600), effective_priority(150, -60));
    assert_eq!(out, vec![Action::SendAdvert { priority: 90 }]);
    // b ignores the lower adverts, a sends one a second, and b takes over at its
    // Master_Down.
    let deadline = ms(3500) + b.master_down_interval();
    for t in (3600..deadline.as_millis() as u64).step_by(1000) {
        b.on_advert(ms(t), ip("10.0.0.1"), &adv(90));
        assert!(b.on_timer(ms(t)).is_empty());
    }
    assert_eq!(b.next_deadline(), Some(deadline));
    // A preemption of a live master, not a death: no "adverts stopped".
    assert_eq!(b.silent_master(deadline), None);
    assert!(b.on_timer(deadline).contains(&Action::AddVip));
    // a sees b's higher advert, steps down and hands the VIP over.
    assert_eq!(
        a.on_advert(deadline, ip("10.0.0.2"), &adv(100)),
        vec![Action::HandOverVip]
    );
    assert_eq!(a.state(), State::Backup);
    assert_eq!(a.silent_master(deadline), None, "b was just heard");
}

#[test]
fn silent_master_only_when_its_adverts_stop() {
    let mut m = machine(100, true, "10.0.0.1");
    m.startup(ms(0));
    assert_eq!(m.silent_master(ms(100)), None, "no master heard yet");
    for t in (1000..=5000).step_by(1000) {
        m.on_advert(ms(t), ip("10.0.0.2"), &adv(150));
        assert_eq!(m.silent_master(ms(t + 999)), None);
    }
    // Adverts from another, lower router say nothing about the master.
    m.on_advert(ms(7000), ip("10.0.0.3"), &adv(50));
    // The master's last advert at 5 s: silent from 8 s (three intervals), and the
    // takeover at Master_Down (8.61 s) is one after its adverts stopped.
    assert_eq!(m.silent_master(ms(7999)), None);
    assert_eq!(m.silent_master(ms(8000)), Some(ip("10.0.0.2")));
    let deadline = m.next_deadline().unwrap();
    assert_eq!(m.silent_master(deadline), Some(ip("10.0.0.2")));
    assert!(m.on_timer(deadline).contains(&Action::AddVip));
    assert_eq!(m.silent_master(deadline), None, "a master follows nobody");
}

#[test]
fn yield_to_unknown_and_restart_master_down() {
    let mut m = machine(100, true, "10.0.0.5");
    m.startup(ms(0));
    assert!(
        m.yield_to_unknown(ms(10)).is_empty(),
        "a backup has nothing to yield"
    );
    m.restart_master_down(ms(3000));
    assert_eq!(
        m.next_deadline(),
        Some(ms(3000) + m.master_down_interval()),
        "the wait starts again"
    );
    m.on_timer(ms(7000));
    assert_eq!(m.state(), State::Master);
    assert_eq!(m.yield_to_unknown(ms(8000)), vec![Action::HandOverVip]);
    assert_eq!(m.state(), State::Backup);
    assert_eq!(m.master(), None);
    assert_eq!(m.next_deadline(), Some(ms(8000) + m.master_down_interval()));
    // A master does not move its advert timer.
    m.on_timer(ms(20_000));
    m.restart_master_down(ms(20_500));
    assert_eq!(m.next_deadline(), Some(ms(21_000)));
}

#[test]
fn effective_priority_clamps() {
    assert_eq!(effective_priority(40, 50), 90);
    assert_eq!(effective_priority(40, -100), 1);
    assert_eq!(effective_priority(200, 100), 254);
    assert_eq!(effective_priority(255, -100), 255);
}
