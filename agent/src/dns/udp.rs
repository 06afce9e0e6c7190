//! Batched UDP: up to [`BATCH`] queries per `recvmmsg(2)` and their replies in one
//! `sendmmsg(2)`, so that under load a query costs a fraction of a system call instead of
//! two (NSD does the same; docs/dns.md, the bench).
//!
//! The calls are nix's; this module owns the buffers they fill and read, reused from one
//! batch to the next.
//!
//! A socket bound to the wildcard address answers from the address each query was sent to
//! (`IP_PKTINFO` / `IPV6_PKTINFO` in, the same address as the source out): a query to the
//! API VIP (a node's initramfs resolving `api-int`, docs/dns.md) or to any address but the
//! interface's first would otherwise get its answer from another address, which resolvers
//! drop as not from the server they asked.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, RawFd};

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg,
    sendmmsg, sendmsg, setsockopt, sockopt,
};

/// Datagrams per system call.
pub const BATCH: usize = 64;
/// Receive buffer per datagram. A query is at most a few hundred bytes (a 255-byte name,
/// EDNS options, padding to 468); a larger datagram is cut here and gets FORMERR.
pub const RX_SIZE: usize = 4096;

/// One received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes received (at most [`RX_SIZE`]).
    pub len: usize,
    /// The datagram was longer than [`RX_SIZE`] and was cut.
    pub cut: bool,
    /// The sender.
    pub peer: Option<SockaddrStorage>,
    /// The address it was sent to (once [`report_destinations`] is on for the socket).
    pub local: Option<IpAddr>,
}

/// Asks the kernel to report each datagram's destination address on `sock` (a socket bound
/// to `family`'s wildcard), so the replies can leave from it.
pub fn report_destinations(sock: &impl AsFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt(sock, sockopt::Ipv6RecvPacketInfo, &true)?;
    } else {
        setsockopt(sock, sockopt::Ipv4PacketInfo, &true)?;
    }
    Ok(())
}

/// The control message that sends from `local`.
enum Source {
    V4(libc::in_pktinfo),
    V6(libc::in6_pktinfo),
}

impl Source {
    fn new(local: IpAddr) -> Self {
        match local {
            IpAddr::V4(a) => Source::V4(libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(a).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            }),
            IpAddr::V6(a) => Source::V6(libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                ipi6_ifindex: 0,
            }),
        }
    }

    fn message(&self) -> ControlMessage<'_> {
        match self {
            Source::V4(info) => ControlMessage::Ipv4PacketInfo(info),
            Source::V6(info) => ControlMessage::Ipv6PacketInfo(info),
        }
    }
}

/// Sends `bytes` to `peer` from `local` (the wildcard socket's choice when `None`).
pub fn send_from(
    fd: RawFd,
    bytes: &[u8],
    peer: &SockaddrStorage,
    local: Option<IpAddr>,
) -> io::Result<usize> {
    let iov = [IoSlice::new(bytes)];
    let source = local.map(Source::new);
    let cmsgs: Vec<ControlMessage<'_>> = source.iter().map(Source::message).collect();
    Ok(sendmsg(
        fd,
        &iov,
        &cmsgs,
        MsgFlags::MSG_DONTWAIT,
        Some(peer),
    )?)
}

/// Room for one packet-info control message of either family (received).
fn cmsg_buffer() -> Vec<u8> {
    nix::cmsg_space!(libc::in6_pktinfo)
}

/// nix's preallocated `mmsghdr`s, kept from one batch to the next.
struct Headers(MultiHeaders<SockaddrStorage>);

// SAFETY: the raw pointers inside point into the headers' own heap allocations (the address
// slots) or into the buffers of the last recvmmsg/sendmmsg call, which the next call of the
// same kind overwrites before the kernel reads them; nothing else dereferences them and none
// is tied to a thread. The batch moves with the task that owns it and is never shared
// (`Send`, not `Sync`).
unsafe impl Send for Headers {}

/// The buffers of one batch: received datagrams and the replies to send back.
pub struct Batch {
    rx: Vec<Box<[u8; RX_SIZE]>>,
    received: Vec<Received>,
    /// Reply buffers, one per received datagram (cleared when nothing is to be sent).
    pub replies: Vec<Vec<u8>>,
    /// For `recvmmsg` and `sendmmsg` apart: nix's `sendmmsg` points a header's address at
    /// the caller's (short-lived) array, and `recvmmsg` would then write the next sender
    /// there instead of into the header's own slot.
    rx_headers: Headers,
    /// One set of send headers per kind of control message: nix's `sendmmsg` hands the
    /// kernel a header's whole control buffer, so its size must be exactly what is sent
    /// (none, an IPv4 or an IPv6 packet info).
    tx_headers: Headers,
    tx_headers_v4: Headers,
    tx_headers_v6: Headers,
    /// The next reply [`Batch::send`] sends.
    next_send: usize,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("received", &self.received.len())
            .finish()
    }
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// Buffers for [`BATCH`] datagrams.
    pub fn new() -> Self {
        Self {
            rx: (0..BATCH).map(|_| Box::new([0u8; RX_SIZE])).collect(),
            received: Vec::with_capacity(BATCH),
            replies: (0..BATCH).map(|_| Vec::with_capacity(512)).collect(),
            rx_headers: Headers(MultiHeaders::preallocate(BATCH, Some(cmsg_buffer()))),
            tx_headers: Headers(MultiHeaders::preallocate(BATCH, None)),
            tx_headers_v4: Headers(MultiHeaders::preallocate(
                BATCH,
                Some(nix::cmsg_space!(libc::in_pktinfo)),
            )),
            tx_headers_v6: Headers(MultiHeaders::preallocate(
                BATCH,
                Some(nix::cmsg_space!(libc::in6_pktinfo)),
            )),
            next_send: 0,
        }
    }

    /// Receives what is queued on `fd` (non-blocking), up to [`BATCH`] datagrams; returns
    /// how many. `WouldBlock` when nothing is queued.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.received.clear();
        self.next_send = 0;
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = self
            .rx
            .iter_mut()
            .map(|b| [IoSliceMut::new(&mut b[..])])
            .collect();
        let results = recvmmsg(
            fd,
            &mut self.rx_headers.0,
            iovs.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )?;
        for r in results {
            let local = r.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::Ipv4PacketInfo(i) => {
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(i.ipi_addr.s_addr))))
                    }
                    ControlMessageOwned::Ipv6PacketInfo(i) => {
                        Some(IpAddr::V6(Ipv6Addr::from(i.ipi6_addr.s6_addr)))
                    }
                    _ => None,
                })
            });
            self.received.push(Received {
                len: r.bytes,
                cut: r.flags.contains(MsgFlags::MSG_TRUNC),
                peer: r.address,
                local,
            });
        }
        Ok(self.received.len())
    }

    /// Datagram `i` of the last [`Batch::recv`], its metadata and the reply buffer for it.
    pub fn get(&mut self, i: usize) -> (&[u8], Received, &mut Vec<u8>) {
        let r = self.received[i];
        (&self.rx[i][..r.len], r, &mut self.replies[i])
    }

    /// Sends the non-empty replies, each to its datagram's sender, from where the last call
    /// stopped; `WouldBlock` when the socket's buffer is full (call again once writable).
    pub fn send(&mut self, fd: RawFd) -> io::Result<()> {
        let n = self.received.len();
        while self.next_send < n {
            if self.replies[self.next_send].is_empty() {
                self.next_send += 1;
                continue;
            }
            // The run of replies from here to one local address (drops and forwards, with
            // no reply, end it): one sendmmsg shares its control messages.
            let local = self.received[self.next_send].local;
            let end = (self.next_send..n)
                .find(|&i| self.replies[i].is_empty() || self.received[i].local != local)
                .unwrap_or(n);
            match self.send_run(fd, self.next_send, end) {
                Ok(sent) => self.next_send += sent,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(e),
                // A reply the kernel refuses (an unreachable peer): skip it.
                Err(e) => {
                    tracing::debug!(error = %e, "udp send failed");
                    self.next_send += 1;
                }
            }
        }
        Ok(())
    }

    /// One `sendmmsg` of replies `start..end`; how many went.
    fn send_run(&mut self, fd: RawFd, start: usize, end: usize) -> io::Result<usize> {
        let iovs: Vec<[IoSlice<'_>; 1]> = self.replies[start..end]
            .iter()
            .map(|r| [IoSlice::new(r)])
            .collect();
        let addrs: Vec<Option<SockaddrStorage>> =
            self.received[start..end].iter().map(|r| r.peer).collect();
        let source = self.received[start].local.map(Source::new);
        let cmsgs: Vec<ControlMessage<'_>> = source.iter().map(Source::message).collect();
        let headers = match source {
            None => &mut self.tx_headers.0,
            Some(Source::V4(_)) => &mut self.tx_headers_v4.0,
            Some(Source::V6(_)) => &mut self.tx_headers_v6.0,
        };
        let sent = sendmmsg(
            fd,
            headers,
            iovs.iter(),
            addrs,
            cmsgs,
            MsgFlags::MSG_DONTWAIT,
        )?
        .count();
        Ok(sent.max(1).min(end - start))
    }
}

/// A socket address from what `recvmmsg` reported.
pub fn socket_addr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn wait_recv(batch: &mut Batch, fd: RawFd) -> usize {
        for _ in 0..200 {
            match batch.recv(fd) {
                Ok(n) => return n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("nothing received");
    }

    /// Every reply goes to the sender of its datagram, batch after batch (nix's shared
    /// headers once sent the second batch's replies to the first batch's senders).
    #[test]
    fn replies_go_to_their_senders() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let fd = server.as_raw_fd();
        let mut batch = Batch::new();
        for round in 0..3u8 {
            let clients: Vec<UdpSocket> = (0..3)
                .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
                .collect();
            for (i, c) in clients.iter().enumerate() {
                c.send_to(&[round, i as u8], addr).unwrap();
            }
            let mut got = 0;
            while got < clients.len() {
                let n = wait_recv(&mut batch, fd);
                for k in 0..n {
                    let (data, rx, reply) = batch.get(k);
                    assert!(!rx.cut);
                    let data = data.to_vec();
                    reply.clear();
                    // Drops (empty replies) between sends are skipped.
                    if data[1] != 1 {
                        reply.extend_from_slice(&data);
                        reply.push(0xee);
                    }
                }
                batch.send(fd).unwrap();
                got += n;
            }
            for (i, c) in clients.iter().enumerate() {
                c.set_read_timeout(Some(Duration::from_millis(if i == 1 { 100 } else { 2000 })))
                    .unwrap();
                let mut buf = [0u8; 16];
                match c.recv(&mut buf) {
                    Ok(n) => {
                        assert_ne!(i, 1, "the dropped one gets nothing");
                        assert_eq!(&buf[..n], &[round, i as u8, 0xee]);
                    }
                    Err(_) => assert_eq!(i, 1, "client {i} got no reply"),
                }
            }
        }
    }

    /// A query to an address of the host that is not the one the kernel would pick as the
    /// source (127.0.0.2 on loopback; a VIP on a NIC) is answered from that address: the
    /// client, connected to it, takes nothing else.
    #[test]
    fn replies_leave_from_the_address_asked() {
        let server = UdpSocket::bind("0.0.0.0:0").unwrap();
        report_destinations(&server, false).unwrap();
        let port = server.local_addr().unwrap().port();
        let fd = server.as_raw_fd();
        let mut batch = Batch::new();
        for asked in ["127.0.0.2", "127.0.0.1", "127.0.0.3"] {
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            client.connect((asked, port)).unwrap();
            client.send(b"q").unwrap();
            let n = wait_recv(&mut batch, fd);
            assert_eq!(n, 1);
            let (_, rx, reply) = batch.get(0);
            assert_eq!(rx.local, Some(asked.parse().unwrap()));
            reply.clear();
            reply.extend_from_slice(b"a");
            batch.send(fd).unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut buf = [0u8; 4];
            assert_eq!(client.recv(&mut buf).unwrap(), 1, "no reply from {asked}");
            // The forwarder's path: one reply at a time.
            client.send(b"q").unwrap();
            assert_eq!(wait_recv(&mut batch, fd), 1);
            let (_, rx, _) = batch.get(0);
            send_from(fd, b"f", rx.peer.as_ref().unwrap(), rx.local).unwrap();
            assert_eq!(
                client.recv(&mut buf).unwrap(),
                1,
                "no forwarded reply from {asked}"
            );
        }
    }

    #[test]
    fn ipv6_senders() {
        // IPv6 on loopback is a need like any other: under CI its absence fails the test.
        let server = UdpSocket::bind("[::1]:0");
        if !keelson_testkit::need::need(
            server.is_ok(),
            &format!(
                "IPv6 on loopback (binding [::1]: {})",
                server
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        ) {
            return;
        }
        let server = server.unwrap();
        let client = UdpSocket::bind("[::1]:0").unwrap();
        client
            .send_to(b"six", server.local_addr().unwrap())
            .unwrap();
        let mut batch = Batch::new();
        assert_eq!(wait_recv(&mut batch, server.as_raw_fd()), 1);
        let (data, rx, reply) = batch.get(0);
        assert_eq!(data, b"six");
        assert_eq!(
            rx.peer.as_ref().and_then(socket_addr),
            Some(client.local_addr().unwrap())
        );
        reply.clear();
        reply.extend_from_slice(b"back");
        batch.send(server.as_raw_fd()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut buf = [0u8; 8];
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"back");
    }

    #[test]
    fn long_datagrams_are_flagged_cut() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .send_to(&vec![7u8; RX_SIZE + 10], server.local_addr().unwrap())
            .unwrap();
        let mut batch = Batch::new();
        assert_eq!(wait_recv(&mut batch, server.as_raw_fd()), 1);
        let (data, rx, _) = batch.get(0);
        assert!(rx.cut);
        assert_eq!(data.len(), RX_SIZE);
        assert_eq!(
            rx.peer.as_ref().and_then(socket_addr),
            Some(client.local_addr().unwrap())
        );
    }
}
