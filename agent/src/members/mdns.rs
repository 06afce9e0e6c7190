//! mDNS / DNS-SD (RFC 6762/6763) for members, as pure logic: the packets we send and what
//! we learn from the packets we receive. The sockets are in [`super::mdns_net`].
//!
//! Each node publishes, with TTL = the members expiry:
//! - `_keelson._tcp.local. PTR <node>._keelson._tcp.local.` (shared record),
//! - `<node>._keelson._tcp.local. SRV 0 0 <ignition tls port> <node>.local.` (cache-flush),
//! - `<node>._keelson._tcp.local. TXT "role=.." "cluster=<zone>" "version=.."` (cache-flush),
//! - `<node>.local. A/AAAA` per address (cache-flush).
//!
//! The wire format is hickory-proto's `Message` (without its `mdns` feature, which would
//! change record parsing for the unicast DNS server too): the cache-flush and unicast-response
//! bits are carried in the class field by hand, as `DNSClass::Unknown(0x8001)`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, PTR, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use keelson_ignition::Role;

use crate::context::Member;

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
    /// The node name is not a valid DNS label.
    #[error("node name {0:?}: expected a DNS label (letters, digits, '-', at most 63 bytes)")]
    BadNodeName(String),
}

/// True when `s` is a plain host label (what Kubernetes accepts as a node name part).
pub fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
}

fn service_name() -> Name {
    Name::from_ascii(SERVICE).expect("constant name")
}

fn instance_name(node: &str) -> Result<Name, MdnsError> {
    if !valid_label(node) {
        return Err(MdnsError::BadNodeName(node.to_string()));
    }
    service_name()
        .prepend_label(node)
        .map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn host_name(node: &str) -> Result<Name, MdnsError> {
    Name::from_ascii(format!("{node}.local."))
        .ok()
        .filter(|_| valid_label(node))
        .ok_or_else(|| MdnsError::BadNodeName(node.to_string()))
}

fn flush(mut r: Record) -> Record {
    r.dns_class = IN_FLUSH;
    r
}

impl Announce {
    /// Our records, with `ttl` (0 for a goodbye).
    pub fn records(&self, ttl: u32) -> Result<Vec<Record>, MdnsError> {
        let m = &self.member;
        let inst = instance_name(&m.name)?;
        let host = host_name(&m.name)?;
        let mut out = vec![
            Record::from_rdata(service_name(), ttl, RData::PTR(PTR(inst.clone()))),
            flush(Record::from_rdata(
                inst.clone(),
                ttl,
                RData::SRV(SRV::new(0, 0, self.port, host.clone())),
            )),
            flush(Record::from_rdata(
                inst,
                ttl,
                RData::TXT(TXT::new(vec![
                    format!("role={}", m.role.as_str()),
                    format!("cluster={}", self.zone),
                    format!("version={}", m.version),
                ])),
            )),
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
        let mut m = Message::new(0, MessageType::Response, OpCode::Query);
        m.metadata.authoritative = true;
        m.answers = self.records(ttl)?;
        Ok(m.to_vec().unwrap_or_default())
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
    name: String,
    target: Option<Name>,
    txt: Option<(Role, String)>,
    seen: Instant,
}

#[derive(Debug, Clone, Default)]
struct Host {
    addrs: Vec<(IpAddr, Instant)>,
}

/// What we know about the other nodes: DNS-SD instances and host addresses, with the time
/// each was last heard.
#[derive(Debug)]
pub struct Cache {
    zone: String,
    own: String,
    expiry: Duration,
    /// Instance label (lower case) -> service.
    services: HashMap<String, Service>,
    /// Host name (lower case, fqdn text) -> addresses.
    hosts: HashMap<String, Host>,
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
        }
    }

    /// Takes in one packet from `src_port`, received at `now`.
    pub fn receive(&mut self, packet: &[u8], src_port: u16, now: Instant) -> Received {
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
                            Ok((role, cluster, version)) => {
                                if !cluster.eq_ignore_ascii_case(&self.zone) {
                                    self.services.remove(&k);
                                    rejected.push(Rejected::OtherCluster);
                                    continue;
                                }
                                if r.ttl == 0 {
                                    self.services.remove(&k);
                                    continue;
                                }
                                let s = self.touch(&k, now);
                                s.txt = Some((role, version));
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

    /// The cache key of instance `name`; `None` for our own node.
    fn instance(&self, name: &Name) -> Result<Option<String>, Rejected> {
        let label = instance_label(name).ok_or(Rejected::Bogus)?;
        let label = String::from_utf8(label).map_err(|_| Rejected::Bogus)?;
        if !valid_label(&label) {
            return Err(Rejected::Bogus);
        }
        let k = label.to_ascii_lowercase();
        Ok((k != self.own).then_some(k))
    }

    fn touch(&mut self, k: &str, now: Instant) -> &mut Service {
        let s = self
            .services
            .entry(k.to_string())
            .or_insert_with(|| Service {
                name: k.to_string(),
                target: None,
                txt: None,
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
    }

    /// The complete members (SRV, TXT and at least one address known), sorted by name.
    pub fn members(&self) -> Vec<Member> {
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
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Reads `role=`, `cluster=`, `version=` from a TXT record.
fn parse_txt(txt: &TXT) -> Result<(Role, String, String), Rejected> {
    let mut role = None;
    let mut cluster = None;
    let mut version = String::new();
    for item in txt.txt_data.iter() {
        let Ok(item) = std::str::from_utf8(item) else {
            continue;
        };
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        match k.to_ascii_lowercase().as_str() {
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
            _ => {}
        }
    }
    match (role, cluster) {
        (Some(r), Some(c)) => Ok((r, c, version)),
        _ => Err(Rejected::Bogus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announce(name: &str, zone: &str, ip: &str) -> Announce {
        Announce {
            member: Member {
                name: name.into(),
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
        let inst = instance_name("n1").unwrap();
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
        let q = Message::from_vec(&resolve_query(&instance_name("n3").unwrap(), None)).unwrap();
        assert!(a.is_asked(&q));
        let q = Message::from_vec(&resolve_query(&instance_name("other").unwrap(), None)).unwrap();
        assert!(!a.is_asked(&q));
    }

    #[test]
    fn bad_node_name() {
        assert!(announce("bad name", "c", "10.0.0.1").packet(1).is_err());
    }

    proptest::proptest! {
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
                proptest::prop_assert!(valid_label(&m.name));
            }
        }

        #[test]
        fn announce_roundtrip(name in "[a-z][a-z0-9-]{0,20}", a in 1u8..255, b in 1u8..255) {
            let ip = format!("10.{a}.{b}.1");
            let ann = announce(&name, "c.example", &ip);
            let mut cache = Cache::new("c.example", "me", Duration::from_secs(6));
            cache.receive(&ann.packet(6).unwrap(), MDNS_PORT, Instant::now());
            let ms = cache.members();
            proptest::prop_assert_eq!(ms.len(), usize::from(name != "me"));
            if name != "me" {
                proptest::prop_assert_eq!(&ms[0].name, &name);
                proptest::prop_assert_eq!(ms[0].addresses[0].to_string(), ip);
            }
        }
    }
}
