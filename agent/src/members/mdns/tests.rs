//! Announcements into a cache and back: expiry, goodbyes, our own and other clusters'
//! records, bogus records, split packets, questions, A-labels.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::rdata::{PTR, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record};
use keelson_cluster::Role;

use super::announce::response;
use super::txt::{TXT_STRING_MAX, addrs_items};
use super::*;
use crate::member::Member;

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
