//! mDNS / DNS-SD (RFC 6762/6763) for members, as pure logic: the packets we send and what
//! we learn from the packets we receive. The sockets are in [`super::mdns_net`].
//!
//! Each node publishes, with TTL = the members expiry:
//! - `_keelson._tcp.local. PTR <node>._keelson._tcp.local.` (shared record),
//! - `<node>._keelson._tcp.local. SRV 0 0 <ignition tls port> <node>.local.` (cache-flush),
//! - `<node>._keelson._tcp.local. TXT "role=.." "cluster=<zone>" "version=.."` (cache-flush),
//! - `<node>.local. A/AAAA` per address (cache-flush).
//!
//! In a cluster whose records are authenticated (`members.keyId`, [`super::auth`]) the TXT
//! record is the whole member record, signed: it also carries `addrs=` (the addresses,
//! comma-separated, continued in `addrs2=`, `addrs3=`... past 255 bytes) and the proof
//! (`kid=`, `time=`, `seq=`, `mac=`), and a TTL-0 TXT is a signed goodbye. A cache with a
//! [`Verifier`] then believes only signed TXT records (from one of the addresses they sign,
//! or from an IPv6 link-local address, which is where IPv6 mDNS comes from); PTR, SRV and
//! A/AAAA records, which anyone can send, only tell it what to ask for. avahi still browses
//! and resolves the nodes: the records it reads are all there.
//!
//! The wire format is hickory-proto's `Message` (without its `mdns` feature, which would
//! change record parsing for the unicast DNS server too): the cache-flush and unicast-response
//! bits are carried in the class field by hand, as `DNSClass::Unknown(0x8001)`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::domain::Label;
use hickory_proto::rr::rdata::{A, AAAA, PTR, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use keelson_cluster::Role;

use super::auth::{Fields, Fresh, Op, Proof, Reject, Signer, Verifier, source_matches};
use crate::dns_label::DnsLabel;
use crate::member::Member;

/// The DNS-SD service type members use.
pub const SERVICE: &str = "_keelson._tcp.local.";
/// The mDNS port.
pub const MDNS_PORT: u16 = 5353;
/// The IPv4 mDNS group.
pub const MDNS_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(224, 0, 0, 251);

/// Class IN with the top bit (cache-flush in answers, unicast-response in questions).
const IN_FLUSH: DNSClass = DNSClass::Unknown(0x8001);

/// What this node announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    /// The node as a member.
    pub member: Member,
    /// The cluster zone, put in TXT `cluster=`.
    pub zone: String,
    /// The SRV port (the Ignition server's TLS port).
    pub port: u16,
    /// TTL of every record.
    pub ttl: u32,
}

/// Errors naming our own records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MdnsError {
    /// The node name does not make a DNS name with the service (hickory refused it).
    #[error("node name {0:?}: no mDNS name can be made of it")]
    BadNodeName(String),
}

fn service_name() -> Name {
    Name::from_ascii(SERVICE).expect("constant name")
}

/// `node` as one DNS label, its bytes as they are: hickory's `&str` conversions would run
/// IDNA over an A-label (`xn--...`) and refuse one it cannot decode, which is not ours to
/// judge (and the agent has no Unicode tables to judge it with).
fn label(node: &DnsLabel) -> Result<Label, MdnsError> {
    Label::from_raw_bytes(node.as_bytes()).map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn instance_name(node: &DnsLabel) -> Result<Name, MdnsError> {
    service_name()
        .prepend_label(label(node)?)
        .map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn host_name(node: &DnsLabel) -> Result<Name, MdnsError> {
    Name::from_labels([
        label(node)?,
        Label::from_ascii("local").expect("constant label"),
    ])
    .map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn flush(mut r: Record) -> Record {
    r.dns_class = IN_FLUSH;
    r
}

/// The longest character-string in a TXT record (RFC 1035 §3.3).
const TXT_STRING_MAX: usize = 255;

impl Announce {
    /// Our records, with `ttl` (0 for a goodbye), unsigned.
    pub fn records(&self, ttl: u32) -> Result<Vec<Record>, MdnsError> {
        self.records_with(ttl, Vec::new())
    }

    /// The TXT items that carry our record: role, cluster, version.
    fn txt_items(&self) -> Vec<String> {
        vec![
            format!("role={}", self.member.role.as_str()),
            format!("cluster={}", self.zone),
            format!("version={}", self.member.version),
        ]
    }

    /// Our records with `ttl`, the TXT record signed by `signer` at `now` (an announcement,
    /// or with `ttl` 0 a goodbye; [`super::auth`]).
    pub fn signed_records(
        &self,
        ttl: u32,
        signer: &Signer,
        now: SystemTime,
    ) -> Result<Vec<Record>, MdnsError> {
        let m = &self.member;
        let proof = signer.sign(
            &Fields {
                op: if ttl == 0 { Op::Goodbye } else { Op::Announce },
                cluster: &self.zone,
                name: &m.name,
                role: Some(m.role),
                addresses: &m.addresses,
                version: &m.version,
            },
            now,
        );
        let mut extra = addrs_items(&m.addresses);
        extra.extend([
            format!("kid={}", proof.key_id),
            format!("time={}", proof.time_ms),
            format!("seq={}", proof.seq),
            format!("mac={}", proof.mac),
        ]);
        self.records_with(ttl, extra)
    }

    /// [`Announce::packet`], signed by `signer` at `now` when there is one.
    pub fn packet_signed(
        &self,
        ttl: u32,
        signer: Option<&Signer>,
        now: SystemTime,
    ) -> Result<Vec<u8>, MdnsError> {
        let records = match signer {
            Some(s) => self.signed_records(ttl, s, now)?,
            None => self.records(ttl)?,
        };
        Ok(response(records))
    }

    fn records_with(&self, ttl: u32, extra: Vec<String>) -> Result<Vec<Record>, MdnsError> {
        let m = &self.member;
        let mut items = self.txt_items();
        items.extend(extra);
        let inst = instance_name(&m.name)?;
        let host = host_name(&m.name)?;
        let mut out = vec![
            Record::from_rdata(service_name(), ttl, RData::PTR(PTR(inst.clone()))),
            flush(Record::from_rdata(
                inst.clone(),
                ttl,
                RData::SRV(SRV::new(0, 0, self.port, host.clone())),
            )),
            flush(Record::from_rdata(inst, ttl, RData::TXT(TXT::new(items)))),
        ];
        for ip in &m.addresses {
            let data = match ip {
                IpAddr::V4(v4) => RData::A(A(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
            };
            out.push(flush(Record::from_rdata(host.clone(), ttl, data)));
        }
        Ok(out)
    }

    /// An unsolicited announcement (or, with `ttl` 0, a goodbye): an authoritative response
    /// with id 0 and no question (RFC 6762 §8.3, §10.1).
    pub fn packet(&self, ttl: u32) -> Result<Vec<u8>, MdnsError> {
        Ok(response(self.records(ttl)?))
    }

    /// Whether a received query asks for one of our records.
    pub fn is_asked(&self, query: &Message) -> bool {
        let Ok(records) = self.records(self.ttl) else {
            return false;
        };
        let services = Name::from_ascii("_services._dns-sd._udp.local.").expect("constant");
        query.queries.iter().any(|q| {
            q.name() == &services
                || records.iter().any(|r| {
                    r.name == *q.name()
                        && (q.query_type() == RecordType::ANY || q.query_type() == r.record_type())
                })
        })
    }
}

/// An unsolicited response carrying `records` (RFC 6762 §8.3, §10.1).
fn response(records: Vec<Record>) -> Vec<u8> {
    let mut m = Message::new(0, MessageType::Response, OpCode::Query);
    m.metadata.authoritative = true;
    m.answers = records;
    m.to_vec().unwrap_or_default()
}

/// `addrs=a,b,...` items, each at most 255 bytes: `addrs=`, then `addrs2=`, `addrs3=`...
fn addrs_items(addresses: &[IpAddr]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::from("addrs=");
    let mut empty = true;
    for a in addresses {
        let a = a.to_string();
        if !empty && cur.len() + 1 + a.len() > TXT_STRING_MAX {
            out.push(std::mem::take(&mut cur));
            cur = format!("addrs{}=", out.len() + 1);
            empty = true;
        }
        if !empty {
            cur.push(',');
        }
        cur.push_str(&a);
        empty = false;
    }
    out.push(cur);
    out
}

/// A query for every keelson instance on the segment.
pub fn browse_query() -> Vec<u8> {
    let mut m = Message::new(0, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(service_name(), RecordType::PTR));
    m.to_vec().unwrap_or_default()
}

/// A query for the SRV/TXT of `instance` and the addresses of `host` we miss.
pub fn resolve_query(instance: &Name, host: Option<&Name>) -> Vec<u8> {
    let mut m = Message::new(0, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(instance.clone(), RecordType::SRV));
    m.add_query(Query::query(instance.clone(), RecordType::TXT));
    if let Some(h) = host {
        m.add_query(Query::query(h.clone(), RecordType::A));
        m.add_query(Query::query(h.clone(), RecordType::AAAA));
    }
    m.to_vec().unwrap_or_default()
}

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

/// The proof items of a TXT record.
#[derive(Debug)]
enum TxtProof {
    /// None of `kid=`, `time=`, `seq=`, `mac=`.
    Absent,
    /// Some, or unreadable: a proof that cannot verify.
    Malformed,
    /// All four.
    Present(Proof),
}

/// What a TXT record of our service says.
#[derive(Debug)]
struct Txt {
    role: Role,
    cluster: String,
    version: String,
    /// `addrs=`, `addrs2=`... (signed records).
    addrs: Vec<IpAddr>,
    proof: TxtProof,
}

/// The most addresses a record may carry (as a unicast registration).
const MAX_ADDRS: usize = 16;

/// Reads `role=`, `cluster=`, `version=`, and for signed records `addrs=` (continued in
/// `addrs2=`...) and the proof, from a TXT record.
fn parse_txt(txt: &TXT) -> Result<Txt, Rejected> {
    let mut role = None;
    let mut cluster = None;
    let mut version = String::new();
    let mut addr_parts: Vec<(u32, String)> = Vec::new();
    let (mut kid, mut time, mut seq, mut mac) = (None, None, None, None);
    for item in txt.txt_data.iter() {
        let Ok(item) = std::str::from_utf8(item) else {
            continue;
        };
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        let k = k.to_ascii_lowercase();
        match k.as_str() {
            "role" => {
                role = Some(match v {
                    "bootstrap" => Role::Bootstrap,
                    "master" => Role::Master,
                    "worker" => Role::Worker,
                    _ => return Err(Rejected::Bogus),
                })
            }
            "cluster" => cluster = Some(v.to_string()),
            "version" if v.len() <= 64 => version = v.to_string(),
            "kid" => kid = Some(v.to_string()),
            "time" => time = Some(v.parse::<u64>().ok()),
            "seq" => seq = Some(v.parse::<u64>().ok()),
            "mac" => mac = Some(v.to_string()),
            _ => {
                if let Some(n) = k.strip_prefix("addrs") {
                    let index = if n.is_empty() {
                        Some(1)
                    } else {
                        n.parse::<u32>().ok().filter(|i| *i >= 2)
                    };
                    if let Some(i) = index
                        && addr_parts.len() < MAX_ADDRS
                    {
                        addr_parts.push((i, v.to_string()));
                    }
                }
            }
        }
    }
    addr_parts.sort_by_key(|(i, _)| *i);
    let mut addrs = Vec::new();
    for (_, part) in &addr_parts {
        for a in part.split(',').filter(|a| !a.is_empty()) {
            addrs.push(a.parse::<IpAddr>().map_err(|_| Rejected::Bogus)?);
        }
    }
    if addrs.len() > MAX_ADDRS {
        return Err(Rejected::Bogus);
    }
    let proof = match (kid, time, seq, mac) {
        (None, None, None, None) => TxtProof::Absent,
        (Some(key_id), Some(Some(time_ms)), Some(Some(seq)), Some(mac)) => {
            TxtProof::Present(Proof {
                key_id,
                time_ms,
                seq,
                mac,
            })
        }
        _ => TxtProof::Malformed,
    };
    match (role, cluster) {
        (Some(role), Some(cluster)) => Ok(Txt {
            role,
            cluster,
            version,
            addrs,
            proof,
        }),
        _ => Err(Rejected::Bogus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announce(name: &str, zone: &str, ip: &str) -> Announce {
        Announce {
            member: Member {
                name: name.parse().unwrap(),
                role: Role::Master,
                addresses: vec![ip.parse().unwrap()],
                version: "0.1.0".into(),
            },
            zone: zone.into(),
            port: 22623,
            ttl: 6,
        }
    }

    #[test]
    fn announce_roundtrip_into_cache() {
        let now = Instant::now();
        let mut cache = Cache::new("ocp4.example.com", "me", Duration::from_secs(6));
        let p = announce("master-1", "ocp4.example.com", "10.0.0.11")
            .packet(6)
            .unwrap();
        match cache.receive(&p, MDNS_PORT, now) {
            Received::Response {
                rejected,
                incomplete,
            } => {
                assert!(rejected.is_empty(), "{rejected:?}");
                assert!(incomplete.is_empty(), "{incomplete:?}");
            }
            other => panic!("{other:?}"),
        }
        let members = cache.members();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].name, "master-1");
        assert_eq!(members[0].role, Role::Master);
        assert_eq!(
            members[0].addresses,
            vec!["10.0.0.11".parse::<IpAddr>().unwrap()]
        );
        // Cache-flush bit is on the wire for SRV.
        let m = Message::from_vec(&p).unwrap();
        assert_eq!(u16::from(m.answers[1].dns_class), 0x8001);
    }

    #[test]
    fn expiry_goodbye_own_and_other_cluster() {
        let now = Instant::now();
        let mut cache = Cache::new("ocp4.example.com", "me", Duration::from_secs(6));
        let a = announce("master-1", "ocp4.example.com", "10.0.0.11");
        cache.receive(&a.packet(6).unwrap(), MDNS_PORT, now);
        cache.expire(now + Duration::from_secs(5));
        assert_eq!(cache.members().len(), 1);
        cache.expire(now + Duration::from_secs(7));
        assert!(cache.members().is_empty());

        cache.receive(&a.packet(6).unwrap(), MDNS_PORT, now);
        cache.receive(&a.packet(0).unwrap(), MDNS_PORT, now);
        assert!(cache.members().is_empty(), "goodbye removes");

        cache.receive(
            &announce("me", "ocp4.example.com", "10.0.0.1")
                .packet(6)
                .unwrap(),
            MDNS_PORT,
            now,
        );
        assert!(cache.members().is_empty(), "own announcements ignored");

        match cache.receive(
            &announce("x", "other.example.com", "10.0.0.9")
                .packet(6)
                .unwrap(),
            MDNS_PORT,
            now,
        ) {
            Received::Response { rejected, .. } => {
                assert!(rejected.contains(&Rejected::OtherCluster))
            }
            other => panic!("{other:?}"),
        }
        assert!(cache.members().is_empty());
        // Wrong source port: dropped.
        assert!(matches!(
            cache.receive(&a.packet(6).unwrap(), 40000, now),
            Received::Dropped(Rejected::BadSourcePort)
        ));
    }

    #[test]
    fn bogus_records_rejected() {
        let now = Instant::now();
        let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
        let inst = instance_name(&"n1".parse().unwrap()).unwrap();
        let mut m = Message::new(0, MessageType::Response, OpCode::Query);
        m.answers.push(Record::from_rdata(
            inst.clone(),
            6,
            RData::SRV(SRV::new(
                0,
                0,
                1,
                Name::from_ascii("evil.example.com.").unwrap(),
            )),
        ));
        m.answers.push(Record::from_rdata(
            inst,
            6,
            RData::TXT(TXT::new(vec![
                "role=king".into(),
                "cluster=c.example".into(),
            ])),
        ));
        m.answers.push(Record::from_rdata(
            Name::from_ascii("_keelson._tcp.local.").unwrap(),
            6,
            RData::PTR(PTR(Name::from_labels(vec![
                &b"bad label!"[..],
                b"_keelson",
                b"_tcp",
                b"local",
            ])
            .unwrap())),
        ));
        match cache.receive(&m.to_vec().unwrap(), MDNS_PORT, now) {
            Received::Response { rejected, .. } => {
                assert_eq!(rejected, vec![Rejected::Bogus; 3]);
            }
            other => panic!("{other:?}"),
        }
        assert!(cache.members().is_empty());
        assert!(matches!(
            cache.receive(b"\x00\x00\x84", MDNS_PORT, now),
            Received::Dropped(Rejected::Malformed)
        ));
    }

    #[test]
    fn split_packets_join_and_ask_for_missing() {
        // avahi sends the service and the host records in separate packets.
        let now = Instant::now();
        let mut cache = Cache::new("c.example", "me", Duration::from_secs(60));
        let a = announce("n2", "c.example", "10.0.0.12");
        let records = a.records(60).unwrap();
        let mut first = Message::new(0, MessageType::Response, OpCode::Query);
        first.answers = records[..3].to_vec();
        match cache.receive(&first.to_vec().unwrap(), MDNS_PORT, now) {
            Received::Response { incomplete, .. } => assert_eq!(incomplete.len(), 1),
            other => panic!("{other:?}"),
        }
        assert!(cache.members().is_empty());
        let mut second = Message::new(0, MessageType::Response, OpCode::Query);
        second.answers = records[3..].to_vec();
        cache.receive(&second.to_vec().unwrap(), MDNS_PORT, now);
        assert_eq!(cache.members().len(), 1);
    }

    #[test]
    fn answers_questions_for_our_records() {
        let a = announce("n3", "c.example", "10.0.0.13");
        let q = Message::from_vec(&browse_query()).unwrap();
        assert!(a.is_asked(&q));
        let q = Message::from_vec(&resolve_query(
            &instance_name(&"n3".parse().unwrap()).unwrap(),
            None,
        ))
        .unwrap();
        assert!(a.is_asked(&q));
        let q = Message::from_vec(&resolve_query(
            &instance_name(&"other".parse().unwrap()).unwrap(),
            None,
        ))
        .unwrap();
        assert!(!a.is_asked(&q));
    }

    /// A-labels are node names like any other (`xn--cwl6ngym1` must not be refused on the
    /// way out, as it was while hickory ran IDNA over it).
    #[test]
    fn a_labels_are_announced_and_heard() {
        for name in ["xn--cwl6ngym1", "xn--bcher-kva", "XN--Bcher-KVA"] {
            let ann = announce(name, "c.example", "10.0.0.9");
            let packet = ann.packet(6).unwrap();
            let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
            cache.receive(&packet, MDNS_PORT, Instant::now());
            let ms = cache.members();
            assert_eq!(ms.len(), 1, "{name}");
            assert_eq!(ms[0].name, name.to_ascii_lowercase());
            // The instance and host names carry the label's bytes as they are.
            let msg = Message::from_vec(&packet).unwrap();
            assert!(
                msg.answers
                    .iter()
                    .any(|r| r.name.to_ascii() == format!("{name}._keelson._tcp.local."))
            );
            assert!(
                msg.answers
                    .iter()
                    .any(|r| r.name.to_ascii() == format!("{name}.local."))
            );
        }
    }

    mod signed {
        use super::*;
        use crate::members::auth::{Keys, Reject, Signer, Verifier};

        const ZONE: &str = "c.example";

        fn keys(b: u8) -> Arc<Keys> {
            Arc::new(Keys::from_raw(&[vec![b; 32]]))
        }

        fn at(secs: u64) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
        }

        fn from(ip: &str) -> SocketAddr {
            SocketAddr::new(ip.parse().unwrap(), MDNS_PORT)
        }

        /// A cache of node `me` that verifies with key 1, and its verifier.
        fn cache() -> (Cache, Arc<Verifier>) {
            let v = Arc::new(Verifier::new(Some(keys(1))));
            let c = Cache::new(ZONE, "me", Duration::from_secs(6)).with_verifier(v.clone());
            (c, v)
        }

        fn drops(v: &Verifier) -> Vec<u64> {
            Reject::ALL.iter().map(|r| v.drops.get(*r)).collect()
        }

        fn names(c: &Cache) -> Vec<String> {
            c.members()
                .into_iter()
                .map(|m| m.name.to_string())
                .collect()
        }

        #[test]
        fn a_signed_announcement_is_believed_from_its_own_address_only() {
            let (mut c, v) = cache();
            let signer = Signer::new(keys(1), at(0));
            let a = announce("master-1", ZONE, "10.0.0.11");
            let t = Instant::now();
            let p1 = a.packet_signed(6, Some(&signer), at(0)).unwrap();
            // From another address: dropped.
            c.receive_from(&p1, from("10.0.0.66"), t, at(0));
            assert!(c.members().is_empty());
            assert_eq!(drops(&v), [0, 0, 0, 0, 0, 1]);
            // From its own: believed, with the signed addresses.
            c.receive_from(&p1, from("10.0.0.11"), t, at(0));
            assert_eq!(names(&c), ["master-1"]);
            assert_eq!(
                c.members()[0].addresses,
                vec!["10.0.0.11".parse::<IpAddr>().unwrap()]
            );
            // The same packet on IPv6 (from a link-local address): a duplicate, renews
            // nothing: it is still dropped at the expiry of the first.
            c.receive_from(&p1, from("fe80::1"), t + Duration::from_secs(5), at(5));
            c.expire(t + Duration::from_secs(7));
            assert!(c.members().is_empty(), "a duplicate renewed the member");
            // Newer announcements; then the old one again, no longer among the last few
            // accepted: a replay.
            let mut p2 = Vec::new();
            for _ in 0..crate::members::auth::RECENT {
                p2 = a.packet_signed(6, Some(&signer), at(8)).unwrap();
                c.receive_from(&p2, from("10.0.0.11"), t + Duration::from_secs(8), at(8));
            }
            assert_eq!(names(&c), ["master-1"]);
            c.receive_from(&p1, from("10.0.0.11"), t + Duration::from_secs(8), at(8));
            assert_eq!(drops(&v), [0, 0, 0, 0, 1, 1]);
            // A captured announcement turned into a goodbye (TTL 0): the MAC covers it.
            let mut forged = Message::from_vec(&p2).unwrap();
            for r in &mut forged.answers {
                r.ttl = 0;
            }
            c.receive_from(&forged.to_vec().unwrap(), from("10.0.0.11"), t, at(8));
            assert_eq!(names(&c), ["master-1"], "a forged goodbye removed it");
            assert_eq!(drops(&v), [0, 1, 0, 0, 1, 1]);
            // Too old.
            c.receive_from(&p2, from("10.0.0.11"), t, at(8 + 121));
            assert_eq!(drops(&v), [0, 1, 0, 1, 1, 1]);
            // Its own signed goodbye removes it.
            let bye = a.packet_signed(0, Some(&signer), at(9)).unwrap();
            c.receive_from(&bye, from("10.0.0.11"), t + Duration::from_secs(9), at(9));
            assert!(c.members().is_empty());
        }

        #[test]
        fn unsigned_forged_and_other_records_change_nothing() {
            let (mut c, v) = cache();
            let t = Instant::now();
            let signer = Signer::new(keys(1), at(0));
            let genuine = announce("master-1", ZONE, "10.0.0.11");
            c.receive_from(
                &genuine.packet_signed(6, Some(&signer), at(0)).unwrap(),
                from("10.0.0.11"),
                t,
                at(0),
            );
            assert_eq!(names(&c), ["master-1"]);
            // Unsigned (an old agent, avahi-publish, a forger): no MAC.
            let fake = announce("master-9", ZONE, "10.0.0.66");
            c.receive_from(&fake.packet(6).unwrap(), from("10.0.0.66"), t, at(0));
            // Signed with a key this node does not hold: unknown key.
            let other = Signer::new(keys(2), at(0));
            c.receive_from(
                &fake.packet_signed(6, Some(&other), at(0)).unwrap(),
                from("10.0.0.66"),
                t,
                at(0),
            );
            // Unsigned goodbyes for the genuine member's PTR, SRV, TXT and address.
            c.receive_from(&genuine.packet(0).unwrap(), from("10.0.0.66"), t, at(0));
            // Half a proof.
            let mut half = fake.records(6).unwrap();
            half[2].data = RData::TXT(TXT::new(vec![
                "role=master".into(),
                format!("cluster={ZONE}"),
                "addrs=10.0.0.66".into(),
                "mac=00".into(),
            ]));
            c.receive_from(&response(half), from("10.0.0.66"), t, at(0));
            // Another cluster's signed record with our member's name: not evicted.
            let stranger = announce("master-1", "other.example", "10.0.0.11");
            c.receive_from(
                &stranger.packet_signed(6, Some(&other), at(0)).unwrap(),
                from("10.0.0.11"),
                t,
                at(0),
            );
            assert_eq!(names(&c), ["master-1"]);
            assert_eq!(
                c.members()[0].addresses,
                vec!["10.0.0.11".parse::<IpAddr>().unwrap()]
            );
            assert_eq!(drops(&v), [2, 1, 1, 0, 0, 0]);
            // Without a source address (`receive`) nothing signed is believed.
            let (mut c2, v2) = cache();
            c2.receive(
                &genuine
                    .packet_signed(6, Some(&signer), SystemTime::now())
                    .unwrap(),
                MDNS_PORT,
                t,
            );
            assert!(c2.members().is_empty());
            assert_eq!(v2.drops.get(Reject::AddressMismatch), 1);
        }

        #[test]
        fn a_heard_txt_is_not_asked_for_again() {
            // avahi answers a question with an unsigned TXT: asking again would loop.
            let (mut c, _) = cache();
            let fake = announce("avahi-node", ZONE, "10.0.0.66");
            let t = Instant::now();
            let mut ptr_only = Message::new(0, MessageType::Response, OpCode::Query);
            ptr_only.answers = fake.records(6).unwrap()[..1].to_vec();
            match c.receive_from(&ptr_only.to_vec().unwrap(), from("10.0.0.66"), t, at(0)) {
                Received::Response { incomplete, .. } => assert_eq!(incomplete.len(), 1),
                other => panic!("{other:?}"),
            }
            match c.receive_from(&fake.packet(6).unwrap(), from("10.0.0.66"), t, at(0)) {
                Received::Response { incomplete, .. } => {
                    assert!(incomplete.is_empty(), "{incomplete:?}")
                }
                other => panic!("{other:?}"),
            }
        }

        #[test]
        fn many_addresses_split_over_txt_strings() {
            let addrs: Vec<IpAddr> = (0..16)
                .map(|i| {
                    format!("fd00:1234:5678:9abc:def0:1234:5678:{i:x}")
                        .parse()
                        .unwrap()
                })
                .collect();
            let items = addrs_items(&addrs);
            assert!(items.len() > 1, "{items:?}");
            assert!(items.iter().all(|i| i.len() <= TXT_STRING_MAX));
            assert!(items[0].starts_with("addrs=") && items[1].starts_with("addrs2="));
            let mut a = announce("master-1", ZONE, "10.0.0.11");
            a.member.addresses = addrs.clone();
            let (mut c, v) = cache();
            let signer = Signer::new(keys(1), at(0));
            c.receive_from(
                &a.packet_signed(6, Some(&signer), at(0)).unwrap(),
                SocketAddr::new(addrs[3], MDNS_PORT),
                Instant::now(),
                at(0),
            );
            assert_eq!(drops(&v), [0, 0, 0, 0, 0, 0]);
            let mut sorted = addrs;
            sorted.sort();
            assert_eq!(c.members()[0].addresses, sorted);
        }

        proptest::proptest! {
            #![proptest_config(keelson_testkit::proptest::config())]
            #[test]
            fn mutated_signed_announcements_are_never_believed_changed(
                pos in 0usize..500,
                val in proptest::prelude::any::<u8>(),
            ) {
                let signer = Signer::new(keys(1), at(0));
                let a = announce("n1", ZONE, "10.0.0.1");
                let mut p = a.packet_signed(6, Some(&signer), at(0)).unwrap();
                if pos < p.len() { p[pos] = val; }
                let (mut c, _) = cache();
                let _ = c.receive_from(&p, from("10.0.0.1"), Instant::now(), at(0));
                for m in c.members() {
                    proptest::prop_assert_eq!(&m, &a.member);
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn receive_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..700)) {
            let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
            let _ = cache.receive(&bytes, MDNS_PORT, Instant::now());
            let _ = cache.members();
        }

        #[test]
        fn mutated_announcements_never_panic(pos in 0usize..300, val in proptest::prelude::any::<u8>()) {
            let mut p = announce("n1", "c.example", "10.0.0.1").packet(6).unwrap();
            if pos < p.len() { p[pos] = val; }
            let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
            let _ = cache.receive(&p, MDNS_PORT, Instant::now());
            for m in cache.members() {
                proptest::prop_assert!(DnsLabel::is_valid(&m.name));
            }
        }

        #[test]
        fn announce_roundtrip(
            name in crate::dns_label::strategy::dns_label(),
            a in 1u8..255,
            b in 1u8..255,
        ) {
            let ip = format!("10.{a}.{b}.1");
            let ann = announce(&name, "c.example", &ip);
            let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
            cache.receive(&ann.packet(6).unwrap(), MDNS_PORT, Instant::now());
            let ms = cache.members();
            let lower = name.to_ascii_lowercase();
            proptest::prop_assert_eq!(ms.len(), usize::from(lower != "me"));
            if lower != "me" {
                proptest::prop_assert_eq!(&ms[0].name, &lower);
                proptest::prop_assert_eq!(ms[0].addresses[0].to_string(), ip);
            }
        }
    }
}
