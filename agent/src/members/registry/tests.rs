use super::*;
use keelson_cluster::Role;

fn member(name: &str, addr: &str) -> Member {
    Member {
        name: name.parse().unwrap(),
        role: Role::Master,
        addresses: vec![addr.parse().unwrap()],
        version: "1".into(),
    }
}

fn reg(cluster: &str, name: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&Registration {
            cluster: cluster.into(),
            member: member(name, "10.0.0.1"),
            auth: None,
        })
        .unwrap(),
    )
}

fn peer() -> SocketAddr {
    "10.0.0.1:40000".parse().unwrap()
}

#[test]
fn register_list_delete() {
    let r = Registry::new("c.example", Duration::from_secs(10));
    let mut rx = r.subscribe();
    let (st, body) = r
        .handle(&Method::POST, MEMBERS_PATH, peer(), reg("C.example", "m0"))
        .unwrap();
    assert_eq!(st, StatusCode::OK);
    assert!(rx.has_changed().unwrap(), "a new member is a change");
    rx.borrow_and_update();
    let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].member.name, "m0");
    assert!(list[0].age_ms < 1000);
    r.handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m0"))
        .unwrap();
    assert!(!rx.has_changed().unwrap(), "a renewal is not");
    let (st, _) = r
        .handle(
            &Method::DELETE,
            &format!("{MEMBERS_PATH}/m0"),
            peer(),
            Bytes::new(),
        )
        .unwrap();
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(r.list().is_empty());
    assert!(rx.has_changed().unwrap());
}

#[test]
fn own_node_is_always_listed_fresh_and_cannot_be_registered() {
    let r = Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
    let (st, body) = r
        .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m0"))
        .unwrap();
    assert_eq!(st, StatusCode::OK);
    let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        list.iter()
            .map(|e| e.member.name.as_str())
            .collect::<Vec<_>>(),
        ["m1", "m0"]
    );
    assert_eq!(list[0].age_ms, 0);
    assert_eq!(
        list[0].member.addresses,
        vec!["10.0.0.11".parse::<std::net::IpAddr>().unwrap()]
    );
    let (st, body) = r
        .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m1"))
        .unwrap();
    assert_eq!(st, StatusCode::CONFLICT);
    assert!(String::from_utf8_lossy(&body).contains("serving this registry"));
}

#[test]
fn merged_answers_are_held_to_the_registration_checks() {
    // Found by the members_registry fuzz target: a 118-byte version came in through
    // another registry's answer and was listed.
    let r = Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
    let crash = include_bytes!("../testdata/fuzz-merge-long-version.json");
    let entries: Vec<Entry> = serde_json::from_slice(crash).unwrap();
    let mut no_address = member("m3", "10.0.0.13");
    no_address.addresses.clear();
    let mut control = member("m4", "10.0.0.14");
    control.version = "1\n2".into();
    let mut all = entries;
    all.extend([no_address, control].map(|member| Entry { member, age_ms: 0 }));
    all.push(Entry {
        member: member("m2", "10.0.0.12"),
        age_ms: 0,
    });
    assert_eq!(r.merge(all, Instant::now()), 1);
    let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
    assert_eq!(names, ["m1", "m2"]);
}

#[test]
fn merged_answers_keep_the_newest_sighting_and_expire_on_time() {
    let r = Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
    let t0 = Instant::now();
    let heard = |name: &str, age_ms| Entry {
        member: member(name, "10.0.0.12"),
        age_ms,
    };
    // Our own name is skipped (a name that is no DNS label is no `Entry`: the answer's
    // reader drops it, `unicast::parse_answer`).
    let taken = r.merge(vec![heard("m2", 4000), heard("m1", 0)], t0);
    assert_eq!(taken, 1);
    // Gossip about an older sighting does not make it younger.
    r.merge(vec![heard("m2", 9000)], t0);
    r.expire(t0 + Duration::from_secs(6));
    assert_eq!(
        r.list().len(),
        2,
        "heard 4 s before t0: live until t0 + 6 s"
    );
    r.expire(t0 + Duration::from_millis(6100));
    assert_eq!(
        r.list().iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["m1"]
    );
}

/// A node that serves no registry keeps only what some registry still lists: a member
/// gone from every registry's last list leaves at once, one still listed anywhere stays.
#[test]
fn members_no_registry_lists_any_more_are_dropped() {
    let r = Registry::new("c.example", Duration::from_secs(35)).with_own(member("w1", "10.0.0.21"));
    let t0 = Instant::now();
    let heard = |name: &str| Entry {
        member: member(name, "10.0.0.12"),
        age_ms: 0,
    };
    r.merge(vec![heard("m1"), heard("m2"), heard("w2")], t0);
    let a = vec![heard("m1"), heard("m2")];
    let b = vec![heard("m1"), heard("w2")];
    r.drop_unlisted([a.as_slice(), b.as_slice()]);
    assert_eq!(r.list().len(), 4, "each is still listed somewhere");
    let b = vec![heard("m1")];
    let mut changes = r.subscribe();
    changes.borrow_and_update();
    r.drop_unlisted([a.as_slice(), b.as_slice()]);
    assert_eq!(
        r.list().iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["m1", "m2", "w1"],
        "w2 is in no list any more; this node itself always stays"
    );
    assert!(changes.has_changed().unwrap(), "a change is told");
}

/// A-labels (`xn--...`, the ASCII form OpenShift node names may take) register and are
/// listed like any node name.
#[test]
fn a_label_names_register() {
    let r = Registry::new("c.example", Duration::from_secs(10));
    for name in ["xn--cwl6ngym1", "xn--bcher-kva"] {
        let (st, body) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", name))
            .unwrap();
        assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
    assert_eq!(names, ["xn--bcher-kva", "xn--cwl6ngym1"]);
}

#[test]
fn refuses_bad_input() {
    let r = Registry::new("c.example", Duration::from_secs(10));
    let (st, body) = r
        .handle(
            &Method::POST,
            MEMBERS_PATH,
            peer(),
            reg("other.example", "m0"),
        )
        .unwrap();
    assert_eq!(st, StatusCode::CONFLICT);
    assert!(String::from_utf8_lossy(&body).contains("cluster: expected c.example"));
    let (st, body) = r
        .handle(
            &Method::POST,
            MEMBERS_PATH,
            peer(),
            Bytes::from_static(
                br#"{"cluster":"c.example","member":{"name":"bad name","role":"master",
                    "addresses":["10.0.0.1"],"version":"1"}}"#,
            ),
        )
        .unwrap();
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("node name \"bad name\": expected a DNS label"),
        "{text}"
    );
    let (st, body) = r
        .handle(
            &Method::POST,
            MEMBERS_PATH,
            peer(),
            Bytes::from_static(b"{\"cluster\":1}"),
        )
        .unwrap();
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("registration"));
    let (st, _) = r
        .handle(&Method::PUT, MEMBERS_PATH, peer(), Bytes::new())
        .unwrap();
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        r.handle(&Method::GET, "/keelson/v1/other", peer(), Bytes::new())
            .is_none()
    );
    assert!(r.list().is_empty());
}

#[test]
fn authenticated_registry_drops_forgeries_by_reason() {
    use crate::members::auth::{Keys, Signer};
    let keys = Arc::new(Keys::from_raw(&[vec![7; 32]]));
    let r = Registry::new("c.example", Duration::from_secs(10)).awaiting_keys();
    let body = |auth| {
        Bytes::from(
            serde_json::to_vec(&Registration {
                cluster: "c.example".into(),
                member: member("m0", "10.0.0.1"),
                auth,
            })
            .unwrap(),
        )
    };
    let (st, _) = r
        .handle(&Method::POST, MEMBERS_PATH, peer(), body(None))
        .unwrap();
    assert_eq!(
        st,
        StatusCode::SERVICE_UNAVAILABLE,
        "before the key is loaded"
    );
    assert!(r.headers().is_empty(), "no key yet, no key header");
    r.set_verifier(Arc::new(Verifier::new(Some(keys.clone()))));
    // Every answer names the key this registry's node signs with.
    assert_eq!(
        r.headers(),
        [(
            http::HeaderName::from_static(KEY_HEADER),
            http::HeaderValue::from_str(keys.signing_id()).unwrap()
        )]
    );
    assert!(
        Registry::new("c.example", Duration::from_secs(10))
            .headers()
            .is_empty(),
        "an unauthenticated registry names none"
    );
    let signer = Signer::new(keys, SystemTime::now());
    let m = member("m0", "10.0.0.1");
    let fields = Fields {
        op: Op::Register,
        cluster: "c.example",
        name: "m0",
        role: Some(m.role),
        addresses: &m.addresses,
        version: &m.version,
    };
    let genuine = signer.sign(&fields, SystemTime::now());
    let post = |b: Bytes, from: &str| {
        r.handle(&Method::POST, MEMBERS_PATH, from.parse().unwrap(), b)
            .unwrap()
            .0
    };
    assert_eq!(post(body(None), "10.0.0.1:1"), StatusCode::UNAUTHORIZED);
    let mut forged = genuine.clone();
    forged.mac = "00".repeat(32);
    assert_eq!(
        post(body(Some(forged)), "10.0.0.1:1"),
        StatusCode::UNAUTHORIZED
    );
    // Genuine, but sent from another address.
    assert_eq!(
        post(body(Some(genuine.clone())), "10.0.0.66:1"),
        StatusCode::FORBIDDEN
    );
    assert!(r.list().is_empty());
    assert_eq!(
        post(body(Some(genuine.clone())), "10.0.0.1:1"),
        StatusCode::OK
    );
    // IPv4 arriving on a dual-stack socket counts as itself.
    for _ in 0..crate::members::auth::RECENT {
        let again = signer.sign(&fields, SystemTime::now());
        assert_eq!(
            post(body(Some(again)), "[::ffff:10.0.0.1]:1"),
            StatusCode::OK
        );
    }
    // The first, no longer among the last few accepted: a replay.
    assert_eq!(
        post(body(Some(genuine)), "10.0.0.1:1"),
        StatusCode::UNAUTHORIZED,
        "replay"
    );
    // A goodbye without a proof does not remove it; a signed one from it does.
    let (st, _) = r
        .handle(
            &Method::DELETE,
            &format!("{MEMBERS_PATH}/m0"),
            peer(),
            Bytes::new(),
        )
        .unwrap();
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(r.list().len(), 1);
    let bye = signer.sign(
        &Fields {
            op: Op::Delete,
            cluster: "c.example",
            name: "m0",
            role: None,
            addresses: &[],
            version: "",
        },
        SystemTime::now(),
    );
    let (st, _) = r
        .handle(
            &Method::DELETE,
            &format!("{MEMBERS_PATH}/m0"),
            peer(),
            Bytes::from(serde_json::to_vec(&Goodbye { auth: Some(bye) }).unwrap()),
        )
        .unwrap();
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(r.list().is_empty());
    let auth = r.auth_status().unwrap();
    assert!(auth.authenticated);
    assert_eq!(
        serde_json::to_value(&auth.drops).unwrap(),
        serde_json::json!({"noMac": 2, "badMac": 1, "unknownKey": 0, "stale": 0, "replay": 1, "addressMismatch": 1})
    );
}

#[test]
fn a_duplicate_registration_is_answered_but_renews_nothing() {
    use crate::members::auth::{Keys, Signer};
    let keys = Arc::new(Keys::from_raw(&[vec![7; 32]]));
    let r = Registry::new("c.example", Duration::from_secs(10));
    r.set_verifier(Arc::new(Verifier::new(Some(keys.clone()))));
    let m = member("m0", "10.0.0.1");
    let signer = Signer::new(keys, SystemTime::now());
    let auth = signer.sign(
        &Fields {
            op: Op::Register,
            cluster: "c.example",
            name: "m0",
            role: Some(m.role),
            addresses: &m.addresses,
            version: &m.version,
        },
        SystemTime::now(),
    );
    let body = Bytes::from(
        serde_json::to_vec(&Registration {
            cluster: "c.example".into(),
            member: m,
            auth: Some(auth),
        })
        .unwrap(),
    );
    let post = || {
        r.handle(&Method::POST, MEMBERS_PATH, peer(), body.clone())
            .unwrap()
            .0
    };
    assert_eq!(post(), StatusCode::OK);
    std::thread::sleep(Duration::from_millis(300));
    // Through the API VIP as well as directly: answered again...
    assert_eq!(post(), StatusCode::OK);
    // ...but last heard at the first, so a replay cannot keep a dead node alive.
    let age = r.entries(Instant::now())[0].age_ms;
    assert!(age >= 300, "renewed by a duplicate: age {age} ms");
}

fn reg_at(name: &str, addr: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&Registration {
            cluster: "c.example".into(),
            member: member(name, addr),
            auth: None,
        })
        .unwrap(),
    )
}

fn refused(r: &Registry, reason: &str) -> u64 {
    r.registry_status().refused[reason]
}

/// A flood of new names from one address: two are believed (a node and its
/// replacement), the rest refused and counted, then the address is held to its rate;
/// other addresses and the members already listed are untouched.
#[test]
fn a_member_flood_from_one_address_is_refused_and_counted() {
    let r =
        Registry::new("c.example", Duration::from_secs(35)).with_renewal(Duration::from_secs(10));
    let from: SocketAddr = "10.0.0.66:40000".parse().unwrap();
    let post = |name: &str, addr: &str, peer: SocketAddr| {
        r.handle(&Method::POST, MEMBERS_PATH, peer, reg_at(name, addr))
            .unwrap()
            .0
    };
    assert_eq!(
        post("good", "10.0.0.7", "10.0.0.7:1".parse().unwrap()),
        StatusCode::OK
    );
    let codes: Vec<StatusCode> = (0..100)
        .map(|i| post(&format!("fake-{i}"), "10.0.0.66", from))
        .collect();
    let ok = codes.iter().filter(|c| **c == StatusCode::OK).count();
    assert_eq!(ok, MEMBERS_PER_ADDRESS, "{codes:?}");
    let by_address = codes.iter().filter(|c| **c == StatusCode::CONFLICT).count() as u64;
    let by_rate = codes
        .iter()
        .filter(|c| **c == StatusCode::TOO_MANY_REQUESTS)
        .count() as u64;
    assert_eq!(
        by_address,
        u64::from(super::super::limits::BURST) - MEMBERS_PER_ADDRESS as u64
    );
    assert_eq!(by_address + by_rate, 100 - MEMBERS_PER_ADDRESS as u64);
    assert_eq!(refused(&r, "address"), by_address);
    assert_eq!(refused(&r, "rate"), by_rate);
    assert_eq!(refused(&r, "full"), 0);
    // Those believed renew as any member does; the rate limit refused them at once too
    // (it comes first), so a flooder cannot keep many names alive either.
    let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
    assert_eq!(names, ["fake-0", "fake-1", "good"]);
    // Another address is not held back.
    assert_eq!(
        post("other", "10.0.0.8", "10.0.0.8:1".parse().unwrap()),
        StatusCode::OK
    );
    let st = r.registry_status();
    assert_eq!(st.registrations, 102);
    assert_eq!(st.entries, 4);
    assert_eq!(st.sources, 3);
}

/// Records beyond the bound: a full registry refuses a new member (503, counted),
/// still renews those it holds, and skips (and counts) new entries of another
/// registry's answer.
#[test]
fn records_beyond_the_bound_are_refused_and_counted() {
    let r = Registry::new("c.example", Duration::from_secs(35));
    let now = Instant::now();
    let entries: Vec<Entry> = (0..MAX_MEMBERS + 10)
        .map(|i| Entry {
            member: member(
                &format!("n{i}"),
                &std::net::Ipv4Addr::from(0x0a01_0000 + i as u32).to_string(),
            ),
            age_ms: 0,
        })
        .collect();
    assert_eq!(r.merge(entries, now), MAX_MEMBERS);
    let st = r.registry_status();
    assert_eq!((st.entries, st.merge_skipped), (MAX_MEMBERS as u64, 10));
    let (st, body) = r
        .handle(
            &Method::POST,
            MEMBERS_PATH,
            "10.9.0.1:1".parse().unwrap(),
            reg_at("late", "10.9.0.1"),
        )
        .unwrap();
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("full"));
    assert_eq!(refused(&r, "full"), 1);
    // One it holds renews.
    let (st, _) = r
        .handle(
            &Method::POST,
            MEMBERS_PATH,
            "10.1.0.5:1".parse().unwrap(),
            reg_at("n5", "10.1.0.5"),
        )
        .unwrap();
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r.list().len(), MAX_MEMBERS);
}

/// A reused answer states every entry at least as old as it is when served, and a
/// change (a new member) is in the very next answer.
#[test]
fn a_reused_answer_never_makes_a_member_younger() {
    let r = Registry::new("c.example", Duration::from_secs(35)).with_own(member("m1", "10.0.0.11"));
    let post = |name: &str, addr: &str| {
        let (st, body) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                format!("{addr}:1").parse().unwrap(),
                reg_at(name, addr),
            )
            .unwrap();
        assert_eq!(st, StatusCode::OK);
        let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
        list
    };
    let first = post("a", "10.0.0.1");
    let registered = Instant::now();
    assert_eq!(first.len(), 2);
    std::thread::sleep(Duration::from_millis(60));
    let get = || -> Vec<Entry> {
        let (_, body) = r
            .handle(&Method::GET, MEMBERS_PATH, peer(), Bytes::new())
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    };
    for _ in 0..3 {
        let list = get();
        let a = list.iter().find(|e| e.member.name == "a").unwrap();
        let true_age = registered.elapsed().as_millis() as u64;
        assert!(
            a.age_ms >= true_age.saturating_sub(1),
            "a stated {} ms old, is {true_age}",
            a.age_ms
        );
        let own = list.iter().find(|e| e.member.name == "m1").unwrap();
        assert_eq!(
            own.age_ms, 0,
            "the registry's own node is live when it answers"
        );
        std::thread::sleep(Duration::from_millis(40));
    }
    // A new member is not held back by a reused answer.
    let second = post("b", "10.0.0.2");
    assert_eq!(second.len(), 3);
    assert_eq!(get().len(), 3);
    let st = r.registry_status();
    assert_eq!(st.answers, 6);
    assert!(st.answer_bytes > 0);
}

/// Registers `name` at 10.0.0.<n> naming the list tagged `held`, as a current client.
fn post_holding(r: &Registry, name: &str, held: Option<&http::HeaderValue>) -> ExtraAnswer {
    let mut headers = http::HeaderMap::new();
    if let Some(h) = held {
        headers.insert(http::header::IF_NONE_MATCH, h.clone());
    }
    r.handle_request(
        &Method::POST,
        MEMBERS_PATH,
        peer(),
        &headers,
        reg("c.example", name),
    )
    .unwrap()
}

fn header<'a>(a: &'a ExtraAnswer, name: &str) -> Option<&'a http::HeaderValue> {
    a.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

#[test]
fn a_renewal_naming_the_current_list_is_answered_unchanged() {
    let r = Registry::new("c.example", Duration::from_secs(35))
        .with_own(member("m1", "10.0.0.11"))
        .with_renewal(Duration::from_secs(10));
    let first = post_holding(&r, "m0", None);
    assert_eq!(first.status, StatusCode::OK);
    let tag = header(&first, "etag").expect("a list is tagged").clone();
    let list: Vec<Entry> = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(list.len(), 2);

    let again = post_holding(&r, "m0", Some(&tag));
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty(), "no list with an unchanged answer");
    let fresh: u64 = header(&again, FRESH_HEADER)
        .expect("says how fresh")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(fresh < 1000, "m0 renewed just now, stated {fresh} ms");
    let st = r.registry_status();
    assert_eq!(st.answers, 2);
    assert_eq!(
        st.answer_bytes,
        first.body.len() as u64,
        "the 304 sent no list"
    );

    // A tag that is not the current one (another registry's, or a client's own
    // garbage) gets the list.
    let other = http::HeaderValue::from_static("\"0-0\"");
    assert_eq!(post_holding(&r, "m0", Some(&other)).status, StatusCode::OK);
}

#[test]
fn a_change_of_the_list_makes_the_held_tag_stale() {
    let r = Registry::new("c.example", Duration::from_secs(35));
    let tag = header(&post_holding(&r, "m0", None), "etag")
        .unwrap()
        .clone();
    // A new member: the list changed.
    let joined = post_holding(&r, "m2", Some(&tag));
    assert_eq!(joined.status, StatusCode::OK, "a new member is news");
    let tag2 = header(&joined, "etag").unwrap().clone();
    assert_ne!(tag, tag2);
    let list: Vec<Entry> = serde_json::from_slice(&joined.body).unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        post_holding(&r, "m0", Some(&tag2)).status,
        StatusCode::NOT_MODIFIED
    );
    // A goodbye: the list changed again.
    let (st, _) = r
        .handle(
            &Method::DELETE,
            &format!("{MEMBERS_PATH}/m2"),
            peer(),
            Bytes::new(),
        )
        .unwrap();
    assert_eq!(st, StatusCode::NO_CONTENT);
    let after = post_holding(&r, "m0", Some(&tag2));
    assert_eq!(after.status, StatusCode::OK, "a goodbye is news");
    let list: Vec<Entry> = serde_json::from_slice(&after.body).unwrap();
    assert_eq!(list.len(), 1);
    // An expiry: the list changed.
    let tag3 = header(&after, "etag").unwrap().clone();
    let r2 = Registry::new("c.example", Duration::from_millis(400));
    let t = header(&post_holding(&r2, "m0", None), "etag")
        .unwrap()
        .clone();
    let t0 = Instant::now();
    r2.merge(
        vec![Entry {
            member: member("m3", "10.0.0.3"),
            age_ms: 0,
        }],
        t0,
    );
    let t = header(&r2.conditional_answer(Some(&t), t0), "etag")
        .unwrap()
        .clone();
    let later = t0 + Duration::from_millis(300);
    r2.merge(
        vec![Entry {
            member: member("m0", "10.0.0.1"),
            age_ms: 0,
        }],
        later,
    );
    let expired = r2.conditional_answer(Some(&t), later + Duration::from_millis(200));
    assert_eq!(expired.status, StatusCode::OK, "m3 expired: news");
    let list: Vec<Entry> = serde_json::from_slice(&expired.body).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].member.name, "m0");
    assert_ne!(tag3, t, "tags of two registries differ");
}

#[test]
fn a_member_not_heard_lately_keeps_the_list_coming() {
    let r =
        Registry::new("c.example", Duration::from_secs(35)).with_renewal(Duration::from_secs(10));
    let now = Instant::now();
    // m3 was last heard 16 s ago (past one and a half renewal intervals: it stopped).
    r.merge(
        vec![Entry {
            member: member("m3", "10.0.0.3"),
            age_ms: 16_000,
        }],
        now,
    );
    let tag = header(&post_holding(&r, "m0", None), "etag")
        .unwrap()
        .clone();
    let again = post_holding(&r, "m0", Some(&tag));
    assert_eq!(
        again.status,
        StatusCode::OK,
        "an unchanged answer would state m3 heard more lately than it was"
    );
    let list: Vec<Entry> = serde_json::from_slice(&again.body).unwrap();
    let m3 = list.iter().find(|e| e.member.name == "m3").unwrap();
    assert!(m3.age_ms >= 16_000, "its age as it is: {}", m3.age_ms);
}

#[test]
fn a_restarted_registry_does_not_take_its_former_tag() {
    let a = Registry::new("c.example", Duration::from_secs(35));
    let tag = header(&post_holding(&a, "m0", None), "etag")
        .unwrap()
        .clone();
    // The same list, the same change counter, another process.
    let b = Registry::new("c.example", Duration::from_secs(35));
    let again = post_holding(&b, "m0", Some(&tag));
    assert_eq!(again.status, StatusCode::OK);
    assert_ne!(header(&again, "etag"), Some(&tag));
}

#[test]
fn the_unchanged_window_stays_within_the_expiry() {
    let s = Duration::from_secs;
    assert_eq!(fresh_within(s(10), s(35)), s(15));
    assert_eq!(fresh_within(s(10), s(20)), s(10), "half the expiry at most");
    assert_eq!(
        fresh_within(Duration::from_millis(500), s(4)),
        Duration::from_millis(750)
    );
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::config())]
    #[test]
    fn any_body_is_answered(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let r = Registry::new("c.example", Duration::from_secs(10));
        let (st, _) = r.handle(&Method::POST, MEMBERS_PATH, peer(), Bytes::from(body)).unwrap();
        proptest::prop_assert!(st == StatusCode::OK || st.is_client_error());
    }
}
