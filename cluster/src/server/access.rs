//! Which clients may talk to the server. A served master/worker config holds the
//! cluster's secrets, so by default only the machine networks (and loopback, for local
//! checks) may fetch it.

use std::net::IpAddr;

use ipnet::IpNet;

/// Allowed client networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessList {
    networks: Vec<IpNet>,
    loopback: bool,
}

impl AccessList {
    /// Clients inside `networks`, plus loopback when `loopback`.
    pub fn new(networks: Vec<IpNet>, loopback: bool) -> Self {
        Self { networks, loopback }
    }

    /// Whether `ip` may fetch configs. IPv4-mapped IPv6 addresses (from a dual-stack
    /// socket) are checked as the IPv4 address they carry.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        (self.loopback && ip.is_loopback()) || self.networks.iter().any(|n| n.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        let a = AccessList::new(
            vec!["10.0.0.0/16".parse().unwrap(), "fd00::/64".parse().unwrap()],
            true,
        );
        for ok in [
            "10.0.1.2",
            "127.0.0.1",
            "::1",
            "::ffff:10.0.3.4",
            "fd00::5",
            "127.9.9.9",
        ] {
            assert!(a.allows(ok.parse().unwrap()), "{ok}");
        }
        for no in ["10.1.0.1", "192.168.0.1", "::ffff:192.168.0.1", "fd01::1"] {
            assert!(!a.allows(no.parse().unwrap()), "{no}");
        }
        let strict = AccessList::new(vec!["10.0.0.0/8".parse().unwrap()], false);
        assert!(!strict.allows("127.0.0.1".parse().unwrap()));
        assert!(strict.allows("10.2.3.4".parse().unwrap()));
    }
}
