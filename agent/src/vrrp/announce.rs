//! Telling the segment that the VIP moved: gratuitous ARP (IPv4, through an AF_PACKET
//! socket, as keepalived does) and unsolicited neighbour advertisement (IPv6, RFC 4861
//! §7.2.6, through an ICMPv6 raw socket; the kernel fills in the ICMPv6 checksum).
//! The frame builders are pure and tested; the senders are thin.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

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

    /// The next ARP frame on the interface (Ethernet header included).
    pub async fn recv(&self) -> io::Result<Vec<u8>> {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 128];
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|s| s.get_ref().recv(&mut buf)) {
                Ok(Ok(n)) => {
                    // SAFETY: recv initialised the first `n` bytes of `buf`.
                    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
                    return Ok(bytes.to_vec());
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

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
    fn na_layout() {
        let m = na_message([2, 0, 0, 0, 0, 1], "fd00::5".parse().unwrap());
        assert_eq!(m[0], 136);
        assert_eq!(m[4], 0x20);
        assert_eq!(&m[8..10], &[0xfd, 0]);
        assert_eq!(&m[24..26], &[2, 1]);
    }
}
