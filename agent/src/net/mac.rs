//! Ethernet MAC addresses: one type for every place the agent shows or reads one (link
//! listings, DHCP's client hardware address, VRRP's conflict logs and fix hints), so the
//! spelling is the same everywhere: lower-case hex, colon-separated (`fa:16:3e:00:00:01`),
//! as `ip link` and OpenStack's port MACs write it.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// A string that is not six colon-separated hex octets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MAC address {0:?}: expected six colon-separated hex octets (aa:bb:cc:dd:ee:ff)")]
pub struct MacParseError(pub String);

impl FromStr for Mac {
    type Err = MacParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || MacParseError(text.to_string());
        let mut out = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_and_parses_back() {
        let mac = Mac([0xfa, 0x16, 0x3e, 0x00, 0x0a, 0xff]);
        assert_eq!(mac.to_string(), "fa:16:3e:00:0a:ff");
        assert_eq!("fa:16:3e:00:0a:ff".parse::<Mac>(), Ok(mac));
        assert_eq!("FA:16:3E:0:a:FF".parse::<Mac>(), Ok(mac));
    }

    #[test]
    fn rejects_what_is_not_a_mac() {
        for bad in [
            "",
            "fa:16:3e:00:0a",
            "fa:16:3e:00:0a:ff:00",
            "fa:16:3e:00:0a:fg",
            "fa::3e:00:0a:ff",
            "+f:16:3e:00:0a:ff",
            "0fa:16:3e:00:0a:ff",
        ] {
            let err = bad.parse::<Mac>().unwrap_err();
            assert!(
                err.to_string().contains("six colon-separated hex octets"),
                "{bad}: {err}"
            );
        }
    }
}
