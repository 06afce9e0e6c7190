//! What the decision core asks of its runner: [`Effect`]s to carry out in order, and
//! [`Note`]s for the log (the core decides what happened; the runner words it).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::vrrp::handback::TakeOver;

/// What the runner must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send an advert with this priority to [`super::Router::destinations`] (0 when leaving).
    SendAdvert {
        /// Priority in the packet.
        priority: u8,
    },
    /// Add the VIP to the interface (and tell the proxy it is held).
    AddVip,
    /// Remove the VIP now. `handed_over`: after a hand-over's grace, when the VIP is
    /// retired instead if hand-backs are on ([`crate::net::vip::VipManager::retire`]).
    RemoveVip {
        /// The VIP went to a successor that announced it.
        handed_over: bool,
    },
    /// Gratuitous ARP / unsolicited NA for the VIP.
    Announce,
    /// Ask for the VIP: an ARP request from the node's address (IPv4), a neighbour
    /// solicitation (IPv6). Answers come back as [`super::Router::on_arp`] /
    /// [`super::Router::on_holder_answer`].
    Probe,
    /// This backup takes over because the master's adverts stopped: tell the proxy that
    /// node is gone (before the VIP's frontend opens).
    PeerDown(IpAddr),
    /// Forward segments of connections this node did not open to `to`, the holder it is
    /// about to take the VIP from ([`crate::vrrp::handback`]).
    HandBack {
        /// The old holder.
        to: IpAddr,
        /// Why it is about to lose the VIP.
        why: TakeOver,
    },
    /// Run one round of the port check against these targets ([`crate::vrrp::reach`]).
    PortRound(Vec<SocketAddr>),
    /// Something worth a log line.
    Note(Note),
}

/// What the core tells the log (the runner words it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A packet failed validation.
    Dropped {
        /// Its source.
        src: IpAddr,
        /// The drop reason.
        reason: &'static str,
    },
    /// The claim grace ran out with nobody heard: claiming alone.
    LoneClaim,
    /// The claim grace is over but another host answers for the VIP.
    GraceHolderAnswers,
    /// The claim gate opened on an advert.
    GateHeard {
        /// Its source.
        src: IpAddr,
        /// Its priority.
        priority: u8,
    },
    /// The claim gate opened on a member: Master_Down starts again.
    GatePeerKnown,
    /// Adverts arrive again after VRRP was found blocked.
    AdvertsAgain {
        /// From whom.
        src: IpAddr,
    },
    /// A master said goodbye; this backup takes over after `wait` unless one ranked
    /// before it does.
    Leaving {
        /// The leaving master.
        src: IpAddr,
        /// Our rank among the routers left.
        rank: u32,
        /// Our wait.
        wait: Duration,
    },
    /// Master_Down ran out; a backup ranked behind another waits `wait` more.
    RankWait {
        /// The master followed.
        master: IpAddr,
        /// Whether its adverts stopped (else it advertises a priority we preempt).
        silent: bool,
        /// Our rank.
        rank: u32,
        /// The wait.
        wait: Duration,
    },
    /// Leaving master for a router that outranks us; the VIP is kept for the grace.
    HandOver {
        /// The new master and its priority (`None`: a holder seen by ARP).
        by: Option<(IpAddr, u8)>,
        /// Our priority.
        priority: u8,
    },
    /// The effective priority changed.
    Priority {
        /// Before.
        from: u8,
        /// After.
        to: u8,
    },
    /// Unicast: another holder with a lower MAC, no adverts from it: keeping the VIP.
    ConflictStay {
        /// Its MAC.
        mac: [u8; 6],
    },
    /// Unicast: another holder with a higher MAC: giving the VIP up after `wait` unless
    /// an advert arrives.
    ConflictYieldPending {
        /// Its MAC.
        mac: [u8; 6],
        /// The wait.
        wait: Duration,
    },
    /// Unicast: adverts arrive while that holder announces the VIP: VRRP elects.
    ConflictVrrpElects {
        /// Its MAC.
        mac: [u8; 6],
    },
    /// Unicast: that holder no longer answers for the VIP (it gave it up): keeping it.
    ConflictGone {
        /// Its MAC.
        mac: [u8; 6],
    },
    /// Unicast: gave the VIP up to a holder that sends no adverts.
    ConflictYield {
        /// Its MAC.
        mac: [u8; 6],
    },
    /// The port drops the VIP's traffic: priority 1.
    PortDropsVip {
        /// The likely fix.
        fix: String,
    },
    /// The VIP's traffic leaves the port again.
    PortPassesVip,
    /// Another host answers for the VIP, members are live and no advert arrives.
    VrrpBlocked {
        /// The live members' names.
        peers: Vec<String>,
        /// The likely fix.
        fix: String,
    },
    /// Master_Down ran out on a silent master, but the VIP's holder answered the second
    /// path: no claim.
    ClaimHeld {
        /// The master followed, if any.
        master: Option<IpAddr>,
        /// How long no advert has arrived.
        silent_for: Duration,
    },
    /// A silent master's death is confirmed: nobody answered for the VIP.
    ConfirmedDead {
        /// The master followed, if any.
        master: Option<IpAddr>,
        /// How long no advert has arrived.
        silent_for: Duration,
        /// How long the round asked without an answer.
        asked_for: Duration,
    },
    /// Gave the VIP up to a router that keeps advertising as master after our adverts:
    /// it cannot hear us.
    DeafYield {
        /// That router.
        to: IpAddr,
        /// Its priority.
        priority: u8,
    },
    /// The first advert from another virtual router on our VRID: a host that is not a
    /// member (nor a static peer) advertising other VIPs, another version or another
    /// authentication.
    ForeignRouter {
        /// Its source.
        src: IpAddr,
        /// The VRID (ours).
        vrid: u8,
        /// The VIPs it advertises.
        addresses: Vec<IpAddr>,
        /// Why its adverts are not ours (the drop reason).
        reason: &'static str,
    },
}
