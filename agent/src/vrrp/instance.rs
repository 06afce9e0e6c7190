//! One virtual router at run time: the I/O runner around its decision core
//! ([`super::router::Router`]). It owns the sockets (adverts, ARP or neighbour discovery),
//! the VIP on the interface, the hand-back rules and the health checks; it feeds the core
//! every packet, frame, member list, check result and timer with the time, carries out the
//! [`Effect`]s the core returns, logs its [`Note`]s, publishes the status, and on stop says
//! goodbye and hands the VIP over.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::announce::{self, ArpSocket, NdSocket};
use super::codec::{self, Advert};
use super::conflict;
use super::handback::Handback;
use super::router::{Effect, HANDOVER_GRACE, Note, Router, Setup};
use super::socket::{Received, VrrpSocket};
use super::spec::Spec;
use super::status::{InstanceStatus, StatusMap};
use super::{portsec, reach};
use crate::context::AgentContext;
use crate::health::{self, CheckState};
use crate::net::mac::Mac;
use crate::net::vip;

/// Packets already queued that a backup reads before acting on its timer (see
/// `Runner::read_queued`): far more than the routers of one segment send in a stall.
const QUEUED_BEFORE_TIMER: usize = 64;
/// How long a stopping holder keeps its retired VIP for the proxy to drain the connections
/// a new holder forwards back ([`super::handback`]): under the agent's 10 s stop deadline.
const HANDBACK_STOP_HOLD: Duration = Duration::from_secs(8);

/// The second path to the VIP's holder ([`super::confirm`]), by the VIP's family.
enum Prober {
    /// ARP requests from the node's address; every ARP frame on the interface read back
    /// (also the unicast conflict watch's, [`super::conflict`]).
    Arp(ArpSocket),
    /// Neighbour solicitations; advertisements read back.
    Nd(NdSocket),
    /// Neither could be opened: a silent master's death is taken from the timing alone.
    None,
}

struct Runner {
    ctx: AgentContext,
    core: Router,
    sock: VrrpSocket,
    prober: Prober,
    vip: vip::VipManager,
    /// The followers' VIPs ([`Spec::companions`]): on the interface exactly while ours is
    /// (not retired after a hand-over: the hand-back forwards our VIP's connections only).
    companions: Vec<vip::VipManager>,
    mac: [u8; 6],
    origin: Instant,
    checks: tokio::sync::watch::Receiver<Vec<CheckState>>,
    status: StatusMap,
    /// Connections across a clean hand-over (`handbackSecs` > 0): this node's forwarding of
    /// an old holder's segments ([`super::handback`]).
    handback: Option<Handback>,
    /// When the VIP retired after a hand-over ([`vip::VipManager::retire`]) goes for good.
    retired_until: Option<Instant>,
    /// Results of the port check's rounds (each runs in its own task).
    rounds: (
        tokio::sync::mpsc::Sender<Vec<portsec::Paths>>,
        tokio::sync::mpsc::Receiver<Vec<portsec::Paths>>,
    ),
}

impl Runner {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn name(&self) -> &str {
        &self.core.spec().config.name
    }

    fn vip_addr(&self) -> IpAddr {
        self.core.spec().config.vip
    }

    /// Carries out the core's effects, in order, and publishes the status.
    async fn execute(&mut self, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::SendAdvert { priority } => self.send_advert(priority).await,
                Effect::AddVip => self.add_vip().await,
                Effect::RemoveVip { handed_over } => self.remove_vip(handed_over).await,
                Effect::Announce => self.announce(),
                Effect::Probe => self.probe(),
                Effect::PeerDown(addr) => {
                    tracing::info!(
                        "vrrp {}: adverts from {addr} stopped; taking over",
                        self.name()
                    );
                    self.ctx.bus.vrrp_peer_down.send_replace(Some(addr));
                }
                Effect::HandBack { to, why } => self.hand_back_to(to, why).await,
                Effect::PortRound(targets) => self.start_port_round(targets),
                Effect::Note(n) => self.log(&n),
            }
        }
        self.publish();
    }

    /// Words a note of the core.
    fn log(&self, n: &Note) {
        let name = self.name();
        let vip = self.vip_addr();
        match n {
            Note::Dropped { src, reason } => {
                tracing::debug!("vrrp {name}: dropped packet from {src}: {reason}");
            }
            Note::LoneClaim => tracing::warn!(
                "vrrp {name}: no peer heard within the claim grace and nobody answers for {vip}; claiming it alone"
            ),
            Note::GraceHolderAnswers => tracing::info!(
                "vrrp {name}: claim grace over, but another host answers for {vip}: waiting to hear that holder"
            ),
            Note::GateHeard { src, priority } => {
                tracing::info!("vrrp {name}: heard {src} (priority {priority}): claim gate open")
            }
            Note::GatePeerKnown => tracing::info!(
                "vrrp {name}: a peer is known through members: claim gate open, waiting Master_Down"
            ),
            Note::AdvertsAgain { src } => {
                tracing::info!("vrrp {name}: adverts arrive again (from {src})");
            }
            Note::Leaving { src, rank, wait } => tracing::info!(
                "vrrp {name}: {src} is leaving (priority 0); rank {rank} among the routers left: taking over in {wait:?} unless one ranked before us does"
            ),
            Note::RankWait {
                master,
                silent,
                rank,
                wait,
            } => tracing::info!(
                "vrrp {name}: Master_Down for {master} ({}); rank {rank} among the routers left: taking over in {wait:?} unless one ranked before us does",
                if *silent {
                    "its adverts stopped"
                } else {
                    "a priority we preempt"
                }
            ),
            Note::HandOver { by, priority } => {
                let by = match by {
                    Some((by, p)) => {
                        format!("{by} (priority {p}) outranks us (priority {priority})")
                    }
                    None => "another holder wins".to_owned(),
                };
                tracing::info!(
                    "vrrp {name}: {by}: leaving MASTER, keeping {vip} {HANDOVER_GRACE:?} for its announcement"
                );
            }
            Note::Priority { from, to } => tracing::info!("vrrp {name}: priority {from} -> {to}"),
            Note::ConflictStay { mac } => tracing::info!(
                "vrrp {name}: {vip} also held by {} (lower MAC, no adverts from it): keeping it",
                Mac(*mac)
            ),
            Note::ConflictYieldPending { mac, wait } => tracing::info!(
                "vrrp {name}: {vip} also held by {} (higher MAC, no adverts from it): giving it up in {wait:?} unless an advert arrives",
                Mac(*mac)
            ),
            Note::ConflictVrrpElects { mac } => tracing::info!(
                "vrrp {name}: adverts arrive while {} announces {vip}: VRRP elects between us",
                Mac(*mac)
            ),
            Note::ConflictGone { mac } => tracing::info!(
                "vrrp {name}: {} no longer answers for {vip}: keeping it",
                Mac(*mac)
            ),
            Note::ConflictYield { mac } => tracing::warn!(
                "vrrp {name}: {vip} also held by {} (higher MAC, no adverts from it): giving it up and waiting for a peer",
                Mac(*mac)
            ),
            Note::PortDropsVip { fix } => tracing::warn!(
                "vrrp {name}: traffic from {vip} does not leave this node's port (peers answer {} but not {vip}): the port's security drops the VIP, which is likely not one of its allowed address pairs; fix: {fix}; lowering this node's priority to 1 so that a node whose port passes {vip} takes it",
                self.core.spec().primary
            ),
            Note::PortPassesVip => {
                tracing::info!("vrrp {name}: traffic from {vip} leaves this node's port again");
            }
            Note::VrrpBlocked { peers, fix } => tracing::warn!(
                "vrrp {name}: another host answers ARP for {vip} but no VRRP advert has arrived while members {} are live: the network likely drops IP protocol 112 (a security group without it); not claiming {vip} beside its holder; fix: {fix}",
                peers.join(", ")
            ),
            Note::ClaimHeld { master, silent_for } => tracing::info!(
                "vrrp {name}: no advert from {} for {silent_for:?}, but the holder of {vip} answers {}: alive, not claiming",
                master.map_or("any router".to_owned(), |m| m.to_string()),
                self.second_path()
            ),
            Note::ConfirmedDead {
                master,
                silent_for,
                asked_for,
            } => tracing::info!(
                "vrrp {name}: no advert from {} for {silent_for:?} and nobody answered {} for {vip} in {asked_for:?}: its holder is gone",
                master.map_or("any router".to_owned(), |m| m.to_string()),
                self.second_path()
            ),
            Note::DeafYield { to, priority } => tracing::warn!(
                "vrrp {name}: {to} (priority {priority}) still advertises as master after our adverts: it does not hear us; giving {vip} up to it"
            ),
            Note::ForeignRouter {
                src,
                vrid,
                addresses,
                reason,
            } => tracing::warn!(
                "vrrp {name}: VRID collision: {src}, not a member of this cluster, advertises VRID {vrid} for {} (not ours: {reason}); its adverts are dropped and counted (foreignAdverts); {}",
                addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::status::model::ForeignRouter::FIX
            ),
        }
    }

    fn second_path(&self) -> &'static str {
        match self.prober {
            Prober::Arp(_) => "ARP",
            Prober::Nd(_) => "neighbour solicitation",
            Prober::None => "(no second path)",
        }
    }

    async fn add_vip(&mut self) {
        tracing::info!(
            "vrrp {}: MASTER (priority {}), adding {}",
            self.name(),
            self.core.machine().priority(),
            self.vip_addr()
        );
        if let Err(e) = self.vip.add().await {
            tracing::warn!("vrrp {}: {e}", self.name());
        }
        for c in &self.companions {
            match c.add().await {
                Ok(()) => tracing::info!("vrrp {}: adding {} with it", self.name(), c.vip()),
                Err(e) => tracing::warn!("vrrp {}: {e}", self.name()),
            }
        }
        let held = self.held();
        self.ctx.bus.vips_held.send_modify(|s| s.extend(held));
    }

    /// Our VIP and the followers'.
    fn held(&self) -> Vec<IpAddr> {
        std::iter::once(&self.vip)
            .chain(&self.companions)
            .map(vip::VipManager::vip)
            .collect()
    }

    /// Takes the followers' VIPs off the interface.
    async fn remove_companions(&mut self) {
        for c in &self.companions {
            if let Err(e) = c.remove().await {
                tracing::warn!("vrrp {}: {e}", self.name());
            }
        }
    }

    /// Removes the VIP now (leaving master, or a hand-over's grace over). After a hand-over
    /// with hand-backs on, the VIP is retired for the window instead
    /// ([`vip::VipManager::retire`]): the successor forwards this node's connections here.
    async fn remove_vip(&mut self, handed_over: bool) {
        let window = Duration::from_secs(u64::from(self.core.spec().config.handback_secs));
        let (name, vip) = (self.name().to_owned(), self.vip_addr());
        if handed_over && !window.is_zero() {
            tracing::info!(
                "vrrp {name}: hand-over done, retiring {vip} for {window:?}: off the interface, its open connections go on here"
            );
            match self.vip.retire().await {
                Ok(()) => self.retired_until = Some(Instant::now() + window),
                Err(e) => {
                    tracing::warn!("vrrp {name}: retiring: {e}");
                    self.clear_vip().await;
                }
            }
        } else {
            let why = if handed_over {
                "hand-over done"
            } else {
                "leaving MASTER"
            };
            tracing::info!("vrrp {name}: {why}, removing {vip}");
            self.clear_vip().await;
        }
        self.remove_companions().await;
        let held = self.held();
        self.ctx.bus.vips_held.send_modify(|s| {
            for v in &held {
                s.remove(v);
            }
        });
    }

    /// Starts forwarding the segments of an old holder's connections to `src`
    /// ([`super::handback`]) when this backup is about to take the VIP from it.
    async fn hand_back_to(&mut self, src: IpAddr, why: super::handback::TakeOver) {
        let name = self.name().to_owned();
        let (vip, secs) = (self.vip_addr(), self.core.spec().config.handback_secs);
        let Some(h) = self.handback.as_mut() else {
            return;
        };
        if h.target() == Some(src) {
            return;
        }
        match h.forward_to(src).await {
            Ok(()) => tracing::info!(
                "vrrp {name}: segments to {vip} of connections not opened here go to {src} (the holder {why}) for {secs}s"
            ),
            Err(e) => h.log_failure(&name, &e),
        }
    }

    /// The hand-back's forwarding window is over.
    async fn end_hand_back(&mut self) {
        let name = self.name().to_owned();
        if let Some(h) = self.handback.as_mut() {
            if let Some(to) = h.target() {
                tracing::info!("vrrp {name}: hand-back to {to} over");
            }
            h.end().await;
        }
    }

    /// Removes every copy of the VIP from the interface and its retirement, if any (a
    /// failure is logged: the runner goes on).
    async fn clear_vip(&mut self) {
        self.retired_until = None;
        if let Err(e) = self.vip.remove().await {
            tracing::warn!("vrrp {}: {e}", self.name());
        }
        self.remove_companions().await;
    }

    /// The retired VIP's window is over: its rule and route go too.
    async fn drop_retired(&mut self) {
        self.retired_until = None;
        let (name, vip) = (self.name().to_owned(), self.vip_addr());
        if self.core.machine().state() == super::fsm::State::Master {
            // Master again within the window: the VIP stays; the retirement's rule and
            // route, which would otherwise linger until the VIP next goes, go now.
            match self.vip.end_retirement().await {
                Ok(n) if n > 0 => {
                    tracing::info!("vrrp {name}: master again; the retirement of {vip} ended");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("vrrp {name}: {e}"),
            }
            return;
        }
        tracing::info!("vrrp {name}: removing retired {vip}");
        self.clear_vip().await;
    }

    async fn send_advert(&mut self, priority: u8) {
        let spec = self.core.spec();
        let advert = Advert {
            version: spec.version(),
            vrid: spec.config.vrid,
            priority,
            interval_cs: spec.interval_cs(),
            addresses: vec![spec.config.vip],
            auth: spec.auth(),
        };
        let primary = spec.primary;
        for dst in self.core.destinations(self.now()) {
            match codec::encode(&advert, primary, dst) {
                Ok(bytes) => match self.sock.send(&bytes, dst).await {
                    Ok(()) => self.core.counters_mut().adverts_out += 1,
                    Err(e) => tracing::debug!("vrrp {}: send to {dst}: {e}", self.name()),
                },
                Err(e) => tracing::warn!("vrrp {}: {e}", self.name()),
            }
        }
    }

    /// Gratuitous ARP / unsolicited NA for our VIP and each follower's: hosts learn
    /// every VIP of the role on this node at once.
    fn announce(&mut self) {
        for vip in self.held() {
            self.announce_one(vip);
        }
    }

    fn announce_one(&mut self, vip: IpAddr) {
        let res = match vip {
            IpAddr::V4(v) => announce::send_garp(self.vip.index(), self.mac, v),
            IpAddr::V6(v) => announce::send_na(self.vip.index(), self.mac, v),
        };
        match res {
            Ok(()) => self.core.counters_mut().announcements += 1,
            Err(e) => tracing::warn!("vrrp {}: announce {vip}: {e}", self.name()),
        }
    }

    /// Asks for the VIP by the second path.
    fn probe(&self) {
        let res = match (&self.prober, self.vip_addr(), self.core.spec().primary) {
            (Prober::Arp(s), IpAddr::V4(vip), IpAddr::V4(node)) => {
                s.send_probe(self.mac, node, vip)
            }
            (Prober::Nd(s), IpAddr::V6(vip), _) => s.send_probe(vip),
            _ => Ok(()),
        };
        if let Err(e) = res {
            tracing::debug!("vrrp {}: probe: {e}", self.name());
        }
    }

    /// A frame or message from the prober, received `age` before now.
    fn on_probe_answer(&mut self, bytes: &[u8], age: Duration) -> Vec<Effect> {
        let at = self.now().saturating_sub(age);
        match (&self.prober, self.vip_addr()) {
            (Prober::Arp(_), _) => match conflict::parse_arp(bytes) {
                Some(arp) => self.core.on_arp(at, &arp),
                None => Vec::new(),
            },
            (Prober::Nd(_), IpAddr::V6(vip)) => {
                if let Some(na) = announce::parse_na(bytes)
                    && na.target == vip
                    && na.mac != Some(self.mac)
                {
                    self.core.on_holder_answer(at);
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Starts one round of the port check in a task of its own.
    fn start_port_round(&self, targets: Vec<std::net::SocketAddr>) {
        let (node, vip) = (self.core.spec().primary, self.vip_addr());
        let tx = self.rounds.0.clone();
        tokio::spawn(async move {
            let _ = tx.send(reach::round(node, vip, &targets).await).await;
        });
    }

    /// Handles the packets and probe answers already queued before a backup's timer is
    /// acted on. When this node was stalled (a loaded host, a descheduled guest) its timer
    /// and the adverts that arrived meanwhile are ready together, and the loop's `select!`
    /// may take the timer first: a master that kept advertising would look silent, and this
    /// backup would claim its VIP for a moment (seen on OpenStack with TCG guests). Each
    /// counts from when the kernel received it. Bounded, so a flood cannot hold the timer
    /// off.
    async fn read_queued(&mut self) {
        for _ in 0..QUEUED_BEFORE_TIMER {
            match self.sock.try_recv() {
                Ok(Some(pkt)) => self.on_packet(&pkt).await,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("vrrp {}: reading queued packets: {e}", self.name());
                    break;
                }
            }
        }
        for _ in 0..QUEUED_BEFORE_TIMER {
            let next = match &self.prober {
                Prober::Arp(s) => s.try_recv(),
                Prober::Nd(s) => s.try_recv(),
                Prober::None => Ok(None),
            };
            match next {
                Ok(Some((bytes, age))) => {
                    let effects = self.on_probe_answer(&bytes, age);
                    self.execute(effects).await;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("vrrp {}: reading queued answers: {e}", self.name());
                    break;
                }
            }
        }
    }

    async fn on_packet(&mut self, pkt: &Received) {
        let now = self.now();
        let effects = self.core.on_packet(now, pkt);
        self.execute(effects).await;
    }

    async fn on_timer(&mut self) {
        if self.core.machine().state() == super::fsm::State::Backup {
            self.read_queued().await;
        }
        let now = self.now();
        let effects = self.core.on_timer(now);
        self.execute(effects).await;
    }

    fn publish(&self) {
        let now = self.now();
        let snap = self.core.snapshot(now);
        let at = |d: Duration| {
            Instant::now()
                .checked_sub(now.saturating_sub(d))
                .unwrap_or(self.origin)
        };
        let spec = self.core.spec();
        let (master, master_priority) = match snap.master {
            Some((a, p)) => (Some(a), Some(p)),
            None => (None, None),
        };
        self.status.insert(InstanceStatus {
            name: spec.config.name.clone(),
            vip: spec.config.vip,
            companion_vips: spec.companions.clone(),
            vrid: spec.config.vrid,
            state: snap.state,
            base_priority: spec.base,
            priority: snap.priority,
            master,
            master_priority,
            checks: self.checks.borrow().clone(),
            claim_gate: snap.claim_gate,
            destinations: snap.destinations,
            counters: snap.counters,
            state_since: Some(at(snap.state_since)),
            port_security: snap
                .findings
                .into_iter()
                .map(|(p, (since, fix))| (p, (at(since), fix)))
                .collect(),
            foreign_routers: snap
                .foreign
                .into_iter()
                .map(|(src, f)| {
                    let seen = super::status::ForeignSeen {
                        addresses: f.addresses,
                        first: at(f.first),
                        last: at(f.last),
                        adverts: f.adverts,
                    };
                    (src, seen)
                })
                .collect(),
        });
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
                        self.name(), self.vip_addr()
                    );
                    return false;
                }
                r = self.sock.recv() => match r {
                    Ok(p) => p,
                    Err(_) => return false,
                },
            };
            if let Ok(advert) = self.core.spec().validate(&pkt)
                && advert.priority > 0
            {
                tracing::info!(
                    "vrrp {}: {} took over after {:?}; removing {}",
                    self.name(),
                    pkt.src,
                    started.elapsed(),
                    self.vip_addr()
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
            self.name(),
            if done {
                "proxy drained"
            } else {
                "still draining"
            },
            t.elapsed(),
            self.vip_addr()
        );
        self.clear_vip().await;
    }

    /// Stops: the goodbye, the hand-over and every trace of the VIP.
    async fn stop(&mut self) {
        let limit = self.core.successor_bound();
        let now = self.now();
        let effects = self.core.shutdown(now);
        let goodbye = effects
            .iter()
            .any(|e| matches!(e, Effect::SendAdvert { priority: 0 }));
        let (remove, first): (Vec<Effect>, Vec<Effect>) = effects
            .into_iter()
            .partition(|e| matches!(e, Effect::RemoveVip { .. }));
        let grace_pending = remove
            .iter()
            .any(|e| matches!(e, Effect::RemoveVip { handed_over: true }));
        self.execute(first).await;
        let handed_over = goodbye && self.await_successor(limit).await;
        if goodbye {
            // A hand-over: retire the VIP (with hand-backs on) rather than remove it.
            self.remove_vip(handed_over).await;
        } else if grace_pending {
            // Stopped within a hand-over's grace.
            self.remove_vip(true).await;
        }
        if self.retired_until.is_some() {
            self.await_drain().await;
        }
        if self.handback.is_some() {
            self.end_hand_back().await;
        }
        // Whatever the state, leave no VIP behind.
        self.clear_vip().await;
        self.publish();
    }
}

/// Opens the second path to the VIP's holder for `spec`: ARP for an IPv4 VIP, neighbour
/// discovery for an IPv6 one (from the node's own address of that family).
fn open_prober(spec: &Spec, ifindex: u32, mac: [u8; 6]) -> Prober {
    let res = match spec.config.vip {
        IpAddr::V4(_) => ArpSocket::open(ifindex).map(Prober::Arp),
        IpAddr::V6(_) => {
            let src = spec
                .own
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V6(a) => Some(*a),
                    IpAddr::V4(_) => None,
                })
                .min_by_key(|a| a.is_unicast_link_local())
                .or(match spec.primary {
                    IpAddr::V6(a) => Some(a),
                    IpAddr::V4(_) => None,
                });
            match src {
                Some(src) => NdSocket::open(&spec.iface, ifindex, src, mac).map(Prober::Nd),
                None => Ok(Prober::None),
            }
        }
    };
    res.unwrap_or_else(|e| {
        tracing::warn!(
            "vrrp {}: cannot ask for {} by a second path ({e}): a silent master counts as dead once its adverts are missing long enough",
            spec.config.name,
            spec.config.vip
        );
        Prober::None
    })
}

/// Runs one instance until `stop`; on stop sends priority 0 (if master) and removes the VIP.
pub async fn run(
    spec: Spec,
    ctx: AgentContext,
    status: StatusMap,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let cfg = spec.config.clone();
    let vip = vip::VipManager::new(&spec.iface, cfg.vip).await?;
    let mut companions = Vec::new();
    for c in &spec.companions {
        companions.push(vip::VipManager::new(&spec.iface, *c).await?);
    }
    for m in std::iter::once(&vip).chain(&companions) {
        if m.remove().await? > 0 {
            tracing::info!(
                "vrrp {}: removed stale {} from {}",
                cfg.name,
                m.vip(),
                spec.iface
            );
        }
    }
    if !companions.is_empty() {
        tracing::info!(
            "vrrp {}: {} held with {} (instances that follow it)",
            cfg.name,
            spec.companions
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            cfg.vip
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
        cfg.transport == keelson_cluster::cluster::VrrpTransport::Multicast,
    )?;
    let prober = open_prober(&spec, vip.index(), mac);
    let check_stop = stop.child_token();
    let checks = health::spawn(
        &cfg.checks,
        ctx.bus.clone(),
        health::local_apiserver(&ctx, cfg.vip),
        check_stop.clone(),
    );
    let weight = health::weight(&checks.borrow());
    let port_check_port = match ctx.cluster.metrics.port {
        0 => ctx.cluster.ignition.tls_port,
        p => p,
    };
    let origin = Instant::now();
    let core = Router::new(
        Setup {
            node: ctx.node.name.clone(),
            mac,
            weight,
            claim_grace: cfg.claim_grace(&ctx.cluster.members),
            heard_retention: Duration::from_secs(u64::from(ctx.cluster.members.expiry_secs.max(1))),
            port_check_port,
            spec,
        },
        Duration::ZERO,
    );
    let mut members = ctx.bus.members.subscribe();
    let mut r = Runner {
        ctx,
        core,
        sock,
        prober,
        vip,
        companions,
        mac,
        origin,
        checks,
        status,
        handback,
        retired_until: None,
        rounds: tokio::sync::mpsc::channel(4),
    };
    let now = r.now();
    let effects = r.core.start(now);
    r.execute(effects).await;
    let list = members.borrow_and_update().clone();
    let effects = r.core.set_members(r.now(), &list);
    r.execute(effects).await;
    // With no checks the sender is gone at once; stop polling it then.
    let mut checks_alive = true;
    loop {
        let wake = r.core.next_wakeup().map(|d| r.origin + d);
        tokio::select! {
            _ = stop.cancelled() => break,
            res = r.sock.recv() => r.on_packet(&res?).await,
            _ = sleep_until(wake) => r.on_timer().await,
            changed = members.changed() => {
                if changed.is_ok() {
                    let list = members.borrow_and_update().clone();
                    let now = r.now();
                    let effects = r.core.set_members(now, &list);
                    r.execute(effects).await;
                }
            }
            answer = recv_answer(&r.prober) => match answer {
                Ok((bytes, age)) => {
                    let effects = r.on_probe_answer(&bytes, age);
                    r.execute(effects).await;
                }
                Err(e) => tracing::debug!("vrrp {}: probe socket: {e}", r.name()),
            },
            Some(paths) = r.rounds.1.recv() => {
                let now = r.now();
                let effects = r.core.on_port_round(now, &paths);
                r.execute(effects).await;
            }
            _ = sleep_until(r.handback.as_ref().and_then(Handback::ends_at).map(Into::into)) => {
                r.end_hand_back().await;
            }
            _ = sleep_until(r.retired_until) => r.drop_retired().await,
            changed = r.checks.changed(), if checks_alive => {
                if changed.is_err() {
                    checks_alive = false;
                    continue;
                }
                let weight = health::weight(&r.checks.borrow_and_update());
                let now = r.now();
                let effects = r.core.set_weight(now, weight);
                r.execute(effects).await;
            }
        }
    }
    check_stop.cancel();
    r.stop().await;
    Ok(())
}

/// The next answer on the prober's socket, or never without one.
async fn recv_answer(prober: &Prober) -> std::io::Result<(Vec<u8>, Duration)> {
    match prober {
        Prober::Arp(s) => s.recv().await,
        Prober::Nd(s) => s.recv().await,
        Prober::None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
