//! mDNS packets as the members module hears them on 5353, into `members::mdns::Cache` (one
//! input is a sequence of packets, length-prefixed, so records split across packets and
//! goodbyes are fuzzed too). Queries go to `Announce::is_asked`, as the socket loop does.
//! Checks the member list the cache publishes: names are DNS labels, never our own node,
//! every member has at least one address and none is link-local; and our own announcement
//! still decodes into the cache afterwards (parse -> encode -> parse of what we send).
//! The same packets go to a cache of an authenticated cluster too (a membership key set,
//! from a peer's address): the fuzzer cannot sign, so that cache never lists anyone.
#![no_main]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use keelson_agent::dns_label::DnsLabel;
use keelson_agent::members::auth::{Keys, Verifier};
use keelson_agent::members::mdns::{Announce, Cache, MDNS_PORT, Received};
use keelson_agent::member::Member;
use keelson_cluster::Role;
use libfuzzer_sys::fuzz_target;

const ZONE: &str = "ocp4.example.com";

fn own() -> Announce {
    Announce {
        member: Member {
            name: "me".parse().expect("a DNS label"),
            role: Role::Master,
            addresses: vec!["10.0.0.10".parse().unwrap()],
            version: "0.1.0".into(),
        },
        zone: ZONE.into(),
        port: 22623,
        ttl: 35,
    }
}

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let mut cache = Cache::new(ZONE, "me", Duration::from_secs(35));
    let keys = Arc::new(Keys::from_raw(&[vec![7; 32]]));
    let mut signed_only = Cache::new(ZONE, "me", Duration::from_secs(35))
        .with_verifier(Arc::new(Verifier::new(Some(keys))));
    let peer: SocketAddr = "10.0.0.11:5353".parse().unwrap();
    let me = own();
    for (i, packet) in keelson_agent_fuzz::frames(data).into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        // Every third packet from another port: responses from it are refused.
        let port = if i % 3 == 2 { 40000 } else { MDNS_PORT };
        match cache.receive(packet, port, now) {
            Received::Query(q) => {
                let _ = me.is_asked(&q);
            }
            Received::Response { incomplete, .. } => {
                for (instance, host) in incomplete {
                    let _ = keelson_agent::members::mdns::resolve_query(&instance, host.as_ref());
                }
            }
            Received::Dropped(_) => {}
        }
        let _ = signed_only.receive_from(packet, peer, now, SystemTime::now());
        signed_only.expire(now);
        assert!(
            signed_only.members().is_empty(),
            "an unsigned record was believed: {:?}",
            signed_only.members()
        );
        cache.expire(now);
        for m in cache.members() {
            assert!(DnsLabel::is_valid(&m.name), "member name {:?}", m.name);
            assert_ne!(m.name, "me", "our own node is never a heard member");
            assert!(!m.addresses.is_empty());
            for a in &m.addresses {
                let link_local = match a {
                    IpAddr::V4(v4) => v4.is_link_local(),
                    IpAddr::V6(v6) => v6.is_unicast_link_local(),
                };
                assert!(!link_local, "{a} kept");
            }
        }
    }
    // Whatever the cache went through, a genuine announcement is still understood.
    let mut other = own();
    other.member.name = "peer".parse().expect("a DNS label");
    let later = start + Duration::from_secs(100_000);
    let _ = cache.receive(&other.packet(35).expect("valid announce"), MDNS_PORT, later);
    assert!(cache.members().iter().any(|m| m.name == "peer"));
});
