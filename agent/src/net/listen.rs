//! Listening sockets, in one place: the dual-stack TCP listener of the API proxy, its
//! monitor and `/metrics`, and the one-family UDP and TCP sockets of the DNS server.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use tokio::net::{TcpListener, UdpSocket};

/// Binds a listening TCP socket; `freebind` allows an address this host does not have (yet).
/// An unspecified IPv6 address is bound dual-stack, falling back to IPv4 where IPv6 is off.
pub fn tcp(addr: SocketAddr, freebind: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let bind = |addr: SocketAddr| -> io::Result<TcpListener> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        // Accepted sockets inherit TCP_NODELAY on Linux: one setsockopt per client saved.
        s.set_tcp_nodelay(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(false)?;
            if freebind {
                s.set_freebind_v6(true)?;
            }
        } else if freebind {
            s.set_freebind_v4(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(4096)?;
        TcpListener::from_std(s.into())
    };
    match bind(addr) {
        Err(e) if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            tracing::debug!(error = %e, "no IPv6; binding the IPv4 wildcard");
            bind(SocketAddr::from(([0, 0, 0, 0], addr.port())))
        }
        r => r,
    }
}

/// Receive buffer of [`udp_one_family`] sockets: bursts of queries to the DNS server
/// (dnsperf, a cluster booting) must not overflow it while one thread answers.
const UDP_RCVBUF: usize = 4 << 20;

/// A non-blocking socket for `addr`; an IPv6 one takes IPv6 only.
fn one_family_socket(addr: SocketAddr, ty: socket2::Type) -> std::io::Result<socket2::Socket> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, ty, None)?;
    if addr.is_ipv6() {
        // `[::]` next to `0.0.0.0` on the same port: keep the families apart.
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

/// A UDP socket bound to `addr` alone (`[::]` beside `0.0.0.0` on the same port), with a
/// large receive buffer (the DNS server's).
pub fn udp_one_family(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = one_family_socket(addr, socket2::Type::DGRAM)?;
    // Best effort: the kernel caps it at net.core.rmem_max.
    let _ = s.set_recv_buffer_size(UDP_RCVBUF);
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

/// A TCP listener on `addr` alone (`[::]` beside `0.0.0.0` on the same port; the DNS
/// server's).
pub fn tcp_one_family(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = one_family_socket(addr, socket2::Type::STREAM)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}
