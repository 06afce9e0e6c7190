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
