//! The port check's side of the core: while master, what a round of the port check
//! says ([`crate::vrrp::portsec`]) moves the priority (1 while the port drops the VIP),
//! and a backup held back with no advert arriving records that VRRP does not get through.

use std::time::Duration;

use super::{Effect, Note, Router};
use crate::net::mac::Mac;
use crate::vrrp::fsm::{State, effective_priority};
use crate::vrrp::portsec::{self, Change, Problem};

impl Router {
    /// A round of the port check came back.
    pub fn on_port_round(&mut self, now: Duration, paths: &[portsec::Paths]) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.machine.state() != State::Master {
            return out;
        }
        let vip = self.spec.config.vip;
        match self.vip_check.on_round(portsec::judge_round(paths)) {
            Some(Change::Found) => {
                let fix = Problem::VipNotAllowed.fix(vip, &Mac(self.mac).to_string());
                out.push(Effect::Note(Note::PortDropsVip { fix: fix.clone() }));
                self.findings.insert(Problem::VipNotAllowed, (now, fix));
                let actions = self.machine.set_priority(now, 1);
                self.apply(now, actions, &mut out);
            }
            Some(Change::Cleared) => {
                out.push(Effect::Note(Note::PortPassesVip));
                self.findings.remove(&Problem::VipNotAllowed);
                let p = effective_priority(self.spec.base, self.weight);
                let actions = self.machine.set_priority(now, p);
                self.apply(now, actions, &mut out);
            }
            None => {}
        }
        self.sync(now);
        out
    }

    /// The priority to run with: the one health checks give, or 1 while this node's port
    /// drops the VIP (so a router whose port passes it takes over).
    pub(super) fn with_port_penalty(&self, priority: u8) -> u8 {
        if self.findings.contains_key(&Problem::VipNotAllowed) {
            1
        } else {
            priority
        }
    }

    /// Another host answers for the VIP (the callers know), a member taking part in this
    /// instance is live (members reach each other over TCP), and this backup has held back
    /// for it, with no advert arriving, for [`portsec::ADVERTS_STALE_FACTOR`] Master_Down
    /// intervals and [`portsec::ADVERTS_STALE_MIN`]: VRRP itself does not get through.
    /// (Counted from the first hold, not from the last advert: when a cluster forms, every
    /// node waits out the claim grace without adverts, then one claims and the others hear
    /// its answer a moment before its first advert.) Records the finding and says so, once.
    pub(super) fn note_blocked_adverts(&mut self, now: Duration, out: &mut Vec<Effect>) {
        let stale = (self.machine.master_down_interval() * portsec::ADVERTS_STALE_FACTOR)
            .max(portsec::ADVERTS_STALE_MIN);
        let held = *self.held_since.get_or_insert(now);
        if self.findings.contains_key(&Problem::VrrpBlocked)
            || !self.peers.participating_peer(&self.spec)
            || now.saturating_sub(held) < stale
        {
            return;
        }
        let fix = Problem::VrrpBlocked.fix(self.spec.config.vip, &Mac(self.mac).to_string());
        let peers = self.peers.others();
        out.push(Effect::Note(Note::VrrpBlocked {
            peers,
            fix: fix.clone(),
        }));
        self.findings.insert(Problem::VrrpBlocked, (now, fix));
    }
}
