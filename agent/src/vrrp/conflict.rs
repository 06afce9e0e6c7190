//! Detecting another holder of our VIP that VRRP cannot see (unicast, IPv4), pure.
//!
//! Unicast adverts reach only the routers whose addresses we know. Two nodes that hold
//! the VIP without knowing each other (formation before any peer was learned, a cold
//! restart with no remembered peers, a partition healed after the members expired) would
//! both hold it for good. ARP can see them where VRRP cannot: the VIP itself relies on
//! broadcast ARP (gratuitous ARP moves it), so every network a VIP works on carries it.
//! While master, an instance sends an ARP request for its VIP every second from its own
//! address and watches every ARP frame on the interface: a reply or an announcement for the
//! VIP from another MAC is another holder. (Not RFC 5227's probe from 0.0.0.0: cloud ARP
//! protection, Neutron's among them, drops ARP whose sender is not one of the port's
//! addresses, so a probe from 0.0.0.0 never leaves a cloud port. The node's own address is
//! its to announce; the holder learns only the true mapping of it.)
//!
//! If a valid advert arrived within the last Master_Down interval the other holder is a
//! router VRRP already sees, and VRRP resolves it: ignore. Otherwise the holder with the
//! lower MAC yields (both apply the same rule, so exactly one of two stays): it hands the
//! VIP over (removes it after a preempted master's 200 ms grace), closes its claim gate, and registers through the VIP with the holder that kept it,
//! which answers with its own address; from then on they exchange adverts and VRRP elects
//! by priority. The one that stays announces the VIP again so hosts fix their ARP caches.

use std::net::Ipv4Addr;
use std::time::Duration;

const ETH_P_ARP: u16 = 0x0806;

/// The ARP fields the detector needs from a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpFrame {
    /// 1 request, 2 reply.
    pub op: u16,
    /// Sender hardware address.
    pub sender_mac: [u8; 6],
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

/// Parses an Ethernet frame carrying IPv4-over-Ethernet ARP; `None` for anything else.
pub fn parse_arp(frame: &[u8]) -> Option<ArpFrame> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() {
        return None;
    }
    // htype 1 (Ethernet), ptype 0x0800, hlen 6, plen 4.
    if frame[14..20] != [0, 1, 0x08, 0x00, 6, 4] {
        return None;
    }
    let op = u16::from_be_bytes([frame[20], frame[21]]);
    let mut sender_mac = [0u8; 6];
    sender_mac.copy_from_slice(&frame[22..28]);
    let ip = |at: usize| Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
    Some(ArpFrame {
        op,
        sender_mac,
        sender_ip: ip(28),
        target_ip: ip(38),
    })
}

/// An ARP request for `vip` from `mac` and this node's own address `sender`: a broadcast
/// every holder of `vip` answers.
pub fn probe_frame(mac: [u8; 6], sender: Ipv4Addr, vip: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&sender.octets());
    // Target hardware address zero.
    f[38..42].copy_from_slice(&vip.octets());
    f
}

/// What to do about an ARP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not about another holder of our VIP, or VRRP already sees the other router.
    Ignore,
    /// Another holder with a lower MAC: keep the VIP and announce it again.
    Stay,
    /// Another holder with a higher MAC: give the VIP up (the instance first waits an
    /// advert interval for an advert from it, which would make VRRP the judge).
    Yield,
}

/// Whether VRRP itself sees another router: a valid advert arrived within the last
/// Master_Down interval (`since_advert`: how long ago the last one did). Then another
/// holder of the VIP is VRRP's to elect, not the ARP rule's.
pub fn vrrp_sees_a_router(since_advert: Option<Duration>, master_down: Duration) -> bool {
    since_advert.is_some_and(|d| d <= master_down)
}

/// Another holder of `vip` seen in `arp`? `master`: whether we hold it;
/// `since_advert`: time since the last valid advert from another router, if any;
/// `master_down`: the instance's Master_Down interval.
pub fn judge(
    arp: &ArpFrame,
    own_mac: [u8; 6],
    vip: Ipv4Addr,
    master: bool,
    since_advert: Option<Duration>,
    master_down: Duration,
) -> Verdict {
    if !master || arp.sender_ip != vip || arp.sender_mac == own_mac {
        return Verdict::Ignore;
    }
    if vrrp_sees_a_router(since_advert, master_down) {
        return Verdict::Ignore;
    }
    if arp.sender_mac > own_mac {
        Verdict::Yield
    } else {
        Verdict::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
    const OWN: [u8; 6] = [2, 0, 0, 0, 0, 5];

    fn reply(mac: [u8; 6], ip: Ipv4Addr) -> ArpFrame {
        ArpFrame {
            op: 2,
            sender_mac: mac,
            sender_ip: ip,
            target_ip: Ipv4Addr::UNSPECIFIED,
        }
    }

    #[test]
    fn vrrp_sees_a_router_within_master_down_only() {
        let ms = Duration::from_millis;
        let down = ms(3_600);
        assert!(vrrp_sees_a_router(Some(ms(0)), down));
        assert!(vrrp_sees_a_router(Some(down), down));
        assert!(!vrrp_sees_a_router(Some(down + ms(1)), down));
        assert!(!vrrp_sees_a_router(None, down), "never an advert");
    }

    #[test]
    fn probe_round_trips_through_the_parser() {
        let node = Ipv4Addr::new(10, 0, 0, 11);
        let f = probe_frame(OWN, node, VIP);
        assert_eq!(&f[0..6], &[0xff; 6]);
        let a = parse_arp(&f).unwrap();
        assert_eq!(a.op, 1);
        assert_eq!(a.sender_mac, OWN);
        // From the node's own address: cloud ARP protection passes it (not 0.0.0.0).
        assert_eq!(a.sender_ip, node);
        assert_eq!(a.target_ip, VIP);
        // A gratuitous ARP parses too (sender = target = VIP).
        let g = super::super::announce::garp_frame(OWN, VIP);
        let a = parse_arp(&g).unwrap();
        assert_eq!((a.sender_ip, a.target_ip), (VIP, VIP));
    }

    #[test]
    fn parser_refuses_what_is_not_ethernet_ipv4_arp() {
        let f = probe_frame(OWN, Ipv4Addr::new(10, 0, 0, 11), VIP);
        assert!(parse_arp(&f[..41]).is_none());
        let mut other = f;
        other[12] = 0x08;
        other[13] = 0x00;
        assert!(parse_arp(&other).is_none(), "IPv4, not ARP");
        let mut v6 = f;
        v6[16] = 0x86;
        v6[17] = 0xdd;
        assert!(parse_arp(&v6).is_none(), "ptype");
    }

    #[test]
    fn lower_mac_yields_higher_stays() {
        let md = Duration::from_millis(3610);
        let higher = reply([2, 0, 0, 0, 0, 9], VIP);
        let lower = reply([2, 0, 0, 0, 0, 1], VIP);
        assert_eq!(judge(&higher, OWN, VIP, true, None, md), Verdict::Yield);
        assert_eq!(judge(&lower, OWN, VIP, true, None, md), Verdict::Stay);
    }

    #[test]
    fn ignores_what_vrrp_already_resolves_or_is_not_a_conflict() {
        let md = Duration::from_millis(3610);
        let higher = reply([2, 0, 0, 0, 0, 9], VIP);
        // A router heard recently: VRRP decides.
        assert_eq!(
            judge(&higher, OWN, VIP, true, Some(Duration::from_secs(1)), md),
            Verdict::Ignore
        );
        // Heard long ago: a conflict again.
        assert_eq!(
            judge(&higher, OWN, VIP, true, Some(Duration::from_secs(60)), md),
            Verdict::Yield
        );
        assert_eq!(judge(&higher, OWN, VIP, false, None, md), Verdict::Ignore);
        assert_eq!(
            judge(&reply(OWN, VIP), OWN, VIP, true, None, md),
            Verdict::Ignore,
            "our own frame"
        );
        let other_ip = reply([2, 0, 0, 0, 0, 9], Ipv4Addr::new(10, 0, 0, 9));
        assert_eq!(judge(&other_ip, OWN, VIP, true, None, md), Verdict::Ignore);
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = parse_arp(&bytes);
        }
    }
}
