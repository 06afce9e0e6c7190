//! DHCP replies as the client receives them on port 68: `net::dhcp::decode` (the I/O edge's
//! decoder), then the `Client` state machine. One input is a sequence of packets
//! (length-prefixed); the client takes its MAC and transaction id from the first one so the
//! packets reach the state machine instead of being ignored as someone else's, and timers
//! fire between packets. Checks: every message the client sends encodes and decodes back
//! to itself (parse -> encode -> parse); a lease it applies has a valid prefix, no MTU
//! under 68 and valid routes; the state machine never asks for a timer in the past.
#![no_main]

use std::time::Duration;

use dhcproto::v4::Message;
use keelson_agent::net::dhcp::{Action, Client, decode, encode};
use libfuzzer_sys::fuzz_target;

fn check_sent(actions: &[Action]) {
    for action in actions {
        match action {
            Action::Send(msg, _) => {
                let bytes = encode(msg).expect("what we send encodes");
                let back: Message = decode(&bytes).expect("what we send decodes");
                assert_eq!(&back, &**msg, "sent message round trip");
            }
            Action::Apply(lease) | Action::Expire(lease) => {
                assert!(lease.address.prefix_len() <= 32);
                assert!(lease.mtu.is_none_or(|m| m >= 68), "MTU {:?}", lease.mtu);
                for route in lease.routes() {
                    assert!(route.destination.prefix_len() <= 32);
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let packets = keelson_agent_fuzz::frames(data);
    let decoded: Vec<Message> = packets.iter().filter_map(|p| decode(p)).collect();
    let Some(first) = decoded.first() else {
        return;
    };
    let mut mac = [0u8; 6];
    if let Some(m) = first.chaddr().get(..6) {
        mac.copy_from_slice(m);
    }
    // start() uses xid + 1 for its DISCOVER.
    let mut client = Client::new(mac, Some("worker-0".into()), first.xid().wrapping_sub(1));
    let mut now = Duration::ZERO;
    check_sent(&client.start(now));
    for msg in &decoded {
        let actions = client.on_packet(msg, now);
        check_sent(&actions);
        assert!(client.next_timer() >= now, "timer in the past");
        // Let the next timer fire (bounded, so a huge lease time does not overflow `now`).
        now = client.next_timer().min(now + Duration::from_secs(1 << 33));
        check_sent(&client.on_timer(now));
    }
    if let Some((release, _)) = client.release() {
        check_sent(&[Action::Send(
            Box::new(release),
            keelson_agent::net::dhcp::Destination::Broadcast,
        )]);
    }
});
