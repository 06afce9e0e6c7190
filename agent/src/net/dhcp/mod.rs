//! A DHCPv4 client (RFC 2131) for networks `network_data.json` marks `ipv4_dhcp`, or when
//! there is no network_data at all.
//!
//! [`Client`] is the pure state machine: it takes packets and the time, and returns what to
//! send and what to apply; tested with a fake clock. The I/O edge ([`run`]) uses a UDP socket
//! on port 68 bound to the interface (`SO_BINDTODEVICE`) with the BROADCAST flag set in our
//! requests, so the server broadcasts its answers and no raw packet socket is needed before
//! the interface has an address. Packets are encoded and decoded by `dhcproto`. The edge
//! lives in `run.rs`: it never gives up on a failing netlink call or a vanished interface,
//! it says on the console what failed and tries again.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use ipnet::Ipv4Net;

/// A lease the server granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Our address with its prefix.
    pub address: Ipv4Net,
    /// Default router (option 3).
    pub router: Option<Ipv4Addr>,
    /// Classless static routes (option 121, RFC 3442): destination and next hop, `0.0.0.0`
    /// meaning on-link. Neutron hands the metadata service's route this way.
    pub classless_routes: Vec<(Ipv4Net, Ipv4Addr)>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// Interface MTU.
    pub mtu: Option<u16>,
    /// The server that granted it.
    pub server: Ipv4Addr,
    /// Lease time.
    pub lease: Duration,
    /// Renewal time (T1).
    pub t1: Duration,
    /// Rebinding time (T2).
    pub t2: Duration,
}

/// One route a lease asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRoute {
    /// Destination.
    pub destination: Ipv4Net,
    /// Next hop; `None` on-link.
    pub gateway: Option<Ipv4Addr>,
}

impl Lease {
    /// The routes to install: the classless static routes when the server sent any (RFC 3442
    /// §3: the client then ignores the Router option), else a default route via the router.
    pub fn routes(&self) -> Vec<LeaseRoute> {
        if self.classless_routes.is_empty() {
            return self
                .router
                .map(|gw| LeaseRoute {
                    destination: Ipv4Net::default(),
                    gateway: Some(gw),
                })
                .into_iter()
                .collect();
        }
        self.classless_routes
            .iter()
            .map(|(destination, gw)| LeaseRoute {
                destination: destination.trunc(),
                gateway: (!gw.is_unspecified()).then_some(*gw),
            })
            .collect()
    }
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// 255.255.255.255:67.
    Broadcast,
    /// The server, unicast.
    Server(Ipv4Addr),
}

/// What the state machine asks the I/O edge to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a packet.
    Send(Box<Message>, Destination),
    /// Configure this lease (new or renewed).
    Apply(Lease),
    /// The lease expired: remove the address.
    Expire(Lease),
}

/// Client states (RFC 2131 §4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Sending DISCOVER.
    Selecting,
    /// Sent REQUEST for an offer.
    Requesting {
        /// The offered address.
        offered: Ipv4Addr,
        /// The offering server.
        server: Ipv4Addr,
    },
    /// Holding a lease.
    Bound,
    /// T1 passed: asking the server (unicast).
    Renewing,
    /// T2 passed: asking anyone (broadcast).
    Rebinding,
}

/// The DHCPv4 client state machine. Times are durations since an arbitrary start.
#[derive(Debug, Clone)]
pub struct Client {
    mac: [u8; 6],
    hostname: Option<String>,
    xid: u32,
    state: State,
    lease: Option<Lease>,
    bound_at: Duration,
    next_timer: Duration,
    retries: u32,
    /// Retransmission delays (RFC 2131 §4.1: 4 s doubling to 64 s, randomised), the agent's
    /// one retry policy.
    backoff: crate::retry::Backoff,
    /// Jitter samples, seeded from `xid` so the machine stays deterministic under test.
    rng: rand::rngs::SmallRng,
    /// Overrides the server's T1 (tests shorten renewal this way).
    pub t1_override: Option<Duration>,
}

const RETRY: Duration = Duration::from_secs(4);

impl Client {
    /// A client for the NIC with `mac`; `xid` seeds transaction ids.
    pub fn new(mac: [u8; 6], hostname: Option<String>, xid: u32) -> Self {
        Client {
            mac,
            hostname,
            xid,
            state: State::Selecting,
            lease: None,
            bound_at: Duration::ZERO,
            next_timer: Duration::ZERO,
            retries: 0,
            backoff: retransmit_backoff(),
            rng: rand::SeedableRng::seed_from_u64(u64::from(xid)),
            t1_override: None,
        }
    }

    /// The current state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The current lease.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// When [`Client::on_timer`] wants to be called next.
    pub fn next_timer(&self) -> Duration {
        self.next_timer
    }

    fn message(&self, kind: MessageType, ciaddr: Ipv4Addr) -> Message {
        let mut msg = Message::new_with_id(
            self.xid,
            ciaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &self.mac,
        );
        msg.set_opcode(Opcode::BootRequest);
        if ciaddr.is_unspecified() {
            msg.set_flags(Flags::default().set_broadcast());
        }
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        let mut client_id = vec![1u8];
        client_id.extend_from_slice(&self.mac);
        opts.insert(DhcpOption::ClientIdentifier(client_id));
        opts.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::ClasslessStaticRoute,
            OptionCode::DomainNameServer,
            OptionCode::InterfaceMtu,
            OptionCode::AddressLeaseTime,
            OptionCode::Renewal,
            OptionCode::Rebinding,
        ]));
        if let Some(name) = &self.hostname {
            opts.insert(DhcpOption::Hostname(name.clone()));
        }
        msg
    }

    fn discover(&mut self, now: Duration) -> Vec<Action> {
        self.xid = self.xid.wrapping_add(1);
        self.state = State::Selecting;
        self.next_timer = now + self.retransmit_delay();
        self.retries += 1;
        vec![Action::Send(
            Box::new(self.message(MessageType::Discover, Ipv4Addr::UNSPECIFIED)),
            Destination::Broadcast,
        )]
    }

    /// Starts (or restarts) acquisition.
    pub fn start(&mut self, now: Duration) -> Vec<Action> {
        self.retries = 0;
        self.backoff.reset();
        self.discover(now)
    }

    fn retransmit_delay(&mut self) -> Duration {
        let sample = rand::Rng::random::<f64>(&mut self.rng);
        self.backoff.next_delay_with(sample)
    }

    /// Timer expiry: retransmit, renew, rebind or expire.
    pub fn on_timer(&mut self, now: Duration) -> Vec<Action> {
        if now < self.next_timer {
            return vec![];
        }
        match self.state.clone() {
            State::Selecting => self.discover(now),
            State::Requesting { offered, server } => {
                if self.retries > 4 {
                    return self.start(now);
                }
                self.retries += 1;
                self.next_timer = now + self.retransmit_delay();
                vec![Action::Send(
                    Box::new(self.request(offered, server)),
                    Destination::Broadcast,
                )]
            }
            State::Bound | State::Renewing | State::Rebinding => {
                let Some(lease) = self.lease.clone() else {
                    return self.start(now);
                };
                let since = now.saturating_sub(self.bound_at);
                if since >= lease.lease {
                    self.lease = None;
                    let mut actions = vec![Action::Expire(lease)];
                    actions.extend(self.start(now));
                    return actions;
                }
                let t1 = self.t1_override.unwrap_or(lease.t1);
                let (state, dest) = if since >= lease.t2 {
                    (State::Rebinding, Destination::Broadcast)
                } else if since >= t1 {
                    (State::Renewing, Destination::Server(lease.server))
                } else {
                    self.next_timer = self.bound_at + t1;
                    return vec![];
                };
                self.state = state;
                self.xid = self.xid.wrapping_add(1);
                // RFC 2131 §4.4.5: retransmit at half the remaining time, at least 60 s
                // (shortened here to RETRY so short test leases still renew promptly).
                let until = if self.state == State::Renewing {
                    lease.t2
                } else {
                    lease.lease
                };
                let remaining = until.saturating_sub(since);
                self.next_timer = now
                    + (remaining / 2)
                        .max(RETRY)
                        .min(remaining.max(Duration::from_millis(100)));
                let msg = self.message(MessageType::Request, lease.address.addr());
                vec![Action::Send(Box::new(msg), dest)]
            }
        }
    }

    fn request(&self, offered: Ipv4Addr, server: Ipv4Addr) -> Message {
        let mut msg = self.message(MessageType::Request, Ipv4Addr::UNSPECIFIED);
        msg.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(offered));
        msg.opts_mut().insert(DhcpOption::ServerIdentifier(server));
        msg
    }

    /// A packet from a server.
    pub fn on_packet(&mut self, msg: &Message, now: Duration) -> Vec<Action> {
        if msg.opcode() != Opcode::BootReply
            || msg.xid() != self.xid
            // `chaddr()` slices a 16-byte array by `hlen`: check it first (see `decode`).
            || usize::from(msg.hlen()) > CHADDR_LEN
            || msg.chaddr().get(..6) != Some(&self.mac[..])
        {
            return vec![];
        }
        let server = match msg.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => *s,
            _ => msg.siaddr(),
        };
        match (msg.opts().msg_type(), self.state.clone()) {
            (Some(MessageType::Offer), State::Selecting) => {
                let offered = msg.yiaddr();
                if offered.is_unspecified() {
                    return vec![];
                }
                self.state = State::Requesting { offered, server };
                self.retries = 0;
                self.backoff.reset();
                self.next_timer = now + RETRY;
                vec![Action::Send(
                    Box::new(self.request(offered, server)),
                    Destination::Broadcast,
                )]
            }
            (
                Some(MessageType::Ack),
                State::Requesting { .. } | State::Renewing | State::Rebinding,
            ) => {
                let Some(lease) = lease_from(msg, server) else {
                    return vec![];
                };
                self.state = State::Bound;
                self.bound_at = now;
                self.retries = 0;
                self.backoff.reset();
                self.next_timer = now + self.t1_override.unwrap_or(lease.t1);
                self.lease = Some(lease.clone());
                vec![Action::Apply(lease)]
            }
            (Some(MessageType::Nak), _) => {
                let mut actions = Vec::new();
                if let Some(lease) = self.lease.take() {
                    actions.push(Action::Expire(lease));
                }
                actions.extend(self.start(now));
                actions
            }
            _ => vec![],
        }
    }

    /// The RELEASE to send on shutdown, if we hold a lease.
    pub fn release(&mut self) -> Option<(Message, Destination)> {
        let lease = self.lease.take()?;
        self.xid = self.xid.wrapping_add(1);
        let mut msg = self.message(MessageType::Release, lease.address.addr());
        msg.set_flags(Flags::default());
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(lease.server));
        Some((msg, Destination::Server(lease.server)))
    }
}

/// RFC 2131 §4.1: 4 s doubling to 64 s, each "randomized by ... -1 to +1" second at the
/// start; a quarter either way keeps that spread at 4 s and grows with the delay.
fn retransmit_backoff() -> crate::retry::Backoff {
    crate::retry::Backoff::new(RETRY, RETRY * 16).with_jitter(0.25)
}

fn lease_from(msg: &Message, server: Ipv4Addr) -> Option<Lease> {
    let opts = msg.opts();
    let mask = match opts.get(OptionCode::SubnetMask) {
        Some(DhcpOption::SubnetMask(m)) => u32::from(*m).leading_ones() as u8,
        _ => 24,
    };
    let lease = match opts.get(OptionCode::AddressLeaseTime) {
        Some(DhcpOption::AddressLeaseTime(s)) => Duration::from_secs(u64::from(*s)),
        _ => Duration::from_secs(3600),
    };
    let t1 = match opts.get(OptionCode::Renewal) {
        Some(DhcpOption::Renewal(s)) => Duration::from_secs(u64::from(*s)),
        _ => lease / 2,
    };
    let t2 = match opts.get(OptionCode::Rebinding) {
        Some(DhcpOption::Rebinding(s)) => Duration::from_secs(u64::from(*s)),
        _ => lease * 7 / 8,
    };
    Some(Lease {
        address: Ipv4Net::new(msg.yiaddr(), mask).ok()?,
        router: match opts.get(OptionCode::Router) {
            Some(DhcpOption::Router(r)) => r.first().copied(),
            _ => None,
        },
        classless_routes: match opts.get(OptionCode::ClasslessStaticRoute) {
            Some(DhcpOption::ClasslessStaticRoute(routes)) => routes.clone(),
            _ => vec![],
        },
        dns: match opts.get(OptionCode::DomainNameServer) {
            Some(DhcpOption::DomainNameServer(d)) => d.clone(),
            _ => vec![],
        },
        // RFC 2132 §5.1: at least 68; anything smaller is ignored rather than applied.
        mtu: match opts.get(OptionCode::InterfaceMtu) {
            Some(DhcpOption::InterfaceMtu(m)) if *m >= 68 => Some(*m),
            _ => None,
        },
        server,
        lease,
        t1,
        t2,
    })
}

/// Encodes a message.
pub fn encode(msg: &Message) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    msg.encode(&mut Encoder::new(&mut buf)).ok()?;
    Some(buf)
}

/// Decodes a message; `None` for anything malformed (dropped).
///
/// Two guards around dhcproto 0.15, both found by the `dhcp_reply` fuzz target:
/// - it panics, in builds with debug assertions, on a few options whose length is wrong
///   (see [`has_option_dhcproto_panics_on`]): those packets are dropped before it sees them;
/// - its `Message::chaddr()` slices the 16-byte `chaddr` field by the packet's `hlen`, so a
///   reply claiming `hlen` over 16 would panic whoever looks at the hardware address (in
///   every build): such a packet is malformed (RFC 2131 gives chaddr 16 bytes) and dropped.
///
/// The `catch_unwind` stays as a last line: a hostile packet must never take the client
/// task down, whatever the build.
pub fn decode(bytes: &[u8]) -> Option<Message> {
    if has_option_dhcproto_panics_on(bytes) {
        return None;
    }
    let msg = std::panic::catch_unwind(|| Message::decode(&mut Decoder::new(bytes)).ok())
        .ok()
        .flatten()?;
    (usize::from(msg.hlen()) <= CHADDR_LEN).then_some(msg)
}

/// Size of the `chaddr` field.
const CHADDR_LEN: usize = 16;

/// Where the options start: after the fixed BOOTP header (236 bytes) and the magic cookie.
const OPTIONS_AT: usize = 240;

/// Whether dhcproto 0.15 would panic on this option length (a `debug_assert!` on it, or a
/// `len - n` that overflows) rather than return an error: Rapid Commit (80) must be empty,
/// Client FQDN (81) at least 3 bytes, Client Network Interface (94) exactly 3 and the Bulk
/// Leasequery times (152-155) exactly 4. (Its status code, 151, reads a byte before
/// subtracting, so an empty one is an error, not a panic.)
fn dhcproto_panics_on(code: u8, len: usize) -> bool {
    match code {
        80 => len != 0,
        81 => len < 3,
        94 => len != 3,
        152..=155 => len != 4,
        _ => false,
    }
}

/// Whether some option of `bytes` is one [`dhcproto_panics_on`]. Walks the options as
/// dhcproto's decoder does: consecutive instances of one code are joined (RFC 3396) and
/// decoded as one at the next other code, Pad, End or the end of the packet; a truncated
/// option ends the walk (dhcproto stops there with an error). Conservative: it also looks
/// past an option dhcproto would have failed on.
fn has_option_dhcproto_panics_on(bytes: &[u8]) -> bool {
    let mut rest = bytes.get(OPTIONS_AT..).unwrap_or_default();
    // The option being gathered: (code, joined length).
    let mut current: Option<(u8, usize)> = None;
    while let Some(&code) = rest.first() {
        if code == 0 || code == 255 {
            if current
                .take()
                .is_some_and(|(c, len)| dhcproto_panics_on(c, len))
            {
                return true;
            }
            if code == 255 {
                return false;
            }
            rest = &rest[1..];
            continue;
        }
        // A different code: the gathered option is decoded before the next one is read.
        if let Some((c, len)) = current
            && c != code
        {
            if dhcproto_panics_on(c, len) {
                return true;
            }
            current = None;
        }
        let Some(len) = rest.get(1).map(|&l| usize::from(l)) else {
            return false;
        };
        if rest.len() < 2 + len {
            return false;
        }
        current = Some(match current {
            Some((c, joined)) => (c, joined + len),
            None => (code, len),
        });
        rest = &rest[2 + len..];
    }
    current.is_some_and(|(c, len)| dhcproto_panics_on(c, len))
}

mod run;
pub use run::{DhcpClient, DhcpOptions, run};

#[cfg(test)]
mod tests;
