//! What a VRRP instance reports: its counters and status (`keelson-agent vrrp`'s JSON
//! lines, the `vrrp` section of `keelson-agent status`, the `keelson_vrrp_*` metrics), and
//! the map of every instance's status that the runners write and the views read.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::watch;

use super::fsm::State;
use super::portsec::Problem;
use crate::health::CheckState;
use crate::status::model::GateState;

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
    /// Times Master_Down ran out on a silent master but the VIP's holder answered the
    /// second path (ARP / neighbour solicitation), so this backup did not claim.
    pub claims_held: u64,
    /// Times this master gave the VIP up to a router that could not hear it (its adverts
    /// as master went on after ours).
    pub deaf_yields: u64,
    /// Adverts on our VRID from another virtual router (a host that is neither a member
    /// nor a static peer, advertising other VIPs, version or authentication).
    pub foreign_adverts: u64,
    /// Routers heard that were forgotten before their retention ran out, to keep at most
    /// [`super::router::MAX_HEARD`] (the one heard longest ago first).
    pub heard_forgotten: u64,
}

/// What an instance publishes for `status`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Instance name.
    pub name: String,
    /// VIP.
    pub vip: IpAddr,
    /// The VIPs held with it (instances that follow it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub companion_vips: Vec<IpAddr>,
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
    /// Other virtual routers heard on our VRID, by source.
    #[serde(skip)]
    pub foreign_routers: BTreeMap<IpAddr, ForeignSeen>,
}

/// Another virtual router heard on our VRID ([`super::router::ForeignRouter`]), its times
/// as instants.
#[derive(Debug, Clone)]
pub struct ForeignSeen {
    /// The VIPs it advertises.
    pub addresses: Vec<IpAddr>,
    /// Its first advert.
    pub first: Instant,
    /// Its last advert.
    pub last: Instant,
    /// Its adverts heard.
    pub adverts: u64,
}

impl InstanceStatus {
    /// The typed status section of this instance (`status`, `/metrics`).
    pub fn view(&self, now: Instant) -> crate::status::model::VrrpInstance {
        use crate::status::model::{HealthCheck, VrrpInstance, VrrpState};
        let c = &self.counters;
        VrrpInstance {
            name: self.name.clone(),
            vip: self.vip,
            companion_vips: self.companion_vips.clone(),
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
            claims_held: c.claims_held,
            deaf_yields: c.deaf_yields,
            foreign_adverts: c.foreign_adverts,
            heard_forgotten: c.heard_forgotten,
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
            foreign_routers: self
                .foreign_routers
                .iter()
                .filter(|(_, f)| {
                    now.saturating_duration_since(f.last) < super::router::FOREIGN_FINDING_HOLD
                })
                .map(|(src, f)| crate::status::model::ForeignRouter {
                    source: *src,
                    vrid: self.vrid,
                    addresses: f.addresses.clone(),
                    adverts: f.adverts,
                    seconds: now.saturating_duration_since(f.first).as_secs_f64(),
                    last_seconds: now.saturating_duration_since(f.last).as_secs_f64(),
                })
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
