//! Confirming that a silent master is dead before a backup claims its VIP, pure: time is a
//! [`Duration`] since the instance's origin (docs/vrrp.md, "Fast failover without
//! flapping").
//!
//! Adverts that stop do not prove their master dead. A burst of lost adverts, a master whose
//! agent is stalled (a starved or descheduled process, SIGSTOP) while its node runs, and
//! adverts lost one way only all look the same to a backup, and at sub-second adverts they
//! happen often enough to move a live VIP many times a day. What tells them apart is a
//! second path that the holder's *kernel* answers, not its agent: an ARP request (IPv4) or
//! neighbour solicitation (IPv6) for the VIP. A node that still has the VIP on its interface
//! answers it whatever its agent does; a node that died, or whose link did, cannot.
//!
//! So once no advert has arrived for [`Timing::suspect_after`] (1.3 of the master's
//! intervals: an advert a third of an interval late) a backup starts a round: it asks for
//! the VIP at once and every [`Timing::probe_every`] (a quarter of an interval) until
//! someone answers. Its claim at Master_Down then needs the round to have gone unanswered
//! since its first probe, for [`Timing::answer_wait`] at least. An answer from another MAC
//! at any time since the round began means a live holder: no claim, and the next round
//! after Master_Down, then after [`HOLD_RECHECK`] as long as the silence lasts. The round
//! ends whenever an advert arrives.
//!
//! The claim stays where the RFC puts it: at Master_Down, which at 100 ms adverts leaves the
//! round 223 ms (priority 120) to 171 ms (254) of asking — about nine probes, each with an
//! ~80 % chance of an answer inside a round trip of at most 200 ms on a bad network (50 ms
//! ± 50 ms of delay each way, 10 % loss). Only at intervals under 60 ms does the answer
//! wait push the claim past Master_Down. A loaded host's kernel answers even while its
//! processes wait.

use std::time::Duration;

/// How long a round asks, at least, before it confirms a death.
pub const ANSWER_WAIT: Duration = Duration::from_millis(150);

/// After a live holder answered more than once in one silence, how long before the next
/// round (and the next decision). A master whose adverts the network drops (protocol 112
/// blocked) stays silent for good: its backups then ask about once a second, not at the
/// probe rate. (The first time, Master_Down: a holder handing the VIP over answers until
/// its grace ends.)
pub const HOLD_RECHECK: Duration = Duration::from_secs(1);

/// The confirmation's times, from the master's advert interval (Master_Adver_Interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// No advert for this long starts a round: 1.3 intervals, so an advert a third of an
    /// interval late starts one, and the round has most of Master_Down to ask.
    pub suspect_after: Duration,
    /// Probes of one round, this far apart until one is answered: a quarter of an interval,
    /// 20-250 ms.
    pub probe_every: Duration,
    /// A round that has had no answer for this long since its first probe may confirm the
    /// death ([`ANSWER_WAIT`]; the claim also waits for Master_Down).
    pub answer_wait: Duration,
}

impl Timing {
    /// The times for a master advertising every `interval`.
    pub fn for_interval(interval: Duration) -> Self {
        Timing {
            suspect_after: interval * 13 / 10,
            probe_every: (interval / 4)
                .clamp(Duration::from_millis(20), Duration::from_millis(250)),
            answer_wait: ANSWER_WAIT,
        }
    }

    /// How long after the last advert the death of a silent master is confirmed at the
    /// earliest (with Master_Down `master_down`): the later of Master_Down and the end of
    /// the first round's answer wait — Master_Down at intervals of 60 ms and more. The
    /// detection part of the failover bound.
    pub fn confirmed_after(&self, master_down: Duration) -> Duration {
        master_down.max(self.suspect_after + self.answer_wait)
    }
}

/// What a round says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody answered within the answer wait: the holder is gone.
    Dead,
    /// Another host answered for the VIP since the round began (when: the first answer).
    Alive(Duration),
    /// Not yet known: decide again at this time (the round's answer wait ends then).
    Pending(Duration),
}

/// One round of probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Round {
    /// When its first probe went out.
    started: Duration,
    /// When the next probe is due.
    next_probe: Duration,
    /// The first answer since it started.
    answered: Option<Duration>,
}

/// The confirmation of one backup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmation {
    round: Option<Round>,
    /// After a hold: no round before this.
    rest_until: Option<Duration>,
}

impl Confirmation {
    /// An advert arrived (or this router left Backup): whatever was under way ends.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// When the next probe is due, if adverts have been quiet since `quiet_since`: the
    /// round's next probe while unanswered, or the start of the next round.
    pub fn probe_due(&self, quiet_since: Duration, t: &Timing) -> Option<Duration> {
        match self.round {
            Some(r) if r.answered.is_none() => Some(r.next_probe),
            Some(_) => None,
            None => {
                Some((quiet_since + t.suspect_after).max(self.rest_until.unwrap_or(Duration::ZERO)))
            }
        }
    }

    /// A probe went out at `now`; the first starts a round.
    pub fn probe_sent(&mut self, now: Duration, t: &Timing) {
        let r = self.round.get_or_insert(Round {
            started: now,
            next_probe: now,
            answered: None,
        });
        r.next_probe = now + t.probe_every;
        self.rest_until = None;
    }

    /// Another host answered for the VIP at `at` (its arrival).
    pub fn on_answer(&mut self, at: Duration) {
        if let Some(r) = self.round.as_mut()
            && at >= r.started
        {
            r.answered = Some(r.answered.map_or(at, |a| a.min(at)));
        }
    }

    /// Whether a round is under way.
    pub fn in_round(&self) -> bool {
        self.round.is_some()
    }

    /// The verdict at `now` (`Pending` until a round has started and run its wait).
    pub fn verdict(&self, now: Duration, t: &Timing) -> Verdict {
        match self.round {
            None => Verdict::Pending(now + t.answer_wait),
            Some(Round {
                answered: Some(at), ..
            }) => Verdict::Alive(at),
            Some(r) if now >= r.started + t.answer_wait => Verdict::Dead,
            Some(r) => Verdict::Pending(r.started + t.answer_wait),
        }
    }

    /// The holder answered and the backup held its claim: the round ends, and the next
    /// one starts no sooner than `until`.
    pub fn rest(&mut self, until: Duration) {
        self.round = None;
        self.rest_until = Some(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    #[test]
    fn timing_scales_with_the_interval_within_bounds() {
        let t = Timing::for_interval(ms(100));
        assert_eq!(t.suspect_after, ms(130));
        assert_eq!(t.probe_every, ms(25));
        assert_eq!(t.answer_wait, ms(150));
        // 100 ms adverts: Master_Down decides, as the RFC says, at every priority.
        for p in [1u64, 120, 254] {
            let md = Duration::from_micros(300_000 + (256 - p) * 100_000 / 256);
            assert_eq!(t.confirmed_after(md), md, "priority {p}");
        }
        // At 1 s adverts (a keepalived peer's) too.
        let t = Timing::for_interval(ms(1000));
        assert_eq!(t.probe_every, ms(250));
        let md = Duration::from_micros(3_531_250);
        assert_eq!(t.confirmed_after(md), md);
        // At 30 ms the round's wait ends after Master_Down (90 ms and the skew).
        let t = Timing::for_interval(ms(30));
        assert_eq!(t.probe_every, ms(20));
        assert_eq!(t.confirmed_after(ms(106)), ms(189));
    }

    #[test]
    fn an_unanswered_round_confirms_after_its_wait() {
        let t = Timing::for_interval(ms(100));
        let mut c = Confirmation::default();
        // Last advert at 1 s: the first probe is due at 1.13 s.
        assert_eq!(c.probe_due(ms(1000), &t), Some(ms(1130)));
        assert!(!c.in_round());
        c.probe_sent(ms(1130), &t);
        assert_eq!(c.probe_due(ms(1000), &t), Some(ms(1155)));
        assert_eq!(c.verdict(ms(1200), &t), Verdict::Pending(ms(1280)));
        c.probe_sent(ms(1155), &t);
        // An answer from before the round says nothing.
        c.on_answer(ms(1100));
        assert_eq!(c.verdict(ms(1353), &t), Verdict::Dead);
    }

    #[test]
    fn an_answer_holds_and_the_next_round_waits() {
        let t = Timing::for_interval(ms(100));
        let mut c = Confirmation::default();
        c.probe_sent(ms(1130), &t);
        c.on_answer(ms(1260));
        c.on_answer(ms(1133));
        assert_eq!(c.verdict(ms(1353), &t), Verdict::Alive(ms(1133)));
        assert_eq!(c.probe_due(ms(1000), &t), None, "answered: no more probes");
        c.rest(ms(2353));
        assert_eq!(c.probe_due(ms(1000), &t), Some(ms(2353)));
        assert_eq!(c.verdict(ms(2000), &t), Verdict::Pending(ms(2150)));
        // An advert ends it all.
        c.reset();
        assert_eq!(c.probe_due(ms(3000), &t), Some(ms(3130)));
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]

        /// Whatever the probes and answers, a round confirms a death only when no answer
        /// arrived since its first probe and its answer wait has run out; any answer since
        /// then keeps it alive.
        #[test]
        fn dead_only_without_an_answer_after_the_wait(
            interval_ms in 10u64..2000,
            quiet_ms in 0u64..10_000,
            probes in proptest::collection::vec(0u64..3000, 1..8),
            answers in proptest::collection::vec(0u64..13_000, 0..4),
            at_ms in 0u64..14_000,
        ) {
            let t = Timing::for_interval(ms(interval_ms));
            let mut c = Confirmation::default();
            let first = c.probe_due(ms(quiet_ms), &t).unwrap();
            let mut sent = first;
            c.probe_sent(sent, &t);
            for gap in probes {
                sent += ms(gap);
                c.probe_sent(sent, &t);
            }
            for a in &answers {
                c.on_answer(ms(*a));
            }
            let heard = answers.iter().map(|a| ms(*a)).filter(|a| *a >= first).min();
            let now = ms(at_ms);
            match c.verdict(now, &t) {
                Verdict::Dead => {
                    proptest::prop_assert!(heard.is_none());
                    proptest::prop_assert!(now >= first + t.answer_wait);
                }
                Verdict::Alive(at) => proptest::prop_assert_eq!(Some(at), heard),
                Verdict::Pending(until) => {
                    proptest::prop_assert!(heard.is_none());
                    proptest::prop_assert_eq!(until, first + t.answer_wait);
                    proptest::prop_assert!(now < until);
                }
            }
        }
    }
}
