use super::*;

const MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);

fn sent(actions: &[Action]) -> (&Message, Destination) {
    match actions.iter().find_map(|a| match a {
        Action::Send(m, d) => Some((&**m, *d)),
        _ => None,
    }) {
        Some(x) => x,
        None => panic!("nothing sent: {actions:?}"),
    }
}

fn reply(to: &Message, kind: MessageType, yiaddr: Ipv4Addr, lease_secs: u32) -> Message {
    let mut msg = Message::new_with_id(
        to.xid(),
        Ipv4Addr::UNSPECIFIED,
        yiaddr,
        SERVER,
        Ipv4Addr::UNSPECIFIED,
        &MAC,
    );
    msg.set_opcode(Opcode::BootReply);
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(SERVER));
    opts.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
    opts.insert(DhcpOption::Router(vec![SERVER]));
    opts.insert(DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
        10, 1, 0, 53,
    )]));
    opts.insert(DhcpOption::AddressLeaseTime(lease_secs));
    // Round-trip through the wire format, as the I/O edge does.
    decode(&encode(&msg).unwrap()).unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn discover_offer_request_ack_renew_rebind_expire() {
    let mut c = Client::new(MAC, Some("worker-0".into()), 7);
    let actions = c.start(secs(0));
    let (discover, dest) = sent(&actions);
    assert_eq!(dest, Destination::Broadcast);
    assert_eq!(discover.opts().msg_type(), Some(MessageType::Discover));
    assert!(
        discover.flags().broadcast(),
        "ask for broadcast replies: no address yet"
    );

    // A reply for someone else's transaction is ignored.
    let mut stray = reply(
        discover,
        MessageType::Offer,
        Ipv4Addr::new(10, 1, 0, 9),
        120,
    );
    stray.set_xid(discover.xid() ^ 1);
    assert!(c.on_packet(&stray, secs(1)).is_empty());

    let offer = reply(
        discover,
        MessageType::Offer,
        Ipv4Addr::new(10, 1, 0, 50),
        120,
    );
    let actions = c.on_packet(&offer, secs(1));
    let (request, _) = sent(&actions);
    assert_eq!(request.opts().msg_type(), Some(MessageType::Request));
    assert!(matches!(
        request.opts().get(OptionCode::RequestedIpAddress),
        Some(DhcpOption::RequestedIpAddress(a)) if *a == Ipv4Addr::new(10, 1, 0, 50)
    ));

    let ack = reply(request, MessageType::Ack, Ipv4Addr::new(10, 1, 0, 50), 120);
    let actions = c.on_packet(&ack, secs(2));
    let Action::Apply(lease) = &actions[0] else {
        panic!("{actions:?}")
    };
    assert_eq!(lease.address.to_string(), "10.1.0.50/24");
    assert_eq!(lease.router, Some(SERVER));
    assert_eq!((lease.t1, lease.t2), (secs(60), secs(105)));
    assert_eq!(c.state(), &State::Bound);
    assert_eq!(c.next_timer(), secs(62));

    // Nothing before T1.
    assert!(c.on_timer(secs(30)).is_empty());
    // T1: unicast renew from our address.
    let actions = c.on_timer(secs(62));
    let (renew, dest) = sent(&actions);
    assert_eq!(dest, Destination::Server(SERVER));
    assert_eq!(renew.ciaddr(), Ipv4Addr::new(10, 1, 0, 50));
    assert_eq!(c.state(), &State::Renewing);
    // No answer until T2: broadcast rebind.
    let actions = c.on_timer(secs(107));
    let (_, dest) = sent(&actions);
    assert_eq!(
        (dest, c.state()),
        (Destination::Broadcast, &State::Rebinding)
    );
    // No answer until the lease ends: expire and start over.
    let actions = c.on_timer(secs(122));
    assert!(matches!(actions[0], Action::Expire(_)), "{actions:?}");
    assert_eq!(c.state(), &State::Selecting);
    assert!(c.lease().is_none());
}

#[test]
fn renew_ack_extends_and_release_is_unicast() {
    let mut c = Client::new(MAC, None, 1);
    let d = c.start(secs(0));
    let offer = reply(
        sent(&d).0,
        MessageType::Offer,
        Ipv4Addr::new(10, 1, 0, 51),
        100,
    );
    let r = c.on_packet(&offer, secs(0));
    let ack = reply(
        sent(&r).0,
        MessageType::Ack,
        Ipv4Addr::new(10, 1, 0, 51),
        100,
    );
    c.on_packet(&ack, secs(0));
    let renew = c.on_timer(secs(50));
    let ack = reply(
        sent(&renew).0,
        MessageType::Ack,
        Ipv4Addr::new(10, 1, 0, 51),
        100,
    );
    let actions = c.on_packet(&ack, secs(51));
    assert!(matches!(actions[0], Action::Apply(_)));
    assert_eq!(c.state(), &State::Bound);
    assert_eq!(c.next_timer(), secs(101), "T1 counts from the renewal");
    let (release, dest) = c.release().unwrap();
    assert_eq!(release.opts().msg_type(), Some(MessageType::Release));
    assert_eq!(dest, Destination::Server(SERVER));
    assert!(c.release().is_none(), "released once");
}

#[test]
fn nak_restarts_and_retransmits_back_off() {
    let mut c = Client::new(MAC, None, 1);
    let d = c.start(secs(0));
    // RFC 2131 §4.1: 4 s, randomised by about a second either way, then doubling.
    let first = c.next_timer();
    assert!(first >= secs(3) && first <= secs(5), "{first:?}");
    assert!(c.on_timer(first - Duration::from_millis(1)).is_empty());
    let again = c.on_timer(first);
    assert_eq!(
        sent(&again).0.opts().msg_type(),
        Some(MessageType::Discover)
    );
    let second = c.next_timer() - first;
    assert!(
        second >= secs(6) && second <= secs(10),
        "4 s then 8 s: {second:?}"
    );
    let offer = reply(
        sent(&again).0,
        MessageType::Offer,
        Ipv4Addr::new(10, 1, 0, 52),
        100,
    );
    let r = c.on_packet(&offer, first + secs(1));
    let nak = reply(sent(&r).0, MessageType::Nak, Ipv4Addr::UNSPECIFIED, 0);
    let actions = c.on_packet(&nak, first + secs(2));
    assert_eq!(
        sent(&actions).0.opts().msg_type(),
        Some(MessageType::Discover)
    );
    let _ = d;
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::config())]
    #[test]
    fn random_packets_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
        let mut c = Client::new(MAC, None, 1);
        c.start(secs(0));
        if let Some(msg) = decode(&bytes) {
            c.on_packet(&msg, secs(1));
        }
    }
}

#[test]
fn classless_routes_replace_the_router_and_mtu_is_checked() {
    let mut c = Client::new(MAC, None, 3);
    let discover = sent(&c.start(secs(0))).0.clone();
    let wanted = match discover.opts().get(OptionCode::ParameterRequestList) {
        Some(DhcpOption::ParameterRequestList(list)) => list.clone(),
        other => panic!("{other:?}"),
    };
    assert!(wanted.contains(&OptionCode::ClasslessStaticRoute));
    assert!(wanted.contains(&OptionCode::InterfaceMtu));

    let mut ack = reply(
        &discover,
        MessageType::Ack,
        Ipv4Addr::new(10, 1, 0, 50),
        120,
    );
    // What Neutron's dnsmasq sends on a network without a router: the metadata service by
    // way of the DHCP port, plus an on-link route.
    ack.opts_mut().insert(DhcpOption::ClasslessStaticRoute(vec![
        (
            "169.254.169.254/32".parse().unwrap(),
            Ipv4Addr::new(10, 1, 0, 2),
        ),
        ("10.9.0.0/16".parse().unwrap(), Ipv4Addr::UNSPECIFIED),
    ]));
    ack.opts_mut().insert(DhcpOption::InterfaceMtu(1450));
    let lease = lease_from(&decode(&encode(&ack).unwrap()).unwrap(), SERVER).unwrap();
    assert_eq!(lease.mtu, Some(1450));
    assert_eq!(
        lease.routes(),
        [
            LeaseRoute {
                destination: "169.254.169.254/32".parse().unwrap(),
                gateway: Some(Ipv4Addr::new(10, 1, 0, 2)),
            },
            LeaseRoute {
                destination: "10.9.0.0/16".parse().unwrap(),
                gateway: None,
            },
        ],
        "RFC 3442: with option 121 the Router option is ignored"
    );

    let plain = reply(
        &discover,
        MessageType::Ack,
        Ipv4Addr::new(10, 1, 0, 50),
        120,
    );
    let lease = lease_from(&plain, SERVER).unwrap();
    assert_eq!(
        lease.routes(),
        [LeaseRoute {
            destination: "0.0.0.0/0".parse().unwrap(),
            gateway: Some(SERVER),
        }]
    );
    let mut tiny = plain.clone();
    tiny.opts_mut().insert(DhcpOption::InterfaceMtu(40));
    assert_eq!(
        lease_from(&tiny, SERVER).unwrap().mtu,
        None,
        "an MTU under 68 is ignored"
    );
}

/// A BOOTREPLY with `options` (code, value) after the magic cookie, then End.
fn packet_with(options: &[(u8, &[u8])]) -> Vec<u8> {
    let mut ack = reply(
        &Client::new(MAC, None, 0)
            .start(secs(0))
            .iter()
            .find_map(|a| match a {
                Action::Send(m, _) => Some((**m).clone()),
                _ => None,
            })
            .unwrap(),
        MessageType::Ack,
        Ipv4Addr::new(10, 1, 0, 9),
        120,
    );
    ack.opts_mut().clear();
    let mut bytes = encode(&ack).unwrap();
    bytes.truncate(OPTIONS_AT);
    for (code, value) in options {
        bytes.push(*code);
        bytes.push(value.len() as u8);
        bytes.extend_from_slice(value);
    }
    bytes.push(255);
    bytes
}

/// Whether dhcproto itself panics decoding `bytes` (debug builds only: release builds
/// compile its assertions out).
fn dhcproto_panics(bytes: &[u8]) -> bool {
    panicked_during(|| Message::decode(&mut Decoder::new(bytes)).ok())
}

/// Whether `f` panicked on this thread, even if something inside caught the panic (as
/// `decode`'s `catch_unwind` does): a caught panic still prints on PID 1's console and
/// aborts a fuzzer. A hook chained before the existing one records it per thread.
fn panicked_during<T>(f: impl FnOnce() -> T) -> bool {
    use std::cell::Cell;
    thread_local!(static PANICKED: Cell<bool> = const { Cell::new(false) });
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.with(|p| p.set(true));
            previous(info)
        }));
    });
    PANICKED.with(|p| p.set(false));
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    PANICKED.with(|p| p.get())
}

/// Found by the `dhcp_reply` fuzz target: a reply carrying an empty Client FQDN option
/// (81) after a run of Pad bytes made dhcproto 0.15 panic (`assertion failed: len >= 3`).
#[test]
fn fuzz_crash_empty_fqdn_option_is_dropped() {
    let packet = include_bytes!("testdata/fuzz-fqdn-empty.bin");
    if cfg!(debug_assertions) {
        assert!(dhcproto_panics(packet), "the input still crashes dhcproto");
    }
    assert!(has_option_dhcproto_panics_on(packet));
    assert!(
        !panicked_during(|| decode(packet)),
        "dropped before dhcproto sees it"
    );
    assert_eq!(decode(packet), None);
}

#[test]
fn options_dhcproto_panics_on_are_dropped_before_decoding() {
    let cases: [(u8, &[u8], &[u8]); 7] = [
        (80, b"x", b""),
        (81, b"\x01\x00", b"\x01\x00\x00\x00"),
        (94, b"\x01\x02", b"\x01\x02\x03"),
        (152, b"\x00\x00\x00", b"\x00\x00\x00\x01"),
        (153, b"\x00\x00\x00\x00\x00", b"\x00\x00\x00\x01"),
        (154, b"", b"\x00\x00\x00\x01"),
        (155, b"\x00", b"\x00\x00\x00\x01"),
    ];
    for (code, bad, good) in cases {
        let packet = packet_with(&[(53, &[5]), (code, bad)]);
        if cfg!(debug_assertions) {
            assert!(dhcproto_panics(&packet), "option {code} len {}", bad.len());
        }
        assert!(has_option_dhcproto_panics_on(&packet), "option {code}");
        assert!(!panicked_during(|| decode(&packet)), "option {code}");
        assert_eq!(decode(&packet), None, "option {code}");
        let packet = packet_with(&[(53, &[5]), (code, good)]);
        assert!(!has_option_dhcproto_panics_on(&packet), "option {code}");
        assert!(
            decode(&packet).is_some(),
            "option {code} len {}",
            good.len()
        );
    }
    // RFC 3396: consecutive instances are joined before decoding, so two 2-byte FQDN
    // parts are one 4-byte option (fine), and Pad between them splits them (two bad ones).
    let joined = packet_with(&[(81, b"\x01\x00"), (81, b"\x00\x00")]);
    assert!(!has_option_dhcproto_panics_on(&joined));
    assert!(!dhcproto_panics(&joined));
    let mut split = packet_with(&[(81, b"\x01\x00")]);
    split.pop();
    split.extend_from_slice(&[0, 81, 2, 0, 0, 255]);
    assert!(has_option_dhcproto_panics_on(&split));
    // An empty Bulk Leasequery status code is an error for dhcproto, not a panic.
    let status = packet_with(&[(151, b"")]);
    assert!(!dhcproto_panics(&status));
    assert!(!has_option_dhcproto_panics_on(&status));
    // A truncated option ends dhcproto's walk: nothing after it is decoded.
    let mut truncated = packet_with(&[(53, &[5])]);
    truncated.pop();
    truncated.extend_from_slice(&[12, 40, b'x']);
    assert!(!has_option_dhcproto_panics_on(&truncated));
}

/// Found by the `dhcp_reply` fuzz target: a packet with `hlen` 255. dhcproto decodes it,
/// and its `chaddr()` then panics slicing the 16-byte field to 255 (in release builds too).
#[test]
fn fuzz_crash_hlen_over_16_is_dropped() {
    let packet = include_bytes!("testdata/fuzz-hlen-255.bin");
    assert_eq!(packet[2], 255, "hlen");
    let raw = Message::decode(&mut Decoder::new(packet)).expect("dhcproto decodes it");
    assert!(panicked_during(|| raw.chaddr().len()));
    assert_eq!(decode(packet), None);

    // A reply to our transaction with a bad hlen, as dhcproto hands it over, is ignored
    // rather than panicking the client.
    let mut c = Client::new(MAC, None, 6);
    let actions = c.start(secs(0));
    let mut bytes = encode(&reply(
        sent(&actions).0,
        MessageType::Offer,
        Ipv4Addr::new(10, 1, 0, 9),
        60,
    ))
    .unwrap();
    bytes[2] = 17;
    assert_eq!(decode(&bytes), None);
    let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
    assert!(!panicked_during(|| assert!(
        c.on_packet(&msg, secs(1)).is_empty()
    )));
    assert_eq!(c.state(), &State::Selecting);
    bytes[2] = 16;
    assert!(decode(&bytes).is_some(), "16 is the field's size: fine");
}
