//! Unicast member requests into the registry the Ignition server hands `/keelson/` routes
//! to (`members::registry::Registry` through its `ExtraRoutes::handle`, as the server calls
//! it), and another registry's answer as a node takes it in (`unicast::parse_answer`, then
//! `Registry::merge`, as the unicast client does).
//!
//! Input: one byte choosing the method, then the path up to the first newline, then the
//! body (also read as an answer). Checks: every request gets an answer that is 2xx, 4xx or
//! 405; a 200 is a JSON list of entries whose names are DNS labels; the live list only ever
//! holds DNS-label names, this node once, every member with 1 to 16 addresses and a
//! version of at most 64 bytes, however it was learned; an entry list that parses
//! re-encodes to itself. Every other input runs against an authenticated registry (a
//! membership key set): no request the fuzzer writes carries a valid MAC, so nothing it
//! registers is ever listed there.
#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use keelson_agent::dns_label::DnsLabel;
use keelson_agent::members::auth::{Keys, Verifier};
use keelson_agent::member::Member;
use keelson_agent::members::registry::{Entry, MEMBERS_PATH, Registry};
use keelson_cluster::Role;
use keelson_cluster::routes::ExtraRoutes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let method = match m % 5 {
        0 => Method::GET,
        1 => Method::POST,
        2 => Method::DELETE,
        3 => Method::PUT,
        _ => Method::HEAD,
    };
    let (path, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&b""[..], rest),
    };
    // Paths come from hyper as &str; an empty one means "the registration path".
    let path = match std::str::from_utf8(path) {
        Ok("") => MEMBERS_PATH.to_owned(),
        Ok(p) => p.to_owned(),
        Err(_) => return,
    };
    let own = Member {
        name: "master-0".parse().expect("a DNS label"),
        role: Role::Master,
        addresses: vec!["10.0.0.10".parse().unwrap()],
        version: "0.1.0".into(),
    };
    let registry = Registry::new("ocp4.example.com", Duration::from_secs(35)).with_own(own);
    let authenticated = (m / 5) % 2 == 1;
    if authenticated {
        let keys = std::sync::Arc::new(Keys::from_raw(&[vec![7; 32]]));
        registry.set_verifier(std::sync::Arc::new(Verifier::new(Some(keys))));
    }
    let peer: SocketAddr = "10.0.0.11:40000".parse().unwrap();
    // Twice: a registration followed by its renewal (or a repeated delete).
    for _ in 0..2 {
        let Some((status, answer)) =
            registry.handle(&method, &path, peer, Bytes::copy_from_slice(body))
        else {
            // Not a registry path: the server answers 404 itself.
            assert_ne!(path, MEMBERS_PATH);
            continue;
        };
        assert!(
            status.is_success() || status.is_client_error(),
            "status {status}"
        );
        if status == StatusCode::OK {
            let list: Vec<Entry> = serde_json::from_slice(&answer).expect("200 is an entry list");
            assert!(list.iter().all(|e| DnsLabel::is_valid(&e.member.name)));
        }
    }
    if authenticated {
        let names: Vec<String> = registry
            .list()
            .into_iter()
            .map(|m| m.name.to_string())
            .collect();
        assert_eq!(
            names,
            ["master-0"],
            "an unauthenticated registration was believed"
        );
    }
    // The client side: another registry's answer, read and merged as the unicast client
    // does (elements that are no entry skipped, at most MAX_MEMBERS taken).
    if let Ok(answer) = keelson_agent::members::unicast::parse_answer(body) {
        assert!(answer.entries.len() <= keelson_agent::members::table::MAX_MEMBERS);
        let again = serde_json::to_vec(&answer.entries).expect("entries serialise");
        let back: Vec<Entry> = serde_json::from_slice(&again).expect("own output parses");
        assert_eq!(back, answer.entries, "entry list round trip");
        registry.merge(answer.entries, std::time::Instant::now());
    }
    let members = registry.list();
    assert_eq!(
        members.iter().filter(|m| m.name == "master-0").count(),
        1,
        "own node once"
    );
    for member in members {
        assert!(DnsLabel::is_valid(&member.name), "listed {:?}", member.name);
        assert!(
            (1..=16).contains(&member.addresses.len()),
            "{} listed with {} addresses",
            member.name,
            member.addresses.len()
        );
        assert!(
            member.version.len() <= 64,
            "{} version of {} bytes",
            member.name,
            member.version.len()
        );
    }
});
