//! Another holder of the VIP, seen by ARP or neighbour discovery rather than by VRRP:
//! its answers feed the death confirmation and the claim gate, and (unicast, IPv4) a
//! master that sees one judges the conflict ([`crate::vrrp::conflict`]) and, after a rank
//! step with that holder still answering and no router heard, gives the VIP up to it.

use std::net::IpAddr;
use std::time::Duration;

use super::{Effect, Note, Router};
use crate::vrrp::conflict::{self, ArpFrame};
use crate::vrrp::fsm::State;

/// A holder of our VIP seen by ARP that we give the VIP up to unless VRRP hears a router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingYield {
    /// When to yield.
    pub(super) at: Duration,
    /// Its MAC.
    mac: [u8; 6],
    /// A probe goes out then; the yield needs an answer from that MAC after it.
    probe_at: Duration,
    /// When that MAC last answered for (or announced) the VIP.
    seen: Duration,
}

impl Router {
    /// Whether this instance watches ARP for holders VRRP cannot see (unicast, IPv4).
    pub(super) fn arp_watch(&self) -> bool {
        self.spec.unicast() && self.spec.config.vip.is_ipv4()
    }

    /// An ARP frame seen on the interface at `at` (its arrival).
    pub fn on_arp(&mut self, at: Duration, arp: &ArpFrame) -> Vec<Effect> {
        let mut out = Vec::new();
        let IpAddr::V4(vip) = self.spec.config.vip else {
            return out;
        };
        if arp.sender_ip == vip && arp.sender_mac != self.mac {
            self.holder_seen = Some(at);
            self.confirm.on_answer(at);
            if let Some(p) = self.pending_yield.as_mut()
                && p.mac == arp.sender_mac
            {
                p.seen = p.seen.max(at);
            }
        }
        if !self.arp_watch() {
            return out;
        }
        let verdict = conflict::judge(
            arp,
            self.mac,
            vip,
            self.machine.state() == State::Master,
            self.last_other_advert.map(|(t, _)| at.saturating_sub(t)),
            self.machine.master_down_interval(),
        );
        match verdict {
            conflict::Verdict::Ignore => {}
            conflict::Verdict::Stay => {
                self.counters.arp_conflicts += 1;
                out.push(Effect::Note(Note::ConflictStay {
                    mac: arp.sender_mac,
                }));
                out.push(Effect::Announce);
            }
            conflict::Verdict::Yield => {
                self.counters.arp_conflicts += 1;
                // Two routers that claimed at the same moment (equal rank, the tie-break a
                // millisecond apart) see each other's gratuitous ARP and advert together,
                // the ARP socket sometimes first: judged at once, both yielded (one to the
                // other's advert, one to its ARP) and nobody held the VIP. A rank step is
                // time for the other one's advert; and the other must still answer for the
                // VIP at the end (it may have yielded to us by VRRP meanwhile, its adverts
                // never reaching us: then both gave the VIP up).
                if self.pending_yield.is_none() {
                    let wait = self.machine.rank_step();
                    out.push(Effect::Note(Note::ConflictYieldPending {
                        mac: arp.sender_mac,
                        wait,
                    }));
                    let probe_at = at + wait / 2;
                    self.pending_yield = Some(PendingYield {
                        at: at + wait,
                        mac: arp.sender_mac,
                        probe_at,
                        seen: at,
                    });
                    self.next_watch_probe =
                        Some(self.next_watch_probe.map_or(probe_at, |t| t.min(probe_at)));
                }
            }
        }
        out
    }

    /// Another host answered a neighbour solicitation for the (IPv6) VIP at `at`.
    pub fn on_holder_answer(&mut self, at: Duration) {
        self.holder_seen = Some(at);
        self.confirm.on_answer(at);
    }

    /// The wait after a [`conflict::Verdict::Yield`] is over: still master and VRRP still
    /// sees no router ([`conflict::vrrp_sees_a_router`], the verdict's own rule, judged
    /// again), it is a holder VRRP cannot hear; give the VIP up. Not "no advert since its
    /// frame": an advert's time is when the kernel received it, which can be before the ARP
    /// frame that was read first.
    pub(super) fn yield_to_silent_holder(&mut self, now: Duration, out: &mut Vec<Effect>) {
        let Some(pending) = self.pending_yield.take() else {
            return;
        };
        if self.machine.state() != State::Master {
            return;
        }
        if conflict::vrrp_sees_a_router(
            self.last_other_advert.map(|(t, _)| now.saturating_sub(t)),
            self.machine.master_down_interval(),
        ) {
            out.push(Effect::Note(Note::ConflictVrrpElects { mac: pending.mac }));
            return;
        }
        if pending.seen < pending.probe_at {
            out.push(Effect::Note(Note::ConflictGone { mac: pending.mac }));
            return;
        }
        self.counters.conflict_yields += 1;
        out.push(Effect::Note(Note::ConflictYield { mac: pending.mac }));
        let actions = self.machine.yield_to_unknown(now);
        self.gate.close(now);
        self.holder_logged = false;
        self.apply(now, actions, out);
    }
}
