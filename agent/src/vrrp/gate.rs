//! The claim gate of a unicast instance (docs/members.md, "Claiming a VIP in unicast
//! mode"), pure: time is a [`Duration`] since the instance's origin.
//!
//! With multicast every router hears every other one, so RFC 5798's Master_Down is enough
//! before a backup claims the VIP. With unicast a router hears only the routers that know
//! its address, and at start it may know nobody: claiming after Master_Down would make
//! every node that has not yet learned its peers a holder (on a network that drops
//! multicast, all of them at once). So a unicast
//! instance does not leave Backup until the gate is open, which it is once
//!
//! - a valid advert was heard (a peer knows us, and VRRP takes it from there), or
//! - a live member that takes part in this instance is known (we register with it and it
//!   with us, so adverts flow both ways within one interval; the wait for Master_Down then
//!   starts afresh so that peer's adverts have a full interval to arrive), or
//! - the grace period ran out with neither, and nobody answers ARP for the VIP (IPv4): a
//!   lone survivor still takes it. While another host answers for the VIP, a holder exists
//!   that has not learned our address yet (its registry may still be starting): claiming
//!   would make a second holder, so the gate waits on, one second at a time, until that
//!   holder is heard or stops answering.
//!
//! After the instance yields the VIP to an unknown holder (ARP conflict, [`super::conflict`])
//! the gate closes again until one of the three happens anew.

use std::time::Duration;

use crate::status::model::GateState;

/// How recent an ARP answer for the VIP from another host must be to hold the gate.
pub const HOLDER_FRESH: Duration = Duration::from_secs(2);

/// How long the gate waits on when the grace ran out while a holder answers ARP.
pub const HOLDER_RECHECK: Duration = Duration::from_secs(1);

/// What the caller must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateEvent {
    /// Nothing changed.
    None,
    /// The grace ran out but another host holds the VIP: still waiting.
    HolderAnswers,
    /// The gate opened because a peer became known: restart the Master_Down wait.
    RestartMasterDown,
    /// The gate opened (advert or grace): the state machine may proceed as it is.
    Opened,
}

/// The gate of one instance.
#[derive(Debug, Clone)]
pub struct ClaimGate {
    grace: Duration,
    state: GateState,
    deadline: Duration,
}

impl ClaimGate {
    /// A closed gate at `now` with `grace` (unicast instances).
    pub fn closed(now: Duration, grace: Duration) -> Self {
        Self {
            grace,
            state: GateState::Waiting,
            deadline: now + grace,
        }
    }

    /// A gate that is always open (multicast instances).
    pub fn open() -> Self {
        Self {
            grace: Duration::ZERO,
            state: GateState::NotGated,
            deadline: Duration::ZERO,
        }
    }

    /// Whether the instance may leave Backup for Master.
    pub fn is_open(&self) -> bool {
        self.state != GateState::Waiting
    }

    /// The state, for `status`.
    pub fn state(&self) -> GateState {
        self.state
    }

    /// When the grace period runs out (only meaningful while waiting).
    pub fn deadline(&self) -> Option<Duration> {
        (self.state == GateState::Waiting).then_some(self.deadline)
    }

    /// A valid advert arrived.
    pub fn heard(&mut self) -> GateEvent {
        if self.state == GateState::Waiting {
            self.state = GateState::Heard;
            return GateEvent::Opened;
        }
        GateEvent::None
    }

    /// A member taking part in this instance is live.
    pub fn peer_known(&mut self) -> GateEvent {
        if self.state == GateState::Waiting {
            self.state = GateState::PeerKnown;
            return GateEvent::RestartMasterDown;
        }
        GateEvent::None
    }

    /// The timer fired at `now`: opens the gate when the grace period is over, unless
    /// another host answered ARP for the VIP within [`HOLDER_FRESH`] (`holder_seen`: when
    /// it last did).
    pub fn on_timer(&mut self, now: Duration, holder_seen: Option<Duration>) -> GateEvent {
        if self.state != GateState::Waiting || now < self.deadline {
            return GateEvent::None;
        }
        if holder_seen.is_some_and(|t| now.saturating_sub(t) <= HOLDER_FRESH) {
            self.deadline = now + HOLDER_RECHECK;
            return GateEvent::HolderAnswers;
        }
        self.state = GateState::GraceOver;
        GateEvent::Opened
    }

    /// The instance gave the VIP up to a holder it cannot hear: wait for a peer again.
    pub fn close(&mut self, now: Duration) {
        if self.state != GateState::NotGated {
            self.state = GateState::Waiting;
            self.deadline = now + self.grace;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn grace_opens_a_lone_gate() {
        let mut g = ClaimGate::closed(s(1), s(14));
        assert!(!g.is_open());
        assert_eq!(g.deadline(), Some(s(15)));
        assert_eq!(g.on_timer(s(14), None), GateEvent::None);
        assert_eq!(
            g.on_timer(s(15), Some(s(10))),
            GateEvent::Opened,
            "an old answer"
        );
        assert_eq!(g.state(), GateState::GraceOver);
        assert_eq!(g.deadline(), None);
        assert_eq!(g.heard(), GateEvent::None, "already open");
    }

    #[test]
    fn an_advert_or_a_peer_opens_it_early() {
        let mut g = ClaimGate::closed(s(0), s(14));
        assert_eq!(g.heard(), GateEvent::Opened);
        assert_eq!(g.state(), GateState::Heard);
        let mut g = ClaimGate::closed(s(0), s(14));
        assert_eq!(g.peer_known(), GateEvent::RestartMasterDown);
        assert!(g.is_open());
        assert_eq!(g.peer_known(), GateEvent::None);
    }

    #[test]
    fn closing_restarts_the_grace() {
        let mut g = ClaimGate::closed(s(0), s(10));
        g.heard();
        g.close(s(100));
        assert!(!g.is_open());
        assert_eq!(g.deadline(), Some(s(110)));
        assert_eq!(g.on_timer(s(105), None), GateEvent::None);
        assert_eq!(g.on_timer(s(110), None), GateEvent::Opened);
    }

    #[test]
    fn a_holder_answering_arp_keeps_it_waiting() {
        let mut g = ClaimGate::closed(s(0), s(14));
        assert_eq!(g.on_timer(s(14), Some(s(13))), GateEvent::HolderAnswers);
        assert!(!g.is_open());
        assert_eq!(g.deadline(), Some(s(15)));
        assert_eq!(g.on_timer(s(15), Some(s(14))), GateEvent::HolderAnswers);
        // The holder went quiet (died): the lone survivor claims.
        assert_eq!(g.on_timer(s(16), Some(s(14))), GateEvent::HolderAnswers);
        assert_eq!(g.on_timer(s(17), Some(s(14))), GateEvent::Opened);
        assert_eq!(g.state(), GateState::GraceOver);
    }

    #[test]
    fn multicast_is_never_gated() {
        let mut g = ClaimGate::open();
        assert!(g.is_open());
        g.close(s(5));
        assert!(g.is_open());
        assert_eq!(g.state(), GateState::NotGated);
    }
}
