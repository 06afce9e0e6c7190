//! The cluster zone `<name>.<baseDomain>` as data: which names exist and what they answer.
//!
//! Pure logic, no I/O: [`Zone::lookup`] turns a question into an [`Answer`], and the zone is
//! rebuilt (cheaply, it is small) whenever the member list changes.

use std::collections::HashMap;
use std::net::IpAddr;

use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::members::member::Member;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The name is not ours: forward it.
    NotOurs,
    /// Authoritative answer with these records (never empty).
    Records(Vec<Record>),
    /// The name exists but has no record of that type: NOERROR, empty answer, SOA.
    NoData,
    /// The name does not exist in the zone: NXDOMAIN with SOA.
    NxDomain,
    /// A class other than IN in our zone: REFUSED.
    Refused,
}

/// The authoritative data of the cluster zone.
#[derive(Debug, Clone)]
pub struct Zone {
    origin: Name,
    origin_labels: usize,
    ttl: u32,
    api: Vec<IpAddr>,
    ingress: Vec<IpAddr>,
    /// Lower-case node name -> addresses.
    nodes: HashMap<Vec<u8>, Vec<IpAddr>>,
    soa: Record,
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
        let bad = |reason: String| ZoneError::BadOrigin {
            zone: zone.to_string(),
            reason,
        };
        let mut origin = Name::from_ascii(zone)
            .map_err(|e| bad(e.to_string()))?
            .to_lowercase();
        origin.set_fqdn(true);
        if origin.is_root() {
            return Err(bad("the root is not a cluster zone".into()));
        }
        let mname = origin.prepend_label("ns").map_err(|e| bad(e.to_string()))?;
        let rname = origin
            .prepend_label("hostmaster")
            .map_err(|e| bad(e.to_string()))?;
        // The serial only has to grow when the data changes; seconds since the epoch do.
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        let soa = Record::from_rdata(
            origin.clone(),
            ttl,
            RData::SOA(SOA::new(mname, rname, serial, 3600, 600, 86400, ttl)),
        );
        let mut nodes = HashMap::new();
        for m in members {
            // A member's name is one DNS label (`DnsLabel`): served as it is, any case.
            nodes.insert(
                m.name.to_ascii_lowercase().into_bytes(),
                m.addresses.clone(),
            );
        }
        Ok(Self {
            origin_labels: origin.num_labels() as usize,
            origin,
            ttl,
            api: api.to_vec(),
            ingress: ingress.to_vec(),
            nodes,
            soa,
        })
    }

    /// The zone's origin (lower case, fully qualified).
    pub fn origin(&self) -> &Name {
        &self.origin
    }

    /// The SOA record put in negative answers.
    pub fn soa(&self) -> &Record {
        &self.soa
    }

    /// Number of node names served.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Answers `qname`/`qtype`/`qclass`; case-insensitive.
    pub fn lookup(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer {
        let labels: Vec<&[u8]> = qname.iter().collect();
        // A short node name (`master-0.`) is ours only when such a node exists; every
        // other single-label name is left to the upstreams.
        if labels.len() == 1 && !self.origin.zone_of(qname) {
            return match self.node(labels[0]) {
                Some(addrs) => self.records(qname, addrs, qtype, qclass),
                None => Answer::NotOurs,
            };
        }
        if !self.origin.zone_of(qname) {
            return Answer::NotOurs;
        }
        if qclass != DNSClass::IN && qclass != DNSClass::ANY {
            return Answer::Refused;
        }
        let rel = &labels[..labels.len() - self.origin_labels];
        match rel {
            [] => {
                if matches!(qtype, RecordType::SOA | RecordType::ANY) {
                    Answer::Records(vec![self.soa.clone()])
                } else {
                    Answer::NoData
                }
            }
            [one] if one.eq_ignore_ascii_case(b"api") || one.eq_ignore_ascii_case(b"api-int") => {
                self.records(qname, &self.api, qtype, qclass)
            }
            // `apps` itself is an empty non-terminal: it exists (names below it do).
            [one] if one.eq_ignore_ascii_case(b"apps") => Answer::NoData,
            [.., last] if last.eq_ignore_ascii_case(b"apps") => {
                self.records(qname, &self.ingress, qtype, qclass)
            }
            [one] => match self.node(one) {
                Some(addrs) => self.records(qname, addrs, qtype, qclass),
                None => Answer::NxDomain,
            },
            _ => Answer::NxDomain,
        }
    }

    fn node(&self, label: &[u8]) -> Option<&Vec<IpAddr>> {
        if label.len() > 63 {
            return None;
        }
        let mut key = [0u8; 63];
        let key = &mut key[..label.len()];
        key.copy_from_slice(label);
        key.make_ascii_lowercase();
        self.nodes.get(&key[..])
    }

    fn records(
        &self,
        qname: &Name,
        addrs: &[IpAddr],
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Answer {
        if qclass != DNSClass::IN && qclass != DNSClass::ANY {
            return Answer::Refused;
        }
        let want_v4 = matches!(qtype, RecordType::A | RecordType::ANY);
        let want_v6 = matches!(qtype, RecordType::AAAA | RecordType::ANY);
        let records: Vec<Record> = addrs
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) if want_v4 => Some(RData::A(A(*v4))),
                IpAddr::V6(v6) if want_v6 => Some(RData::AAAA(AAAA(*v6))),
                _ => None,
            })
            .map(|rdata| Record::from_rdata(qname.clone(), self.ttl, rdata))
            .collect();
        if records.is_empty() {
            Answer::NoData
        } else {
            Answer::Records(records)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::Role;

    fn zone() -> Zone {
        let members = vec![
            Member {
                name: "master-0".parse().unwrap(),
                role: Role::Master,
                addresses: vec!["10.0.0.10".parse().unwrap(), "fd00::10".parse().unwrap()],
                version: "1".into(),
            },
            Member {
                name: "Worker-1".parse().unwrap(),
                role: Role::Worker,
                addresses: vec!["10.0.0.21".parse().unwrap()],
                version: "1".into(),
            },
            Member {
                name: "xn--bcher-kva".parse().unwrap(),
                role: Role::Worker,
                addresses: vec!["10.0.0.22".parse().unwrap()],
                version: "1".into(),
            },
        ];
        Zone::new(
            "ocp4.Example.COM",
            60,
            &["10.0.0.5".parse().unwrap()],
            &["10.0.0.7".parse().unwrap()],
            &members,
        )
        .unwrap()
    }

    fn ips(answer: Answer) -> Vec<String> {
        match answer {
            Answer::Records(r) => r.iter().map(|r| r.data.to_string()).collect(),
            other => panic!("expected records, got {other:?}"),
        }
    }

    fn q(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    /// A-labels are served as any node name (issue 31), whatever the case asked.
    #[test]
    fn a_label_node_names_are_answered() {
        let z = zone();
        for n in [
            "xn--bcher-kva.ocp4.example.com.",
            "XN--BCHER-KVA.ocp4.example.com.",
            "xn--bcher-kva.",
        ] {
            assert_eq!(
                ips(z.lookup(&q(n), RecordType::A, DNSClass::IN)),
                ["10.0.0.22"],
                "{n}"
            );
        }
    }

    #[test]
    fn api_and_api_int() {
        let z = zone();
        for n in ["api.ocp4.example.com.", "API-INT.OCP4.example.com."] {
            assert_eq!(
                ips(z.lookup(&q(n), RecordType::A, DNSClass::IN)),
                ["10.0.0.5"]
            );
            assert_eq!(
                z.lookup(&q(n), RecordType::AAAA, DNSClass::IN),
                Answer::NoData
            );
        }
    }

    #[test]
    fn apps_wildcard_any_depth() {
        let z = zone();
        for n in ["x.apps.ocp4.example.com.", "a.b.c.APPS.ocp4.example.com."] {
            assert_eq!(
                ips(z.lookup(&q(n), RecordType::A, DNSClass::IN)),
                ["10.0.0.7"]
            );
        }
        let apps = q("apps.ocp4.example.com.");
        assert_eq!(z.lookup(&apps, RecordType::A, DNSClass::IN), Answer::NoData);
    }

    #[test]
    fn nodes_short_and_fqdn() {
        let z = zone();
        let fq = q("master-0.ocp4.example.com.");
        assert_eq!(
            ips(z.lookup(&fq, RecordType::A, DNSClass::IN)),
            ["10.0.0.10"]
        );
        assert_eq!(
            ips(z.lookup(&fq, RecordType::AAAA, DNSClass::IN)),
            ["fd00::10"]
        );
        assert_eq!(
            ips(z.lookup(&q("worker-1."), RecordType::A, DNSClass::IN)),
            ["10.0.0.21"]
        );
        assert_eq!(
            z.lookup(&q("worker-1."), RecordType::AAAA, DNSClass::IN),
            Answer::NoData
        );
        assert_eq!(
            z.lookup(&q("nothere."), RecordType::A, DNSClass::IN),
            Answer::NotOurs
        );
    }

    #[test]
    fn nxdomain_and_foreign() {
        let z = zone();
        let nx = q("nope.ocp4.example.com.");
        assert_eq!(z.lookup(&nx, RecordType::A, DNSClass::IN), Answer::NxDomain);
        let deep = q("a.api.ocp4.example.com.");
        assert_eq!(
            z.lookup(&deep, RecordType::A, DNSClass::IN),
            Answer::NxDomain
        );
        let other = q("www.example.com.");
        assert_eq!(
            z.lookup(&other, RecordType::A, DNSClass::IN),
            Answer::NotOurs
        );
        let chaos = q("api.ocp4.example.com.");
        assert_eq!(
            z.lookup(&chaos, RecordType::A, DNSClass::CH),
            Answer::Refused
        );
    }

    #[test]
    fn apex_soa() {
        let z = zone();
        let apex = q("OCP4.example.com.");
        match z.lookup(&apex, RecordType::SOA, DNSClass::IN) {
            Answer::Records(r) => assert_eq!(r[0].record_type(), RecordType::SOA),
            other => panic!("{other:?}"),
        }
        assert_eq!(z.lookup(&apex, RecordType::A, DNSClass::IN), Answer::NoData);
    }

    #[test]
    fn bad_origin() {
        assert!(Zone::new("a..b", 60, &[], &[], &[]).is_err());
        assert!(Zone::new(".", 60, &[], &[], &[]).is_err());
    }
}
