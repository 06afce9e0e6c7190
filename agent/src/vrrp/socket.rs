//! Raw IP sockets for protocol 112 on one interface.
//!
//! Two sockets per instance: a receive socket (unbound, so it sees multicast and unicast
//! adverts, joined to the group, bound to the device) and a send socket bound to our
//! source address, so the kernel puts exactly the address we used in the v3 pseudo-header
//! checksum. TTL / hop limit 255 on both unicast and multicast (RFC 5798 §5.1.1.3).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrIn6, SockaddrStorage};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;

use super::codec::{GROUP_V4, GROUP_V6, PROTO_VRRP};

/// One received IP packet carrying protocol 112.
#[derive(Debug, Clone)]
pub struct Received {
    /// IP source.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// TTL (IPv4) or hop limit (IPv6) as received.
    pub ttl: u8,
    /// The VRRP message (IP payload).
    pub payload: Vec<u8>,
    /// How long before it was read the kernel received it (`SO_TIMESTAMPNS`; zero without
    /// a timestamp). A packet read after a stall (a loaded host, a descheduled guest)
    /// counts from when it arrived, not from when we got round to it.
    pub age: Duration,
}

/// The pair of sockets of one instance.
#[derive(Debug)]
pub struct VrrpSocket {
    recv: AsyncFd<Socket>,
    send: AsyncFd<Socket>,
    v6: bool,
    ifindex: u32,
}

fn raw(v6: bool, iface: &str) -> io::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(
        domain,
        Type::RAW,
        Some(Protocol::from(i32::from(PROTO_VRRP))),
    )?;
    s.bind_device(Some(iface.as_bytes()))?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl VrrpSocket {
    /// Opens the sockets on `iface` (index `ifindex`), sending from `src`. Joins the VRRP
    /// group when `multicast`.
    pub fn open(iface: &str, ifindex: u32, src: IpAddr, multicast: bool) -> io::Result<Self> {
        let v6 = src.is_ipv6();
        let recv = raw(v6, iface)?;
        let send = raw(v6, iface)?;
        // Bursts (many routers, or junk) must not overflow the queue between two reads.
        recv.set_recv_buffer_size(1 << 20)?;
        nix::sys::socket::setsockopt(&recv, nix::sys::socket::sockopt::ReceiveTimestampns, &true)?;
        // Nobody reads the send socket; keep what piles up in it small.
        send.set_recv_buffer_size(1)?;
        match src {
            IpAddr::V4(src4) => {
                if multicast {
                    recv.join_multicast_v4_n(&GROUP_V4, &InterfaceIndexOrAddress::Index(ifindex))?;
                }
                send.set_multicast_if_v4(&src4)?;
                send.set_multicast_ttl_v4(255)?;
                send.set_ttl_v4(255)?;
                send.set_multicast_loop_v4(false)?;
                send.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
            }
            IpAddr::V6(src6) => {
                if multicast {
                    recv.join_multicast_v6(&GROUP_V6, ifindex)?;
                }
                nix::sys::socket::setsockopt(
                    &recv,
                    nix::sys::socket::sockopt::Ipv6RecvHopLimit,
                    &true,
                )?;
                nix::sys::socket::setsockopt(
                    &recv,
                    nix::sys::socket::sockopt::Ipv6RecvPacketInfo,
                    &true,
                )?;
                send.set_multicast_if_v6(ifindex)?;
                send.set_multicast_hops_v6(255)?;
                send.set_unicast_hops_v6(255)?;
                send.set_multicast_loop_v6(false)?;
                let scope = if src6.is_unicast_link_local() {
                    ifindex
                } else {
                    0
                };
                send.bind(&SockAddr::from(SocketAddrV6::new(src6, 0, 0, scope)))?;
            }
        }
        Ok(Self {
            recv: register(recv)?,
            send: register(send)?,
            v6,
            ifindex,
        })
    }

    /// Sends one VRRP message to `dst`.
    pub async fn send(&self, payload: &[u8], dst: IpAddr) -> io::Result<()> {
        let addr = match dst {
            IpAddr::V6(d) => {
                let scope = if d.is_multicast() || d.is_unicast_link_local() {
                    self.ifindex
                } else {
                    0
                };
                SockAddr::from(SocketAddrV6::new(d, 0, 0, scope))
            }
            IpAddr::V4(_) => SockAddr::from(SocketAddr::new(dst, 0)),
        };
        loop {
            let mut guard = self.send.writable().await?;
            match guard.try_io(|s| s.get_ref().send_to(payload, &addr)) {
                Ok(r) => return r.map(|_| ()),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives the next protocol-112 packet on the interface.
    pub async fn recv(&self) -> io::Result<Received> {
        loop {
            let mut guard = self.recv.readable().await?;
            let res = guard.try_io(|s| {
                let fd = s.get_ref().as_raw_fd();
                if self.v6 { recv_v6(fd) } else { recv_v4(fd) }
            });
            match res {
                Ok(Ok(Some(r))) => return Ok(r),
                // A packet we cannot even read an IP header from: skip it.
                Ok(Ok(None)) => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

impl VrrpSocket {
    /// A packet already queued on the socket, without waiting: `Ok(None)` when none is.
    /// The socket is non-blocking (registered with the reactor), so this is one `recvfrom`
    /// that says `EAGAIN` when the queue is empty.
    pub fn try_recv(&self) -> io::Result<Option<Received>> {
        let fd = self.recv.get_ref().as_raw_fd();
        loop {
            let r = if self.v6 { recv_v6(fd) } else { recv_v4(fd) };
            match r {
                Ok(Some(r)) => return Ok(Some(r)),
                // A packet we cannot even read an IP header from: skip it.
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

pub(crate) fn register(s: Socket) -> io::Result<AsyncFd<Socket>> {
    // SAFETY: `Socket` owns its descriptor, which stays open and the same until the
    // AsyncFd (which owns the Socket) is dropped.
    unsafe { AsyncFd::register(s) }.map_err(|e| io::Error::other(e.to_string()))
}

/// IPv4 raw sockets hand us the IP header: TTL, addresses and total length come from it.
fn recv_v4(fd: std::os::fd::RawFd) -> io::Result<Option<Received>> {
    let (b, age) = recv_stamped(fd, 2048)?;
    let n = b.len();
    if n < 20 || b[0] >> 4 != 4 {
        return Ok(None);
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([b[2], b[3]])).min(n);
    if ihl < 20 || total < ihl {
        return Ok(None);
    }
    Ok(Some(Received {
        src: IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15])),
        dst: IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])),
        ttl: b[8],
        payload: b[ihl..total].to_vec(),
        age,
    }))
}

/// IPv6 raw sockets give only the payload: source from the address, destination and hop
/// limit from ancillary data.
fn recv_v6(fd: std::os::fd::RawFd) -> io::Result<Option<Received>> {
    let mut buf = [0u8; 2048];
    let mut cmsg = nix::cmsg_space!(libc::in6_pktinfo, libc::c_int, nix::sys::time::TimeSpec);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg =
        nix::sys::socket::recvmsg::<SockaddrIn6>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let n = msg.bytes;
    let Some(src) = msg.address.map(|a| a.ip()) else {
        return Ok(None);
    };
    let mut dst = None;
    // Without the hop limit we cannot check it: treat as 0, so the packet is dropped.
    let mut ttl = 0u8;
    let mut age = Duration::ZERO;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::ScmTimestampns(ts) => age = age_of(ts),
            ControlMessageOwned::Ipv6PacketInfo(info) => {
                dst = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr));
            }
            ControlMessageOwned::Ipv6HopLimit(h) => ttl = u8::try_from(h).unwrap_or(0),
            _ => {}
        }
    }
    let Some(dst) = dst else { return Ok(None) };
    Ok(Some(Received {
        src: IpAddr::V6(src),
        dst: IpAddr::V6(dst),
        ttl,
        payload: buf[..n].to_vec(),
        age,
    }))
}

/// The next datagram or frame of a registered socket with `SO_TIMESTAMPNS` on
/// ([`recv_stamped`]), waiting for one.
pub(crate) async fn recv_stamped_async(
    fd: &AsyncFd<Socket>,
    max: usize,
) -> io::Result<(Vec<u8>, Duration)> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|s| recv_stamped(s.get_ref().as_raw_fd(), max)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// One already queued ([`recv_stamped`]), without waiting: `Ok(None)` when none is.
pub(crate) fn try_recv_stamped(
    fd: &AsyncFd<Socket>,
    max: usize,
) -> io::Result<Option<(Vec<u8>, Duration)>> {
    match recv_stamped(fd.get_ref().as_raw_fd(), max) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// One datagram or frame from a socket with `SO_TIMESTAMPNS` on, at most `max` bytes, and
/// how long before now the kernel received it (zero without a timestamp).
pub(crate) fn recv_stamped(fd: std::os::fd::RawFd, max: usize) -> io::Result<(Vec<u8>, Duration)> {
    let mut buf = vec![0u8; max];
    let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = nix::sys::socket::recvmsg::<SockaddrStorage>(
        fd,
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )?;
    let n = msg.bytes;
    let mut age = Duration::ZERO;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmTimestampns(ts) = c {
            age = age_of(ts);
        }
    }
    buf.truncate(n);
    Ok((buf, age))
}

/// How long ago the kernel's receive timestamp `ts` (CLOCK_REALTIME) was, capped at
/// [`MAX_AGE`]: zero for a timestamp in the future (the clock was stepped back), and a
/// step forward cannot make a packet look older than the cap.
fn age_of(ts: nix::sys::time::TimeSpec) -> Duration {
    let at = Duration::from(ts);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(Duration::ZERO, |now| now.saturating_sub(at))
        .min(MAX_AGE)
}

/// The oldest a queued packet is taken to be: longer than any Master_Down (255 s adverts
/// aside), short enough that a clock step does not age every packet without bound.
const MAX_AGE: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::time::TimeSpec;

    fn ago(offset_secs: f64) -> TimeSpec {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let at = if offset_secs >= 0.0 {
            now - Duration::from_secs_f64(offset_secs)
        } else {
            now + Duration::from_secs_f64(-offset_secs)
        };
        TimeSpec::from_duration(at)
    }

    #[test]
    fn age_counts_from_the_kernel_timestamp_within_bounds() {
        let two = age_of(ago(2.0));
        assert!(
            two >= Duration::from_secs(2) && two < Duration::from_secs(3),
            "{two:?}"
        );
        assert_eq!(
            age_of(ago(-5.0)),
            Duration::ZERO,
            "a timestamp in the future"
        );
        assert_eq!(
            age_of(ago(3600.0)),
            MAX_AGE,
            "a clock step forward is capped"
        );
    }
}
