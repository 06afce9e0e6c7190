//! Telling the segment that the VIP moved: gratuitous ARP (IPv4, through an AF_PACKET
//! socket, as keepalived does) and unsolicited neighbour advertisement (IPv6, RFC 4861
//! §7.2.6, through an ICMPv6 raw socket; the kernel fills in the ICMPv6 checksum).
//! The frame builders are pure and tested; the senders are thin.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const ETH_P_ARP: u16 = 0x0806;

/// An Ethernet broadcast frame carrying a gratuitous ARP request for `vip` from `mac`
/// (sender and target protocol address both the VIP, RFC 5227 §3 "ARP Announcement").
pub fn garp_frame(mac: [u8; 6], vip: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    // htype Ethernet, ptype IPv4, hlen 6, plen 4, op request.
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&vip.octets());
    // Target hardware address stays zero.
    f[38..42].copy_from_slice(&vip.octets());
    f
}

/// An unsolicited neighbour advertisement for `vip` (Override flag set, Solicited clear,
/// target link-layer address option), checksum left to the kernel.
pub fn na_message(mac: [u8; 6], vip: Ipv6Addr) -> [u8; 32] {
    let mut m = [0u8; 32];
    m[0] = 136; // Neighbor Advertisement
    m[4] = 0x20; // O flag
    m[8..24].copy_from_slice(&vip.octets());
    m[24] = 2; // Target Link-Layer Address option
    m[25] = 1; // length in units of 8 bytes
    m[26..32].copy_from_slice(&mac);
    m
}

/// Broadcasts a gratuitous ARP for `vip` on interface `ifindex`.
pub fn send_garp(ifindex: u32, mac: [u8; 6], vip: Ipv4Addr) -> io::Result<()> {
    let proto = i32::from(ETH_P_ARP.to_be());
    let sock = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(proto)))?;
    let frame = garp_frame(mac, vip);
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value we then fill in.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_protocol = ETH_P_ARP.to_be();
    ll.sll_ifindex = ifindex as i32;
    ll.sll_halen = 6;
    ll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    // SAFETY: the frame pointer/length describe a live buffer, and `ll` is a valid,
    // initialised sockaddr_ll whose size we pass.
    let n = unsafe {
        libc::sendto(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&ll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends an unsolicited NA for `vip` to all-nodes (ff02::1) on interface `ifindex`, from
/// the VIP itself (it is on the interface, without DAD).
pub fn send_na(ifindex: u32, mac: [u8; 6], vip: Ipv6Addr) -> io::Result<()> {
    let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    sock.set_multicast_hops_v6(255)?;
    sock.set_multicast_if_v6(ifindex)?;
    sock.bind(&SockAddr::from(SocketAddrV6::new(vip, 0, 0, 0)))?;
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    sock.send_to(
        &na_message(mac, vip),
        &SockAddr::from(SocketAddrV6::new(all_nodes, 0, 0, ifindex)),
    )?;
    Ok(())
}

/// An AF_PACKET socket for ARP on one interface: sends ARP probes for a VIP and receives
/// every ARP frame on the interface, for [`super::conflict`].
#[derive(Debug)]
pub struct ArpSocket {
    fd: tokio::io::unix::AsyncFd<Socket>,
    ifindex: u32,
}

fn sockaddr_ll(ifindex: u32, dst: [u8; 6]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value we then fill in.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_protocol = ETH_P_ARP.to_be();
    ll.sll_ifindex = ifindex as i32;
    ll.sll_halen = 6;
    ll.sll_addr[..6].copy_from_slice(&dst);
    ll
}

impl ArpSocket {
    /// Opens the socket on interface `ifindex` (needs CAP_NET_RAW).
    pub fn open(ifindex: u32) -> io::Result<Self> {
        let proto = i32::from(ETH_P_ARP.to_be());
        let sock = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(proto)))?;
        sock.set_nonblocking(true)?;
        let ll = sockaddr_ll(ifindex, [0; 6]);
        // SAFETY: `ll` is a valid, initialised sockaddr_ll whose size we pass; the fd is open.
        let rc = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                (&ll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimestampns, &true)?;
        Ok(Self {
            fd: super::socket::register(sock)?,
            ifindex,
        })
    }

    /// Broadcasts an ARP request for `vip` from `mac` and the node's own address `sender`.
    pub fn send_probe(&self, mac: [u8; 6], sender: Ipv4Addr, vip: Ipv4Addr) -> io::Result<()> {
        let frame = super::conflict::probe_frame(mac, sender, vip);
        let ll = sockaddr_ll(self.ifindex, [0xff; 6]);
        // SAFETY: the frame pointer/length describe a live buffer, and `ll` is a valid,
        // initialised sockaddr_ll whose size we pass.
        let n = unsafe {
            libc::sendto(
                std::os::fd::AsRawFd::as_raw_fd(self.fd.get_ref()),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&ll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next ARP frame on the interface (Ethernet header included), with how long
    /// before it was read the kernel received it.
    pub async fn recv(&self) -> io::Result<(Vec<u8>, std::time::Duration)> {
        super::socket::recv_stamped_async(&self.fd, 128).await
    }

    /// A frame already queued, without waiting (`Ok(None)` when none is).
    pub fn try_recv(&self) -> io::Result<Option<(Vec<u8>, std::time::Duration)>> {
        super::socket::try_recv_stamped(&self.fd, 128)
    }
}

/// A neighbour solicitation for `target` from `mac` (source link-layer address option),
/// checksum left to the kernel: the IPv6 counterpart of an ARP probe of the VIP.
pub fn ns_message(mac: [u8; 6], target: Ipv6Addr) -> [u8; 32] {
    let mut m = [0u8; 32];
    m[0] = 135; // Neighbor Solicitation
    m[8..24].copy_from_slice(&target.octets());
    m[24] = 1; // Source Link-Layer Address option
    m[25] = 1; // length in units of 8 bytes
    m[26..32].copy_from_slice(&mac);
    m
}

/// The solicited-node multicast address of `a` (RFC 4291 §2.7.1), where a neighbour
/// solicitation for it goes.
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// What a neighbour advertisement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighbourAdvert {
    /// The address it answers for.
    pub target: Ipv6Addr,
    /// The target link-layer address option, if present.
    pub mac: Option<[u8; 6]>,
}

/// Parses an ICMPv6 message as a neighbour advertisement (RFC 4861 §4.4); `None` for
/// anything else or anything malformed.
pub fn parse_na(m: &[u8]) -> Option<NeighbourAdvert> {
    if m.len() < 24 || m[0] != 136 || m[1] != 0 {
        return None;
    }
    let mut t = [0u8; 16];
    t.copy_from_slice(&m[8..24]);
    let mut mac = None;
    let mut opts = &m[24..];
    while opts.len() >= 2 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            return None;
        }
        if opts[0] == 2 && len >= 8 {
            let mut a = [0u8; 6];
            a.copy_from_slice(&opts[2..8]);
            mac = Some(a);
        }
        opts = &opts[len..];
    }
    Some(NeighbourAdvert {
        target: Ipv6Addr::from(t),
        mac,
    })
}

/// An ICMPv6 socket on one interface for the IPv6 VIP's second path: sends neighbour
/// solicitations for the VIP and receives the neighbour advertisements that answer them
/// (the kernel filters everything else out, `ICMP6_FILTER`).
#[derive(Debug)]
pub struct NdSocket {
    fd: tokio::io::unix::AsyncFd<Socket>,
    ifindex: u32,
    mac: [u8; 6],
}

impl NdSocket {
    /// Opens the socket on interface `iface` (index `ifindex`), soliciting from `src` (the
    /// node's address on it; a link-local one is scoped to the interface).
    pub fn open(iface: &str, ifindex: u32, src: Ipv6Addr, mac: [u8; 6]) -> io::Result<Self> {
        let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        sock.bind_device(Some(iface.as_bytes()))?;
        sock.set_nonblocking(true)?;
        sock.set_multicast_hops_v6(255)?;
        sock.set_unicast_hops_v6(255)?;
        sock.set_multicast_if_v6(ifindex)?;
        sock.set_multicast_loop_v6(false)?;
        // Block every ICMPv6 type but 136 (RFC 3542 §3.2: a set bit blocks).
        let mut filter = [u32::MAX; 8];
        filter[136 >> 5] &= !(1u32 << (136 & 31));
        // SAFETY: `filter` is a live, initialised icmp6_filter (8 x u32) whose size we
        // pass; the descriptor is open.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_ICMPV6,
                ICMP6_FILTER,
                filter.as_ptr().cast(),
                std::mem::size_of_val(&filter) as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimestampns, &true)?;
        let scope = if src.is_unicast_link_local() {
            ifindex
        } else {
            0
        };
        sock.bind(&SockAddr::from(SocketAddrV6::new(src, 0, 0, scope)))?;
        Ok(Self {
            fd: super::socket::register(sock)?,
            ifindex,
            mac,
        })
    }

    /// Sends a neighbour solicitation for `target` to its solicited-node group.
    pub fn send_probe(&self, target: Ipv6Addr) -> io::Result<()> {
        let dst = SocketAddrV6::new(solicited_node(target), 0, 0, self.ifindex);
        self.fd
            .get_ref()
            .send_to(&ns_message(self.mac, target), &SockAddr::from(dst))?;
        Ok(())
    }

    /// The next neighbour advertisement (the ICMPv6 message), with how long before it was
    /// read the kernel received it.
    pub async fn recv(&self) -> io::Result<(Vec<u8>, std::time::Duration)> {
        super::socket::recv_stamped_async(&self.fd, 256).await
    }

    /// An advertisement already queued, without waiting (`Ok(None)` when none is).
    pub fn try_recv(&self) -> io::Result<Option<(Vec<u8>, std::time::Duration)>> {
        super::socket::try_recv_stamped(&self.fd, 256)
    }
}

/// `ICMP6_FILTER` (linux/icmpv6.h), which the libc crate does not name.
const ICMP6_FILTER: libc::c_int = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garp_layout() {
        let mac = [2, 0, 0, 0, 0, 1];
        let f = garp_frame(mac, Ipv4Addr::new(10, 0, 0, 5));
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "request");
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[28..32], &[10, 0, 0, 5]);
        assert_eq!(&f[38..42], &[10, 0, 0, 5]);
    }

    #[test]
    fn ns_layout_and_solicited_node_group() {
        let vip: Ipv6Addr = "fd00::1:2:3:abcd".parse().unwrap();
        let m = ns_message([2, 0, 0, 0, 0, 1], vip);
        assert_eq!(m[0], 135);
        assert_eq!(&m[8..24], &vip.octets());
        assert_eq!(&m[24..26], &[1, 1], "source link-layer option");
        assert_eq!(&m[26..32], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(
            solicited_node(vip),
            "ff02::1:ff03:abcd".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn an_advertisement_parses_with_and_without_its_link_layer_option() {
        let vip: Ipv6Addr = "fd00::5".parse().unwrap();
        let mac = [2, 0, 0, 0, 0, 9];
        let na = parse_na(&na_message(mac, vip)).unwrap();
        assert_eq!(
            na,
            NeighbourAdvert {
                target: vip,
                mac: Some(mac)
            }
        );
        let bare = parse_na(&na_message(mac, vip)[..24]).unwrap();
        assert_eq!(bare.mac, None);
        // A solicitation is not an advertisement; a zero-length option is malformed.
        assert_eq!(parse_na(&ns_message(mac, vip)), None);
        let mut bad = na_message(mac, vip);
        bad[25] = 0;
        assert_eq!(parse_na(&bad), None);
        assert_eq!(parse_na(&bad[..23]), None);
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn na_parser_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = parse_na(&bytes);
        }
    }

    #[test]
    fn na_layout() {
        let m = na_message([2, 0, 0, 0, 0, 1], "fd00::5".parse().unwrap());
        assert_eq!(m[0], 136);
        assert_eq!(m[4], 0x20);
        assert_eq!(&m[8..10], &[0xfd, 0]);
        assert_eq!(&m[24..26], &[2, 1]);
    }
}
