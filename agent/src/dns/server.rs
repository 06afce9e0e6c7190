//! The sockets: one UDP loop and one TCP accept loop per listen address.
//!
//! Authoritative answers are computed inline in the receive loop, a batch of datagrams at a
//! time (`udp`: no task and no system call per query; that is what keeps one thread fast);
//! forwarded queries get a task each, so a slow upstream never holds up the zone.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::os::fd::AsRawFd;

use hickory_proto::op::{Message, ResponseCode};
use nix::sys::socket::SockaddrStorage;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::forward::Forwarder;
use super::handler::{self, DropReason, Outcome, Request, Transport};
use super::udp;
use super::zone::Zone;

/// How long a TCP client may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once; more are closed at accept.
const MAX_TCP_CONNECTIONS: usize = 256;
/// UDP queries being forwarded at once; more get SERVFAIL at once, so a flood of
/// uncached names towards a dead upstream cannot pile up tasks and sockets.
const MAX_FORWARDS: usize = 1024;

/// Question types counted one by one; everything else is `other` (bounded labels).
pub const QTYPES: [(u16, &str); 12] = [
    (1, "A"),
    (2, "NS"),
    (5, "CNAME"),
    (6, "SOA"),
    (12, "PTR"),
    (15, "MX"),
    (16, "TXT"),
    (28, "AAAA"),
    (33, "SRV"),
    (65, "HTTPS"),
    (64, "SVCB"),
    (255, "ANY"),
];

/// Response codes counted one by one; everything else is `other`.
pub const RCODES: [(u16, &str); 7] = [
    (0, "NOERROR"),
    (1, "FORMERR"),
    (2, "SERVFAIL"),
    (3, "NXDOMAIN"),
    (4, "NOTIMP"),
    (5, "REFUSED"),
    (16, "BADVERS"),
];

/// The question type of a query packet, read straight from the bytes (no decoding: this
/// runs for every packet), or `None` when it has not exactly one question or the name does
/// not end inside the packet.
pub fn question_type(packet: &[u8]) -> Option<u16> {
    if packet.len() < 12 || u16::from_be_bytes([packet[4], packet[5]]) != 1 {
        return None;
    }
    let mut i = 12;
    loop {
        let len = usize::from(*packet.get(i)?);
        match len {
            0 => break,
            // A compression pointer ends the name (two bytes).
            l if l & 0xc0 == 0xc0 => {
                i += 1;
                break;
            }
            l if l & 0xc0 != 0 => return None,
            l => i += 1 + l,
        }
    }
    let t = packet.get(i + 1..i + 3)?;
    Some(u16::from_be_bytes([t[0], t[1]]))
}

/// Index of `code` in `table`, or the `other` slot after the table's last.
fn slot(table: &[(u16, &str)], code: u16) -> usize {
    table
        .iter()
        .position(|(c, _)| *c == code)
        .unwrap_or(table.len())
}

/// Counters, published in the status snapshot.
#[derive(Debug, Default)]
pub struct Stats {
    /// Queries by question type ([`QTYPES`] then `other`).
    pub qtypes: [AtomicU64; QTYPES.len() + 1],
    /// Responses by code ([`RCODES`] then `other`).
    pub rcodes: [AtomicU64; RCODES.len() + 1],
    /// Forwarded queries that no upstream answered (SERVFAIL sent).
    pub forward_failures: AtomicU64,
    /// Upstream round trips of forwarded queries.
    pub forward_latency: crate::status::histogram::Histogram,
    /// Requests received (UDP datagrams and TCP messages).
    pub received: AtomicU64,
    /// Answered from the zone.
    pub authoritative: AtomicU64,
    /// Sent upstream or answered from the cache.
    pub forwarded: AtomicU64,
    /// Answered from the forward cache.
    pub cache_hits: AtomicU64,
    /// Dropped: shorter than a header.
    pub dropped_short: AtomicU64,
    /// Dropped: a response, not a query.
    pub dropped_response: AtomicU64,
    /// FORMERR sent (undecodable, zero or several questions).
    pub formerr: AtomicU64,
    /// SERVFAIL sent (no upstream answered, or too many forwards in flight).
    pub servfail: AtomicU64,
    /// TCP connections refused (too many at once).
    pub tcp_refused: AtomicU64,
    /// Responses truncated (TC) over UDP.
    pub truncated: AtomicU64,
}

impl Stats {
    /// The counters as the typed status section (the caller fills in zone, nodes, listen
    /// and upstreams).
    pub fn status(&self) -> crate::status::model::DnsStatus {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let table = |names: &[(u16, &'static str)], counts: &[AtomicU64]| {
            names
                .iter()
                .map(|(_, n)| *n)
                .chain(["other"])
                .zip(counts)
                .map(|(n, c)| (n.to_string(), g(c)))
                .collect()
        };
        crate::status::model::DnsStatus {
            zone: String::new(),
            nodes: 0,
            listen: Vec::new(),
            upstreams: Vec::new(),
            received: g(&self.received),
            queries: table(&QTYPES, &self.qtypes),
            responses: table(&RCODES, &self.rcodes),
            authoritative: g(&self.authoritative),
            forwarded: g(&self.forwarded),
            forward_failures: g(&self.forward_failures),
            cache_hits: g(&self.cache_hits),
            forward_latency: self.forward_latency.snapshot(),
            dropped: [
                ("short".to_string(), g(&self.dropped_short)),
                ("response".to_string(), g(&self.dropped_response)),
            ]
            .into(),
            truncated: g(&self.truncated),
            tcp_refused: g(&self.tcp_refused),
            etcd: None,
        }
    }

    fn count_reply(&self, rcode: ResponseCode, truncated: bool) {
        self.rcodes[slot(&RCODES, u16::from(rcode))].fetch_add(1, Ordering::Relaxed);
        if rcode == ResponseCode::FormErr {
            self.formerr.fetch_add(1, Ordering::Relaxed);
        }
        if rcode == ResponseCode::ServFail {
            self.servfail.fetch_add(1, Ordering::Relaxed);
        }
        if truncated {
            self.truncated.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the loops share.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The current zone.
    pub zone: watch::Receiver<Arc<Zone>>,
    /// Forwarding and cache.
    pub forwarder: Arc<Forwarder>,
    /// Counters.
    pub stats: Arc<Stats>,
    forwards: Arc<tokio::sync::Semaphore>,
    tcp: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    /// State for the loops serving `zone` and forwarding with `forwarder`.
    pub fn new(zone: watch::Receiver<Arc<Zone>>, forwarder: Arc<Forwarder>) -> Self {
        Self {
            zone,
            forwarder,
            stats: Arc::new(Stats::default()),
            forwards: Arc::new(tokio::sync::Semaphore::new(MAX_FORWARDS)),
            tcp: Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CONNECTIONS)),
        }
    }

    /// Decides on `packet` over `zone`, a reply written into `reply`; counts.
    fn decide(
        &self,
        zone: &Zone,
        packet: &[u8],
        transport: Transport,
        reply: &mut Vec<u8>,
    ) -> Outcome {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = question_type(packet) {
            self.stats.qtypes[slot(&QTYPES, t)].fetch_add(1, Ordering::Relaxed);
        }
        let out = handler::handle(packet, zone, transport, reply);
        self.count(&out);
        out
    }

    /// A datagram cut at the receive buffer: FORMERR, as any message cut short.
    fn decide_cut(&self, packet: &[u8], reply: &mut Vec<u8>) -> Outcome {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let out = handler::cut_short(packet, reply);
        self.count(&out);
        out
    }

    fn count(&self, out: &Outcome) {
        match out {
            Outcome::Drop(DropReason::Short) => {
                self.stats.dropped_short.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Drop(DropReason::NotAQuery) => {
                self.stats.dropped_response.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Reply {
                rcode, truncated, ..
            } => {
                if *rcode != ResponseCode::FormErr {
                    self.stats.authoritative.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.count_reply(*rcode, *truncated);
            }
            Outcome::Forward(_) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Answers a forwarded request from the cache, if possible, without awaiting.
    fn answer_cached(&self, req: &Request) -> Option<Vec<u8>> {
        let hit = self.forwarder.cached(req.query())?;
        self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(self.build(req, Ok(hit)))
    }

    async fn forward(&self, req: &Request) -> Vec<u8> {
        let started = std::time::Instant::now();
        let result = self.forwarder.resolve(req.query()).await;
        match &result {
            Ok(_) => self.stats.forward_latency.observe(started.elapsed()),
            Err(e) => {
                self.stats.forward_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(query = %req.query(), error = %e, "forwarding failed");
            }
        }
        self.build(req, result)
    }

    fn build(
        &self,
        req: &Request,
        result: Result<super::forward::Upstream, super::forward::ForwardError>,
    ) -> Vec<u8> {
        let mut resp: Message = handler::response_to(&req.message);
        match result {
            Ok(up) => {
                resp.metadata.response_code = up.rcode;
                resp.answers = up.answers;
                resp.authorities = up.authorities;
                resp.additionals = up.additionals;
            }
            Err(_) => resp.metadata.response_code = ResponseCode::ServFail,
        }
        let mut bytes = Vec::new();
        match handler::finish(resp, req.max_size, &mut bytes) {
            Outcome::Reply { rcode, truncated } => {
                self.stats.count_reply(rcode, truncated);
                bytes
            }
            _ => Vec::new(),
        }
    }
}

/// Serves UDP on `sock` until `stop`: whenever it is readable, batches of datagrams
/// (`udp::Batch`) until the queue is empty.
pub async fn serve_udp(sock: UdpSocket, shared: Shared, stop: CancellationToken) {
    let sock = Arc::new(sock);
    let fd = sock.as_raw_fd();
    let mut batch = udp::Batch::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            r = sock.readable() => if let Err(e) = r {
                tracing::debug!(error = %e, "udp readiness error");
                continue;
            },
        }
        loop {
            let n = match sock.try_io(Interest::READABLE, || batch.recv(fd)) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // ICMP errors from earlier sends surface here on Linux; keep serving.
                    tracing::debug!(error = %e, "udp receive error");
                    continue;
                }
            };
            answer_batch(&sock, &shared, &mut batch, n);
            send_batch(&sock, &mut batch).await;
            if n < udp::BATCH {
                break;
            }
        }
    }
}

/// Answers the `n` datagrams of `batch`: zone answers and cache hits into the reply
/// buffers, other forwards in tasks of their own.
fn answer_batch(sock: &Arc<UdpSocket>, shared: &Shared, batch: &mut udp::Batch, n: usize) {
    let zone = shared.zone.borrow().clone();
    for i in 0..n {
        let (packet, rx, reply) = batch.get(i);
        let outcome = if rx.cut {
            shared.decide_cut(packet, reply)
        } else {
            shared.decide(&zone, packet, Transport::Udp, reply)
        };
        match outcome {
            Outcome::Reply { .. } => {}
            Outcome::Drop(_) => reply.clear(),
            Outcome::Forward(req) => {
                reply.clear();
                let Some(peer) = rx.peer else {
                    continue;
                };
                let local = rx.local;
                if let Some(bytes) = shared.answer_cached(&req) {
                    reply.extend_from_slice(&bytes);
                    continue;
                }
                let Ok(permit) = shared.forwards.clone().try_acquire_owned() else {
                    shared
                        .stats
                        .forward_failures
                        .fetch_add(1, Ordering::Relaxed);
                    let bytes = shared.build(&req, Err(super::forward::ForwardError::Busy));
                    reply.extend_from_slice(&bytes);
                    continue;
                };
                let sock = sock.clone();
                let shared = shared.clone();
                tokio::spawn(async move {
                    let bytes = shared.forward(&req).await;
                    send(&sock, &bytes, &peer, local).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Sends the batch's replies, waiting for the socket to drain when its buffer is full.
async fn send_batch(sock: &UdpSocket, batch: &mut udp::Batch) {
    let fd = sock.as_raw_fd();
    loop {
        match sock.try_io(Interest::WRITABLE, || batch.send(fd)) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if sock.writable().await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "udp send failed");
                return;
            }
        }
    }
}

/// Sends a forwarded answer to `peer` from `local`, the address its query was sent to.
async fn send(sock: &UdpSocket, bytes: &[u8], peer: &SockaddrStorage, local: Option<IpAddr>) {
    if bytes.is_empty() {
        return;
    }
    let fd = sock.as_raw_fd();
    loop {
        match sock.try_io(Interest::WRITABLE, || {
            udp::send_from(fd, bytes, peer, local)
        }) {
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if sock.writable().await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(peer = ?udp::socket_addr(peer), error = %e, "udp send failed");
                return;
            }
        }
    }
}

/// Serves TCP on `listener` until `stop`.
pub async fn serve_tcp(listener: TcpListener, shared: Shared, stop: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "tcp accept error");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = shared.tcp.clone().try_acquire_owned() else {
            shared.stats.tcp_refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = stop.cancelled() => {}
                r = tcp_conn(stream, &shared) => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "tcp connection ended");
                    }
                }
            }
        });
    }
}

async fn tcp_conn(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    loop {
        let len = match tokio::time::timeout(TCP_IDLE, stream.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        };
        let mut buf = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "idle"))??;
        let zone = shared.zone.borrow().clone();
        let mut reply = Vec::new();
        let bytes = match shared.decide(&zone, &buf, Transport::Tcp, &mut reply) {
            Outcome::Reply { .. } => reply,
            Outcome::Forward(req) => match shared.answer_cached(&req) {
                Some(b) => b,
                None => shared.forward(&req).await,
            },
            // A response or runt on a stream: the peer is not speaking DNS; hang up.
            Outcome::Drop(_) => return Ok(()),
        };
        let mut out = Vec::with_capacity(bytes.len() + 2);
        out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        out.extend_from_slice(&bytes);
        stream.write_all(&out).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use proptest::prelude::*;

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    #[test]
    fn question_type_reads_the_wire() {
        assert_eq!(
            question_type(&query("api.ocp4.example.com.", RecordType::A)),
            Some(1)
        );
        assert_eq!(question_type(&query("x.", RecordType::AAAA)), Some(28));
        assert_eq!(question_type(&query(".", RecordType::SRV)), Some(33));
        let mut two = query("x.", RecordType::A);
        two[5] = 2;
        assert_eq!(question_type(&two), None, "two questions");
        let p = query("abc.example.", RecordType::A);
        assert_eq!(question_type(&p[..p.len() - 3]), None, "cut short");
        assert_eq!(question_type(&p[..10]), None);
        assert_eq!(slot(&QTYPES, 28), 7);
        assert_eq!(slot(&QTYPES, 9999), QTYPES.len());
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn question_type_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = question_type(&bytes);
        }
    }
}
