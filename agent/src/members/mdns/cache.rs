//! What this node learns from the packets it receives: the DNS-SD instances and host
//! addresses of the other nodes, each with the time it was last heard, and (with a
//! [`Verifier`]) the signed member records; what it drops, and why.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::PTR;
use hickory_proto::rr::{DNSClass, Name, RData};
use keelson_cluster::Role;

use crate::dns_label::DnsLabel;
use crate::member::Member;
use crate::members::auth::{Fields, Fresh, Op, Reject, Verifier, source_matches};

use super::txt::{Txt, TxtProof, parse_txt};
use super::{MDNS_PORT, instance_name, service_name};

/// Why a received record was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejected {
    /// The packet did not decode.
    Malformed,
    /// A response from a source port other than 5353 (RFC 6762 §6).
    BadSourcePort,
    /// A record of our service that makes no sense (bad instance label, SRV target outside
    /// `.local`, TXT without a valid role or cluster).
    Bogus,
    /// A member of another cluster.
    OtherCluster,
}

/// What one received packet is.
#[derive(Debug)]
pub enum Received {
    /// A query (we may have to answer it).
    Query(Message),
    /// A response; the cache has been updated.
    Response {
        /// Records dropped, by reason.
        rejected: Vec<Rejected>,
        /// Instances we saw without their SRV/TXT or host addresses: ask for them.
        incomplete: Vec<(Name, Option<Name>)>,
    },
    /// Not usable at all.
    Dropped(Rejected),
}

#[derive(Debug, Clone)]
struct Service {
    name: DnsLabel,
    target: Option<Name>,
    txt: Option<(Role, String)>,
    /// A TXT record was heard (believed or not): nothing more to ask for it.
    txt_heard: bool,
    seen: Instant,
}

#[derive(Debug, Clone, Default)]
struct Host {
    addrs: Vec<(IpAddr, Instant)>,
}

/// What we know about the other nodes: DNS-SD instances and host addresses, with the time
/// each was last heard; with a [`Verifier`], the signed member records.
#[derive(Debug)]
pub struct Cache {
    zone: String,
    own: String,
    expiry: Duration,
    /// Instance label (lower case) -> service.
    services: HashMap<DnsLabel, Service>,
    /// Host name (lower case, fqdn text) -> addresses.
    hosts: HashMap<String, Host>,
    /// Set: only signed TXT records make members.
    verifier: Option<Arc<Verifier>>,
    /// Instance label (lower case) -> the member its last accepted signed record names.
    signed: HashMap<DnsLabel, (Member, Instant)>,
}

fn key(name: &Name) -> String {
    name.to_lowercase().to_ascii()
}

fn is_in(class: DNSClass) -> bool {
    u16::from(class) & 0x7fff == 1
}

/// The instance label of `name` if it is `<label>._keelson._tcp.local.`.
fn instance_label(name: &Name) -> Option<Vec<u8>> {
    let svc = service_name();
    (name.num_labels() == svc.num_labels() + 1 && svc.zone_of(name))
        .then(|| name.iter().next().map(|l| l.to_vec()))
        .flatten()
}

impl Cache {
    /// An empty cache for cluster zone `zone`, ignoring our own node `own`.
    pub fn new(zone: &str, own: &str, expiry: Duration) -> Self {
        Self {
            zone: zone.to_ascii_lowercase(),
            own: own.to_ascii_lowercase(),
            expiry,
            services: HashMap::new(),
            hosts: HashMap::new(),
            verifier: None,
            signed: HashMap::new(),
        }
    }

    /// The same cache believing only records `verifier` accepts (when it holds keys), and
    /// counting the others in its drops.
    pub fn with_verifier(mut self, verifier: Arc<Verifier>) -> Self {
        self.verifier = verifier.enabled().then_some(verifier);
        self
    }

    /// Takes in one packet from `src_port`, received at `now`, its sender's address unknown
    /// (so, in a cache with a [`Verifier`], no signed record is believed: the address check
    /// fails); [`Cache::receive_from`] is the whole thing.
    pub fn receive(&mut self, packet: &[u8], src_port: u16, now: Instant) -> Received {
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), src_port);
        self.receive_from(packet, src, now, SystemTime::now())
    }

    /// Takes in one packet from `src`, received at `now` (`wall`: the same moment on the
    /// clock signed records are checked against).
    // Over 100 lines on purpose: one pass over a packet's records (host addresses first, then
    // the services that name them), each rejection beside the reason it is counted under.
    pub fn receive_from(
        &mut self,
        packet: &[u8],
        src: SocketAddr,
        now: Instant,
        wall: SystemTime,
    ) -> Received {
        let src_port = src.port();
        let Ok(msg) = Message::from_vec(packet) else {
            return Received::Dropped(Rejected::Malformed);
        };
        if msg.metadata.op_code != OpCode::Query
            || msg.metadata.response_code != ResponseCode::NoError
        {
            return Received::Dropped(Rejected::Malformed);
        }
        if msg.metadata.message_type == MessageType::Query {
            return Received::Query(msg);
        }
        if src_port != MDNS_PORT {
            return Received::Dropped(Rejected::BadSourcePort);
        }
        let mut rejected = Vec::new();
        let mut touched = Vec::new();
        let records = msg
            .answers
            .iter()
            .chain(msg.additionals.iter())
            .chain(msg.authorities.iter());
        // Host addresses first: a packet usually carries them with the SRV that names them.
        for r in records.clone() {
            if !is_in(r.dns_class) {
                continue;
            }
            let ip = match &r.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(a) => IpAddr::V6(a.0),
                _ => continue,
            };
            // Link-local addresses (avahi publishes fe80::) carry no scope in DNS and are no
            // use to VRRP, the proxy or DNS: leave them out.
            if is_link_local(&ip) {
                continue;
            }
            let local = Name::from_ascii("local.").expect("constant");
            if !local.zone_of(&r.name) {
                rejected.push(Rejected::Bogus);
                continue;
            }
            let host = self.hosts.entry(key(&r.name)).or_default();
            host.addrs.retain(|(a, _)| *a != ip);
            if r.ttl > 0 {
                host.addrs.push((ip, now));
            }
        }
        for r in records {
            if !is_in(r.dns_class) {
                continue;
            }
            match &r.data {
                RData::PTR(PTR(target)) if r.name == service_name() => {
                    match self.instance(target) {
                        Ok(Some(k)) => {
                            if r.ttl == 0 {
                                self.services.remove(&k);
                            } else {
                                self.touch(&k, now);
                                touched.push(k);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => rejected.push(e),
                    }
                }
                RData::SRV(srv) if instance_label(&r.name).is_some() => {
                    match self.instance(&r.name) {
                        Ok(Some(k)) => {
                            let local = Name::from_ascii("local.").expect("constant");
                            if !local.zone_of(&srv.target) || srv.target.num_labels() != 2 {
                                rejected.push(Rejected::Bogus);
                                continue;
                            }
                            if r.ttl == 0 {
                                self.services.remove(&k);
                                continue;
                            }
                            let s = self.touch(&k, now);
                            s.target = Some(srv.target.to_lowercase());
                            touched.push(k);
                        }
                        Ok(None) => {}
                        Err(e) => rejected.push(e),
                    }
                }
                RData::TXT(txt) if instance_label(&r.name).is_some() => {
                    match self.instance(&r.name) {
                        Ok(Some(k)) => match parse_txt(txt) {
                            Ok(info) => {
                                if !info.cluster.eq_ignore_ascii_case(&self.zone) {
                                    // Unsigned, it may only forget what is unsigned too.
                                    if self.verifier.is_none() {
                                        self.services.remove(&k);
                                    }
                                    rejected.push(Rejected::OtherCluster);
                                    continue;
                                }
                                if let Some(v) = self.verifier.clone() {
                                    self.touch(&k, now).txt_heard = true;
                                    self.take_signed(&v, &k, info, r.ttl, src, now, wall);
                                    touched.push(k);
                                    continue;
                                }
                                let Txt { role, version, .. } = info;
                                if r.ttl == 0 {
                                    self.services.remove(&k);
                                    continue;
                                }
                                let s = self.touch(&k, now);
                                s.txt = Some((role, version));
                                s.txt_heard = true;
                                touched.push(k);
                            }
                            Err(e) => rejected.push(e),
                        },
                        Ok(None) => {}
                        Err(e) => rejected.push(e),
                    }
                }
                _ => {}
            }
        }
        touched.sort();
        touched.dedup();
        let incomplete = touched
            .iter()
            .filter_map(|k| {
                let s = self.services.get(k)?;
                if self.verifier.is_some() {
                    // Signed: the TXT record is the whole member; ask until one is heard.
                    return (!s.txt_heard).then(|| {
                        (
                            instance_name(&s.name).unwrap_or_else(|_| service_name()),
                            s.target.clone(),
                        )
                    });
                }
                let has_addrs = s
                    .target
                    .as_ref()
                    .and_then(|t| self.hosts.get(&key(t)))
                    .is_some_and(|h| !h.addrs.is_empty());
                let complete = s.target.is_some() && s.txt.is_some() && has_addrs;
                (!complete).then(|| {
                    (
                        instance_name(&s.name).unwrap_or_else(|_| service_name()),
                        s.target.clone(),
                    )
                })
            })
            .collect();
        Received::Response {
            rejected,
            incomplete,
        }
    }

    /// The cache key of instance `name` (its node name, lower case); `None` for our own
    /// node.
    fn instance(&self, name: &Name) -> Result<Option<DnsLabel>, Rejected> {
        let label = instance_label(name).ok_or(Rejected::Bogus)?;
        let label = String::from_utf8(label).map_err(|_| Rejected::Bogus)?;
        let k = DnsLabel::new(label.to_ascii_lowercase()).map_err(|_| Rejected::Bogus)?;
        Ok((k != self.own).then_some(k))
    }

    /// Takes in the TXT record `info` of instance `k` with `ttl`, heard from `src`, in a
    /// cache whose records are signed: believed (an announcement, or with TTL 0 a goodbye)
    /// only when `v` accepts it and it came from an address it signs (or from an IPv6
    /// link-local address: IPv6 mDNS is sent from one, and it names no member).
    #[allow(clippy::too_many_arguments)]
    fn take_signed(
        &mut self,
        v: &Verifier,
        k: &DnsLabel,
        info: Txt,
        ttl: u32,
        src: SocketAddr,
        now: Instant,
        wall: SystemTime,
    ) {
        let proof = match info.proof {
            TxtProof::Absent => None,
            TxtProof::Malformed => return v.refuse(Reject::BadMac, k, src),
            TxtProof::Present(p) => Some(p),
        };
        let fields = Fields {
            op: if ttl == 0 { Op::Goodbye } else { Op::Announce },
            cluster: &info.cluster,
            name: k,
            role: Some(info.role),
            addresses: &info.addrs,
            version: &info.version,
        };
        let from_it = is_v6_link_local(&src.ip()) || source_matches(src.ip(), &info.addrs);
        let fresh = match v.check(&fields, proof.as_ref(), from_it, wall) {
            Ok(f) => f,
            Err(r) => return v.refuse(r, k, src),
        };
        if fresh == Fresh::Duplicate {
            return;
        }
        v.accept(k, proof.as_ref());
        if ttl == 0 {
            self.signed.remove(k);
            return;
        }
        let mut addresses: Vec<IpAddr> = info
            .addrs
            .into_iter()
            .filter(|a| !is_link_local(a))
            .collect();
        addresses.sort();
        self.signed.insert(
            k.clone(),
            (
                Member {
                    name: k.clone(),
                    role: info.role,
                    addresses,
                    version: info.version,
                },
                now,
            ),
        );
    }

    fn touch(&mut self, k: &DnsLabel, now: Instant) -> &mut Service {
        let s = self.services.entry(k.clone()).or_insert_with(|| Service {
            name: k.clone(),
            target: None,
            txt: None,
            txt_heard: false,
            seen: now,
        });
        s.seen = now;
        s
    }

    /// Forgets what was not heard within the expiry.
    pub fn expire(&mut self, now: Instant) {
        let expiry = self.expiry;
        self.services
            .retain(|_, s| now.saturating_duration_since(s.seen) <= expiry);
        for h in self.hosts.values_mut() {
            h.addrs
                .retain(|(_, t)| now.saturating_duration_since(*t) <= expiry);
        }
        self.hosts.retain(|_, h| !h.addrs.is_empty());
        self.signed
            .retain(|_, (_, t)| now.saturating_duration_since(*t) <= expiry);
    }

    /// The complete members (SRV, TXT and at least one address known; with a verifier, the
    /// signed records with an address), sorted by name.
    pub fn members(&self) -> Vec<Member> {
        if self.verifier.is_some() {
            let mut out: Vec<Member> = self
                .signed
                .values()
                .filter(|(m, _)| !m.addresses.is_empty())
                .map(|(m, _)| m.clone())
                .collect();
            out.sort();
            return out;
        }
        let mut out: Vec<Member> = self
            .services
            .values()
            .filter_map(|s| {
                let (role, version) = s.txt.clone()?;
                let host = self.hosts.get(&key(s.target.as_ref()?))?;
                let mut addresses: Vec<IpAddr> = host.addrs.iter().map(|(a, _)| *a).collect();
                addresses.sort();
                (!addresses.is_empty()).then(|| Member {
                    name: s.name.clone(),
                    role,
                    addresses,
                    version,
                })
            })
            .collect();
        out.sort();
        out
    }
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

fn is_v6_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(_)) && is_link_local(ip)
}
