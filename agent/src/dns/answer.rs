//! The zone's answer to one question, on the wire: the records, the SOA of negative
//! answers, the addresses of SRV targets as additional data, truncation and OPT.
//!
//! Size rules (docs/dns.md): the answer and authority sections fit whole or the response is
//! truncated (TC, question and OPT only); additional records are added one RRset at a time
//! while they fit and left out otherwise, without TC (RFC 2181 §9: a client has what it
//! asked for and resolves the rest itself).

use hickory_proto::op::ResponseCode;

use super::etcd::{SRV_PRIORITY, SRV_WEIGHT, Target};
use super::wire::{Flags, OPT_LEN, OUR_UDP_PAYLOAD, Owner, Question, Section, Writer, rtype};
use super::zone::{Answer, Zone, asked_for};

/// What was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The response code.
    pub rcode: ResponseCode,
    /// Whether the answer was cut to the question (TC).
    pub truncated: bool,
}

/// Writes the response to `q` carrying `answer` into `out`, within `max_size` bytes;
/// `None` for [`Answer::NotOurs`], which is not the zone's to answer.
pub fn write(
    q: &Question<'_>,
    zone: &Zone,
    answer: Answer<'_>,
    max_size: usize,
    out: &mut Vec<u8>,
) -> Option<Written> {
    let mut w = Writer::new(out, q, zone.origin());
    let ttl = zone.ttl();
    let mut flags = Flags {
        aa: true,
        tc: false,
        rd: q.rd,
        cd: q.cd,
        rcode: 0,
    };
    let mut additional: &[Target] = &[];
    match answer {
        Answer::NotOurs => return None,
        Answer::Addresses { addrs, qtype } => {
            for ip in addrs.iter().filter(|ip| asked_for(ip, qtype)) {
                w.address(Section::Answer, Owner::Question, ttl, *ip);
            }
        }
        Answer::Soa => w.soa(Section::Answer, Owner::Question, ttl, zone.soa()),
        Answer::Srv { targets, port } => {
            for t in targets {
                let srv = [SRV_PRIORITY, SRV_WEIGHT, port];
                w.srv(Owner::Question, ttl, srv, t.label.as_bytes());
            }
            additional = targets;
        }
        // The SOA of a negative answer: its TTL is the negative-caching time (RFC 2308 §3).
        Answer::NoData => w.soa(Section::Authority, Owner::Origin, ttl, zone.soa()),
        Answer::NxDomain => {
            flags.rcode = u16::from(ResponseCode::NXDomain) as u8;
            w.soa(Section::Authority, Owner::Origin, ttl, zone.soa());
        }
        Answer::Refused => {
            flags.aa = false;
            flags.rcode = u16::from(ResponseCode::Refused) as u8;
        }
    }
    let opt = q.edns.map(|_| OUR_UDP_PAYLOAD);
    let limit = max_size.saturating_sub(if opt.is_some() { OPT_LEN } else { 0 });
    if w.len() > limit {
        w.clear_records();
        flags.tc = true;
    } else {
        add_addresses(&mut w, additional, ttl, limit);
    }
    let rcode = ResponseCode::from_low(flags.rcode);
    let truncated = flags.tc;
    w.finish(q.id, flags, opt);
    Some(Written { rcode, truncated })
}

/// The A then AAAA RRset of each target, while each fits whole under `limit`.
fn add_addresses(w: &mut Writer<'_>, targets: &[Target], ttl: u32, limit: usize) {
    for t in targets {
        for qtype in [rtype::A, rtype::AAAA] {
            let mark = w.mark();
            for ip in t.addresses.iter().filter(|ip| asked_for(ip, qtype)) {
                w.address(
                    Section::Additional,
                    Owner::UnderOrigin(t.label.as_bytes()),
                    ttl,
                    *ip,
                );
            }
            if w.len() > limit {
                w.rollback(mark);
                return;
            }
        }
    }
}
