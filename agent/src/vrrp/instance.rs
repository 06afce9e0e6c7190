//! One virtual router at run time: sockets + VIP + announcements around a [`Machine`].
//! Validates every received packet (counting drops by reason), feeds the machine, carries
//! out its actions, follows health weights, and cleans up on stop.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keelson_ignition::cluster::{VrrpInstanceConfig, VrrpTransport, VrrpVersion};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::codec::{self, Advert, Auth, CodecError, GROUP_V4, GROUP_V6, Version};
use super::fsm::{Action, Machine, Params, State, effective_priority};
use super::socket::{Received, VrrpSocket};
use super::{announce, vip};
use crate::context::AgentContext;
use crate::health::{self, CheckState};

/// How long a stopping master keeps the VIP after its successor's first advert: that
/// advert and the successor's gratuitous ARP go out together; hosts need a moment.
const HANDOVER_GRACE: Duration = Duration::from_millis(200);

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
    /// Counters.
    pub counters: Counters,
    /// When it entered its current state.
    #[serde(skip)]
    pub state_since: Option<Instant>,
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
            drops: c.drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
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

/// Shared status of all instances, republished as the `vrrp` snapshot.
pub type StatusMap = Arc<Mutex<BTreeMap<String, InstanceStatus>>>;

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
}

impl Runner {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn destinations(&self) -> Vec<IpAddr> {
        if self.spec.config.transport == VrrpTransport::Multicast {
            return vec![match self.spec.primary {
                IpAddr::V4(_) => GROUP_V4.into(),
                IpAddr::V6(_) => GROUP_V6.into(),
            }];
        }
        let v6 = self.spec.primary.is_ipv6();
        let mut peers: Vec<IpAddr> = self.spec.config.unicast_peers.clone();
        for m in self.ctx.bus.members.borrow().iter() {
            peers.extend(m.addresses.iter().copied());
        }
        peers.retain(|p| p.is_ipv6() == v6 && !self.spec.own.contains(p));
        peers.sort();
        peers.dedup();
        peers
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
                    if let Err(e) = self.vip.add().await {
                        tracing::warn!("vrrp {}: {e}", self.spec.config.name);
                    }
                    let v = self.spec.config.vip;
                    self.ctx.bus.vips_held.send_modify(|s| {
                        s.insert(v);
                    });
                }
                Action::RemoveVip => {
                    tracing::info!(
                        "vrrp {}: leaving MASTER, removing {}",
                        self.spec.config.name,
                        self.spec.config.vip
                    );
                    if let Err(e) = self.vip.remove().await {
                        tracing::warn!("vrrp {}: {e}", self.spec.config.name);
                    }
                    let v = self.spec.config.vip;
                    self.ctx.bus.vips_held.send_modify(|s| {
                        s.remove(&v);
                    });
                }
                Action::Announce => self.announce(),
            }
        }
        self.counters.transitions = self.machine.transitions();
        if self.machine.state() != self.state_seen.0 {
            self.state_seen = (self.machine.state(), Instant::now());
        }
        self.publish();
    }

    /// After a timer: when this backup took over because the master's adverts stopped (not
    /// after its goodbye), tell the proxy that node is gone; called before the takeover's
    /// actions run, so the proxy knows before the VIP frontend opens.
    fn hint_master_down(&self, before: (State, Option<(IpAddr, u8)>)) {
        if let (State::Backup, Some((addr, _))) = before
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
            counters: self.counters.clone(),
            state_since: Some(self.state_seen.1),
        };
        let snapshot = {
            let mut map = self.status.lock().unwrap_or_else(|p| p.into_inner());
            map.insert(st.name.clone(), st);
            serde_json::to_value(&*map).unwrap_or_default()
        };
        self.ctx.bus.publish_status("vrrp", snapshot);
    }

    /// After our goodbye (priority 0), keeps the VIP until another router has taken over
    /// (its first advert as master) and a moment more for hosts to act on its gratuitous
    /// ARP, at most `limit`: the VIP is never without a holder during a clean stop, so no
    /// client connect goes unanswered (keepalived drops it at once, and requests sent in
    /// the backup's skew time fail).
    async fn await_successor(&mut self, limit: Duration) {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let pkt = tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(
                        "vrrp {}: no successor within {limit:?}; removing {} anyway",
                        self.spec.config.name, self.spec.config.vip
                    );
                    return;
                }
                r = self.sock.recv() => match r {
                    Ok(p) => p,
                    Err(_) => return,
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
                return;
            }
        }
    }

    fn drop_packet(&mut self, reason: &'static str) {
        *self.counters.drops.entry(reason).or_default() += 1;
    }
}

/// Runs one instance until `stop`; on stop sends priority 0 (if master) and removes the VIP.
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
    let mac = vip::mac(&spec.iface)?;
    let sock = VrrpSocket::open(
        &spec.iface,
        vip.index(),
        spec.primary,
        cfg.transport == VrrpTransport::Multicast,
    )?;
    let check_stop = stop.child_token();
    let checks = health::spawn(&cfg.checks, ctx.bus.clone(), check_stop.clone());
    let priority = effective_priority(spec.base, health::weight(&checks.borrow()));
    let machine = Machine::new(
        Params {
            interval_cs: spec.interval_cs(),
            preempt: cfg.preempt,
            primary: spec.primary,
        },
        priority,
    );
    let refresh = Duration::from_secs(u64::from(cfg.garp_refresh_secs));
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
    };
    let now = r.now();
    let actions = r.machine.startup(now);
    r.execute(actions).await;
    let mut next_refresh: Option<Instant> = None;
    // With no checks the sender is gone at once; stop polling it then.
    let mut checks_alive = true;
    loop {
        let deadline = r.machine.next_deadline().map(|d| r.origin + d);
        let master = r.machine.state() == State::Master;
        if !master {
            next_refresh = None;
        } else if next_refresh.is_none() && !refresh.is_zero() {
            next_refresh = Some(Instant::now() + refresh);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            res = r.sock.recv() => {
                let pkt = res?;
                match r.spec.validate(&pkt) {
                    Ok(advert) => {
                        r.counters.adverts_in += 1;
                        if advert.priority == 0 {
                            r.master_left = Some(pkt.src);
                        } else if r.master_left == Some(pkt.src) {
                            r.master_left = None;
                        }
                        let now = r.now();
                        let actions = r.machine.on_advert(now, pkt.src, &advert);
                        r.execute(actions).await;
                    }
                    Err(reason) => {
                        tracing::debug!("vrrp {}: dropped packet from {}: {reason}", r.spec.config.name, pkt.src);
                        r.drop_packet(reason);
                        r.publish();
                    }
                }
            }
            _ = sleep_until(deadline) => {
                let now = r.now();
                let before = (r.machine.state(), r.machine.master());
                let actions = r.machine.on_timer(now);
                r.hint_master_down(before);
                r.execute(actions).await;
            }
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
    if handing_over {
        r.await_successor(master_down).await;
    }
    r.execute(remove).await;
    // Whatever the state, leave no VIP behind.
    if let Err(e) = r.vip.remove().await {
        tracing::warn!("vrrp {}: {e}", r.spec.config.name);
    }
    Ok(())
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
    use keelson_ignition::cluster::RolePriorities;

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
                auth_pass: pass.map(Into::into),
                preempt: true,
                garp_refresh_secs: 60,
                priorities: RolePriorities::default(),
                checks: vec![],
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
