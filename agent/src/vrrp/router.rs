//! The decision core of one virtual router, pure: every input comes with the time (a
//! [`Duration`] since the instance's origin) and every decision comes back as [`Effect`]s
//! for the I/O runner ([`super::instance`]) to carry out. No sockets, no clocks, no netlink;
//! unit- and property-tested without any (`tests` drives several cores over a simulated
//! segment).
//!
//! It wraps the RFC state machine ([`Machine`]) with what keelson decides around it:
//!
//! - **peers** (`peers`): the routers heard (with the priority each advertised) and the
//!   live members taking part in the instance — where adverts go (unicast) and whom a
//!   backup ranks itself among ([`Machine::goodbye_rank`]);
//! - **timers** (here): Master_Down and the advert timer, the repeats of an announcement,
//!   the hand-over's grace, the gratuitous ARP refresh;
//! - **the death confirmation** (`silence`, [`super::confirm`]): no claim on a silent
//!   master before a second path (ARP / neighbour solicitation for the VIP) says nobody
//!   holds it;
//! - **a router that cannot hear us** (here): a master that another router keeps
//!   contesting as if it never heard our answers gives the VIP up to it
//!   ([`Machine::give_way`]);
//! - **the claim gate** of a unicast instance ([`super::gate`]) and **the ARP yield** to a
//!   holder VRRP cannot see (`holder`, [`super::conflict`]);
//! - **the port check** (`port`, [`super::portsec`]): while master, whether the port
//!   passes the VIP;
//! - **other virtual routers on our VRID** (`foreign`): an advert on our VRID for other
//!   VIPs (or of another version or authentication) from a host that is neither a member
//!   nor a static peer is another cluster's router ([`Router::on_packet`]): dropped as
//!   ever, counted, named once per source, and a finding while it is heard
//!   ([`ForeignRouter`]).
//!
//! What comes out, [`Effect`] and [`Note`], is in `effect`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

mod effect;
mod foreign;
mod holder;
mod peers;
mod port;
mod silence;

pub use effect::{Effect, Note};
pub use foreign::{FOREIGN_FINDING_HOLD, FOREIGN_SOURCES_MAX, ForeignRouter};
use holder::PendingYield;
pub use peers::MAX_HEARD;
use peers::Peers;
use silence::Silence;

use super::codec::Advert;
use super::confirm::{Confirmation, Timing};
use super::fsm::{Action, Machine, Params, State, effective_priority};
use super::gate::{ClaimGate, GateEvent};
use super::handback;
use super::portsec::{Problem, VipCheck};
use super::socket::Received;
use super::spec::Spec;
use super::status::Counters;
use crate::dns_label::DnsLabel;
use crate::member::Member;
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

/// One virtual router's decisions.
#[derive(Debug, Clone)]
pub struct Router {
    spec: Spec,
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
    /// The live members and the routers heard.
    peers: Peers,
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
            peers: Peers::new(node, heard_retention),
            mac,
            machine,
            counters: Counters::default(),
            weight,
            state_since: now,
            state_seen: State::Initialize,
            gate,
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
            out.push(Effect::PortRound(
                self.peers
                    .port_check_targets(&self.spec, self.port_check_port),
            ));
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
        if self.silent(now) && !self.confirm_death(now, out) {
            return;
        }
        let silent_master = self.machine.silent_master(now);
        // Master_Down ran out: rank ourselves among the backups that saw it too.
        self.machine.set_rivals(self.peers.rivals(&self.spec, now));
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
        if self.peers.of_this_cluster(&self.spec, src) {
            return;
        }
        self.counters.foreign_adverts += 1;
        if foreign::record(&mut self.foreign, src, at, &advert.addresses) {
            out.push(Effect::Note(Note::ForeignRouter {
                src,
                vrid: advert.vrid,
                addresses: advert.addresses,
                reason,
            }));
        }
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
        if self.peers.remember_heard(src, at, advert.priority) {
            self.counters.heard_forgotten += 1;
        }
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
            self.machine.set_rivals(self.peers.rivals(&self.spec, at));
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

    /// The live members changed.
    pub fn set_members(&mut self, now: Duration, members: &[Member]) -> Vec<Effect> {
        self.peers.set_members(members);
        let mut out = Vec::new();
        if !self.gate.is_open()
            && self.peers.participating_peer(&self.spec)
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
        self.peers.destinations(&self.spec, now)
    }
}

#[cfg(test)]
mod tests;
