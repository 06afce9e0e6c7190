//! The routers around one virtual router: the live members taking part in its instance
//! and the routers heard advertising (with the priority each advertised). Where adverts go
//! (unicast), whom a backup ranks itself among after a goodbye or at Master_Down, and what
//! the port check connects to are all read from here; pure, like the rest of the core.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::dns_label::DnsLabel;
use crate::member::Member;
use crate::vrrp::codec::{GROUP_V4, GROUP_V6};
use crate::vrrp::fsm::effective_priority;
use crate::vrrp::spec::Spec;

/// The most routers heard that an instance keeps (each a destination of its adverts and a
/// rival for the VIP for the retention). Any address on the segment can send an advert that
/// passes [`Spec::validate`], so without a bound every source ever seen would be kept and
/// sent 10 adverts a second; a real segment has one master advertising, a few contenders
/// for an election's length, and the nodes that may take part are also reached as members.
pub const MAX_HEARD: usize = 256;

/// The live members and the routers heard, for one instance.
#[derive(Debug, Clone)]
pub(super) struct Peers {
    /// This node's name (members with it are us).
    node: DnsLabel,
    /// Live members (this node's own record included: readers filter by name).
    members: Vec<Member>,
    /// Routers whose valid adverts arrived: when last, and the priority advertised.
    heard: BTreeMap<IpAddr, (Duration, u8)>,
    /// How long a router heard stays a destination and a rival (`members.expirySecs`).
    retention: Duration,
}

impl Peers {
    /// No member known and no router heard yet.
    pub(super) fn new(node: DnsLabel, retention: Duration) -> Self {
        Peers {
            node,
            members: Vec::new(),
            heard: BTreeMap::new(),
            retention,
        }
    }

    /// The live members changed.
    pub(super) fn set_members(&mut self, members: &[Member]) {
        self.members = members.to_vec();
    }

    /// Whether `src` is a member's address or a static peer: a node of this cluster.
    pub(super) fn of_this_cluster(&self, spec: &Spec, src: IpAddr) -> bool {
        spec.config.unicast_peers.contains(&src)
            || self.members.iter().any(|m| m.addresses.contains(&src))
    }

    /// Records that `src` advertised `priority` at `at`, within [`MAX_HEARD`]: the routers
    /// past the retention go first, then the one heard longest ago. True when that one
    /// had to be forgotten (the caller counts it).
    pub(super) fn remember_heard(&mut self, src: IpAddr, at: Duration, priority: u8) -> bool {
        let mut forgot = false;
        if !self.heard.contains_key(&src) && self.heard.len() >= MAX_HEARD {
            let retention = self.retention;
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
                forgot = true;
            }
        }
        self.heard.insert(src, (at, priority));
        forgot
    }

    /// Where adverts go: the multicast group, or (unicast) the static peers, the live
    /// members whose role takes part in this instance, and every router heard recently;
    /// same family, minus our own addresses.
    pub(super) fn destinations(&self, spec: &Spec, now: Duration) -> Vec<IpAddr> {
        if !spec.unicast() {
            return vec![match spec.primary {
                IpAddr::V4(_) => GROUP_V4.into(),
                IpAddr::V6(_) => GROUP_V6.into(),
            }];
        }
        let v6 = spec.primary.is_ipv6();
        let mut peers: Vec<IpAddr> = spec.config.unicast_peers.clone();
        // Members whose role takes part in this instance (the others would only count
        // our adverts as drops).
        for m in &self.members {
            if spec.config.priorities.for_role(m.role).is_some() {
                peers.extend(m.addresses.iter().copied());
            }
        }
        peers.extend(self.heard_recently(now).map(|(a, _)| a));
        peers.retain(|p| p.is_ipv6() == v6 && !spec.own.contains(p) && !p.is_unspecified());
        peers.sort();
        peers.dedup();
        peers
    }

    /// Whether a live member other than us takes part in this instance.
    pub(super) fn participating_peer(&self, spec: &Spec) -> bool {
        let v6 = spec.primary.is_ipv6();
        self.members.iter().any(|m| {
            m.name != self.node
                && spec.config.priorities.for_role(m.role).is_some()
                && m.addresses.iter().any(|a| a.is_ipv6() == v6)
        })
    }

    /// The names of the live members other than us.
    pub(super) fn others(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.name != self.node)
            .map(|m| m.name.to_string())
            .collect()
    }

    /// The routers whose adverts arrived within the retention (`members.expirySecs`), with
    /// the priority each last advertised.
    fn heard_recently(&self, now: Duration) -> impl Iterator<Item = (IpAddr, u8)> + '_ {
        self.heard
            .iter()
            .filter(move |(_, (t, _))| now.saturating_sub(*t) <= self.retention)
            .map(|(a, (_, p))| (*a, *p))
    }

    /// The other routers that could take over after a goodbye, with the priority each is
    /// assumed to run at ([`super::Machine::goodbye_rank`]): live members taking part in
    /// this instance at their role's base priority with every check passing (what ours is
    /// when whole: every node of a role runs the same checks), and routers heard within the
    /// retention at the priority they last advertised. Members only when our primary
    /// address is comparable with theirs (IPv6 multicast adverts come from link-local
    /// addresses, which no member record names).
    pub(super) fn rivals(&self, spec: &Spec, now: Duration) -> BTreeMap<IpAddr, u8> {
        let mut out: BTreeMap<IpAddr, u8> = self.heard_recently(now).collect();
        let primary = spec.primary;
        let link_local = match primary {
            IpAddr::V4(_) => false,
            IpAddr::V6(a) => a.is_unicast_link_local(),
        };
        if !link_local {
            let weights: i32 = spec.config.checks.iter().map(|c| c.weight).sum();
            for m in &self.members {
                let Some(base) = spec.config.priorities.for_role(m.role) else {
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
        out.retain(|a, _| !spec.own.contains(a));
        out
    }

    /// What the port check connects to: live members taking part in this instance (their
    /// `/metrics` port, open to the machine network on every node), and for IPv4 the
    /// metadata service, there on most clouds even for a node alone.
    pub(super) fn port_check_targets(&self, spec: &Spec, port: u16) -> Vec<SocketAddr> {
        let v6 = spec.primary.is_ipv6();
        let mut targets: Vec<SocketAddr> = self
            .members
            .iter()
            .filter(|m| m.name != self.node && spec.config.priorities.for_role(m.role).is_some())
            .flat_map(|m| m.addresses.iter().copied())
            .filter(|a| a.is_ipv6() == v6 && !spec.own.contains(a))
            .take(3)
            .map(|a| SocketAddr::new(a, port))
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
