//! VRRP advertisement codec: VRRPv3 (RFC 5798, IPv4 and IPv6, centisecond intervals,
//! checksum over an IP pseudo-header) and VRRPv2 (RFC 3768, IPv4, whole-second intervals,
//! `auth_type` none or simple password, checksum over the VRRP message only).
//!
//! Pure: bytes in, [`Advert`] out and back. The IP header is not part of the input; the
//! caller passes the source and destination addresses (needed for the v3 pseudo-header).
//! Hand-written because no maintained crate covers both versions with the pseudo-header.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol number of VRRP.
pub const PROTO_VRRP: u8 = 112;
/// IPv4 multicast group of VRRP.
pub const GROUP_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// IPv6 multicast group of VRRP.
pub const GROUP_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// The only advertisement message type.
const TYPE_ADVERT: u8 = 1;
/// Length of the fixed VRRP header.
const HEADER_LEN: usize = 8;
/// Length of the VRRPv2 authentication data.
const AUTH_LEN: usize = 8;

/// VRRP protocol version of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// RFC 3768.
    V2,
    /// RFC 5798.
    V3,
}

/// VRRPv2 authentication (RFC 3768 §5.3.6; type 2, IP AH, is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Auth {
    /// `auth_type` 0: no authentication.
    None,
    /// `auth_type` 1: simple text password, NUL-padded to 8 bytes.
    Pass([u8; 8]),
}

impl Auth {
    /// A simple-password auth from a password of at most 8 bytes (longer is truncated,
    /// as keepalived does; `cluster.json` checking already rejects it).
    pub fn pass(password: &str) -> Self {
        let mut data = [0u8; 8];
        let bytes = password.as_bytes();
        let n = bytes.len().min(8);
        data[..n].copy_from_slice(&bytes[..n]);
        Auth::Pass(data)
    }
}

/// One VRRP advertisement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Advert {
    /// Version on the wire.
    pub version: Version,
    /// Virtual router ID.
    pub vrid: u8,
    /// Sender's priority (0: the master is leaving, 255: address owner).
    pub priority: u8,
    /// Advertisement interval in centiseconds. v3: 12 bits; v2: a whole number of seconds
    /// (multiple of 100, at most 255 s) stored in centiseconds too so callers see one unit.
    pub interval_cs: u16,
    /// The virtual addresses (all of the packet's family).
    pub addresses: Vec<IpAddr>,
    /// v2 authentication; always [`Auth::None`] for v3.
    pub auth: Auth,
}

/// Why a packet is not a valid advertisement. Each variant maps to a drop counter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Fewer bytes than the fixed header or than the address count needs.
    #[error("VRRP packet too short: {len} bytes, need {need}")]
    Short {
        /// Bytes received.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// More bytes than the header and address count account for.
    #[error("VRRP packet too long: {len} bytes, expected {expected} for {count} addresses")]
    Long {
        /// Bytes received.
        len: usize,
        /// Bytes expected.
        expected: usize,
        /// The address count field.
        count: u8,
    },
    /// The version nibble is neither 2 nor 3.
    #[error("VRRP version {0}: expected 2 or 3")]
    Version(u8),
    /// Version 2 over IPv6 (RFC 3768 is IPv4-only).
    #[error("VRRP version 2 over IPv6: expected version 3")]
    V2OverIpv6,
    /// The type nibble is not 1 (advertisement).
    #[error("VRRP type {0}: expected 1 (advertisement)")]
    Type(u8),
    /// The address count is zero.
    #[error("VRRP address count 0: expected at least one address")]
    NoAddresses,
    /// The checksum does not match.
    #[error("VRRP checksum {got:#06x}: expected {expected:#06x}")]
    Checksum {
        /// The checksum in the packet.
        got: u16,
        /// The checksum computed over the packet.
        expected: u16,
    },
    /// A v2 `auth_type` other than 0 or 1.
    #[error("VRRPv2 auth_type {0}: expected 0 (none) or 1 (simple password)")]
    AuthType(u8),
    /// The advertisement interval is zero.
    #[error("VRRP advertisement interval 0: expected at least 1")]
    ZeroInterval,
    /// Source and destination are of different families.
    #[error("VRRP packet from {src} to {dst}: address families differ")]
    MixedFamilies {
        /// Source address.
        src: IpAddr,
        /// Destination address.
        dst: IpAddr,
    },
}

/// Why an advert cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// An address of the wrong family, or a v2 advert over IPv6.
    #[error("VRRP address {0} does not match the packet's family or version")]
    Family(IpAddr),
    /// No addresses, or more than 255.
    #[error("VRRP address count {0}: expected 1..=255")]
    Count(usize),
    /// Interval not representable in the version's field.
    #[error("VRRP interval {0} cs: expected 1..=4095 cs (v3) or 1..=255 whole seconds (v2)")]
    Interval(u16),
}

fn addr_len(v6: bool) -> usize {
    if v6 { 16 } else { 4 }
}

/// Parses a VRRP message (the IP payload) received from `src` to `dst`, checking the
/// length, version, type and checksum. Does not check TTL, VRID, auth or addresses against
/// any configuration: the caller does, and counts each failure apart.
pub fn parse(bytes: &[u8], src: IpAddr, dst: IpAddr) -> Result<Advert, CodecError> {
    if src.is_ipv6() != dst.is_ipv6() {
        return Err(CodecError::MixedFamilies { src, dst });
    }
    let v6 = src.is_ipv6();
    if bytes.len() < HEADER_LEN {
        return Err(CodecError::Short {
            len: bytes.len(),
            need: HEADER_LEN,
        });
    }
    let version = match bytes[0] >> 4 {
        2 => Version::V2,
        3 => Version::V3,
        other => return Err(CodecError::Version(other)),
    };
    let kind = bytes[0] & 0x0f;
    if kind != TYPE_ADVERT {
        return Err(CodecError::Type(kind));
    }
    if version == Version::V2 && v6 {
        return Err(CodecError::V2OverIpv6);
    }
    let count = bytes[3];
    if count == 0 {
        return Err(CodecError::NoAddresses);
    }
    let alen = addr_len(v6);
    let expected =
        HEADER_LEN + usize::from(count) * alen + if version == Version::V2 { AUTH_LEN } else { 0 };
    if bytes.len() < expected {
        return Err(CodecError::Short {
            len: bytes.len(),
            need: expected,
        });
    }
    if bytes.len() > expected {
        return Err(CodecError::Long {
            len: bytes.len(),
            expected,
            count,
        });
    }
    let got = u16::from_be_bytes([bytes[6], bytes[7]]);
    let expected_sum = match version {
        Version::V2 => checksum(&[bytes], 6),
        Version::V3 => checksum(&[&pseudo_header(src, dst, bytes.len()), bytes], 40 + 6),
    };
    // A correct checksum makes the sum with the field zeroed equal to the field.
    if got != expected_sum {
        return Err(CodecError::Checksum {
            got,
            expected: expected_sum,
        });
    }
    let (interval_cs, auth) = match version {
        Version::V2 => {
            let auth = match bytes[4] {
                0 => Auth::None,
                1 => {
                    let mut data = [0u8; 8];
                    data.copy_from_slice(&bytes[expected - AUTH_LEN..]);
                    Auth::Pass(data)
                }
                other => return Err(CodecError::AuthType(other)),
            };
            (u16::from(bytes[5]) * 100, auth)
        }
        Version::V3 => (
            u16::from_be_bytes([bytes[4], bytes[5]]) & 0x0fff,
            Auth::None,
        ),
    };
    if interval_cs == 0 {
        return Err(CodecError::ZeroInterval);
    }
    let addresses = bytes[HEADER_LEN..HEADER_LEN + usize::from(count) * alen]
        .chunks_exact(alen)
        .map(|c| {
            if v6 {
                let mut a = [0u8; 16];
                a.copy_from_slice(c);
                IpAddr::V6(Ipv6Addr::from(a))
            } else {
                IpAddr::V4(Ipv4Addr::new(c[0], c[1], c[2], c[3]))
            }
        })
        .collect();
    Ok(Advert {
        version,
        vrid: bytes[1],
        priority: bytes[2],
        interval_cs,
        addresses,
        auth,
    })
}

/// Encodes `advert` as sent from `src` to `dst` (both needed for the v3 checksum).
pub fn encode(advert: &Advert, src: IpAddr, dst: IpAddr) -> Result<Vec<u8>, EncodeError> {
    let v6 = src.is_ipv6();
    if dst.is_ipv6() != v6 {
        return Err(EncodeError::Family(dst));
    }
    if advert.version == Version::V2 && v6 {
        return Err(EncodeError::Family(src));
    }
    let count = advert.addresses.len();
    if count == 0 || count > 255 {
        return Err(EncodeError::Count(count));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + count * addr_len(v6) + AUTH_LEN);
    let version_nibble = match advert.version {
        Version::V2 => 2u8,
        Version::V3 => 3u8,
    };
    out.push((version_nibble << 4) | TYPE_ADVERT);
    out.push(advert.vrid);
    out.push(advert.priority);
    out.push(count as u8);
    match advert.version {
        Version::V2 => {
            let secs = advert.interval_cs / 100;
            if !advert.interval_cs.is_multiple_of(100) || secs == 0 || secs > 255 {
                return Err(EncodeError::Interval(advert.interval_cs));
            }
            out.push(match advert.auth {
                Auth::None => 0,
                Auth::Pass(_) => 1,
            });
            out.push(secs as u8);
        }
        Version::V3 => {
            if advert.interval_cs == 0 || advert.interval_cs > 0x0fff {
                return Err(EncodeError::Interval(advert.interval_cs));
            }
            out.extend_from_slice(&advert.interval_cs.to_be_bytes());
        }
    }
    out.extend_from_slice(&[0, 0]);
    for a in &advert.addresses {
        match (a, v6) {
            (IpAddr::V4(a), false) => out.extend_from_slice(&a.octets()),
            (IpAddr::V6(a), true) => out.extend_from_slice(&a.octets()),
            _ => return Err(EncodeError::Family(*a)),
        }
    }
    if advert.version == Version::V2 {
        match advert.auth {
            Auth::None => out.extend_from_slice(&[0; AUTH_LEN]),
            Auth::Pass(data) => out.extend_from_slice(&data),
        }
    }
    let sum = match advert.version {
        Version::V2 => checksum(&[&out], usize::MAX),
        Version::V3 => checksum(&[&pseudo_header(src, dst, out.len()), &out], usize::MAX),
    };
    out[6..8].copy_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// The IP pseudo-header of RFC 5798 §5.2.8 (as for UDP/ICMPv6), padded to 40 bytes so
/// the checksum field's offset in the concatenation is fixed (zeros do not change the sum).
fn pseudo_header(src: IpAddr, dst: IpAddr, len: usize) -> [u8; 40] {
    let mut p = [0u8; 40];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            // IPv4: src(4) dst(4) zero(1) proto(1) length(2).
            p[28..32].copy_from_slice(&s.octets());
            p[32..36].copy_from_slice(&d.octets());
            p[37] = PROTO_VRRP;
            p[38..40].copy_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            // IPv6: src(16) dst(16) length(4) zero(3) next header(1).
            p[..16].copy_from_slice(&s.octets());
            p[16..32].copy_from_slice(&d.octets());
            p[32..36].copy_from_slice(&(len as u32).to_be_bytes());
            p[39] = PROTO_VRRP;
        }
        // Mixed families are rejected before we get here; a zero header is harmless.
        _ => {}
    }
    p
}

/// Internet checksum (RFC 1071) over the concatenation of `parts` (each of even length
/// except possibly the last), treating the 16-bit word at byte offset `skip` (within the
/// concatenation) as zero.
fn checksum(parts: &[&[u8]], skip: usize) -> u16 {
    let mut sum: u32 = 0;
    let mut offset = 0usize;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            if offset != skip {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            offset += 2;
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
            offset += 1;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A VRRPv2 advert laid out by hand from RFC 3768 §5.1 (the interop test checks the
    /// real keepalived): vrid 51, prio 100, 1 address 192.168.1.10, auth PASS "secret", 1 s.
    #[test]
    fn parses_keepalived_v2_pass() {
        let mut pkt = vec![
            0x21, 51, 100, 1, 1, 1, 0, 0, 192, 168, 1, 10, b's', b'e', b'c', b'r', b'e', b't', 0, 0,
        ];
        let sum = checksum(&[&pkt], usize::MAX);
        pkt[6..8].copy_from_slice(&sum.to_be_bytes());
        let a = parse(&pkt, v4("192.168.1.2"), IpAddr::V4(GROUP_V4)).unwrap();
        assert_eq!(a.version, Version::V2);
        assert_eq!(a.vrid, 51);
        assert_eq!(a.priority, 100);
        assert_eq!(a.interval_cs, 100);
        assert_eq!(a.addresses, vec![v4("192.168.1.10")]);
        assert_eq!(a.auth, Auth::pass("secret"));
        // And we encode the same bytes.
        assert_eq!(
            encode(&a, v4("192.168.1.2"), IpAddr::V4(GROUP_V4)).unwrap(),
            pkt
        );
    }

    #[test]
    fn v3_checksum_covers_pseudo_header() {
        let a = Advert {
            version: Version::V3,
            vrid: 7,
            priority: 40,
            interval_cs: 10,
            addresses: vec![v4("10.0.0.5")],
            auth: Auth::None,
        };
        let src = v4("10.0.0.11");
        let dst = IpAddr::V4(GROUP_V4);
        let bytes = encode(&a, src, dst).unwrap();
        assert_eq!(bytes.len(), 12);
        assert_eq!(bytes[0], 0x31);
        assert_eq!(&bytes[4..6], &[0, 10]);
        assert_eq!(parse(&bytes, src, dst).unwrap(), a);
        // Same bytes from another source: the pseudo-header differs, so the checksum fails.
        let err = parse(&bytes, v4("10.0.0.12"), dst).unwrap_err();
        assert!(matches!(err, CodecError::Checksum { .. }), "{err}");
        // Verify the sum the RFC way: the whole including the field sums to 0xffff.
        let ph = pseudo_header(src, dst, bytes.len());
        assert_eq!(checksum(&[&ph, &bytes], usize::MAX), 0);
    }

    #[test]
    fn v6_round_trip_and_v2_over_v6_rejected() {
        let src: IpAddr = "fe80::1".parse().unwrap();
        let dst = IpAddr::V6(GROUP_V6);
        let a = Advert {
            version: Version::V3,
            vrid: 9,
            priority: 255,
            interval_cs: 4095,
            addresses: vec!["fd00::5".parse().unwrap(), "fd00::6".parse().unwrap()],
            auth: Auth::None,
        };
        let bytes = encode(&a, src, dst).unwrap();
        assert_eq!(bytes.len(), 8 + 32);
        assert_eq!(parse(&bytes, src, dst).unwrap(), a);
        let mut v2 = bytes.clone();
        v2[0] = 0x21;
        assert_eq!(parse(&v2, src, dst), Err(CodecError::V2OverIpv6));
    }

    #[test]
    fn errors_name_the_problem() {
        let src = v4("10.0.0.11");
        let dst = IpAddr::V4(GROUP_V4);
        let good = encode(
            &Advert {
                version: Version::V3,
                vrid: 1,
                priority: 100,
                interval_cs: 100,
                addresses: vec![v4("10.0.0.5")],
                auth: Auth::None,
            },
            src,
            dst,
        )
        .unwrap();
        let e = |bytes: &[u8]| parse(bytes, src, dst).unwrap_err();
        assert_eq!(e(&good[..5]), CodecError::Short { len: 5, need: 8 });
        assert_eq!(e(&good[..10]), CodecError::Short { len: 10, need: 12 });
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            e(&long),
            CodecError::Long {
                len: 13,
                expected: 12,
                count: 1
            }
        );
        let mut bad = good.clone();
        bad[0] = 0x41;
        assert_eq!(e(&bad), CodecError::Version(4));
        bad[0] = 0x32;
        assert_eq!(e(&bad), CodecError::Type(2));
        let mut bad = good.clone();
        bad[3] = 0;
        assert_eq!(e(&bad), CodecError::NoAddresses);
        bad[3] = 2;
        assert_eq!(e(&bad), CodecError::Short { len: 12, need: 16 });
        let mut bad = good.clone();
        bad[7] ^= 1;
        assert!(
            e(&bad).to_string().starts_with("VRRP checksum"),
            "{}",
            e(&bad)
        );
        assert!(matches!(
            parse(&good, src, IpAddr::V6(GROUP_V6)),
            Err(CodecError::MixedFamilies { .. })
        ));
    }

    #[test]
    fn encode_rejects_bad_interval_and_family() {
        let mut a = Advert {
            version: Version::V2,
            vrid: 1,
            priority: 1,
            interval_cs: 150,
            addresses: vec![v4("10.0.0.5")],
            auth: Auth::None,
        };
        let src = v4("10.0.0.1");
        let dst = IpAddr::V4(GROUP_V4);
        assert_eq!(encode(&a, src, dst), Err(EncodeError::Interval(150)));
        a.version = Version::V3;
        a.interval_cs = 4096;
        assert_eq!(encode(&a, src, dst), Err(EncodeError::Interval(4096)));
        a.interval_cs = 100;
        a.addresses = vec!["fd00::1".parse().unwrap()];
        assert!(matches!(encode(&a, src, dst), Err(EncodeError::Family(_))));
        a.addresses.clear();
        assert_eq!(encode(&a, src, dst), Err(EncodeError::Count(0)));
    }

    fn arb_advert() -> impl Strategy<Value = (Advert, IpAddr, IpAddr)> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<u8>(),
            any::<u8>(),
            1u16..=4095,
            prop::collection::vec(any::<u128>(), 1..20),
            prop::option::of(any::<[u8; 8]>()),
            any::<u128>(),
            any::<u128>(),
        )
            .prop_map(|(v6, v3, vrid, priority, iv, addrs, pass, s, d)| {
                let v3 = v3 || v6;
                let to_ip = |x: u128| {
                    if v6 {
                        IpAddr::V6(Ipv6Addr::from(x))
                    } else {
                        IpAddr::V4(Ipv4Addr::from(x as u32))
                    }
                };
                let advert = Advert {
                    version: if v3 { Version::V3 } else { Version::V2 },
                    vrid,
                    priority,
                    interval_cs: if v3 { iv } else { (iv % 255 + 1) * 100 },
                    addresses: addrs.into_iter().map(to_ip).collect(),
                    auth: match (v3, pass) {
                        (false, Some(p)) => Auth::Pass(p),
                        _ => Auth::None,
                    },
                };
                (advert, to_ip(s), to_ip(d))
            })
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn round_trip((advert, src, dst) in arb_advert()) {
            let bytes = encode(&advert, src, dst).unwrap();
            prop_assert_eq!(parse(&bytes, src, dst).unwrap(), advert);
        }

        #[test]
        fn any_single_bit_flip_is_caught_or_harmless((advert, src, dst) in arb_advert(), bit in any::<usize>()) {
            let mut bytes = encode(&advert, src, dst).unwrap();
            let bit = bit % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            // A flipped bit never parses back to the original advert.
            if let Ok(parsed) = parse(&bytes, src, dst) { prop_assert_ne!(parsed, advert) }
        }

        #[test]
        fn never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200), v6 in any::<bool>()) {
            let (src, dst) = if v6 {
                ("fe80::1".parse().unwrap(), IpAddr::V6(GROUP_V6))
            } else {
                (v4("10.0.0.1"), IpAddr::V4(GROUP_V4))
            };
            let _ = parse(&bytes, src, dst);
        }
    }
}
