//! The decision core of one virtual router, pure: every input comes with the time (a
//! [`Duration`] since the instance's origin) and every decision comes back as [`Effect`]s
//! for the I/O runner ([`super::instance`]) to carry out. No sockets, no clocks, no netlink;
//! unit- and property-tested without any (the tests below drive several cores over a
//! simulated segment).
//!
//! It wraps the RFC state machine ([`Machine`]) with what keelson decides around it:
//!
//! - **peers**: the routers heard (with the priority each advertised) and the live members
//!   taking part in the instance — where adverts go (unicast) and whom a backup ranks
//!   itself among ([`Machine::goodbye_rank`]);
//! - **timers**: Master_Down and the advert timer, the repeats of an announcement, the
//!   hand-over's grace, the gratuitous ARP refresh;
//! - **the death confirmation** ([`super::confirm`]): no claim on a silent master before a
//!   second path (ARP / neighbour solicitation for the VIP) says nobody holds the VIP;
//! - **a router that cannot hear us**: a master that another router keeps contesting as
//!   if it never heard our answers gives the VIP up to it ([`Machine::give_way`]);
//! - **the claim gate** of a unicast instance ([`super::gate`]) and **the ARP yield** to a
//!   holder VRRP cannot see ([`super::conflict`]);
//! - **the port check** ([`super::portsec`]): while master, whether the port passes the VIP.
//!
//! - **other virtual routers on our VRID**: an advert on our VRID for other VIPs (or of
//!   another version or authentication) from a host that is neither a member nor a static
//!   peer is another cluster's router ([`Router::on_packet`]): dropped as ever, counted,
//!   named once per source, and a finding while it is heard ([`ForeignRouter`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::codec::{Advert, GROUP_V4, GROUP_V6};
use super::confirm::{Confirmation, HOLD_RECHECK, Timing, Verdict};
use super::conflict::{self, ArpFrame};
use super::fsm::{Action, Machine, Params, State, effective_priority};
use super::gate::{ClaimGate, GateEvent};
use super::handback::{self, TakeOver};
use super::portsec::{self, Change, Problem, VipCheck};
use super::socket::Received;
use super::spec::Spec;
use super::status::Counters;
use crate::dns_label::DnsLabel;
use crate::member::Member;
use crate::net::mac::Mac;
use crate::status::model::GateState;

/// When the first round of the port check runs after this node took the VIP.
pub const PORT_CHECK_FIRST: Duration = Duration::from_secs(5);
/// How often it runs while this node holds the VIP.
pub const PORT_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How long a master that leaves keeps the VIP after its successor's first advert: that
/// advert and the successor's gratuitous ARP go out together; hosts need a moment. The same
/// for a clean stop (after its goodbye) and for a master that a higher priority preempted
/// ([`Action::HandOverVip`]): both hold the VIP this long, and the successor's repeated
/// announcements ([`ANNOUNCE_FOLLOWUPS`]) put right any host that asked the leaving one.
pub const HANDOVER_GRACE: Duration = Duration::from_millis(200);

/// Announcements repeated, one advert interval apart, after each announcement as master.
/// One gratuitous ARP is not enough: when two backups take over at once (equal priorities
/// time out together), the loser's announcement can reach a host after the winner's, and a
/// lost frame does the same; the host then sends to a MAC that no longer holds the VIP until
/// its ARP entry is probed again (10-40 s on Linux) or the refresh (a minute) comes. keepalived
/// repeats its gratuitous ARPs for the same reason (`garp_master_repeat`, `garp_master_delay`).
pub const ANNOUNCE_FOLLOWUPS: u8 = 3;

/// How often a master (unicast, IPv4) asks for its own VIP by ARP, and a unicast backup
/// whose claim gate waits: is there a holder VRRP cannot hear ([`super::conflict`],
/// [`super::gate`])?
pub const ARP_WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long a backup that gave the VIP up to a router that cannot hear it follows that
/// router whatever their priorities ([`Machine::defer_to`]) before it may preempt it again.
pub const DEAF_RETRY: Duration = Duration::from_secs(60);

/// How many other virtual routers on our VRID the core remembers (each named once): a
/// bound on what a flood of forged sources can make it keep; beyond it they are counted
/// only.
pub const FOREIGN_SOURCES_MAX: usize = 16;

/// How long after its last advert another virtual router on our VRID stays a finding.
pub const FOREIGN_FINDING_HOLD: Duration = Duration::from_secs(60);

/// What the runner must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send an advert with this priority to [`Router::destinations`] (0 when leaving).
    SendAdvert {
        /// Priority in the packet.
        priority: u8,
    },
    /// Add the VIP to the interface (and tell the proxy it is held).
    AddVip,
    /// Remove the VIP now. `handed_over`: after a hand-over's grace, when the VIP is
    /// retired instead if hand-backs are on ([`super::vip::VipManager::retire`]).
    RemoveVip {
        /// The VIP went to a successor that announced it.
        handed_over: bool,
    },
    /// Gratuitous ARP / unsolicited NA for the VIP.
    Announce,
    /// Ask for the VIP: an ARP request from the node's address (IPv4), a neighbour
    /// solicitation (IPv6). Answers come back as [`Router::on_arp`] /
    /// [`Router::on_holder_answer`].
    Probe,
    /// This backup takes over because the master's adverts stopped: tell the proxy that
    /// node is gone (before the VIP's frontend opens).
    PeerDown(IpAddr),
    /// Forward segments of connections this node did not open to `to`, the holder it is
    /// about to take the VIP from ([`super::handback`]).
    HandBack {
        /// The old holder.
        to: IpAddr,
        /// Why it is about to lose the VIP.
        why: TakeOver,
    },
    /// Run one round of the port check against these targets ([`super::reach`]).
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

/// Another virtual router heard on our VRID (a finding while heard within
/// [`FOREIGN_FINDING_HOLD`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignRouter {
    /// The VIPs it last advertised.
    pub addresses: Vec<IpAddr>,
    /// Its first advert.
    pub first: Duration,
    /// Its last advert.
    pub last: Duration,
    /// Its adverts heard.
    pub adverts: u64,
}

/// The most routers heard that an instance keeps (each a destination of its adverts and a
/// rival for the VIP for the retention). Any address on the segment can send an advert that
/// passes [`Spec::validate`], so without a bound every source ever seen would be kept and
/// sent 10 adverts a second; a real segment has one master advertising, a few contenders
/// for an election's length, and the nodes that may take part are also reached as members.
pub const MAX_HEARD: usize = 256;

/// What the runner resolves for the core at start.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The instance.
    pub spec: Spec,
    /// This node's name (members with it are us).
    pub node: DnsLabel,
    /// The interface's MAC.
    pub mac: [u8; 6],
    /// The health checks' weight now.
    pub weight: i32,
    /// Unicast: the claim grace ([`keelson_cluster::cluster::VrrpInstanceConfig::claim_grace`]).
    pub claim_grace: Duration,
    /// How long a router heard stays a destination and a rival (`members.expirySecs`).
    pub heard_retention: Duration,
    /// The port the port check connects to on members.
    pub port_check_port: u16,
}

/// A holder of our VIP seen by ARP that we give the VIP up to unless VRRP hears a router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingYield {
    /// When to yield.
    at: Duration,
    /// Its MAC.
    mac: [u8; 6],
    /// A probe goes out then; the yield needs an answer from that MAC after it.
    probe_at: Duration,
    /// When that MAC last answered for (or announced) the VIP.
    seen: Duration,
}

/// While master: a router we outrank that advertises as master too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Contest {
    /// That router.
    from: IpAddr,
    /// Its first advert of this contest (we answered it).
    since: Duration,
    /// Its last one.
    last: Duration,
}

/// What a silence of the master has led to so far (each is logged and counted once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Silence {
    /// Nothing yet.
    #[default]
    Quiet,
    /// The VIP's holder answered: no claim.
    Held,
    /// Nobody answered: the death is confirmed.
    Dead,
}

/// One virtual router's decisions.
#[derive(Debug, Clone)]
pub struct Router {
    spec: Spec,
    node: DnsLabel,
    mac: [u8; 6],
    machine: Machine,
    counters: Counters,
    /// The health checks' weight.
    weight: i32,
    /// When the current state began.
    state_since: Duration,
    state_seen: State,
    /// Unicast: no claim before a peer is heard or the grace ran out.
    gate: ClaimGate,
    /// Live members (this node's own record included: callers filter by name).
    members: Vec<Member>,
    /// Routers whose valid adverts arrived: when last, and the priority advertised.
    heard: BTreeMap<IpAddr, (Duration, u8)>,
    heard_retention: Duration,
    /// When the last valid advert from another router arrived, and whether it was a goodbye.
    last_other_advert: Option<(Duration, bool)>,
    /// Adverts (priority > 0) quiet since: the last one's arrival, or entering Backup.
    quiet_since: Duration,
    /// The master that last said goodbye: its adverts stopping is no death.
    master_left: Option<IpAddr>,
    /// The death confirmation of a silent master.
    confirm: Confirmation,
    /// The confirmation's verdict is pending: no claim before this.
    claim_not_before: Option<Duration>,
    /// What this silence of the master already led to (logged and counted once).
    silence: Silence,
    /// Since when this backup holds back because another host answers for the VIP while
    /// no advert arrives (the confirmation's or the claim gate's): the report that adverts
    /// do not arrive counts from here.
    held_since: Option<Duration>,
    /// When another host last answered ARP / NS for the VIP (or announced it).
    holder_seen: Option<Duration>,
    /// The "another host answers" line of the claim gate was logged in this wait.
    holder_logged: bool,
    /// While master: a router we outrank that advertises as master too.
    contest: Option<Contest>,
    /// The router we defer to ([`Machine::defer_to`]) until when.
    deferred_until: Option<Duration>,
    /// While master: whether the port lets the VIP's traffic out.
    vip_check: VipCheck,
    /// Port security problems found, since when, and their fix.
    findings: BTreeMap<Problem, (Duration, String)>,
    port_check_port: u16,
    next_port_round: Option<Duration>,
    /// While master: the next repeat of the last announcement, and how many remain.
    followups: Option<(Duration, u8)>,
    next_refresh: Option<Duration>,
    /// Preempted: when the VIP we still hold goes.
    release_at: Option<Duration>,
    /// Unicast: a higher-MAC holder of the VIP seen by ARP, given the VIP up at `at`.
    pending_yield: Option<PendingYield>,
    /// The next ARP watch probe (unicast IPv4: master, or backup behind a closed gate).
    next_watch_probe: Option<Duration>,
    /// Other virtual routers heard on our VRID, by source (at most
    /// [`FOREIGN_SOURCES_MAX`]).
    foreign: BTreeMap<IpAddr, ForeignRouter>,
}

/// A core's status, for the runner to publish.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// State.
    pub state: State,
    /// Effective priority.
    pub priority: u8,
    /// The master last heard (or us) and its priority.
    pub master: Option<(IpAddr, u8)>,
    /// The claim gate.
    pub claim_gate: GateState,
    /// Where adverts go.
    pub destinations: Vec<IpAddr>,
    /// Counters.
    pub counters: Counters,
    /// When the current state began.
    pub state_since: Duration,
    /// Port security findings: since when, and the fix.
    pub findings: BTreeMap<Problem, (Duration, String)>,
    /// Other virtual routers heard on our VRID, by source.
    pub foreign: BTreeMap<IpAddr, ForeignRouter>,
}

impl Router {
    /// A router in Initialize at `now`; [`Router::start`] starts it.
    pub fn new(setup: Setup, now: Duration) -> Self {
        let Setup {
            spec,
            node,
            mac,
            weight,
            claim_grace,
            heard_retention,
            port_check_port,
        } = setup;
        let cfg = &spec.config;
        let machine = Machine::new(
            Params {
                interval_cs: spec.interval_cs(),
                preempt: cfg.preempt,
                primary: spec.primary,
                full_priority: effective_priority(
                    spec.base,
                    cfg.checks.iter().map(|c| c.weight).sum(),
                ),
            },
            effective_priority(spec.base, weight),
        );
        let gate = if spec.unicast() {
            ClaimGate::closed(now, claim_grace)
        } else {
            ClaimGate::open()
        };
        Router {
            node,
            mac,
            machine,
            counters: Counters::default(),
            weight,
            state_since: now,
            state_seen: State::Initialize,
            gate,
            members: Vec::new(),
            heard: BTreeMap::new(),
            heard_retention,
            last_other_advert: None,
            quiet_since: now,
            master_left: None,
            confirm: Confirmation::default(),
            claim_not_before: None,
            silence: Silence::Quiet,
            held_since: None,
            holder_seen: None,
            holder_logged: false,
            contest: None,
            deferred_until: None,
            vip_check: VipCheck::default(),
            findings: BTreeMap::new(),
            port_check_port,
            next_port_round: None,
            followups: None,
            next_refresh: None,
            release_at: None,
            pending_yield: None,
            next_watch_probe: None,
            foreign: BTreeMap::new(),
            spec,
        }
    }

    /// The instance.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The state machine (read only).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Counters the runner keeps (adverts sent, announcements).
    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// The status to publish.
    pub fn snapshot(&self, now: Duration) -> Snapshot {
        Snapshot {
            state: self.machine.state(),
            priority: self.machine.priority(),
            master: self.machine.master(),
            claim_gate: self.gate.state(),
            destinations: self.destinations(now),
            counters: self.counters.clone(),
            state_since: self.state_since,
            findings: self.findings.clone(),
            foreign: self.foreign.clone(),
        }
    }

    /// The death confirmation's times for the master followed now.
    pub fn timing(&self) -> Timing {
        Timing::for_interval(self.machine.master_interval())
    }

    /// How long a stopping master keeps the VIP for a successor to advertise, at most.
    pub fn successor_bound(&self) -> Duration {
        self.machine.successor_bound()
    }

    /// Startup (RFC 5798 §6.4.1).
    pub fn start(&mut self, now: Duration) -> Vec<Effect> {
        let actions = self.machine.startup(now);
        let mut out = Vec::new();
        self.apply(now, actions, &mut out);
        self.sync(now);
        out
    }

    /// Shutdown: a master's goodbye (priority 0) and the VIP's removal; a router within a
    /// hand-over's grace removes the VIP it still holds as handed over.
    pub fn shutdown(&mut self, now: Duration) -> Vec<Effect> {
        let actions = self.machine.shutdown();
        let mut out = Vec::new();
        self.apply(now, actions, &mut out);
        if self.release_at.take().is_some() {
            out.push(Effect::RemoveVip { handed_over: true });
        }
        self.sync(now);
        out
    }

    /// When [`Router::on_timer`] must run next, if ever.
    pub fn next_wakeup(&self) -> Option<Duration> {
        [
            self.decision_at(),
            self.release_at,
            self.followups.map(|(at, _)| at),
            self.next_refresh,
            self.pending_yield.map(|p| p.at),
            self.next_port_round,
            self.next_probe(),
            self.deferred_until,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When the state machine's next decision is due: its deadline, with a backup held
    /// back by a closed claim gate or a pending confirmation.
    fn decision_at(&self) -> Option<Duration> {
        let fsm = self.machine.next_deadline();
        match self.machine.state() {
            State::Backup => {
                let mut at = fsm?;
                if let Some(gate) = self.gate.deadline() {
                    at = at.max(gate);
                }
                if let Some(t) = self.claim_not_before {
                    at = at.max(t);
                }
                Some(at)
            }
            _ => fsm,
        }
    }

    /// The next probe of either kind.
    fn next_probe(&self) -> Option<Duration> {
        [self.next_watch_probe, self.next_confirm_probe()]
            .into_iter()
            .flatten()
            .min()
    }

    /// While a backup's master is silent: the confirmation's next probe (not while a
    /// unicast claim gate waits: it has its own watch).
    fn next_confirm_probe(&self) -> Option<Duration> {
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
    fn goodbye_until(&self) -> Option<Duration> {
        match self.last_other_advert {
            Some((at, true)) => Some(at + self.successor_bound() * portsec::ADVERTS_STALE_FACTOR),
            _ => None,
        }
    }

    /// Whether this backup's master (or whoever might hold the VIP) is silent: no advert
    /// for [`Timing::suspect_after`] and no recent goodbye. Only then does a claim need
    /// the death confirmed; a master that advertises a priority we preempt is alive.
    fn silent(&self, now: Duration) -> bool {
        now.saturating_sub(self.quiet_since) >= self.timing().suspect_after
            && self.goodbye_until().is_none_or(|until| now >= until)
    }

    /// Whether this instance watches ARP for holders VRRP cannot see (unicast, IPv4).
    fn arp_watch(&self) -> bool {
        self.spec.unicast() && self.spec.config.vip.is_ipv4()
    }

    /// Timer: whatever is due at `now`.
    pub fn on_timer(&mut self, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.deferred_until.is_some_and(|t| now >= t) {
            self.deferred_until = None;
            self.machine.defer_to(None);
        }
        if self.release_at.is_some_and(|t| now >= t) {
            self.release_at = None;
            out.push(Effect::RemoveVip { handed_over: true });
        }
        if let Some((at, left)) = self.followups
            && now >= at
        {
            out.push(Effect::Announce);
            self.followups = (left > 1).then(|| (now + self.spec.interval(), left - 1));
        }
        if self.next_refresh.is_some_and(|t| now >= t) {
            self.next_refresh = None;
            out.push(Effect::Announce);
        }
        if self.pending_yield.is_some_and(|p| now >= p.at) {
            self.yield_to_silent_holder(now, &mut out);
        }
        if self.next_port_round.is_some_and(|t| now >= t) {
            self.next_port_round = Some(now + PORT_CHECK_EVERY);
            out.push(Effect::PortRound(self.port_check_targets()));
        }
        self.probe_if_due(now, &mut out);
        match self.gate.on_timer(now, self.holder_seen) {
            GateEvent::Opened => {
                self.counters.lone_claims += 1;
                out.push(Effect::Note(Note::LoneClaim));
            }
            GateEvent::HolderAnswers => {
                self.note_blocked_adverts(now, &mut out);
                if !self.holder_logged {
                    self.holder_logged = true;
                    out.push(Effect::Note(Note::GraceHolderAnswers));
                }
            }
            _ => {}
        }
        match self.machine.state() {
            State::Backup => self.backup_due(now, &mut out),
            State::Master => {
                let actions = self.machine.on_timer(now);
                self.apply(now, actions, &mut out);
            }
            State::Initialize => {}
        }
        self.sync(now);
        out
    }

    /// Sends the probes due: one frame answers both the ARP watch and the confirmation.
    fn probe_if_due(&mut self, now: Duration, out: &mut Vec<Effect>) {
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

    /// A backup's Master_Down (or the claim gate, or the confirmation) is due: claim, wait
    /// for the rank's turn, or hold because the silent master's VIP still answers.
    fn backup_due(&mut self, now: Duration, out: &mut Vec<Effect>) {
        if !self.gate.is_open() {
            return;
        }
        let due = self.machine.next_deadline().is_some_and(|d| now >= d)
            && self.claim_not_before.is_none_or(|t| now >= t);
        if !due {
            return;
        }
        self.claim_not_before = None;
        let master = self.machine.master().map(|(a, _)| a);
        let silent_for = now.saturating_sub(self.quiet_since);
        if self.silent(now) {
            let t = self.timing();
            if !self.confirm.in_round() {
                // The round's first probe had not gone out (this backup ran late).
                out.push(Effect::Probe);
                self.confirm.probe_sent(now, &t);
            }
            match self.confirm.verdict(now, &t) {
                Verdict::Pending(until) => {
                    self.claim_not_before = Some(until);
                    return;
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
                    return;
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
        }
        let silent_master = self.machine.silent_master(now);
        // Master_Down ran out: rank ourselves among the backups that saw it too.
        self.machine.set_rivals(self.rivals(now));
        let wait = self.machine.rank_wait();
        let actions = self.machine.on_timer(now);
        if let (Some(wait), Some((m, _))) = (wait, self.machine.master()) {
            out.push(Effect::Note(Note::RankWait {
                master: m,
                silent: silent_master.is_some(),
                rank: self.machine.goodbye_rank(m),
                wait,
            }));
        }
        // Taking over because the master's adverts stopped (not after its goodbye, and not
        // when it still advertised a priority we preempt: that node lives and its backend
        // may be fine): the proxy hears of it before the VIP's frontend opens.
        if let Some(addr) = silent_master
            && self.machine.state() == State::Master
            && !self.spec.own.contains(&addr)
            && self.master_left != Some(addr)
        {
            out.push(Effect::PeerDown(addr));
        }
        self.apply(now, actions, out);
    }

    /// A packet read from the VRRP socket at `now` (it arrived `pkt.age` earlier).
    pub fn on_packet(&mut self, now: Duration, pkt: &Received) -> Vec<Effect> {
        let at = now.saturating_sub(pkt.age);
        let dropped = |core: &mut Self, reason| {
            *core.counters.drops.entry(reason).or_default() += 1;
            vec![Effect::Note(Note::Dropped {
                src: pkt.src,
                reason,
            })]
        };
        let advert = match self.spec.on_our_vrid(pkt) {
            Ok(a) => a,
            Err(reason) => return dropped(self, reason),
        };
        match self.spec.same_router(&advert) {
            Ok(()) => self.on_advert(at, pkt.src, &advert),
            Err(reason) => {
                let mut out = dropped(self, reason);
                self.on_foreign(at, pkt.src, advert, reason, &mut out);
                out
            }
        }
    }

    /// An advert on our VRID that is not of our virtual router, from `src`. From a member
    /// or a static peer it is a node of this cluster configured otherwise (a drop only);
    /// from anyone else, another cluster's router on our VRID: neither sees the other's
    /// adverts as its own, so both hold their VIPs, but any router of either that takes
    /// the other's adverts for its own (keepalived with the same VIP listed, an older
    /// agent) would follow the wrong master. Named once per source, counted, and a
    /// finding while heard.
    fn on_foreign(
        &mut self,
        at: Duration,
        src: IpAddr,
        advert: Advert,
        reason: &'static str,
        out: &mut Vec<Effect>,
    ) {
        let member = self.spec.config.unicast_peers.contains(&src)
            || self.members.iter().any(|m| m.addresses.contains(&src));
        if member {
            return;
        }
        self.counters.foreign_adverts += 1;
        if let Some(seen) = self.foreign.get_mut(&src) {
            seen.last = seen.last.max(at);
            seen.adverts += 1;
            seen.addresses = advert.addresses;
            return;
        }
        if self.foreign.len() >= FOREIGN_SOURCES_MAX {
            return;
        }
        out.push(Effect::Note(Note::ForeignRouter {
            src,
            vrid: advert.vrid,
            addresses: advert.addresses.clone(),
            reason,
        }));
        self.foreign.insert(
            src,
            ForeignRouter {
                addresses: advert.addresses,
                first: at,
                last: at,
                adverts: 1,
            },
        );
    }

    /// Records that `src` advertised `priority` at `at`, within [`MAX_HEARD`]: the routers
    /// past the retention go first, then the one heard longest ago (counted).
    fn remember_heard(&mut self, src: IpAddr, at: Duration, priority: u8) {
        if !self.heard.contains_key(&src) && self.heard.len() >= MAX_HEARD {
            let retention = self.heard_retention;
            self.heard
                .retain(|_, (t, _)| at.saturating_sub(*t) <= retention);
            if self.heard.len() >= MAX_HEARD
                && let Some(oldest) = self
                    .heard
                    .iter()
                    .min_by_key(|(_, (t, _))| *t)
                    .map(|(a, _)| *a)
            {
                self.heard.remove(&oldest);
                self.counters.heard_forgotten += 1;
            }
        }
        self.heard.insert(src, (at, priority));
    }

    /// A valid advert from `src` that arrived at `at`.
    pub fn on_advert(&mut self, at: Duration, src: IpAddr, advert: &Advert) -> Vec<Effect> {
        let mut out = Vec::new();
        self.counters.adverts_in += 1;
        if advert.priority == 0 {
            self.master_left = Some(src);
            if self.machine.deferred() == Some(src) {
                self.machine.defer_to(None);
                self.deferred_until = None;
            }
        } else if self.master_left == Some(src) {
            self.master_left = None;
        }
        self.remember_heard(src, at, advert.priority);
        self.last_other_advert = Some((at, advert.priority == 0));
        if advert.priority > 0 {
            // A router advertises: nobody is silent.
            self.quiet_since = self.quiet_since.max(at);
            self.confirm.reset();
            self.claim_not_before = None;
            self.silence = Silence::Quiet;
            self.held_since = None;
        }
        if self.findings.remove(&Problem::VrrpBlocked).is_some() {
            out.push(Effect::Note(Note::AdvertsAgain { src }));
        }
        if self.gate.heard() == GateEvent::Opened {
            out.push(Effect::Note(Note::GateHeard {
                src,
                priority: advert.priority,
            }));
        }
        // Before the state machine: the hand-back's rules are in before this node can claim.
        if self.machine.state() == State::Backup
            && !self.spec.own.contains(&src)
            && let Some(why) = handback::takes_over(
                self.spec.config.preempt,
                self.machine.priority(),
                advert.priority,
            )
        {
            out.push(Effect::HandBack { to: src, why });
        }
        if advert.priority == 0 && self.machine.state() == State::Backup {
            self.machine.set_rivals(self.rivals(at));
            out.push(Effect::Note(Note::Leaving {
                src,
                rank: self.machine.goodbye_rank(src),
                wait: self.machine.goodbye_wait(src),
            }));
        }
        if self.contested_by_a_deaf_router(at, src, advert) {
            let actions = self.machine.give_way(at, src, advert);
            self.counters.deaf_yields += 1;
            self.machine.defer_to(Some(src));
            self.deferred_until = Some(at + DEAF_RETRY);
            self.release_at = None;
            out.push(Effect::Note(Note::DeafYield {
                to: src,
                priority: advert.priority,
            }));
            self.apply(at, actions, &mut out);
        } else {
            let actions = self.machine.on_advert(at, src, advert);
            self.apply(at, actions, &mut out);
        }
        self.sync(at);
        out
    }

    /// While master: whether `src`, a router we outrank that advertises as master too, still
    /// does so with its third advert since our first answer to it (1.5 of its intervals
    /// on, whatever the jitter). A router that hears us yields to our answer within a round
    /// trip (RFC 5798 §6.4.3), and we answer each of its adverts, so one that goes on cannot
    /// hear us (adverts lost one way), and it never will yield: the VIP would have two
    /// holders for as long as that lasts. So they hold it together for two intervals and a
    /// delay, less than Master_Down (three intervals and the skew), the time a backup asks
    /// before it claims. On a bad network (0-100 ms of delay each way, 10 % loss) a router
    /// that hears us misses both answers about one contest in ten: then both give the VIP
    /// up, and the next Master_Down elects one. Updates the contest.
    fn contested_by_a_deaf_router(&mut self, at: Duration, src: IpAddr, advert: &Advert) -> bool {
        if self.machine.state() != State::Master
            || advert.priority == 0
            || self.spec.own.contains(&src)
        {
            self.contest = None;
            return false;
        }
        let ours = (self.machine.priority(), self.spec.primary);
        if (advert.priority, src) > ours {
            // It outranks us: the RFC's yield.
            return false;
        }
        let interval = Duration::from_millis(u64::from(advert.interval_cs) * 10);
        match self.contest.as_mut() {
            Some(c) if c.from == src && at.saturating_sub(c.last) <= interval * 4 => {
                c.last = at;
                at.saturating_sub(c.since) >= interval * 3 / 2
            }
            _ => {
                self.contest = Some(Contest {
                    from: src,
                    since: at,
                    last: at,
                });
                false
            }
        }
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
    fn yield_to_silent_holder(&mut self, now: Duration, out: &mut Vec<Effect>) {
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

    /// The live members changed.
    pub fn set_members(&mut self, now: Duration, members: &[Member]) -> Vec<Effect> {
        self.members = members.to_vec();
        let mut out = Vec::new();
        if !self.gate.is_open()
            && self.participating_peer()
            && self.gate.peer_known() == GateEvent::RestartMasterDown
        {
            out.push(Effect::Note(Note::GatePeerKnown));
            self.machine.restart_master_down(now);
        }
        self.sync(now);
        out
    }

    /// The health checks' weight changed.
    pub fn set_weight(&mut self, now: Duration, weight: i32) -> Vec<Effect> {
        self.weight = weight;
        let p = self.with_port_penalty(effective_priority(self.spec.base, weight));
        let mut out = vec![Effect::Note(Note::Priority {
            from: self.machine.priority(),
            to: p,
        })];
        let actions = self.machine.set_priority(now, p);
        self.apply(now, actions, &mut out);
        self.sync(now);
        out
    }

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
    fn with_port_penalty(&self, priority: u8) -> u8 {
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
    fn note_blocked_adverts(&mut self, now: Duration, out: &mut Vec<Effect>) {
        let stale = (self.machine.master_down_interval() * portsec::ADVERTS_STALE_FACTOR)
            .max(portsec::ADVERTS_STALE_MIN);
        let held = *self.held_since.get_or_insert(now);
        if self.findings.contains_key(&Problem::VrrpBlocked)
            || !self.participating_peer()
            || now.saturating_sub(held) < stale
        {
            return;
        }
        let fix = Problem::VrrpBlocked.fix(self.spec.config.vip, &Mac(self.mac).to_string());
        let peers = self
            .members
            .iter()
            .filter(|m| m.name != self.node)
            .map(|m| m.name.to_string())
            .collect();
        out.push(Effect::Note(Note::VrrpBlocked {
            peers,
            fix: fix.clone(),
        }));
        self.findings.insert(Problem::VrrpBlocked, (now, fix));
    }

    /// Carries the state machine's actions into effects.
    fn apply(&mut self, now: Duration, actions: Vec<Action>, out: &mut Vec<Effect>) {
        for a in actions {
            match a {
                Action::SendAdvert { priority } => out.push(Effect::SendAdvert { priority }),
                Action::AddVip => {
                    self.release_at = None;
                    out.push(Effect::AddVip);
                }
                Action::RemoveVip => out.push(Effect::RemoveVip {
                    handed_over: self.release_at.take().is_some(),
                }),
                Action::HandOverVip => {
                    out.push(Effect::Note(Note::HandOver {
                        by: self.machine.master(),
                        priority: self.machine.priority(),
                    }));
                    self.release_at = Some(now + HANDOVER_GRACE);
                }
                Action::Announce => {
                    out.push(Effect::Announce);
                    self.followups = Some((now + self.spec.interval(), ANNOUNCE_FOLLOWUPS));
                }
            }
        }
        self.counters.transitions = self.machine.transitions();
    }

    /// What depends on the state, after every input: the state's start, and the timers a
    /// master runs (refresh, port check, ARP watch) or a backup does.
    fn sync(&mut self, now: Duration) {
        let state = self.machine.state();
        if state != self.state_seen {
            self.state_seen = state;
            self.state_since = now;
            self.confirm.reset();
            self.claim_not_before = None;
            self.silence = Silence::Quiet;
            if state == State::Backup {
                self.quiet_since = self.quiet_since.max(now);
            }
        }
        if state == State::Master {
            let refresh = Duration::from_secs(u64::from(self.spec.config.garp_refresh_secs));
            if self.next_refresh.is_none() && !refresh.is_zero() {
                self.next_refresh = Some(now + refresh);
            }
            self.next_port_round.get_or_insert(now + PORT_CHECK_FIRST);
            if self.arp_watch() {
                self.next_watch_probe.get_or_insert(now);
            }
            if self.machine.deferred().is_some() {
                self.machine.defer_to(None);
                self.deferred_until = None;
            }
        } else {
            self.next_refresh = None;
            self.followups = None;
            self.next_port_round = None;
            self.contest = None;
            // A backup behind a closed claim gate asks whether a holder it cannot hear yet
            // exists ([`super::gate`]).
            if self.arp_watch() && !self.gate.is_open() && state == State::Backup {
                self.next_watch_probe.get_or_insert(now);
            } else {
                self.next_watch_probe = None;
            }
        }
    }

    /// Where adverts go: the multicast group, or (unicast) the static peers, the live
    /// members whose role takes part in this instance, and every router heard recently;
    /// same family, minus our own addresses.
    pub fn destinations(&self, now: Duration) -> Vec<IpAddr> {
        if !self.spec.unicast() {
            return vec![match self.spec.primary {
                IpAddr::V4(_) => GROUP_V4.into(),
                IpAddr::V6(_) => GROUP_V6.into(),
            }];
        }
        let v6 = self.spec.primary.is_ipv6();
        let mut peers: Vec<IpAddr> = self.spec.config.unicast_peers.clone();
        // Members whose role takes part in this instance (the others would only count
        // our adverts as drops).
        for m in &self.members {
            if self.spec.config.priorities.for_role(m.role).is_some() {
                peers.extend(m.addresses.iter().copied());
            }
        }
        peers.extend(self.heard_recently(now).map(|(a, _)| a));
        peers.retain(|p| p.is_ipv6() == v6 && !self.spec.own.contains(p) && !p.is_unspecified());
        peers.sort();
        peers.dedup();
        peers
    }

    /// Whether a live member other than us takes part in this instance.
    fn participating_peer(&self) -> bool {
        let v6 = self.spec.primary.is_ipv6();
        self.members.iter().any(|m| {
            m.name != self.node
                && self.spec.config.priorities.for_role(m.role).is_some()
                && m.addresses.iter().any(|a| a.is_ipv6() == v6)
        })
    }

    /// The routers whose adverts arrived within the retention (`members.expirySecs`), with
    /// the priority each last advertised.
    fn heard_recently(&self, now: Duration) -> impl Iterator<Item = (IpAddr, u8)> + '_ {
        self.heard
            .iter()
            .filter(move |(_, (t, _))| now.saturating_sub(*t) <= self.heard_retention)
            .map(|(a, (_, p))| (*a, *p))
    }

    /// The other routers that could take over after a goodbye, with the priority each is
    /// assumed to run at ([`Machine::goodbye_rank`]): live members taking part in this
    /// instance at their role's base priority with every check passing (what ours is when
    /// whole: every node of a role runs the same checks), and routers heard within the
    /// retention at the priority they last advertised. Members only when our primary
    /// address is comparable with theirs (IPv6 multicast adverts come from link-local
    /// addresses, which no member record names).
    fn rivals(&self, now: Duration) -> BTreeMap<IpAddr, u8> {
        let mut out: BTreeMap<IpAddr, u8> = self.heard_recently(now).collect();
        let primary = self.spec.primary;
        let link_local = match primary {
            IpAddr::V4(_) => false,
            IpAddr::V6(a) => a.is_unicast_link_local(),
        };
        if !link_local {
            let weights: i32 = self.spec.config.checks.iter().map(|c| c.weight).sum();
            for m in &self.members {
                let Some(base) = self.spec.config.priorities.for_role(m.role) else {
                    continue;
                };
                if m.name == self.node {
                    continue;
                }
                let p = effective_priority(base, weights);
                for a in m
                    .addresses
                    .iter()
                    .filter(|a| a.is_ipv6() == primary.is_ipv6())
                {
                    out.insert(*a, p);
                }
            }
        }
        out.retain(|a, _| !self.spec.own.contains(a));
        out
    }

    /// What the port check connects to: live members taking part in this instance (their
    /// `/metrics` port, open to the machine network on every node), and for IPv4 the
    /// metadata service, there on most clouds even for a node alone.
    fn port_check_targets(&self) -> Vec<SocketAddr> {
        let v6 = self.spec.primary.is_ipv6();
        let mut targets: Vec<SocketAddr> = self
            .members
            .iter()
            .filter(|m| {
                m.name != self.node && self.spec.config.priorities.for_role(m.role).is_some()
            })
            .flat_map(|m| m.addresses.iter().copied())
            .filter(|a| a.is_ipv6() == v6 && !self.spec.own.contains(a))
            .take(3)
            .map(|a| SocketAddr::new(a, self.port_check_port))
            .collect();
        if !v6 {
            targets.push(SocketAddr::new(
                Ipv4Addr::new(169, 254, 169, 254).into(),
                80,
            ));
        }
        targets
    }
}

#[cfg(test)]
mod tests;
