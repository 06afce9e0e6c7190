//! One DNS request in, one decision out: reply now, forward, or drop.
//!
//! Pure logic over bytes (no sockets), so every malformed-input rule is unit-tested:
//! short packets and responses are dropped; undecodable ones (bad labels, compression
//! loops, oversized names), zero or several questions get FORMERR; other opcodes NOTIMP;
//! EDNS versions above 0 BADVERS. Responses over the client's UDP size are truncated
//! (TC set, question kept).

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};

use super::zone::{Answer, Zone};

/// Largest UDP payload we advertise and accept to send (the DNS flag day 2020 value).
pub const OUR_UDP_PAYLOAD: u16 = 1232;
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
    /// Send these bytes back.
    Reply {
        /// The encoded response.
        bytes: Vec<u8>,
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
    pub fn query(&self) -> &Query {
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

/// Decides what to do with `packet`.
pub fn handle(packet: &[u8], zone: &Zone, transport: Transport) -> Outcome {
    if packet.len() < 12 {
        return Outcome::Drop(DropReason::Short);
    }
    if packet[2] & 0x80 != 0 {
        return Outcome::Drop(DropReason::NotAQuery);
    }
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let opcode = OpCode::from_u8((packet[2] >> 3) & 0x0f);
    let message = match Message::from_vec(packet) {
        Ok(m) => m,
        Err(_) => return header_only(id, opcode, ResponseCode::FormErr),
    };
    if message.metadata.op_code != OpCode::Query {
        return header_only(id, message.metadata.op_code, ResponseCode::NotImp);
    }
    let max_size = match transport {
        Transport::Tcp => TCP_LIMIT,
        Transport::Udp => match &message.edns {
            Some(e) => usize::from(e.max_payload().clamp(512, OUR_UDP_PAYLOAD)),
            None => 512,
        },
    };
    if message.queries.len() != 1 {
        let mut resp = response_to(&message);
        resp.metadata.response_code = ResponseCode::FormErr;
        resp.queries.clear();
        return finish(resp, max_size);
    }
    if let Some(e) = &message.edns
        && e.version() > 0
    {
        let mut resp = response_to(&message);
        resp.metadata.response_code = ResponseCode::BADVERS;
        return finish(resp, max_size);
    }
    let q = &message.queries[0];
    let answer = zone.lookup(q.name(), q.query_type(), q.query_class());
    let mut resp = response_to(&message);
    resp.metadata.authoritative = true;
    match answer {
        Answer::NotOurs => return Outcome::Forward(Request { message, max_size }),
        Answer::Records(records) => resp.answers = records,
        Answer::NoData => resp.authorities.push(negative_soa(zone)),
        Answer::NxDomain => {
            resp.metadata.response_code = ResponseCode::NXDomain;
            resp.authorities.push(negative_soa(zone));
        }
        Answer::Refused => {
            resp.metadata.authoritative = false;
            resp.metadata.response_code = ResponseCode::Refused;
        }
    }
    finish(resp, max_size)
}

/// The SOA of a negative answer: its TTL is the negative-caching time (RFC 2308 §3).
fn negative_soa(zone: &Zone) -> hickory_proto::rr::Record {
    zone.soa().clone()
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
fn header_only(id: u16, opcode: OpCode, rcode: ResponseCode) -> Outcome {
    let mut resp = Message::new(id, MessageType::Response, opcode);
    resp.metadata.response_code = rcode;
    finish(resp, 512)
}

/// Encodes `resp`, truncating it to `max_size` (TC set, question and OPT kept).
pub fn finish(resp: Message, max_size: usize) -> Outcome {
    let rcode = resp.metadata.response_code;
    match encode_limited(&resp, max_size) {
        Some((bytes, truncated)) => Outcome::Reply {
            bytes,
            rcode,
            truncated,
        },
        // Even the truncated form does not encode: answer SERVFAIL with the header only.
        None => {
            let mut fail = Message::new(
                resp.metadata.id,
                MessageType::Response,
                resp.metadata.op_code,
            );
            fail.metadata.response_code = ResponseCode::ServFail;
            Outcome::Reply {
                bytes: fail.to_vec().unwrap_or_default(),
                rcode: ResponseCode::ServFail,
                truncated: false,
            }
        }
    }
}

/// Encodes `resp` within `max_size`; `(bytes, truncated)`.
pub fn encode_limited(resp: &Message, max_size: usize) -> Option<(Vec<u8>, bool)> {
    let bytes = resp.to_vec().ok()?;
    if bytes.len() <= max_size {
        return Some((bytes, false));
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
    use crate::members::member::Member;
    use hickory_proto::rr::{Name, RecordType};
    use keelson_cluster::Role;

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

    fn reply(o: Outcome) -> Message {
        match o {
            Outcome::Reply { bytes, .. } => Message::from_vec(&bytes).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn answers_and_negative() {
        let z = zone(2);
        let r = reply(handle(
            &query("API.c.example.com.", RecordType::A, None),
            &z,
            Transport::Udp,
        ));
        assert_eq!(r.metadata.id, 0x1234);
        assert!(r.metadata.authoritative);
        assert_eq!(r.answers.len(), 2);
        let r = reply(handle(
            &query("api.c.example.com.", RecordType::AAAA, None),
            &z,
            Transport::Udp,
        ));
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.answers.is_empty());
        assert_eq!(r.authorities[0].record_type(), RecordType::SOA);
        let r = reply(handle(
            &query("zz.c.example.com.", RecordType::A, None),
            &z,
            Transport::Udp,
        ));
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(r.authorities[0].record_type(), RecordType::SOA);
    }

    #[test]
    fn forwards_foreign_names() {
        let z = zone(0);
        assert!(matches!(
            handle(
                &query("www.example.org.", RecordType::A, None),
                &z,
                Transport::Udp
            ),
            Outcome::Forward(_)
        ));
    }

    #[test]
    fn drops_short_and_responses() {
        let z = zone(0);
        assert!(matches!(
            handle(&[1, 2, 3], &z, Transport::Udp),
            Outcome::Drop(DropReason::Short)
        ));
        let mut q = query("api.c.example.com.", RecordType::A, None);
        q[2] |= 0x80;
        assert!(matches!(
            handle(&q, &z, Transport::Udp),
            Outcome::Drop(DropReason::NotAQuery)
        ));
    }

    #[test]
    fn formerr_on_zero_and_two_questions() {
        let z = zone(0);
        let mut m = Message::query();
        m.metadata.id = 7;
        let r = reply(handle(&m.to_vec().unwrap(), &z, Transport::Udp));
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        m.add_query(Query::query(Name::from_ascii("a.").unwrap(), RecordType::A));
        m.add_query(Query::query(Name::from_ascii("b.").unwrap(), RecordType::A));
        let r = reply(handle(&m.to_vec().unwrap(), &z, Transport::Udp));
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(r.metadata.id, 7);
    }

    #[test]
    fn formerr_on_compression_loop() {
        let z = zone(0);
        // Header with one question whose name is a pointer to itself (offset 12).
        let mut p = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        let r = reply(handle(&p, &z, Transport::Udp));
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
        let r = reply(handle(&p, &z, Transport::Udp));
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    }

    #[test]
    fn notimp_and_badvers() {
        let z = zone(0);
        let mut q = query("api.c.example.com.", RecordType::A, None);
        q[2] = (q[2] & !0x78) | (2 << 3); // STATUS
        let r = reply(handle(&q, &z, Transport::Udp));
        assert_eq!(r.metadata.response_code, ResponseCode::NotImp);

        let mut m =
            Message::from_vec(&query("api.c.example.com.", RecordType::A, Some(1232))).unwrap();
        m.edns.as_mut().unwrap().set_version(1);
        let r = reply(handle(&m.to_vec().unwrap(), &z, Transport::Udp));
        // 16 is BADVERS in an OPT context (hickory decodes it under its BADSIG alias).
        assert_eq!(u16::from(r.metadata.response_code), 16);
    }

    #[test]
    fn truncates_over_udp_only() {
        // 100 members under `*.apps`? No: many API addresses make one big answer.
        let addrs: Vec<std::net::IpAddr> = (1..=60)
            .map(|i| format!("10.1.0.{i}").parse().unwrap())
            .collect();
        let z = Zone::new("c.example.com", 60, &addrs, &[], &[]).unwrap();
        let q = query("api.c.example.com.", RecordType::A, None);
        match handle(&q, &z, Transport::Udp) {
            Outcome::Reply {
                bytes, truncated, ..
            } => {
                assert!(truncated);
                assert!(bytes.len() <= 512);
                let m = Message::from_vec(&bytes).unwrap();
                assert!(m.metadata.truncation);
                assert_eq!(m.queries.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        let q = query("api.c.example.com.", RecordType::A, Some(1232));
        let r = reply(handle(&q, &z, Transport::Udp));
        assert!(!r.metadata.truncation);
        assert_eq!(r.answers.len(), 60);
        assert!(r.edns.is_some());
        let r = reply(handle(&q, &z, Transport::Tcp));
        assert_eq!(r.answers.len(), 60);
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let z = zone(3);
            let _ = handle(&bytes, &z, Transport::Udp);
        }

        #[test]
        fn mutated_queries_never_panic(pos in 0usize..40, val in proptest::prelude::any::<u8>()) {
            let z = zone(3);
            let mut q = query("x.apps.c.example.com.", RecordType::A, Some(1232));
            if pos < q.len() { q[pos] = val; }
            let _ = handle(&q, &z, Transport::Udp);
        }
    }
}
