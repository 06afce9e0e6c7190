//! A silent master: no advert from it for
//! [`crate::vrrp::confirm::Timing::suspect_after`] and no recent goodbye.
//! Before a backup claims the VIP from one, a second path (ARP / neighbour solicitation for
//! the VIP, [`crate::vrrp::confirm`]) must say that nobody holds it; the probes of that
//! confirmation go out with the ARP watch's.

use std::time::Duration;

use super::{ARP_WATCH_EVERY, Effect, Note, Router};
use crate::vrrp::confirm::{HOLD_RECHECK, Verdict};
use crate::vrrp::fsm::State;
use crate::vrrp::portsec;

/// What a silence of the master has led to so far (each is logged and counted once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Silence {
    /// Nothing yet.
    #[default]
    Quiet,
    /// The VIP's holder answered: no claim.
    Held,
    /// Nobody answered: the death is confirmed.
    Dead,
}

impl Router {
    /// While a backup's master is silent: the confirmation's next probe (not while a
    /// unicast claim gate waits: it has its own watch).
    pub(super) fn next_confirm_probe(&self) -> Option<Duration> {
        if self.machine.state() != State::Backup || !self.gate.is_open() {
            return None;
        }
        let due = self.confirm.probe_due(self.quiet_since, &self.timing())?;
        Some(match self.goodbye_until() {
            Some(until) => due.max(until),
            None => due,
        })
    }

    /// After a goodbye (the last advert heard): until when the leaver keeps the VIP, at
    /// most (it answers for it until its successor's first advert). No confirmation then:
    /// its answers say nothing about its death, and the goodbye proved adverts get through.
    pub(super) fn goodbye_until(&self) -> Option<Duration> {
        match self.last_other_advert {
            Some((at, true)) => Some(at + self.successor_bound() * portsec::ADVERTS_STALE_FACTOR),
            _ => None,
        }
    }

    /// Whether this backup's master (or whoever might hold the VIP) is silent: no advert
    /// for [`crate::vrrp::confirm::Timing::suspect_after`] and no recent goodbye. Only then does a claim need
    /// the death confirmed; a master that advertises a priority we preempt is alive.
    pub(super) fn silent(&self, now: Duration) -> bool {
        now.saturating_sub(self.quiet_since) >= self.timing().suspect_after
            && self.goodbye_until().is_none_or(|until| now >= until)
    }

    /// Sends the probes due: one frame answers both the ARP watch and the confirmation.
    pub(super) fn probe_if_due(&mut self, now: Duration, out: &mut Vec<Effect>) {
        let watch = self.next_watch_probe.is_some_and(|t| now >= t);
        let confirm = self.next_confirm_probe().is_some_and(|t| now >= t);
        if !watch && !confirm {
            return;
        }
        out.push(Effect::Probe);
        if watch {
            self.next_watch_probe = Some(now + ARP_WATCH_EVERY);
        }
        if confirm || self.confirm.in_round() {
            let t = self.timing();
            self.confirm.probe_sent(now, &t);
        }
    }

    /// Master_Down ran out on a silent master ([`Router::silent`]): whether its death is
    /// confirmed, so the claim may go ahead. Otherwise the verdict is pending (no claim
    /// before it) or the VIP's holder answered (no claim; decided again later), and false.
    pub(super) fn confirm_death(&mut self, now: Duration, out: &mut Vec<Effect>) -> bool {
        let master = self.machine.master().map(|(a, _)| a);
        let silent_for = now.saturating_sub(self.quiet_since);
        let t = self.timing();
        if !self.confirm.in_round() {
            // The round's first probe had not gone out (this backup ran late).
            out.push(Effect::Probe);
            self.confirm.probe_sent(now, &t);
        }
        match self.confirm.verdict(now, &t) {
            Verdict::Pending(until) => {
                self.claim_not_before = Some(until);
                return false;
            }
            Verdict::Alive(_) => {
                // The first hold of a silence decides again after Master_Down (a
                // holder handing the VIP over answers until its grace ends); later
                // ones once a second.
                let mut recheck = self.machine.master_down_interval();
                if self.silence == Silence::Held {
                    recheck = recheck.max(HOLD_RECHECK);
                } else {
                    self.silence = Silence::Held;
                    self.counters.claims_held += 1;
                    out.push(Effect::Note(Note::ClaimHeld { master, silent_for }));
                }
                self.machine.hold_until(now + recheck);
                self.confirm
                    .rest(now + recheck.saturating_sub(t.answer_wait.min(recheck)));
                if self.spec.unicast() {
                    self.note_blocked_adverts(now, out);
                }
                return false;
            }
            Verdict::Dead => {
                if self.silence != Silence::Dead {
                    self.silence = Silence::Dead;
                    out.push(Effect::Note(Note::ConfirmedDead {
                        master,
                        silent_for,
                        asked_for: t.answer_wait,
                    }));
                }
            }
        }
        true
    }
}
