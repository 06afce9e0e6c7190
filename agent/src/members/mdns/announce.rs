//! What this node sends: its records (PTR, SRV, TXT, A/AAAA), unsigned or with the TXT
//! record signed, as an unsolicited response or a goodbye, whether a query asks for them,
//! and the queries that browse for the other nodes and resolve one.

use std::net::IpAddr;
use std::time::SystemTime;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::{A, AAAA, PTR, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::member::Member;
use crate::members::auth::{Fields, Op, Signer};

use super::txt::addrs_items;
use super::{MdnsError, flush, host_name, instance_name, service_name};

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
pub(super) fn response(records: Vec<Record>) -> Vec<u8> {
    let mut m = Message::new(0, MessageType::Response, OpCode::Query);
    m.metadata.authoritative = true;
    m.answers = records;
    m.to_vec().unwrap_or_default()
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
