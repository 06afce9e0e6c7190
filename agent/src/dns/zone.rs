//! The cluster zone `<name>.<baseDomain>` as data: which names exist and what they answer.
//!
//! Pure logic, no I/O: [`Zone::lookup`] turns a question (its name in wire form, as the
//! client spelt it) into an [`Answer`] that borrows the zone's data, and the zone is rebuilt
//! (cheaply, it is small) whenever the member list changes. `dns::answer` writes the answer.

use std::collections::HashMap;
use std::net::IpAddr;

use super::etcd::{self, EtcdNames, Target};
use super::wire::{self, CLASS_ANY, CLASS_IN, rtype};
use crate::member::Member;

/// Errors building a zone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZoneError {
    /// The cluster name or base domain do not form a valid DNS name.
    #[error("cluster zone {zone:?}: expected a valid DNS name: {reason}")]
    BadOrigin {
        /// The zone as configured.
        zone: String,
        /// Why it is not a name.
        reason: String,
    },
}

/// What the zone says about one question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'z> {
    /// The name is not ours: forward it.
    NotOurs,
    /// A and/or AAAA records of the question name: the addresses of `addrs` of the family
    /// `qtype` asks for (at least one; both families for ANY).
    Addresses {
        /// Every address of the name.
        addrs: &'z [IpAddr],
        /// The question type (A, AAAA or ANY).
        qtype: u16,
    },
    /// The zone's SOA (a question for the apex).
    Soa,
    /// SRV records, one per etcd name, with the names' addresses as additional data.
    Srv {
        /// The etcd names, by index.
        targets: &'z [Target],
        /// The port of every record.
        port: u16,
    },
    /// The name exists but has no record of that type: NOERROR, empty answer, SOA.
    NoData,
    /// The name does not exist in the zone: NXDOMAIN with SOA.
    NxDomain,
    /// A class other than IN in our zone: REFUSED.
    Refused,
}

/// The SOA's numbers after the names: serial, refresh, retry, expire, minimum.
pub type SoaNumbers = [u32; 5];

/// The authoritative data of the cluster zone.
#[derive(Debug, Clone)]
pub struct Zone {
    /// The origin in wire form, lower case.
    origin: Vec<u8>,
    ttl: u32,
    api: Vec<IpAddr>,
    ingress: Vec<IpAddr>,
    /// Lower-case node name -> addresses.
    nodes: HashMap<Vec<u8>, Vec<IpAddr>>,
    soa: SoaNumbers,
    /// The etcd names, when the cluster serves them.
    etcd: Option<EtcdNames>,
}

impl Zone {
    /// Builds the zone `zone` (e.g. `ocp4.example.com`) with the VIPs and the members.
    pub fn new(
        zone: &str,
        ttl: u32,
        api: &[IpAddr],
        ingress: &[IpAddr],
        members: &[Member],
    ) -> Result<Self, ZoneError> {
        let bad = |reason: &str| ZoneError::BadOrigin {
            zone: zone.to_string(),
            reason: reason.into(),
        };
        // hickory's parser decides what a name is, as it does for every other name here.
        hickory_proto::rr::Name::from_ascii(zone).map_err(|e| bad(&e.to_string()))?;
        let origin = wire::name_to_wire(zone).ok_or_else(|| bad("a label or the name too long"))?;
        if origin.len() == 1 {
            return Err(bad("the root is not a cluster zone"));
        }
        // The SOA's own names (`hostmaster.<zone>`) must fit too.
        if origin.len() + 11 > wire::MAX_NAME {
            return Err(bad("too long for the SOA's hostmaster.<zone>"));
        }
        // The serial only has to grow when the data changes; seconds since the epoch do.
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        let mut nodes = HashMap::new();
        for m in members {
            // A member's name is one DNS label (`DnsLabel`): served as it is, any case.
            nodes.insert(
                m.name.to_ascii_lowercase().into_bytes(),
                m.addresses.clone(),
            );
        }
        Ok(Self {
            origin,
            ttl,
            api: api.to_vec(),
            ingress: ingress.to_vec(),
            nodes,
            soa: [serial, 3600, 600, 86400, ttl],
            etcd: None,
        })
    }

    /// The zone with the etcd names of `members` (docs/dns.md): the SRV sets are answered
    /// once `masters` masters have one.
    pub fn with_etcd(mut self, members: &[Member], masters: u32) -> Self {
        self.etcd = Some(EtcdNames::new(members, masters));
        self
    }

    /// The origin in wire form, lower case.
    pub fn origin(&self) -> &[u8] {
        &self.origin
    }

    /// TTL of every record (and the SOA minimum).
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    /// The SOA's numbers.
    pub fn soa(&self) -> SoaNumbers {
        self.soa
    }

    /// Number of node names served.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The etcd names, when served.
    pub fn etcd(&self) -> Option<&EtcdNames> {
        self.etcd.as_ref()
    }

    /// Answers the question `qname` (wire form, any case) / `qtype` / `qclass`.
    pub fn lookup(&self, qname: &[u8], qtype: u16, qclass: u16) -> Answer<'_> {
        let Some(at) = wire::suffix_at(qname, &self.origin) else {
            // A short node name (`master-0.`) is ours only when such a node exists; every
            // other name outside the zone is left to the upstreams.
            return match single_label(qname).and_then(|l| self.node(l)) {
                Some(addrs) => addresses(addrs, qtype, qclass),
                None => Answer::NotOurs,
            };
        };
        if qclass != CLASS_IN && qclass != CLASS_ANY {
            return Answer::Refused;
        }
        let rel = &qname[..at];
        if rel.is_empty() {
            return if matches!(qtype, rtype::SOA | rtype::ANY) {
                Answer::Soa
            } else {
                Answer::NoData
            };
        }
        if let Some(one) = single_label_rel(rel) {
            return self.one_label(one, qtype, qclass);
        }
        if let Some(answer) = self.etcd_srv(rel, qtype) {
            return answer;
        }
        // Any depth below `apps`: the ingress wildcard.
        if last_label(rel).eq_ignore_ascii_case(b"apps") {
            return addresses(&self.ingress, qtype, qclass);
        }
        Answer::NxDomain
    }

    /// A name one label below the origin.
    fn one_label(&self, label: &[u8], qtype: u16, qclass: u16) -> Answer<'_> {
        if label.eq_ignore_ascii_case(b"api") || label.eq_ignore_ascii_case(b"api-int") {
            return addresses(&self.api, qtype, qclass);
        }
        // `apps` itself is an empty non-terminal: it exists (names below it do).
        if label.eq_ignore_ascii_case(b"apps") {
            return Answer::NoData;
        }
        if let Some(names) = &self.etcd {
            if let Some(target) = lower(label, |l| names.target(l)) {
                return addresses(&target.addresses, qtype, qclass);
            }
            // `_tcp` is the empty non-terminal above the SRV names.
            if label.eq_ignore_ascii_case(b"_tcp") {
                return Answer::NoData;
            }
        }
        match self.node(label) {
            Some(addrs) => addresses(addrs, qtype, qclass),
            None => Answer::NxDomain,
        }
    }

    /// `_etcd-server-ssl._tcp` and `_etcd-client-ssl._tcp`: SRV once every master is a
    /// member, NODATA before and for other types; `None` for any other name.
    fn etcd_srv(&self, rel: &[u8], qtype: u16) -> Option<Answer<'_>> {
        let names = self.etcd.as_ref()?;
        let port = if rel.eq_ignore_ascii_case(b"\x10_etcd-server-ssl\x04_tcp") {
            etcd::PEER_PORT
        } else if rel.eq_ignore_ascii_case(b"\x10_etcd-client-ssl\x04_tcp") {
            etcd::CLIENT_PORT
        } else {
            return None;
        };
        Some(if names.ready && matches!(qtype, rtype::SRV | rtype::ANY) {
            Answer::Srv {
                targets: &names.targets,
                port,
            }
        } else {
            Answer::NoData
        })
    }

    fn node(&self, label: &[u8]) -> Option<&Vec<IpAddr>> {
        lower(label, |l| self.nodes.get(l))
    }
}

/// Calls `f` with `label` in lower case (labels are at most 63 bytes: no allocation).
fn lower<T>(label: &[u8], f: impl FnOnce(&[u8]) -> Option<T>) -> Option<T> {
    if label.len() > 63 {
        return None;
    }
    let mut key = [0u8; 63];
    let key = &mut key[..label.len()];
    key.copy_from_slice(label);
    key.make_ascii_lowercase();
    f(key)
}

/// The label of a wire name of exactly one label.
fn single_label(name: &[u8]) -> Option<&[u8]> {
    let len = usize::from(*name.first()?);
    (len > 0 && name.len() == len + 2).then(|| &name[1..=len])
}

/// The label of a relative wire name (no root) of exactly one label.
fn single_label_rel(rel: &[u8]) -> Option<&[u8]> {
    let len = usize::from(rel[0]);
    (rel.len() == len + 1).then(|| &rel[1..])
}

/// The last label of a relative wire name.
fn last_label(rel: &[u8]) -> &[u8] {
    let mut i = 0;
    loop {
        let next = i + 1 + usize::from(rel[i]);
        if next >= rel.len() {
            return &rel[i + 1..rel.len().min(next)];
        }
        i = next;
    }
}

/// Whether a question of type `qtype` (A, AAAA or ANY) asks for `ip`.
pub fn asked_for(ip: &IpAddr, qtype: u16) -> bool {
    matches!(
        (ip, qtype),
        (_, rtype::ANY) | (IpAddr::V4(_), rtype::A) | (IpAddr::V6(_), rtype::AAAA)
    )
}

/// The addresses of `addrs` `qtype` asks for, or NODATA when there are none; REFUSED for a
/// class other than IN.
fn addresses(addrs: &[IpAddr], qtype: u16, qclass: u16) -> Answer<'_> {
    if qclass != CLASS_IN && qclass != CLASS_ANY {
        return Answer::Refused;
    }
    if addrs.iter().any(|ip| asked_for(ip, qtype)) {
        Answer::Addresses { addrs, qtype }
    } else {
        Answer::NoData
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use keelson_cluster::Role;

    /// `name` in wire form, spelt as given (the tests check case-insensitivity).
    pub(crate) fn q(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in name
            .trim_end_matches('.')
            .split('.')
            .filter(|l| !l.is_empty())
        {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    pub(crate) fn member(name: &str, role: Role, addrs: &[&str]) -> Member {
        Member {
            name: name.parse().unwrap(),
            role,
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            version: "1".into(),
        }
    }

    fn members() -> Vec<Member> {
        vec![
            member("master-0", Role::Master, &["10.0.0.10", "fd00::10"]),
            member("Worker-1", Role::Worker, &["10.0.0.21"]),
            member("xn--bcher-kva", Role::Worker, &["10.0.0.22"]),
        ]
    }

    fn zone() -> Zone {
        Zone::new(
            "ocp4.Example.COM",
            60,
            &["10.0.0.5".parse().unwrap()],
            &["10.0.0.7".parse().unwrap()],
            &members(),
        )
        .unwrap()
    }

    fn ips(answer: Answer<'_>) -> Vec<String> {
        match answer {
            Answer::Addresses { addrs, qtype } => addrs
                .iter()
                .filter(|ip| match qtype {
                    rtype::A => ip.is_ipv4(),
                    rtype::AAAA => ip.is_ipv6(),
                    _ => true,
                })
                .map(|ip| ip.to_string())
                .collect(),
            other => panic!("expected addresses, got {other:?}"),
        }
    }

    const A: u16 = rtype::A;
    const AAAA: u16 = rtype::AAAA;
    const IN: u16 = CLASS_IN;

    /// A-labels (`xn--...`, the ASCII form OpenShift node names may take) are served as any
    /// node name, whatever the case asked.
    #[test]
    fn a_label_node_names_are_answered() {
        let z = zone();
        for n in [
            "xn--bcher-kva.ocp4.example.com.",
            "XN--BCHER-KVA.ocp4.example.com.",
            "xn--bcher-kva.",
        ] {
            assert_eq!(ips(z.lookup(&q(n), A, IN)), ["10.0.0.22"], "{n}");
        }
    }

    #[test]
    fn api_and_api_int() {
        let z = zone();
        for n in ["api.ocp4.example.com.", "API-INT.OCP4.example.com."] {
            assert_eq!(ips(z.lookup(&q(n), A, IN)), ["10.0.0.5"]);
            assert_eq!(z.lookup(&q(n), AAAA, IN), Answer::NoData);
        }
    }

    #[test]
    fn apps_wildcard_any_depth() {
        let z = zone();
        for n in ["x.apps.ocp4.example.com.", "a.b.c.APPS.ocp4.example.com."] {
            assert_eq!(ips(z.lookup(&q(n), A, IN)), ["10.0.0.7"]);
        }
        let apps = q("apps.ocp4.example.com.");
        assert_eq!(z.lookup(&apps, A, IN), Answer::NoData);
    }

    #[test]
    fn nodes_short_and_fqdn() {
        let z = zone();
        let fq = q("master-0.ocp4.example.com.");
        assert_eq!(ips(z.lookup(&fq, A, IN)), ["10.0.0.10"]);
        assert_eq!(ips(z.lookup(&fq, AAAA, IN)), ["fd00::10"]);
        assert_eq!(
            ips(z.lookup(&fq, rtype::ANY, IN)),
            ["10.0.0.10", "fd00::10"]
        );
        assert_eq!(ips(z.lookup(&q("worker-1."), A, IN)), ["10.0.0.21"]);
        assert_eq!(z.lookup(&q("worker-1."), AAAA, IN), Answer::NoData);
        assert_eq!(z.lookup(&q("nothere."), A, IN), Answer::NotOurs);
        assert_eq!(z.lookup(&q("."), A, IN), Answer::NotOurs);
    }

    #[test]
    fn nxdomain_and_foreign() {
        let z = zone();
        let nx = q("nope.ocp4.example.com.");
        assert_eq!(z.lookup(&nx, A, IN), Answer::NxDomain);
        let deep = q("a.api.ocp4.example.com.");
        assert_eq!(z.lookup(&deep, A, IN), Answer::NxDomain);
        assert_eq!(z.lookup(&q("www.example.com."), A, IN), Answer::NotOurs);
        assert_eq!(z.lookup(&q("xocp4.example.com."), A, IN), Answer::NotOurs);
        let api = q("api.ocp4.example.com.");
        assert_eq!(z.lookup(&api, A, 3), Answer::Refused, "CH");
    }

    #[test]
    fn apex_soa() {
        let z = zone();
        let apex = q("OCP4.example.com.");
        assert_eq!(z.lookup(&apex, rtype::SOA, IN), Answer::Soa);
        assert_eq!(z.lookup(&apex, rtype::ANY, IN), Answer::Soa);
        assert_eq!(z.lookup(&apex, A, IN), Answer::NoData);
        assert_eq!(z.soa()[4], 60, "negative caching time is the TTL");
    }

    #[test]
    fn bad_origin() {
        assert!(Zone::new("a..b", 60, &[], &[], &[]).is_err());
        assert!(Zone::new(".", 60, &[], &[], &[]).is_err());
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(55)
        );
        assert!(Zone::new(&long, 60, &[], &[], &[]).is_err());
    }

    fn etcd_zone(masters: &[(&str, &[&str])], expected: u32) -> Zone {
        let mut members: Vec<Member> = masters
            .iter()
            .map(|(n, a)| member(n, Role::Master, a))
            .collect();
        members.push(member("worker-0", Role::Worker, &["10.0.0.20"]));
        Zone::new("ocp4.example.com", 60, &[], &[], &members)
            .unwrap()
            .with_etcd(&members, expected)
    }

    #[test]
    fn etcd_names_follow_the_master_names() {
        let z = etcd_zone(
            &[
                ("ocp4-x-master-1", &["10.0.0.11", "fd00::11"]),
                ("ocp4-x-master-0", &["10.0.0.10"]),
            ],
            3,
        );
        let e1 = q("ETCD-1.ocp4.example.com.");
        assert_eq!(ips(z.lookup(&e1, A, IN)), ["10.0.0.11"]);
        assert_eq!(ips(z.lookup(&e1, AAAA, IN)), ["fd00::11"]);
        let e0 = q("etcd-0.ocp4.example.com.");
        assert_eq!(z.lookup(&e0, AAAA, IN), Answer::NoData);
        for nx in ["etcd-2", "etcd-01", "etcd-", "etcd-x"] {
            let n = q(&format!("{nx}.ocp4.example.com."));
            assert_eq!(z.lookup(&n, A, IN), Answer::NxDomain, "{nx}");
        }
    }

    #[test]
    fn srv_only_with_every_master() {
        let srv = q("_etcd-server-ssl._TCP.ocp4.example.com.");
        let two: &[(&str, &[&str])] = &[("master-0", &["10.0.0.10"]), ("master-1", &["10.0.0.11"])];
        let z = etcd_zone(two, 3);
        assert_eq!(z.lookup(&srv, rtype::SRV, IN), Answer::NoData);
        let three: &[(&str, &[&str])] = &[
            ("master-0", &["10.0.0.10"]),
            ("master-2", &["10.0.0.12"]),
            ("master-1", &["10.0.0.11"]),
        ];
        let z = etcd_zone(three, 3);
        match z.lookup(&srv, rtype::SRV, IN) {
            Answer::Srv { targets, port } => {
                assert_eq!(port, 2380);
                let labels: Vec<_> = targets.iter().map(|t| t.label.as_str()).collect();
                assert_eq!(labels, ["etcd-0", "etcd-1", "etcd-2"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(z.lookup(&srv, rtype::ANY, IN), Answer::Srv { .. }));
        assert_eq!(z.lookup(&srv, A, IN), Answer::NoData);
        let client = q("_etcd-client-ssl._tcp.ocp4.example.com.");
        assert!(matches!(
            z.lookup(&client, rtype::SRV, IN),
            Answer::Srv { port: 2379, .. }
        ));
        let tcp = q("_tcp.ocp4.example.com.");
        assert_eq!(z.lookup(&tcp, rtype::SRV, IN), Answer::NoData);
        let plain = q("_etcd-server._tcp.ocp4.example.com.");
        assert_eq!(z.lookup(&plain, rtype::SRV, IN), Answer::NxDomain);
    }

    #[test]
    fn no_etcd_names_when_off() {
        let z = zone();
        for n in [
            "etcd-0.ocp4.example.com.",
            "_etcd-server-ssl._tcp.ocp4.example.com.",
            "_tcp.ocp4.example.com.",
        ] {
            assert_eq!(z.lookup(&q(n), rtype::SRV, IN), Answer::NxDomain, "{n}");
        }
    }
}
