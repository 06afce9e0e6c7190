//! A DNS request as the cluster DNS server receives it (UDP and TCP), into the zone handler
//! (`dns::handler::handle`) over the zone `build_zone` makes from the test cluster.json and
//! three members. Checks what the server then sends or forwards:
//! - a reply decodes, is a response with the request's id, and fits the transport's limit
//!   (512 bytes without EDNS, the client's EDNS size up to 1232, 65535 over TCP);
//! - a reply to a request that decoded with one question carries that question back
//!   (parse -> encode -> parse of the question);
//! - a forwarded request has exactly one question; a dropped one is short or a response;
//! - whatever the in-place reader of plain queries (`dns::wire`) accepts, hickory decodes
//!   to the same id, flags, question and EDNS size (the two readers agree).
#![no_main]

use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType};
use keelson_agent::dns::build_zone;
use keelson_agent::dns::handler::{
    DropReason, OUR_UDP_PAYLOAD, Outcome, TCP_LIMIT, Transport, handle,
};
use hickory_proto::serialize::binary::BinEncodable;
use keelson_agent::dns::wire;
use keelson_agent::dns::zone::Zone;
use keelson_agent::member::Member;
use keelson_cluster::Role;
use libfuzzer_sys::fuzz_target;

fn zone() -> &'static Zone {
    static ZONE: OnceLock<Zone> = OnceLock::new();
    ZONE.get_or_init(|| {
        let members: Vec<Member> = ["master-0", "master-1", "worker-0"]
            .iter()
            .enumerate()
            .map(|(i, name)| Member {
                name: name.parse().expect("a DNS label"),
                role: if i < 2 { Role::Master } else { Role::Worker },
                addresses: vec![
                    format!("10.0.0.{}", 10 + i).parse().unwrap(),
                    format!("fd00::{}", 10 + i).parse().unwrap(),
                ],
                version: "0.1.0".into(),
            })
            .collect();
        build_zone(keelson_agent_fuzz::cluster(), &members)
            .expect("zone")
            .with_etcd(&members, 2)
    })
}

fn check(packet: &[u8], transport: Transport) {
    let request = Message::from_vec(packet).ok();
    let mut bytes = Vec::new();
    match handle(packet, zone(), transport, &mut bytes) {
        Outcome::Reply { rcode, truncated } => {
            let limit = match (transport, request.as_ref().and_then(|m| m.edns.as_ref())) {
                (Transport::Tcp, _) => TCP_LIMIT,
                (Transport::Udp, Some(edns)) => {
                    usize::from(edns.max_payload().clamp(512, OUR_UDP_PAYLOAD))
                }
                (Transport::Udp, None) => 512,
            };
            assert!(
                bytes.len() <= limit,
                "reply of {} bytes over the limit {limit}",
                bytes.len()
            );
            let reply = Message::from_vec(&bytes).expect("our reply decodes");
            assert_eq!(reply.metadata.message_type, MessageType::Response);
            assert_eq!(
                reply.metadata.id,
                u16::from_be_bytes([packet[0], packet[1]])
            );
            assert_eq!(reply.metadata.truncation, truncated);
            if let Some(req) = &request
                && req.queries.len() == 1
                && reply.metadata.response_code == rcode
                && !reply.queries.is_empty()
            {
                assert_eq!(reply.queries, req.queries, "question echoed");
            }
        }
        Outcome::Forward(req) => {
            assert_eq!(req.message.queries.len(), 1);
            assert!(req.max_size >= 512);
        }
        Outcome::Drop(DropReason::Short) => assert!(packet.len() < 12),
        Outcome::Drop(DropReason::NotAQuery) => assert!(packet[2] & 0x80 != 0),
    }
}

/// The in-place reader and hickory read a plain query the same.
fn readers_agree(packet: &[u8]) {
    let Some(q) = wire::read_plain_query(packet) else {
        return;
    };
    let m = Message::from_vec(packet).expect("hickory decodes what the plain reader read");
    assert_eq!(m.queries.len(), 1);
    assert_eq!(m.metadata.message_type, MessageType::Query);
    assert_eq!(m.metadata.id, q.id);
    assert_eq!(m.metadata.recursion_desired, q.rd);
    assert_eq!(m.metadata.checking_disabled, q.cd);
    assert_eq!(m.queries[0].name().to_bytes().unwrap(), q.name);
    assert_eq!(u16::from(m.queries[0].query_type()), q.qtype);
    assert_eq!(u16::from(m.queries[0].query_class()), q.qclass);
    assert_eq!(
        m.edns.as_ref().map(|e| (e.max_payload(), e.version())),
        q.edns.map(|e| (e.payload.max(512), e.version))
    );
}

fuzz_target!(|packet: &[u8]| {
    readers_agree(packet);
    check(packet, Transport::Udp);
    check(packet, Transport::Tcp);
});
