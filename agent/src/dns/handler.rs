//! One DNS request in, one decision out: reply now, forward, or drop.
//!
//! Pure logic over bytes (no sockets), so every malformed-input rule is unit-tested:
//! short packets and responses are dropped; undecodable ones (bad labels, compression
//! loops, oversized names), zero or several questions get FORMERR; other opcodes NOTIMP;
//! EDNS versions above 0 BADVERS. Responses over the client's UDP size are truncated
//! (`dns::answer` for the zone's, [`finish`] for forwarded ones).
//!
//! Two readers, one answer: the plain query shape is read in place (`wire`), everything
//! else is decoded by hickory-proto; either way the zone's answer is written by
//! `answer::write`.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::serialize::binary::BinEncodable;

use super::answer;
use super::wire::{self, Question};
use super::zone::Zone;

pub use super::wire::OUR_UDP_PAYLOAD;
/// Size limit over TCP (the 2-byte length prefix).
pub const TCP_LIMIT: usize = 65535;

/// Why a packet got no answer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Shorter than a DNS header.
    Short,
    /// The QR bit is set: a response, never answered (reflection loops).
    NotAQuery,
}

/// What to do with one request.
#[derive(Debug)]
pub enum Outcome {
    /// Send the bytes [`handle`] wrote back.
    Reply {
        /// The response code, for counters.
        rcode: ResponseCode,
        /// Whether it was truncated.
        truncated: bool,
    },
    /// The name is not ours: resolve it upstream.
    Forward(Request),
    /// Ignore the packet.
    Drop(DropReason),
}

/// A decoded, checked request with exactly one question.
#[derive(Debug, Clone)]
pub struct Request {
    /// The client's message.
    pub message: Message,
    /// The most the client accepts in one response on this transport.
    pub max_size: usize,
}

impl Request {
    /// The single question.
    pub fn query(&self) -> &hickory_proto::op::Query {
        &self.message.queries[0]
    }
}

/// The transport a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP: responses limited to 512 bytes or the client's EDNS size.
    Udp,
    /// TCP: up to 65535 bytes.
    Tcp,
}

/// The most a client accepts in one response: 65535 over TCP; over UDP its EDNS size
/// within 512..=[`OUR_UDP_PAYLOAD`], or 512 without EDNS.
fn max_size(transport: Transport, edns_payload: Option<u16>) -> usize {
    match (transport, edns_payload) {
        (Transport::Tcp, _) => TCP_LIMIT,
        (Transport::Udp, Some(p)) => usize::from(p.clamp(512, OUR_UDP_PAYLOAD)),
        (Transport::Udp, None) => 512,
    }
}

/// Decides what to do with `packet`; a reply is written into `out`.
pub fn handle(packet: &[u8], zone: &Zone, transport: Transport, out: &mut Vec<u8>) -> Outcome {
    if packet.len() < 12 {
        return Outcome::Drop(DropReason::Short);
    }
    if packet[2] & 0x80 != 0 {
        return Outcome::Drop(DropReason::NotAQuery);
    }
    // The common case, read in place. A name that is not ours is forwarded, and forwarding
    // works on the decoded message: it takes the general path below.
    if let Some(q) = wire::read_plain_query(packet)
        && q.edns.is_none_or(|e| e.version == 0)
    {
        let max = max_size(transport, q.edns.map(|e| e.payload));
        let answer = zone.lookup(q.name, q.qtype, q.qclass);
        if let Some(w) = answer::write(&q, zone, answer, max, out) {
            return Outcome::Reply {
                rcode: w.rcode,
                truncated: w.truncated,
            };
        }
    }
    handle_decoded(packet, zone, transport, out)
}

/// [`handle`] for what the plain reader left: decoded by hickory, with every malformed-input
/// rule.
fn handle_decoded(packet: &[u8], zone: &Zone, transport: Transport, out: &mut Vec<u8>) -> Outcome {
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let opcode = OpCode::from_u8((packet[2] >> 3) & 0x0f);
    let message = match Message::from_vec(packet) {
        Ok(m) => m,
        Err(_) => return header_only(id, opcode, ResponseCode::FormErr, out),
    };
    if message.metadata.op_code != OpCode::Query {
        return header_only(id, message.metadata.op_code, ResponseCode::NotImp, out);
    }
    let max_size = max_size(transport, message.edns.as_ref().map(Edns::max_payload));
    if message.queries.len() != 1 {
        let mut resp = response_to(&message);
        resp.metadata.response_code = ResponseCode::FormErr;
        resp.queries.clear();
        return finish(resp, max_size, out);
    }
    if let Some(e) = &message.edns
        && e.version() > 0
    {
        let mut resp = response_to(&message);
        resp.metadata.response_code = ResponseCode::BADVERS;
        return finish(resp, max_size, out);
    }
    let query = &message.queries[0];
    let Ok(name) = query.name().to_bytes() else {
        return header_only(id, opcode, ResponseCode::FormErr, out);
    };
    let q = Question {
        id,
        rd: message.metadata.recursion_desired,
        cd: message.metadata.checking_disabled,
        name: &name,
        qtype: u16::from(query.query_type()),
        qclass: u16::from(query.query_class()),
        edns: message.edns.as_ref().map(|e| wire::Edns {
            payload: e.max_payload(),
            version: e.version(),
        }),
    };
    let answer = zone.lookup(q.name, q.qtype, q.qclass);
    match answer::write(&q, zone, answer, max_size, out) {
        Some(w) => Outcome::Reply {
            rcode: w.rcode,
            truncated: w.truncated,
        },
        None => Outcome::Forward(Request { message, max_size }),
    }
}

/// A datagram cut at the receive buffer (longer than any query): FORMERR, header only, as a
/// message cut short gets; dropped when it is a response.
pub fn cut_short(packet: &[u8], out: &mut Vec<u8>) -> Outcome {
    if packet.len() < 12 {
        return Outcome::Drop(DropReason::Short);
    }
    if packet[2] & 0x80 != 0 {
        return Outcome::Drop(DropReason::NotAQuery);
    }
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let opcode = OpCode::from_u8((packet[2] >> 3) & 0x0f);
    header_only(id, opcode, ResponseCode::FormErr, out)
}

/// An empty response to `req`: same id, question, RD and CD; our EDNS when the client used it.
pub fn response_to(req: &Message) -> Message {
    let mut resp = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.checking_disabled = req.metadata.checking_disabled;
    resp.metadata.recursion_available = true;
    resp.queries = req.queries.clone();
    if req.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(OUR_UDP_PAYLOAD);
        edns.set_version(0);
        resp.edns = Some(edns);
    }
    resp
}

/// A response carrying only a header (used when the request could not be decoded).
fn header_only(id: u16, opcode: OpCode, rcode: ResponseCode, out: &mut Vec<u8>) -> Outcome {
    let mut resp = Message::new(id, MessageType::Response, opcode);
    resp.metadata.response_code = rcode;
    finish(resp, 512, out)
}

/// Encodes `resp` into `out` within `max_size` ([`encode_limited`]).
pub fn finish(resp: Message, max_size: usize, out: &mut Vec<u8>) -> Outcome {
    let rcode = resp.metadata.response_code;
    out.clear();
    match encode_limited(&resp, max_size) {
        Some((bytes, truncated)) => {
            out.extend_from_slice(&bytes);
            Outcome::Reply { rcode, truncated }
        }
        // Even the truncated form does not encode: answer SERVFAIL with the header only.
        None => {
            let mut fail = Message::new(
                resp.metadata.id,
                MessageType::Response,
                resp.metadata.op_code,
            );
            fail.metadata.response_code = ResponseCode::ServFail;
            out.extend_from_slice(&fail.to_vec().unwrap_or_default());
            Outcome::Reply {
                rcode: ResponseCode::ServFail,
                truncated: false,
            }
        }
    }
}

/// Encodes `resp` within `max_size`; `(bytes, truncated)`. Over the size, the additional
/// records go first (no TC: RFC 2181 §9); if the rest still does not fit, the header with
/// TC, the question and OPT.
pub fn encode_limited(resp: &Message, max_size: usize) -> Option<(Vec<u8>, bool)> {
    let bytes = resp.to_vec().ok()?;
    if bytes.len() <= max_size {
        return Some((bytes, false));
    }
    if !resp.additionals.is_empty() {
        let mut lean = resp.clone();
        lean.additionals.clear();
        let bytes = lean.to_vec().ok()?;
        if bytes.len() <= max_size {
            return Some((bytes, false));
        }
    }
    let mut short = resp.truncate();
    short.metadata.message_type = MessageType::Response;
    short.metadata.id = resp.metadata.id;
    let bytes = short.to_vec().ok()?;
    (bytes.len() <= max_size).then_some((bytes, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::zone::tests::member;
    use crate::member::Member;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{Name, RData, RecordType};
    use keelson_cluster::Role;
    use proptest::prelude::*;

    fn zone(n: usize) -> Zone {
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("node-{i}").parse().unwrap(),
                role: Role::Worker,
                addresses: vec![format!("10.0.{}.{}", i / 250, i % 250 + 1).parse().unwrap()],
                version: "1".into(),
            })
            .collect();
        Zone::new(
            "c.example.com",
            60,
            &["10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap()],
            &["10.0.0.7".parse().unwrap()],
            &members,
        )
        .unwrap()
    }

    /// A zone with `n` masters `master-<i>`, each with an IPv4 and an IPv6 address, serving
    /// the etcd names for a control plane of `n`.
    fn etcd_zone(n: usize) -> Zone {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let (a, b) = (i / 250, i % 250 + 1);
                member(
                    &format!("master-{i}"),
                    Role::Master,
                    &[&format!("10.1.{a}.{b}"), &format!("fd00::{a}:{b}")],
                )
            })
            .collect();
        Zone::new(
            "c.example.com",
            60,
            &["10.0.0.5".parse().unwrap()],
            &[],
            &members,
        )
        .unwrap()
        .with_etcd(&members, n as u32)
    }

    fn query(name: &str, t: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0x1234;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    /// The outcome and the bytes written.
    fn run(p: &[u8], z: &Zone, t: Transport) -> (Outcome, Vec<u8>) {
        let mut out = Vec::new();
        let o = handle(p, z, t, &mut out);
        (o, out)
    }

    fn reply_over(p: &[u8], z: &Zone, t: Transport) -> Message {
        match run(p, z, t) {
            (Outcome::Reply { .. }, bytes) => Message::from_vec(&bytes).unwrap(),
            (other, _) => panic!("expected a reply, got {other:?}"),
        }
    }

    fn reply(p: &[u8], z: &Zone) -> Message {
        reply_over(p, z, Transport::Udp)
    }

    #[test]
    fn answers_and_negative() {
        let z = zone(2);
        let r = reply(&query("API.c.example.com.", RecordType::A, None), &z);
        assert_eq!(r.metadata.id, 0x1234);
        assert!(r.metadata.authoritative);
        assert_eq!(r.answers.len(), 2);
        assert_eq!(r.answers[0].name.to_ascii(), "API.c.example.com.");
        let r = reply(&query("api.c.example.com.", RecordType::AAAA, None), &z);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.answers.is_empty());
        assert_eq!(r.authorities[0].record_type(), RecordType::SOA);
        assert_eq!(r.authorities[0].ttl, 60);
        let r = reply(&query("zz.c.example.com.", RecordType::A, None), &z);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        match &r.authorities[0].data {
            RData::SOA(soa) => {
                assert_eq!(soa.mname.to_ascii(), "ns.c.example.com.");
                assert_eq!(soa.rname.to_ascii(), "hostmaster.c.example.com.");
                assert_eq!(soa.minimum, 60);
            }
            other => panic!("{other:?}"),
        }
        // A short node name's negative answer carries the zone's SOA too.
        let r = reply(&query("node-1.", RecordType::AAAA, Some(1232)), &z);
        assert_eq!(r.authorities[0].name.to_ascii(), "c.example.com.");
        assert!(r.edns.is_some());
    }

    #[test]
    fn forwards_foreign_names() {
        let z = etcd_zone(3);
        // SRV questions for a zone keelson does not own are forwarded as any other.
        for name in [
            "_etcd-server-ssl._tcp.other.example.",
            "_etcd-server-ssl._tcp.example.com.",
        ] {
            assert!(
                matches!(
                    run(&query(name, RecordType::SRV, None), &z, Transport::Udp).0,
                    Outcome::Forward(_)
                ),
                "{name}"
            );
        }
        let z = zone(0);
        assert!(matches!(
            run(
                &query("www.example.org.", RecordType::A, None),
                &z,
                Transport::Udp
            )
            .0,
            Outcome::Forward(_)
        ));
    }

    #[test]
    fn drops_short_and_responses() {
        let z = zone(0);
        assert!(matches!(
            run(&[1, 2, 3], &z, Transport::Udp).0,
            Outcome::Drop(DropReason::Short)
        ));
        let mut q = query("api.c.example.com.", RecordType::A, None);
        q[2] |= 0x80;
        assert!(matches!(
            run(&q, &z, Transport::Udp).0,
            Outcome::Drop(DropReason::NotAQuery)
        ));
    }

    #[test]
    fn formerr_on_zero_and_two_questions() {
        let z = zone(0);
        let mut m = Message::query();
        m.metadata.id = 7;
        let r = reply(&m.to_vec().unwrap(), &z);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        m.add_query(Query::query(Name::from_ascii("a.").unwrap(), RecordType::A));
        m.add_query(Query::query(Name::from_ascii("b.").unwrap(), RecordType::A));
        let r = reply(&m.to_vec().unwrap(), &z);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(r.metadata.id, 7);
    }

    #[test]
    fn formerr_on_compression_loop() {
        let z = zone(0);
        // Header with one question whose name is a pointer to itself (offset 12).
        let mut p = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        let r = reply(&p, &z);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(r.metadata.id, 0xabcd);
    }

    #[test]
    fn formerr_on_oversized_name() {
        let z = zone(0);
        let mut p = vec![0, 9, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for _ in 0..5 {
            p.push(63);
            p.extend(std::iter::repeat_n(b'a', 63));
        }
        p.extend_from_slice(&[0, 0, 1, 0, 1]);
        let r = reply(&p, &z);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    }

    #[test]
    fn other_shapes_are_answered_like_plain_ones() {
        let z = zone(0);
        // A query carrying an answer record is not the plain shape: hickory decodes it,
        // and the answer is the same bytes.
        let plain = query("api.c.example.com.", RecordType::A, None);
        let mut m = Message::from_vec(&plain).unwrap();
        m.answers.push(hickory_proto::rr::Record::from_rdata(
            Name::from_ascii("x.").unwrap(),
            1,
            RData::A("192.0.2.1".parse().unwrap()),
        ));
        let odd = m.to_vec().unwrap();
        assert!(wire::read_plain_query(&odd).is_none());
        assert_eq!(
            run(&odd, &z, Transport::Udp).1,
            run(&plain, &z, Transport::Udp).1
        );
    }

    #[test]
    fn notimp_and_badvers() {
        let z = zone(0);
        let mut q = query("api.c.example.com.", RecordType::A, None);
        q[2] = (q[2] & !0x78) | (2 << 3); // STATUS
        let r = reply(&q, &z);
        assert_eq!(r.metadata.response_code, ResponseCode::NotImp);

        let mut m =
            Message::from_vec(&query("api.c.example.com.", RecordType::A, Some(1232))).unwrap();
        m.edns.as_mut().unwrap().set_version(1);
        let r = reply(&m.to_vec().unwrap(), &z);
        // 16 is BADVERS in an OPT context (hickory decodes it under its BADSIG alias).
        assert_eq!(u16::from(r.metadata.response_code), 16);
    }

    #[test]
    fn truncates_over_udp_only() {
        // Many API addresses make one big answer.
        let addrs: Vec<std::net::IpAddr> = (1..=60)
            .map(|i| format!("10.1.0.{i}").parse().unwrap())
            .collect();
        let z = Zone::new("c.example.com", 60, &addrs, &[], &[]).unwrap();
        let q = query("api.c.example.com.", RecordType::A, None);
        match run(&q, &z, Transport::Udp) {
            (Outcome::Reply { truncated, .. }, bytes) => {
                assert!(truncated);
                assert!(bytes.len() <= 512);
                let m = Message::from_vec(&bytes).unwrap();
                assert!(m.metadata.truncation);
                assert!(m.metadata.authoritative);
                assert_eq!(m.queries.len(), 1);
                assert!(m.answers.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let q = query("api.c.example.com.", RecordType::A, Some(1232));
        let r = reply(&q, &z);
        assert!(!r.metadata.truncation);
        assert_eq!(r.answers.len(), 60);
        assert!(r.edns.is_some());
        let r = reply_over(&q, &z, Transport::Tcp);
        assert_eq!(r.answers.len(), 60);
    }

    fn srv_query(edns: Option<u16>) -> Vec<u8> {
        query(
            "_etcd-server-ssl._tcp.C.example.com.",
            RecordType::SRV,
            edns,
        )
    }

    /// The SRV targets and the owners of the additional records of `m`.
    fn srv_view(m: &Message) -> (Vec<String>, Vec<String>) {
        let targets = m
            .answers
            .iter()
            .map(|r| match &r.data {
                RData::SRV(s) => {
                    assert_eq!((s.priority, s.weight, s.port), (0, 10, 2380));
                    s.target.to_ascii()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        let extra = m
            .additionals
            .iter()
            .map(|r| format!("{} {}", r.name.to_lowercase().to_ascii(), r.data))
            .collect();
        (targets, extra)
    }

    #[test]
    fn srv_with_its_addresses() {
        let z = etcd_zone(3);
        let r = reply(&srv_query(None), &z);
        assert!(r.metadata.authoritative && !r.metadata.truncation);
        let (targets, extra) = srv_view(&r);
        assert_eq!(
            targets,
            [
                "etcd-0.c.example.com.",
                "etcd-1.c.example.com.",
                "etcd-2.c.example.com."
            ]
        );
        assert_eq!(
            extra,
            [
                "etcd-0.c.example.com. 10.1.0.1",
                "etcd-0.c.example.com. fd00::1",
                "etcd-1.c.example.com. 10.1.0.2",
                "etcd-1.c.example.com. fd00::2",
                "etcd-2.c.example.com. 10.1.0.3",
                "etcd-2.c.example.com. fd00::3",
            ]
        );
        assert_eq!(
            r.answers[0].name.to_ascii(),
            "_etcd-server-ssl._tcp.C.example.com."
        );
        // Not ready: NODATA with the SOA.
        let members = [member("master-0", Role::Master, &["10.1.0.1"])];
        let z = Zone::new("c.example.com", 60, &[], &[], &members)
            .unwrap()
            .with_etcd(&members, 3);
        let r = reply(&srv_query(None), &z);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.answers.is_empty());
        assert_eq!(r.authorities[0].record_type(), RecordType::SOA);
    }

    #[test]
    fn srv_target_is_not_compressed() {
        let z = etcd_zone(1);
        let (_, bytes) = run(&srv_query(None), &z, Transport::Udp);
        let target = b"\x06etcd-0\x01c\x07example\x03com\x00";
        assert!(
            bytes.windows(target.len()).any(|w| w == target),
            "RFC 2782: the target is written in full"
        );
    }

    #[test]
    fn large_srv_answers_follow_the_size_rules() {
        // 20 masters: 20 SRV records (~500 bytes with the question) fit 1232 but not all
        // 40 address RRsets: the additional section is cut at a whole RRset, no TC.
        let z = etcd_zone(20);
        let (o, bytes) = run(&srv_query(Some(1232)), &z, Transport::Udp);
        assert!(matches!(
            o,
            Outcome::Reply {
                truncated: false,
                ..
            }
        ));
        assert!(bytes.len() <= 1232);
        let r = Message::from_vec(&bytes).unwrap();
        assert!(!r.metadata.truncation);
        assert_eq!(r.answers.len(), 20);
        let (_, extra) = srv_view(&r);
        assert!(!extra.is_empty() && extra.len() < 40, "{}", extra.len());
        assert!(r.edns.is_some(), "OPT kept");
        // Whole RRsets in target order: every owner seen has both of its records unless
        // it is the last one (an A set whose AAAA set did not fit).
        for (i, rec) in extra.iter().enumerate() {
            let idx = i / 2;
            assert!(rec.starts_with(&format!("etcd-{idx}.")), "{rec}");
        }
        // Without EDNS the answer section itself does not fit 512: TC, question only.
        let (o, bytes) = run(&srv_query(None), &z, Transport::Udp);
        assert!(matches!(
            o,
            Outcome::Reply {
                truncated: true,
                ..
            }
        ));
        let r = Message::from_vec(&bytes).unwrap();
        assert!(r.metadata.truncation && r.answers.is_empty() && r.additionals.is_empty());
        assert_eq!(r.queries.len(), 1);
        // Over TCP everything.
        let r = reply_over(&srv_query(None), &z, Transport::Tcp);
        assert_eq!(r.answers.len(), 20);
        assert_eq!(r.additionals.len(), 40);
    }

    #[test]
    fn forwarded_answers_lose_additionals_before_tc() {
        let q = Message::from_vec(&query("x.example.org.", RecordType::A, None)).unwrap();
        let mut resp = response_to(&q);
        resp.answers.push(hickory_proto::rr::Record::from_rdata(
            Name::from_ascii("x.example.org.").unwrap(),
            60,
            RData::A("192.0.2.1".parse().unwrap()),
        ));
        for i in 0..40 {
            resp.additionals.push(hickory_proto::rr::Record::from_rdata(
                Name::from_ascii(format!("n{i}.example.org.")).unwrap(),
                60,
                RData::AAAA(format!("2001:db8::{i}").parse().unwrap()),
            ));
        }
        let (bytes, truncated) = encode_limited(&resp, 512).unwrap();
        assert!(!truncated);
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.answers.len(), 1);
        assert!(m.additionals.is_empty());
    }

    /// Names near and in the zone, in random case, for the property tests.
    fn names() -> impl Strategy<Value = String> {
        let label = prop_oneof![
            Just("api".to_string()),
            Just("api-int".to_string()),
            Just("apps".to_string()),
            Just("etcd-1".to_string()),
            Just("etcd-07".to_string()),
            Just("_etcd-server-ssl._tcp".to_string()),
            Just("_etcd-client-ssl._tcp".to_string()),
            Just("_tcp".to_string()),
            Just("master-2".to_string()),
            Just("x.y.apps".to_string()),
            "[a-z0-9-]{1,12}",
        ];
        let zone = prop_oneof![
            Just(".c.example.com.".to_string()),
            Just(".".to_string()),
            Just(".example.com.".to_string()),
            Just(".c.example.com".to_string()),
        ];
        (label, zone, any::<u64>()).prop_map(|(l, z, case)| {
            format!("{l}{z}")
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if case >> (i % 64) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect()
        })
    }

    fn qtypes() -> impl Strategy<Value = u16> {
        prop_oneof![
            Just(1u16),
            Just(28),
            Just(33),
            Just(6),
            Just(255),
            Just(16),
            Just(2),
            any::<u16>()
        ]
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let z = etcd_zone(3);
            let _ = run(&bytes, &z, Transport::Udp);
        }

        #[test]
        fn mutated_queries_never_panic(pos in 0usize..60, val in any::<u8>()) {
            let z = etcd_zone(3);
            let mut q = query("x.apps.c.example.com.", RecordType::A, Some(1232));
            if pos < q.len() { q[pos] = val; }
            let _ = run(&q, &z, Transport::Udp);
        }

        /// The plain reader reads what hickory decodes, or leaves the packet to it.
        #[test]
        fn plain_reader_agrees_with_hickory(
            name in names(), qtype in qtypes(), class in prop_oneof![Just(1u16), Just(3), Just(255), any::<u16>()],
            edns in proptest::option::of(any::<u16>()), rd in any::<bool>(), cd in any::<bool>(),
            pos in 0usize..80, val in any::<u8>(), mutate in any::<bool>(),
        ) {
            let Ok(n) = Name::from_ascii(&name) else { return Ok(()) };
            let mut m = Message::query();
            m.metadata.id = 0x4242;
            m.metadata.recursion_desired = rd;
            m.metadata.checking_disabled = cd;
            let mut query = Query::query(n, RecordType::from(qtype));
            query.set_query_class(hickory_proto::rr::DNSClass::from(class));
            m.add_query(query);
            if let Some(size) = edns {
                let mut e = Edns::new();
                e.set_max_payload(size);
                m.set_edns(e);
            }
            let Ok(mut p) = m.to_vec() else { return Ok(()) };
            if mutate && pos < p.len() { p[pos] = val; }
            if let Some(q) = wire::read_plain_query(&p) {
                let d = Message::from_vec(&p).expect("hickory decodes what the plain reader read");
                prop_assert_eq!(d.metadata.message_type, MessageType::Query);
                prop_assert_eq!(d.metadata.op_code, OpCode::Query);
                prop_assert_eq!(d.queries.len(), 1);
                prop_assert_eq!(d.metadata.id, q.id);
                prop_assert_eq!(d.metadata.recursion_desired, q.rd);
                prop_assert_eq!(d.metadata.checking_disabled, q.cd);
                prop_assert_eq!(d.queries[0].name().to_bytes().unwrap(), q.name.to_vec());
                prop_assert_eq!(u16::from(d.queries[0].query_type()), q.qtype);
                prop_assert_eq!(u16::from(d.queries[0].query_class()), q.qclass);
                prop_assert_eq!(d.edns.as_ref().map(|e| (e.max_payload(), e.version())),
                    q.edns.map(|e| (e.payload.max(512), e.version)));
                // And both paths write the same bytes.
                let z = etcd_zone(3);
                for t in [Transport::Udp, Transport::Tcp] {
                    let mut fast = Vec::new();
                    let mut slow = Vec::new();
                    let a = handle(&p, &z, t, &mut fast);
                    let b = handle_decoded(&p, &z, t, &mut slow);
                    if let (Outcome::Reply { .. }, Outcome::Reply { .. }) = (&a, &b) {
                        prop_assert_eq!(&fast, &slow);
                    } else {
                        prop_assert!(matches!((&a, &b), (Outcome::Forward(_), Outcome::Forward(_))), "{a:?} {b:?}");
                    }
                }
            }
        }

        /// Every reply decodes, echoes id and question, fits the limit.
        #[test]
        fn replies_decode_and_fit(name in names(), qtype in qtypes(), edns in proptest::option::of(any::<u16>()), tcp in any::<bool>()) {
            let Ok(n) = Name::from_ascii(&name) else { return Ok(()) };
            let mut m = Message::query();
            m.metadata.id = 0x77;
            m.add_query(Query::query(n, RecordType::from(qtype)));
            if let Some(size) = edns {
                let mut e = Edns::new();
                e.set_max_payload(size);
                m.set_edns(e);
            }
            let Ok(p) = m.to_vec() else { return Ok(()) };
            let z = etcd_zone(40);
            let t = if tcp { Transport::Tcp } else { Transport::Udp };
            let (o, bytes) = run(&p, &z, t);
            if let Outcome::Reply { truncated, .. } = o {
                let limit = max_size(t, edns);
                prop_assert!(bytes.len() <= limit);
                let r = Message::from_vec(&bytes).expect("reply decodes");
                prop_assert_eq!(r.metadata.id, 0x77);
                prop_assert_eq!(r.metadata.truncation, truncated);
                prop_assert_eq!(r.queries.len(), 1);
                prop_assert_eq!(r.queries[0].name().to_bytes().unwrap(), m.queries[0].name().to_bytes().unwrap());
                prop_assert_eq!(r.queries[0].query_type(), m.queries[0].query_type());
                prop_assert_eq!(r.edns.is_some(), edns.is_some());
            }
        }
    }
}
