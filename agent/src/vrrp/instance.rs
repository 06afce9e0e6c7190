//! One virtual router at run time: sockets + VIP + announcements around a [`Machine`].
//! Validates every received packet (counting drops by reason), feeds the machine, carries
//! out its actions, follows health weights, and cleans up on stop. In unicast mode it also
//! keeps the claim gate ([`super::gate`]) and watches ARP for holders it cannot hear
//! ([`super::conflict`]). Whatever the transport it checks, while master, that its port lets
//! the VIP's traffic out, and in unicast mode a backup does not claim beside a holder whose
//! adverts the network drops ([`super::portsec`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keelson_cluster::cluster::{VrrpInstanceConfig, VrrpTransport, VrrpVersion};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::codec::{self, Advert, Auth, CodecError, GROUP_V4, GROUP_V6, Version};
use super::conflict::{self, Verdict};
use super::fsm::{Action, Machine, Params, State, effective_priority};
use super::gate::{ClaimGate, GateEvent};
use super::handback::{self, Handback};
use super::portsec::{self, Change, Problem, VipCheck};
use super::socket::{Received, VrrpSocket};
use super::{announce, reach, vip};
use crate::context::AgentContext;
use crate::health::{self, CheckState};
use crate::member::MemberList;
use crate::status::model::GateState;

/// When the first round of the port check runs after this node took the VIP.
const PORT_CHECK_FIRST: Duration = Duration::from_secs(5);
/// How often it runs while this node holds the VIP.
const PORT_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How long a master that leaves keeps the VIP after its successor's first advert: that
/// advert and the successor's gratuitous ARP go out together; hosts need a moment. The same
/// for a clean stop (after its goodbye) and for a master that a higher priority preempted
/// ([`Action::HandOverVip`]): both hold the VIP this long, and the successor's repeated
/// announcements ([`ANNOUNCE_FOLLOWUPS`]) put right any host that asked the leaving one.
const HANDOVER_GRACE: Duration = Duration::from_millis(200);

/// Announcements repeated, one advert interval apart, after each announcement as master.
/// One gratuitous ARP is not enough: when two backups take over at once (equal priorities
/// time out together), the loser's announcement can reach a host after the winner's, and a
/// lost frame does the same; the host then sends to a MAC that no longer holds the VIP until
/// its ARP entry is probed again (10-40 s on Linux) or the refresh (a minute) comes. keepalived
/// repeats its gratuitous ARPs for the same reason (`garp_master_repeat`, `garp_master_delay`).
const ANNOUNCE_FOLLOWUPS: u8 = 3;
/// Packets already queued that a backup reads before acting on its timer (see
/// `Runner::read_queued`): far more than the routers of one segment send in a stall.
const QUEUED_BEFORE_TIMER: usize = 64;
/// How long a stopping holder keeps its retired VIP for the proxy to drain the connections
/// a new holder forwards back ([`super::handback`]): under the agent's 10 s stop deadline.
const HANDBACK_STOP_HOLD: Duration = Duration::from_secs(8);

/// Per-instance counters.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Valid adverts accepted for this VRID.
    pub adverts_in: u64,
    /// Adverts sent (one per destination).
    pub adverts_out: u64,
    /// State changes.
    pub transitions: u64,
    /// Gratuitous ARPs / unsolicited NAs sent.
    pub announcements: u64,
    /// Dropped packets by reason.
    pub drops: BTreeMap<&'static str, u64>,
    /// Unicast: ARP frames showing another holder of the VIP that sends us no adverts.
    pub arp_conflicts: u64,
    /// Unicast: times this node gave the VIP up to such a holder.
    pub conflict_yields: u64,
    /// Unicast: times the claim grace ran out with no peer heard (claimed alone).
    pub lone_claims: u64,
}

/// The drop reason of a codec error.
pub fn drop_reason(e: &CodecError) -> &'static str {
    match e {
        CodecError::Short { .. } | CodecError::Long { .. } => "length",
        CodecError::Version(_) | CodecError::V2OverIpv6 => "version",
        CodecError::Type(_) => "type",
        CodecError::NoAddresses => "address_count",
        CodecError::Checksum { .. } => "checksum",
        CodecError::AuthType(_) => "auth",
        CodecError::ZeroInterval => "interval",
        CodecError::MixedFamilies { .. } => "family",
    }
}

/// Everything an instance needs, resolved from cluster.json and node.json.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The instance's config.
    pub config: VrrpInstanceConfig,
    /// This node's base priority in it.
    pub base: u8,
    /// Interface.
    pub iface: String,
    /// Source of our adverts.
    pub primary: IpAddr,
    /// All our own addresses (adverts from any of them are ours).
    pub own: Vec<IpAddr>,
}

impl Spec {
    fn version(&self) -> Version {
        match self.config.version {
            VrrpVersion::V2 => Version::V2,
            VrrpVersion::V3 => Version::V3,
        }
    }

    fn auth(&self) -> Auth {
        match &self.config.auth_pass {
            Some(p) if self.config.version == VrrpVersion::V2 => Auth::pass(p),
            _ => Auth::None,
        }
    }

    fn interval_cs(&self) -> u16 {
        (self.config.advert_interval_ms / 10).clamp(1, 0x0fff) as u16
    }

    /// Checks a received packet; `Err(reason)` to drop it.
    pub fn validate(&self, r: &Received) -> Result<Advert, &'static str> {
        if r.ttl != 255 {
            return Err("ttl");
        }
        if self.own.contains(&r.src) {
            return Err("own_address");
        }
        let a = codec::parse(&r.payload, r.src, r.dst).map_err(|e| drop_reason(&e))?;
        if a.vrid != self.config.vrid {
            return Err("vrid");
        }
        if a.version != self.version() {
            return Err("version");
        }
        if a.version == Version::V2 {
            if a.auth != self.auth() {
                return Err("auth");
            }
            // RFC 3768 §7.1: drop adverts whose interval differs from ours.
            if a.interval_cs != self.interval_cs() {
                return Err("interval");
            }
        }
        if a.addresses.len() != 1 {
            return Err("address_count");
        }
        if a.addresses[0] != self.config.vip {
            return Err("address");
        }
        Ok(a)
    }
}

/// What an instance publishes for `status`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Instance name.
    pub name: String,
    /// VIP.
    pub vip: IpAddr,
    /// VRID.
    pub vrid: u8,
    /// State.
    pub state: State,
    /// Base priority.
    pub base_priority: u8,
    /// Effective priority.
    pub priority: u8,
    /// The master last heard (or us), and its priority.
    pub master: Option<IpAddr>,
    /// The master's priority.
    pub master_priority: Option<u8>,
    /// Health checks.
    pub checks: Vec<CheckState>,
    /// Unicast: whether this node may claim yet, and why (`notGated` for multicast).
    pub claim_gate: GateState,
    /// Where adverts go (unicast: the peers; multicast: the group).
    pub destinations: Vec<IpAddr>,
    /// Counters.
    pub counters: Counters,
    /// When it entered its current state.
    #[serde(skip)]
    pub state_since: Option<Instant>,
    /// Port security problems found ([`super::portsec`]): since when, and the fix.
    #[serde(skip)]
    pub port_security: BTreeMap<Problem, (Instant, String)>,
}

impl InstanceStatus {
    /// The typed status section of this instance (`status`, `/metrics`).
    pub fn view(&self, now: Instant) -> crate::status::model::VrrpInstance {
        use crate::status::model::{HealthCheck, VrrpInstance, VrrpState};
        let c = &self.counters;
        VrrpInstance {
            name: self.name.clone(),
            vip: self.vip,
            vrid: self.vrid,
            state: match self.state {
                State::Initialize => VrrpState::Initialize,
                State::Backup => VrrpState::Backup,
                State::Master => VrrpState::Master,
            },
            state_seconds: self
                .state_since
                .map(|t| now.saturating_duration_since(t).as_secs_f64())
                .unwrap_or_default(),
            base_priority: self.base_priority,
            priority: self.priority,
            master: self.master,
            master_priority: self.master_priority,
            transitions: c.transitions,
            adverts_received: c.adverts_in,
            adverts_sent: c.adverts_out,
            announcements: c.announcements,
            arp_conflicts: c.arp_conflicts,
            conflict_yields: c.conflict_yields,
            lone_claims: c.lone_claims,
            claim_gate: self.claim_gate,
            destinations: self.destinations.clone(),
            drops: c.drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            port_security: self
                .port_security
                .iter()
                .map(
                    |(p, (since, fix))| crate::status::model::PortSecurityFinding {
                        problem: *p,
                        seconds: now.saturating_duration_since(*since).as_secs_f64(),
                        fix: fix.clone(),
                    },
                )
                .collect(),
            checks: self
                .checks
                .iter()
                .map(|ch| HealthCheck {
                    name: ch.name.clone(),
                    passing: ch.passing,
                    weight: ch.weight,
                    transitions: ch.transitions,
                })
                .collect(),
        }
    }
}

/// The status of every instance by name, read by the `vrrp` view, with a signal at each
/// change (`keelson-agent vrrp` prints the map then).
#[derive(Debug, Clone)]
pub struct StatusMap {
    map: Arc<Mutex<BTreeMap<String, InstanceStatus>>>,
    changed: Arc<watch::Sender<()>>,
}

impl Default for StatusMap {
    fn default() -> Self {
        Self {
            map: Arc::default(),
            changed: Arc::new(watch::Sender::new(())),
        }
    }
}

impl StatusMap {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, InstanceStatus>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an instance's status and signals the change.
    pub fn insert(&self, st: InstanceStatus) {
        self.lock().insert(st.name.clone(), st);
        self.changed.send_replace(());
    }

    /// Forgets an instance that no longer runs (the node left it) and signals the change.
    pub fn remove(&self, name: &str) {
        self.lock().remove(name);
        self.changed.send_replace(());
    }

    /// The typed status sections of every instance (`status`, `/metrics`).
    pub fn views(&self, now: Instant) -> Vec<crate::status::model::VrrpInstance> {
        self.lock().values().map(|s| s.view(now)).collect()
    }

    /// The map as one JSON document (`keelson-agent vrrp`'s lines).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&*self.lock()).unwrap_or_default()
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

struct Runner {
    spec: Spec,
    ctx: AgentContext,
    machine: Machine,
    sock: VrrpSocket,
    vip: vip::VipManager,
    mac: [u8; 6],
    counters: Counters,
    origin: Instant,
    checks: watch::Receiver<Vec<CheckState>>,
    status: StatusMap,
    /// The state last published and since when.
    state_seen: (State, Instant),
    /// The master that last said goodbye (priority 0): its adverts stopping is no death.
    master_left: Option<IpAddr>,
    /// Connections across a clean hand-over (`handbackSecs` > 0): this node's forwarding of
    /// an old holder's segments ([`super::handback`]).
    handback: Option<Handback>,
    /// When the VIP retired after a hand-over ([`vip::VipManager::retire`]) goes for good.
    retired_until: Option<Instant>,
    /// Unicast: no claim before a peer is heard or the grace period ran out.
    gate: ClaimGate,
    /// Routers whose valid adverts we received: when last, and the priority advertised
    /// (unicast: they get ours too, so a router that knows us is known back).
    heard: BTreeMap<IpAddr, (Duration, u8)>,
    /// How long a router heard stays a destination.
    heard_retention: Duration,
    /// When the last valid advert from another router arrived.
    last_other_advert: Option<Duration>,
    /// That advert was a goodbye (priority 0).
    last_advert_goodbye: bool,
    /// When another host last answered ARP for the VIP (or announced it).
    holder_arp: Option<Duration>,
    /// The "another host answers" line was logged in this waiting period.
    holder_logged: bool,
    members: watch::Receiver<MemberList>,
    /// While master: whether the port lets the VIP's traffic out ([`portsec`]).
    vip_check: VipCheck,
    /// Port security problems found, since when, and their fix.
    findings: BTreeMap<Problem, (Instant, String)>,
    /// Results of the port check's rounds (each runs in its own task).
    rounds: (
        tokio::sync::mpsc::Sender<Vec<portsec::Paths>>,
        tokio::sync::mpsc::Receiver<Vec<portsec::Paths>>,
    ),
    /// While master: when the next repeat of the last announcement is due, and how many
    /// remain ([`ANNOUNCE_FOLLOWUPS`]).
    followups: Option<(Instant, u8)>,
    /// Preempted ([`Action::HandOverVip`]): when the VIP we still hold is removed.
    release_at: Option<Instant>,
    /// While master: a higher-MAC holder of the VIP seen by ARP ([`Verdict::Yield`]), given
    /// the VIP an advert interval later unless VRRP sees a router by then
    /// ([`Runner::yield_to_silent_holder`]).
    pending_yield: Option<PendingYield>,
}

/// A holder of our VIP seen by ARP that we give the VIP up to unless VRRP hears a router.
#[derive(Debug, Clone, Copy)]
struct PendingYield {
    /// When to yield.
    at: Instant,
    /// Its MAC.
    mac: [u8; 6],
}

impl Runner {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn unicast(&self) -> bool {
        self.spec.config.transport == VrrpTransport::Unicast
    }

    fn destinations(&self) -> Vec<IpAddr> {
        if !self.unicast() {
            return vec![match self.spec.primary {
                IpAddr::V4(_) => GROUP_V4.into(),
                IpAddr::V6(_) => GROUP_V6.into(),
            }];
        }
        let v6 = self.spec.primary.is_ipv6();
        let mut peers: Vec<IpAddr> = self.spec.config.unicast_peers.clone();
        // Members whose role takes part in this instance (the others would only count
        // our adverts as drops).
        for m in self.members.borrow().iter() {
            if self.spec.config.priorities.for_role(m.role).is_some() {
                peers.extend(m.addresses.iter().copied());
            }
        }
        peers.extend(self.heard_recently().map(|(a, _)| a));
        peers.retain(|p| p.is_ipv6() == v6 && !self.spec.own.contains(p) && !p.is_unspecified());
        peers.sort();
        peers.dedup();
        peers
    }

    /// Whether a live member other than us takes part in this instance.
    fn participating_peer(&self) -> bool {
        let v6 = self.spec.primary.is_ipv6();
        self.members.borrow().iter().any(|m| {
            m.name != self.ctx.node.name
                && self.spec.config.priorities.for_role(m.role).is_some()
                && m.addresses.iter().any(|a| a.is_ipv6() == v6)
        })
    }

    /// Unicast backup that has heard no advert for two intervals: it probes ARP for the VIP
    /// so that it sees a holder whose adverts do not arrive ([`portsec::hold_claim`]).
    fn adverts_quiet(&self) -> bool {
        self.unicast()
            && self.machine.state() == State::Backup
            && self
                .last_other_advert
                .is_none_or(|t| self.now().saturating_sub(t) > self.quiet_after())
    }

    /// How long without an advert before a unicast backup probes ARP for the VIP: two
    /// intervals, well inside Master_Down (three and the skew).
    fn quiet_after(&self) -> Duration {
        Duration::from_millis(2 * u64::from(self.spec.config.advert_interval_ms.max(1)))
    }

    /// A unicast backup that still hears adverts: when they turn quiet unless another one
    /// arrives. The first probe must go then, not at the next event that happens to wake
    /// the loop: its answer must be in before Master_Down runs out
    /// ([`portsec::hold_claim`]), or the backup claims the VIP beside its holder.
    fn quiet_at(&self) -> Option<Duration> {
        if !self.unicast() || self.machine.state() != State::Backup {
            return None;
        }
        self.last_other_advert
            .map(|t| t + self.quiet_after() + Duration::from_millis(1))
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

    /// What the port check connects to: live members taking part in this instance (their
    /// `/metrics` port, open to the machine network on every node), and for IPv4 the
    /// metadata service, there on most clouds even for a node alone.
    fn port_check_targets(&self) -> Vec<std::net::SocketAddr> {
        let port = match self.ctx.cluster.metrics.port {
            0 => self.ctx.cluster.ignition.tls_port,
            p => p,
        };
        let v6 = self.spec.primary.is_ipv6();
        let mut targets: Vec<std::net::SocketAddr> = self
            .members
            .borrow()
            .iter()
            .filter(|m| {
                m.name != self.ctx.node.name
                    && self.spec.config.priorities.for_role(m.role).is_some()
            })
            .flat_map(|m| m.addresses.iter().copied())
            .filter(|a| a.is_ipv6() == v6 && !self.spec.own.contains(a))
            .take(3)
            .map(|a| std::net::SocketAddr::new(a, port))
            .collect();
        if !v6 {
            targets.push(std::net::SocketAddr::new(
                std::net::Ipv4Addr::new(169, 254, 169, 254).into(),
                80,
            ));
        }
        targets
    }

    /// Starts one round of the port check in a task of its own.
    fn start_port_round(&self) {
        let (node, vip) = (self.spec.primary, self.spec.config.vip);
        let targets = self.port_check_targets();
        let tx = self.rounds.0.clone();
        tokio::spawn(async move {
            let _ = tx.send(reach::round(node, vip, &targets).await).await;
        });
    }

    /// A round of the port check came back.
    async fn on_port_round(&mut self, paths: &[portsec::Paths]) {
        if self.machine.state() != State::Master {
            return;
        }
        let name = self.spec.config.name.clone();
        let vip = self.spec.config.vip;
        match self.vip_check.on_round(portsec::judge_round(paths)) {
            Some(Change::Found) => {
                let fix = Problem::VipNotAllowed.fix(vip, &fmt_mac(self.mac));
                tracing::warn!(
                    "vrrp {name}: traffic from {vip} does not leave this node's port (peers answer {} but not {vip}): the port's security drops the VIP, which is likely not one of its allowed address pairs; fix: {fix}; lowering this node's priority to 1 so that a node whose port passes {vip} takes it",
                    self.spec.primary
                );
                self.findings
                    .insert(Problem::VipNotAllowed, (Instant::now(), fix));
                let now = self.now();
                let actions = self.machine.set_priority(now, 1);
                self.execute(actions).await;
            }
            Some(Change::Cleared) => {
                tracing::info!("vrrp {name}: traffic from {vip} leaves this node's port again");
                self.findings.remove(&Problem::VipNotAllowed);
                let p = effective_priority(self.spec.base, health::weight(&self.checks.borrow()));
                let now = self.now();
                let actions = self.machine.set_priority(now, p);
                self.execute(actions).await;
            }
            None => {}
        }
    }

    /// A unicast backup whose Master_Down ran out while another host answers ARP for the
    /// VIP and no advert arrives: holds its claim ([`portsec::hold_claim`]) and says why.
    /// Returns whether it held.
    fn hold_claim_for_blocked_adverts(&mut self, now: Duration) -> bool {
        if !self.unicast()
            || self.machine.state() != State::Backup
            || !self.gate.is_open()
            || self.machine.next_deadline().is_none_or(|d| d > now)
            || !portsec::hold_claim(
                now,
                self.holder_arp,
                super::gate::HOLDER_FRESH,
                self.last_other_advert.map(|at| portsec::LastAdvert {
                    at,
                    goodbye: self.last_advert_goodbye,
                }),
                // The leaver keeps the VIP until a successor's advert, at most Master_Down
                // (`await_successor`); the factor covers a loaded host's delays.
                self.machine.master_down_interval() * portsec::ADVERTS_STALE_FACTOR,
            )
        {
            return false;
        }
        self.machine.restart_master_down(now);
        self.note_blocked_adverts(now);
        self.publish();
        true
    }

    /// Another host answers ARP for the VIP (the callers know), a member taking part in this
    /// instance is live (members reach each other over TCP), and no advert has arrived for
    /// [`portsec::ADVERTS_STALE_FACTOR`] Master_Down intervals: VRRP itself does not get
    /// through. Records the finding and says so, once.
    fn note_blocked_adverts(&mut self, now: Duration) {
        let stale = self.machine.master_down_interval() * portsec::ADVERTS_STALE_FACTOR;
        if self.findings.contains_key(&Problem::VrrpBlocked)
            || !self.participating_peer()
            || self
                .last_other_advert
                .is_some_and(|t| now.saturating_sub(t) <= stale)
        {
            return;
        }
        let vip = self.spec.config.vip;
        let fix = Problem::VrrpBlocked.fix(vip, &fmt_mac(self.mac));
        let peers: Vec<String> = self
            .members
            .borrow()
            .iter()
            .filter(|m| m.name != self.ctx.node.name)
            .map(|m| m.name.to_string())
            .collect();
        tracing::warn!(
            "vrrp {}: another host answers ARP for {vip} but no VRRP advert has arrived while members {} are live: the network likely drops IP protocol 112 (a security group without it); not claiming {vip} beside its holder; fix: {fix}",
            self.spec.config.name,
            peers.join(", ")
        );
        self.findings
            .insert(Problem::VrrpBlocked, (Instant::now(), fix));
    }

    /// The next time anything is due in the state machine, with the claim gate holding a
    /// backup back until it opens.
    fn deadline(&self) -> Option<Duration> {
        let fsm = self.machine.next_deadline();
        match (self.machine.state(), self.gate.deadline()) {
            (State::Backup, Some(gate)) => fsm.map(|d| d.max(gate)),
            _ => fsm,
        }
    }

    async fn on_timer(&mut self) {
        if self.machine.state() == State::Backup {
            self.read_queued().await;
        }
        let now = self.now();
        match self.gate.on_timer(now, self.holder_arp) {
            GateEvent::Opened => {
                self.counters.lone_claims += 1;
                tracing::warn!(
                    "vrrp {}: no peer heard within the claim grace and nobody answers for {}; claiming it alone",
                    self.spec.config.name,
                    self.spec.config.vip
                );
            }
            GateEvent::HolderAnswers => {
                self.note_blocked_adverts(now);
                if !self.holder_logged {
                    self.holder_logged = true;
                    tracing::info!(
                        "vrrp {}: claim grace over, but another host answers for {}: waiting to hear that holder",
                        self.spec.config.name,
                        self.spec.config.vip
                    );
                }
                self.publish();
            }
            _ => {}
        }
        if self.hold_claim_for_blocked_adverts(now) {
            return;
        }
        if self.gate.is_open() || self.machine.state() != State::Backup {
            let silent = self.machine.silent_master(now);
            let due = self.machine.state() == State::Backup
                && self.machine.next_deadline().is_some_and(|d| now >= d);
            if due {
                // Master_Down ran out: rank ourselves among the backups that saw it too.
                self.machine.set_rivals(self.rivals());
                tracing::debug!(
                    "vrrp {}: Master_Down ran out; master {:?}, rivals {:?}, rank wait {:?}",
                    self.spec.config.name,
                    self.machine.master(),
                    self.rivals(),
                    self.machine.rank_wait()
                );
            }
            let wait = due.then(|| self.machine.rank_wait()).flatten();
            let actions = self.machine.on_timer(now);
            if let (Some(wait), Some((master, _))) = (wait, self.machine.master()) {
                tracing::info!(
                    "vrrp {}: Master_Down for {master} ({}); rank {} among the routers left: taking over in {wait:?} unless one ranked before us does",
                    self.spec.config.name,
                    if silent.is_some() {
                        "its adverts stopped"
                    } else {
                        "a priority we preempt"
                    },
                    self.machine.goodbye_rank(master)
                );
                self.publish();
            }
            self.hint_master_down(silent);
            self.execute(actions).await;
        }
    }

    /// Handles the packets already queued on the socket before a backup's timer is acted
    /// on. When this node was stalled (a loaded host, a descheduled guest) its timer and the
    /// adverts that arrived meanwhile are ready together, and the loop's `select!` may take
    /// the timer first: a master that kept advertising would look silent, and this backup
    /// would claim its VIP for a moment (seen on OpenStack with TCG guests). Bounded, so a
    /// flood of packets cannot hold the timer off.
    async fn read_queued(&mut self) {
        for _ in 0..QUEUED_BEFORE_TIMER {
            let pkt = match self.sock.try_recv() {
                Ok(Some(pkt)) => pkt,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(
                        "vrrp {}: reading queued packets: {e}",
                        self.spec.config.name
                    );
                    return;
                }
            };
            self.on_packet(&pkt).await;
        }
    }

    /// One protocol-112 packet: an advert to act on, or a drop counted by reason.
    async fn on_packet(&mut self, pkt: &Received) {
        match self.spec.validate(pkt) {
            Ok(advert) => {
                let arrived = self.now().saturating_sub(pkt.age);
                self.on_advert(pkt.src, &advert, arrived).await;
            }
            Err(reason) => {
                tracing::debug!(
                    "vrrp {}: dropped packet from {}: {reason}",
                    self.spec.config.name,
                    pkt.src
                );
                self.drop_packet(reason);
                self.publish();
            }
        }
    }

    /// A valid advert from `src`, which arrived at `now` (the runner's clock; earlier
    /// than this moment when it waited in the socket's queue).
    async fn on_advert(&mut self, src: IpAddr, advert: &Advert, now: Duration) {
        self.counters.adverts_in += 1;
        if advert.priority == 0 {
            self.master_left = Some(src);
        } else if self.master_left == Some(src) {
            self.master_left = None;
        }
        self.heard.insert(src, (now, advert.priority));
        self.last_other_advert = Some(now);
        self.last_advert_goodbye = advert.priority == 0;
        if self.findings.remove(&Problem::VrrpBlocked).is_some() {
            tracing::info!(
                "vrrp {}: adverts arrive again (from {src})",
                self.spec.config.name
            );
        }
        if self.gate.heard() == GateEvent::Opened {
            tracing::info!(
                "vrrp {}: heard {src} (priority {}): claim gate open",
                self.spec.config.name,
                advert.priority
            );
        }
        self.hand_back_to(src, advert.priority).await;
        if advert.priority == 0 && self.machine.state() == State::Backup {
            self.machine.set_rivals(self.rivals());
            let rank = self.machine.goodbye_rank(src);
            tracing::info!(
                "vrrp {}: {src} is leaving (priority 0); rank {rank} among the routers left: taking over in {:?} unless one ranked before us does",
                self.spec.config.name,
                self.machine.goodbye_wait(src)
            );
        }
        let actions = self.machine.on_advert(now, src, advert);
        self.execute(actions).await;
    }

    /// The routers whose adverts arrived within the retention (`members.expirySecs`), with
    /// the priority each last advertised.
    fn heard_recently(&self) -> impl Iterator<Item = (IpAddr, u8)> + '_ {
        let now = self.now();
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
    fn rivals(&self) -> BTreeMap<IpAddr, u8> {
        let mut out: BTreeMap<IpAddr, u8> = self.heard_recently().collect();
        let primary = self.spec.primary;
        let link_local = match primary {
            IpAddr::V4(_) => false,
            IpAddr::V6(a) => a.is_unicast_link_local(),
        };
        if !link_local {
            let weights: i32 = self.spec.config.checks.iter().map(|c| c.weight).sum();
            for m in self.members.borrow().iter() {
                let Some(base) = self.spec.config.priorities.for_role(m.role) else {
                    continue;
                };
                if m.name == self.ctx.node.name {
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

    fn on_members(&mut self) {
        if self.gate.is_open() || !self.participating_peer() {
            return;
        }
        if self.gate.peer_known() == GateEvent::RestartMasterDown {
            let now = self.now();
            tracing::info!(
                "vrrp {}: a peer is known through members: claim gate open, waiting Master_Down",
                self.spec.config.name
            );
            self.machine.restart_master_down(now);
            self.publish();
        }
    }

    async fn on_arp(&mut self, frame: &[u8]) {
        let IpAddr::V4(vip) = self.spec.config.vip else {
            return;
        };
        let Some(arp) = conflict::parse_arp(frame) else {
            return;
        };
        let now = self.now();
        if arp.sender_ip == vip && arp.sender_mac != self.mac {
            self.holder_arp = Some(now);
        }
        let verdict = conflict::judge(
            &arp,
            self.mac,
            vip,
            self.machine.state() == State::Master,
            self.last_other_advert.map(|t| now.saturating_sub(t)),
            self.machine.master_down_interval(),
        );
        match verdict {
            Verdict::Ignore => {}
            Verdict::Stay => {
                self.counters.arp_conflicts += 1;
                tracing::info!(
                    "vrrp {}: {} also held by {} (lower MAC, no adverts from it): keeping it",
                    self.spec.config.name,
                    vip,
                    fmt_mac(arp.sender_mac)
                );
                self.announce();
                self.publish();
            }
            Verdict::Yield => {
                self.counters.arp_conflicts += 1;
                // Two routers that claimed at the same moment (equal rank, the tie-break a
                // millisecond apart) see each other's gratuitous ARP and advert together,
                // the ARP socket sometimes first: judged at once, both yielded (one to the
                // other's advert, one to its ARP) and nobody held the VIP (the CI run of
                // stop 35). An advert interval is time for the other one's advert.
                if self.pending_yield.is_none() {
                    let wait = Duration::from_millis(u64::from(
                        self.spec.config.advert_interval_ms.max(1),
                    ));
                    tracing::info!(
                        "vrrp {}: {} also held by {} (higher MAC, no adverts from it): giving it up in {wait:?} unless an advert arrives",
                        self.spec.config.name,
                        vip,
                        fmt_mac(arp.sender_mac)
                    );
                    self.pending_yield = Some(PendingYield {
                        at: Instant::now() + wait,
                        mac: arp.sender_mac,
                    });
                }
            }
        }
    }

    /// The advert interval after a [`Verdict::Yield`]: still master and VRRP still sees no
    /// router ([`conflict::vrrp_sees_a_router`], the verdict's own rule, judged again), it
    /// is a holder VRRP cannot hear; give the VIP up. Not "no advert since its frame": an
    /// advert's time is when the kernel received it, which can be before the ARP frame
    /// that was read first.
    async fn yield_to_silent_holder(&mut self) {
        let Some(pending) = self.pending_yield.take() else {
            return;
        };
        if self.machine.state() != State::Master {
            return;
        }
        let vip = self.spec.config.vip;
        let now = self.now();
        if conflict::vrrp_sees_a_router(
            self.last_other_advert.map(|t| now.saturating_sub(t)),
            self.machine.master_down_interval(),
        ) {
            tracing::info!(
                "vrrp {}: adverts arrive while {} announces {vip}: VRRP elects between us",
                self.spec.config.name,
                fmt_mac(pending.mac)
            );
            return;
        }
        self.counters.conflict_yields += 1;
        tracing::warn!(
            "vrrp {}: {vip} also held by {} (higher MAC, no adverts from it): giving it up and waiting for a peer",
            self.spec.config.name,
            fmt_mac(pending.mac)
        );
        let actions = self.machine.yield_to_unknown(now);
        self.gate.close(now);
        self.holder_logged = false;
        self.execute(actions).await;
    }

    async fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::SendAdvert { priority } => self.send_advert(priority).await,
                Action::AddVip => {
                    tracing::info!(
                        "vrrp {}: MASTER (priority {}), adding {}",
                        self.spec.config.name,
                        self.machine.priority(),
                        self.spec.config.vip
                    );
                    self.release_at = None;
                    if let Err(e) = self.vip.add().await {
                        tracing::warn!("vrrp {}: {e}", self.spec.config.name);
                    }
                    let v = self.spec.config.vip;
                    self.ctx.bus.vips_held.send_modify(|s| {
                        s.insert(v);
                    });
                }
                Action::RemoveVip => self.remove_vip().await,
                Action::HandOverVip => {
                    let by = match self.machine.master() {
                        Some((by, priority)) => format!(
                            "{by} (priority {priority}) outranks us (priority {})",
                            self.machine.priority()
                        ),
                        None => "another holder wins".to_owned(),
                    };
                    tracing::info!(
                        "vrrp {}: {by}: leaving MASTER, keeping {} {HANDOVER_GRACE:?} for its announcement",
                        self.spec.config.name,
                        self.spec.config.vip
                    );
                    self.release_at = Some(Instant::now() + HANDOVER_GRACE);
                }
                Action::Announce => {
                    self.announce();
                    self.followups =
                        Some((Instant::now() + self.advert_interval(), ANNOUNCE_FOLLOWUPS));
                }
            }
        }
        self.counters.transitions = self.machine.transitions();
        if self.machine.state() != self.state_seen.0 {
            self.state_seen = (self.machine.state(), Instant::now());
        }
        self.publish();
    }

    /// Removes the VIP now (leaving master, or a hand-over's grace over). After a hand-over
    /// with hand-backs on, the VIP is retired for the window instead
    /// ([`vip::VipManager::retire`]): the successor forwards this node's connections here.
    async fn remove_vip(&mut self) {
        let handed_over = self.release_at.take().is_some();
        let window = Duration::from_secs(u64::from(self.spec.config.handback_secs));
        if handed_over && !window.is_zero() {
            tracing::info!(
                "vrrp {}: hand-over done, retiring {} for {window:?}: off the interface, its open connections go on here",
                self.spec.config.name,
                self.spec.config.vip
            );
            match self.vip.retire().await {
                Ok(()) => self.retired_until = Some(Instant::now() + window),
                Err(e) => {
                    tracing::warn!("vrrp {}: retiring: {e}", self.spec.config.name);
                    self.clear_vip().await;
                }
            }
        } else {
            let why = if handed_over {
                "hand-over done"
            } else {
                "leaving MASTER"
            };
            tracing::info!(
                "vrrp {}: {why}, removing {}",
                self.spec.config.name,
                self.spec.config.vip
            );
            self.clear_vip().await;
        }
        let v = self.spec.config.vip;
        self.ctx.bus.vips_held.send_modify(|s| {
            s.remove(&v);
        });
    }

    /// After a timer: when this backup took over because the master's adverts stopped
    /// (`silent`, [`Machine::silent_master`] asked before the timer; not after its goodbye,
    /// and not when it still advertised at a priority we preempt: that node lives and its
    /// backend may be fine), tell the proxy that node is gone; called before the takeover's
    /// actions run, so the proxy knows before the VIP frontend opens.
    fn hint_master_down(&self, silent: Option<IpAddr>) {
        if let Some(addr) = silent
            && self.machine.state() == State::Master
            && !self.spec.own.contains(&addr)
            && self.master_left != Some(addr)
        {
            tracing::info!(
                "vrrp {}: adverts from {addr} stopped; taking over",
                self.spec.config.name
            );
            self.ctx.bus.vrrp_peer_down.send_replace(Some(addr));
        }
    }

    /// Starts forwarding the segments of an old holder's connections to `src`
    /// ([`super::handback`]) when this backup is about to take the VIP from it: `src` said
    /// goodbye (priority 0), or it advertises a priority this node preempts. Before the
    /// advert reaches the state machine, so the rules are in before this node can claim.
    async fn hand_back_to(&mut self, src: IpAddr, priority: u8) {
        if self.machine.state() != State::Backup || self.spec.own.contains(&src) {
            return;
        }
        let Some(why) =
            handback::takes_over(self.spec.config.preempt, self.machine.priority(), priority)
        else {
            return;
        };
        let Some(h) = self.handback.as_mut() else {
            return;
        };
        if h.target() == Some(src) {
            return;
        }
        match h.forward_to(src).await {
            Ok(()) => tracing::info!(
                "vrrp {}: segments to {} of connections not opened here go to {src} (the holder {why}) for {}s",
                self.spec.config.name,
                self.spec.config.vip,
                self.spec.config.handback_secs
            ),
            Err(e) => h.log_failure(&self.spec.config.name, &e),
        }
    }

    /// The hand-back's forwarding window is over.
    async fn end_hand_back(&mut self) {
        if let Some(h) = self.handback.as_mut() {
            if let Some(to) = h.target() {
                tracing::info!("vrrp {}: hand-back to {to} over", self.spec.config.name);
            }
            h.end().await;
        }
    }

    /// Removes every copy of the VIP from the interface and its retirement, if any (a
    /// failure is logged: the runner goes on).
    async fn clear_vip(&mut self) {
        self.retired_until = None;
        if let Err(e) = self.vip.remove().await {
            tracing::warn!("vrrp {}: {e}", self.spec.config.name);
        }
    }

    /// The retired VIP's window is over: its rule and route go too.
    async fn drop_retired(&mut self) {
        self.retired_until = None;
        if self.machine.state() == State::Master {
            // Master again within the window: the VIP stays; the retirement's rule and
            // route, which would otherwise linger until the VIP next goes, go now.
            match self.vip.end_retirement().await {
                Ok(n) if n > 0 => tracing::info!(
                    "vrrp {}: master again; the retirement of {} ended",
                    self.spec.config.name,
                    self.spec.config.vip
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("vrrp {}: {e}", self.spec.config.name),
            }
            return;
        }
        tracing::info!(
            "vrrp {}: removing retired {}",
            self.spec.config.name,
            self.spec.config.vip
        );
        self.clear_vip().await;
    }

    async fn send_advert(&mut self, priority: u8) {
        let advert = Advert {
            version: self.spec.version(),
            vrid: self.spec.config.vrid,
            priority,
            interval_cs: self.spec.interval_cs(),
            addresses: vec![self.spec.config.vip],
            auth: self.spec.auth(),
        };
        for dst in self.destinations() {
            match codec::encode(&advert, self.spec.primary, dst) {
                Ok(bytes) => match self.sock.send(&bytes, dst).await {
                    Ok(()) => self.counters.adverts_out += 1,
                    Err(e) => tracing::debug!("vrrp {}: send to {dst}: {e}", self.spec.config.name),
                },
                Err(e) => tracing::warn!("vrrp {}: {e}", self.spec.config.name),
            }
        }
    }

    fn advert_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.spec.interval_cs()) * 10)
    }

    /// One repeat of the last announcement ([`ANNOUNCE_FOLLOWUPS`]); the next is scheduled
    /// while some remain.
    fn follow_up(&mut self) {
        let Some((_, left)) = self.followups.take() else {
            return;
        };
        self.announce();
        if left > 1 {
            self.followups = Some((Instant::now() + self.advert_interval(), left - 1));
        }
        self.publish();
    }

    fn announce(&mut self) {
        let res = match self.spec.config.vip {
            IpAddr::V4(v) => announce::send_garp(self.vip.index(), self.mac, v),
            IpAddr::V6(v) => announce::send_na(self.vip.index(), self.mac, v),
        };
        match res {
            Ok(()) => self.counters.announcements += 1,
            Err(e) => tracing::warn!("vrrp {}: announce: {e}", self.spec.config.name),
        }
    }

    fn publish(&self) {
        let (master, master_priority) = match self.machine.master() {
            Some((a, p)) => (Some(a), Some(p)),
            None => (None, None),
        };
        let st = InstanceStatus {
            name: self.spec.config.name.clone(),
            vip: self.spec.config.vip,
            vrid: self.spec.config.vrid,
            state: self.machine.state(),
            base_priority: self.spec.base,
            priority: self.machine.priority(),
            master,
            master_priority,
            checks: self.checks.borrow().clone(),
            claim_gate: self.gate.state(),
            destinations: self.destinations(),
            counters: self.counters.clone(),
            state_since: Some(self.state_seen.1),
            port_security: self.findings.clone(),
        };
        self.status.insert(st);
    }

    /// After our goodbye (priority 0), keeps the VIP until another router has taken over
    /// (its first advert as master) and a moment more for hosts to act on its gratuitous
    /// ARP, at most `limit`: the VIP is never without a holder during a clean stop, so no
    /// client connect goes unanswered (keepalived drops it at once, and requests sent in
    /// the backup's skew time fail). Returns whether a successor advertised within `limit`
    /// (then after [`HANDOVER_GRACE`]).
    async fn await_successor(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let pkt = tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(
                        "vrrp {}: no successor within {limit:?}; removing {} anyway",
                        self.spec.config.name, self.spec.config.vip
                    );
                    return false;
                }
                r = self.sock.recv() => match r {
                    Ok(p) => p,
                    Err(_) => return false,
                },
            };
            if let Ok(advert) = self.spec.validate(&pkt)
                && advert.priority > 0
            {
                tracing::info!(
                    "vrrp {}: {} took over after {:?}; removing {}",
                    self.spec.config.name,
                    pkt.src,
                    started.elapsed(),
                    self.spec.config.vip
                );
                tokio::time::sleep(HANDOVER_GRACE).await;
                return true;
            }
        }
    }

    /// Stopping with the VIP retired: waits for the proxy to drain the connections the
    /// successor forwards here (at most [`HANDBACK_STOP_HOLD`]), then removes it for good.
    async fn await_drain(&mut self) {
        let mut draining = self.ctx.bus.proxy_draining.subscribe();
        let t = Instant::now();
        let done = tokio::time::timeout(HANDBACK_STOP_HOLD, draining.wait_for(|d| !*d))
            .await
            .is_ok();
        tracing::info!(
            "vrrp {}: {} after {:?}; removing retired {}",
            self.spec.config.name,
            if done {
                "proxy drained"
            } else {
                "still draining"
            },
            t.elapsed(),
            self.spec.config.vip
        );
        self.clear_vip().await;
    }

    fn drop_packet(&mut self, reason: &'static str) {
        *self.counters.drops.entry(reason).or_default() += 1;
    }
}

/// Runs one instance until `stop`; on stop sends priority 0 (if master) and removes the VIP.
// Over 100 lines on purpose: the instance's one `select!` loop (adverts, timers, checks, members, stop); each arm is a few lines and hands the work to the state machine, and the loop reads best whole.
pub async fn run(
    spec: Spec,
    ctx: AgentContext,
    status: StatusMap,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let cfg = &spec.config;
    let vip = vip::VipManager::new(&spec.iface, cfg.vip).await?;
    let stale = vip.remove().await?;
    if stale > 0 {
        tracing::info!(
            "vrrp {}: removed stale {} from {}",
            cfg.name,
            cfg.vip,
            spec.iface
        );
    }
    if cfg.vip.is_ipv4() {
        vip::announce_from_own_address(&spec.iface);
    }
    let mut handback = (cfg.handback_secs > 0).then(|| {
        Handback::new(
            &cfg.name,
            &spec.iface,
            cfg.vip,
            Duration::from_secs(u64::from(cfg.handback_secs)),
        )
    });
    if let Some(h) = handback.as_mut() {
        // Whatever a crashed agent left.
        h.end().await;
    }
    let mac = vip::mac(&spec.iface)?;
    let sock = VrrpSocket::open(
        &spec.iface,
        vip.index(),
        spec.primary,
        cfg.transport == VrrpTransport::Multicast,
    )?;
    let check_stop = stop.child_token();
    let checks = health::spawn(
        &cfg.checks,
        ctx.bus.clone(),
        health::local_apiserver(&ctx, cfg.vip),
        check_stop.clone(),
    );
    let priority = effective_priority(spec.base, health::weight(&checks.borrow()));
    let machine = Machine::new(
        Params {
            interval_cs: spec.interval_cs(),
            preempt: cfg.preempt,
            primary: spec.primary,
            full_priority: effective_priority(spec.base, cfg.checks.iter().map(|c| c.weight).sum()),
        },
        priority,
    );
    let refresh = Duration::from_secs(u64::from(cfg.garp_refresh_secs));
    let unicast = cfg.transport == VrrpTransport::Unicast;
    let gate = if unicast {
        ClaimGate::closed(Duration::ZERO, cfg.claim_grace(&ctx.cluster.members))
    } else {
        ClaimGate::open()
    };
    // ARP conflicts are looked for in unicast mode, for IPv4 VIPs (IPv6 has no ARP; see
    // docs/members.md).
    let arp = match (unicast, cfg.vip) {
        (true, IpAddr::V4(_)) => Some(announce::ArpSocket::open(vip.index())?),
        _ => None,
    };
    let heard_retention = Duration::from_secs(u64::from(ctx.cluster.members.expiry_secs.max(1)));
    let members = ctx.bus.members.subscribe();
    let mut r = Runner {
        spec,
        ctx,
        machine,
        sock,
        vip,
        mac,
        counters: Counters::default(),
        origin: Instant::now(),
        checks,
        status,
        state_seen: (State::Initialize, Instant::now()),
        master_left: None,
        handback,
        retired_until: None,
        gate,
        heard: BTreeMap::new(),
        heard_retention,
        last_other_advert: None,
        last_advert_goodbye: false,
        holder_arp: None,
        holder_logged: false,
        members,
        vip_check: VipCheck::default(),
        findings: BTreeMap::new(),
        rounds: tokio::sync::mpsc::channel(4),
        followups: None,
        release_at: None,
        pending_yield: None,
    };
    let now = r.now();
    let actions = r.machine.startup(now);
    r.execute(actions).await;
    r.on_members();
    let probe_every = Duration::from_secs(1);
    let mut next_probe: Option<Instant> = None;
    // The port check while master: the first round a few seconds after taking the VIP
    // (hosts act on its gratuitous ARP first), then every PORT_CHECK_EVERY.
    let mut next_round: Option<Instant> = None;
    let mut next_refresh: Option<Instant> = None;
    // With no checks the sender is gone at once; stop polling it then.
    let mut checks_alive = true;
    loop {
        let deadline = r.deadline().map(|d| r.origin + d);
        let master = r.machine.state() == State::Master;
        if !master {
            next_refresh = None;
            r.followups = None;
        } else if next_refresh.is_none() && !refresh.is_zero() {
            next_refresh = Some(Instant::now() + refresh);
        }
        // ARP probes for the VIP: while master (another holder?) and while the claim gate
        // waits (is there a holder we have not heard yet?).
        let probing = master || !r.gate.is_open() || r.adverts_quiet();
        if !master {
            next_round = None;
        } else if next_round.is_none() {
            next_round = Some(Instant::now() + PORT_CHECK_FIRST);
        }
        if arp.is_none() {
            next_probe = None;
        } else if probing {
            next_probe = next_probe.or_else(|| Some(Instant::now()));
        } else {
            // Not probing yet: wake when adverts turn quiet (moves with every advert).
            next_probe = r.quiet_at().map(|d| r.origin + d);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            res = r.sock.recv() => r.on_packet(&res?).await,
            _ = sleep_until(deadline) => r.on_timer().await,
            changed = r.members.changed() => {
                if changed.is_ok() {
                    r.members.borrow_and_update();
                    r.on_members();
                }
            }
            _ = sleep_until(next_probe) => {
                next_probe = Some(Instant::now() + probe_every);
                if let (Some(sock), IpAddr::V4(vip), IpAddr::V4(node)) =
                    (&arp, r.spec.config.vip, r.spec.primary)
                    && let Err(e) = sock.send_probe(r.mac, node, vip)
                {
                    tracing::debug!("vrrp {}: ARP probe: {e}", r.spec.config.name);
                }
            }
            frame = recv_arp(arp.as_ref()) => {
                match frame {
                    Ok(frame) => r.on_arp(&frame).await,
                    Err(e) => tracing::debug!("vrrp {}: ARP socket: {e}", r.spec.config.name),
                }
            }
            _ = sleep_until(next_round) => {
                next_round = Some(Instant::now() + PORT_CHECK_EVERY);
                r.start_port_round();
            }
            Some(paths) = r.rounds.1.recv() => r.on_port_round(&paths).await,
            _ = sleep_until(r.followups.map(|(at, _)| at)) => r.follow_up(),
            _ = sleep_until(r.release_at) => {
                r.remove_vip().await;
                r.publish();
            }
            _ = sleep_until(r.pending_yield.map(|p| p.at)) => r.yield_to_silent_holder().await,
            _ = sleep_until(r.handback.as_ref().and_then(Handback::ends_at).map(Into::into)) => {
                r.end_hand_back().await;
            }
            _ = sleep_until(r.retired_until) => r.drop_retired().await,
            _ = sleep_until(next_refresh) => {
                next_refresh = None;
                r.announce();
                r.publish();
            }
            changed = r.checks.changed(), if checks_alive => {
                if changed.is_err() {
                    checks_alive = false;
                    continue;
                }
                let p = effective_priority(r.spec.base, health::weight(&r.checks.borrow_and_update()));
                let p = r.with_port_penalty(p);
                tracing::info!("vrrp {}: priority {} -> {p}", r.spec.config.name, r.machine.priority());
                let now = r.now();
                let actions = r.machine.set_priority(now, p);
                r.execute(actions).await;
            }
        }
    }
    check_stop.cancel();
    let master_down = r.machine.master_down_interval();
    let actions = r.machine.shutdown();
    let handing_over = actions.contains(&Action::RemoveVip);
    let (remove, first): (Vec<Action>, Vec<Action>) =
        actions.into_iter().partition(|a| *a == Action::RemoveVip);
    r.execute(first).await;
    if handing_over && r.await_successor(master_down).await {
        // A hand-over: retire the VIP (with hand-backs on) rather than remove it.
        r.release_at = Some(Instant::now());
    }
    r.execute(remove).await;
    if r.release_at.is_some() {
        // Stopped within a hand-over's grace.
        r.remove_vip().await;
    }
    if r.retired_until.is_some() {
        r.await_drain().await;
    }
    if r.handback.is_some() {
        r.end_hand_back().await;
    }
    // Whatever the state, leave no VIP behind.
    r.clear_vip().await;
    Ok(())
}

/// The next frame of `sock`, or never without one.
async fn recv_arp(sock: Option<&announce::ArpSocket>) -> std::io::Result<Vec<u8>> {
    match sock {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

fn fmt_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::cluster::RolePriorities;

    fn spec(version: VrrpVersion, pass: Option<&str>) -> Spec {
        Spec {
            config: VrrpInstanceConfig {
                name: "api".into(),
                vip: "10.0.0.5".parse().unwrap(),
                vrid: 7,
                version,
                advert_interval_ms: 1000,
                transport: VrrpTransport::Multicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: pass.map(Into::into),
                preempt: true,
                garp_refresh_secs: 60,
                handback_secs: 0,
                priorities: RolePriorities::default(),
                checks: vec![],
                required_checks: vec![],
            },
            base: 40,
            iface: "eth0".into(),
            primary: "10.0.0.11".parse().unwrap(),
            own: vec!["10.0.0.11".parse().unwrap()],
        }
    }

    fn packet(a: &Advert, src: &str, ttl: u8) -> Received {
        let src: IpAddr = src.parse().unwrap();
        Received {
            src,
            dst: GROUP_V4.into(),
            ttl,
            payload: codec::encode(a, src, GROUP_V4.into()).unwrap(),
            age: Duration::ZERO,
        }
    }

    fn advert(version: Version, auth: Auth) -> Advert {
        Advert {
            version,
            vrid: 7,
            priority: 100,
            interval_cs: 100,
            addresses: vec!["10.0.0.5".parse().unwrap()],
            auth,
        }
    }

    #[test]
    fn validation_drops_by_reason() {
        let s = spec(VrrpVersion::V3, None);
        let good = advert(Version::V3, Auth::None);
        assert!(s.validate(&packet(&good, "10.0.0.12", 255)).is_ok());
        assert_eq!(s.validate(&packet(&good, "10.0.0.12", 254)), Err("ttl"));
        assert_eq!(
            s.validate(&packet(&good, "10.0.0.11", 255)),
            Err("own_address")
        );
        let mut a = good.clone();
        a.vrid = 8;
        assert_eq!(s.validate(&packet(&a, "10.0.0.12", 255)), Err("vrid"));
        let mut a = good.clone();
        a.addresses.push("10.0.0.6".parse().unwrap());
        assert_eq!(
            s.validate(&packet(&a, "10.0.0.12", 255)),
            Err("address_count")
        );
        let mut a = good.clone();
        a.addresses = vec!["10.0.0.6".parse().unwrap()];
        assert_eq!(s.validate(&packet(&a, "10.0.0.12", 255)), Err("address"));
        let mut p = packet(&good, "10.0.0.12", 255);
        p.payload[7] ^= 0xff;
        assert_eq!(s.validate(&p), Err("checksum"));
        p.payload.push(0);
        assert_eq!(s.validate(&p), Err("length"));
        let v2 = advert(Version::V2, Auth::None);
        assert_eq!(s.validate(&packet(&v2, "10.0.0.12", 255)), Err("version"));
    }

    #[test]
    fn v2_auth_and_interval_must_match() {
        let s = spec(VrrpVersion::V2, Some("secret"));
        let ok = advert(Version::V2, Auth::pass("secret"));
        assert!(s.validate(&packet(&ok, "10.0.0.12", 255)).is_ok());
        let wrong = advert(Version::V2, Auth::pass("nope"));
        assert_eq!(s.validate(&packet(&wrong, "10.0.0.12", 255)), Err("auth"));
        let none = advert(Version::V2, Auth::None);
        assert_eq!(s.validate(&packet(&none, "10.0.0.12", 255)), Err("auth"));
        let mut slow = ok.clone();
        slow.interval_cs = 200;
        assert_eq!(
            s.validate(&packet(&slow, "10.0.0.12", 255)),
            Err("interval")
        );
    }
}
