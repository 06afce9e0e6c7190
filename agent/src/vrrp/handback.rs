//! Connections across a clean hand-over (docs/vrrp.md): the new holder forwards the TCP
//! segments of connections it did not open to the old holder, which retires the VIP (off its
//! interface, unannounced, but what arrives for it still delivered) and goes on serving them
//! until they end or the window closes.
//!
//! Without it, a connection whose handshake the old holder completed just before hosts
//! switched to the new one is reset by the new holder at its next segment (it has no socket
//! for it), and so is every keep-alive connection the old holder's proxy still drains.
//!
//! The new holder's side is an nftables `netdev` table on the VRRP interface's ingress hook,
//! before the node's IP stack sees the frame: an opening SYN to the VIP records its flow
//! (client address and port) in a set; any other TCP segment to the VIP whose flow is not in
//! the set is sent on to the old holder (`fwd ... to <old holder> device <iface>`: the kernel
//! resolves the old holder's MAC and sends the frame from this node's). It is installed when
//! the old holder says it is leaving (its priority-0 advert) or when this node is about to
//! preempt it, before this node adds the VIP, so no flow opened here is missed.
//! Segments to a port of this node's ephemeral range (`ip_local_port_range`) are never
//! forwarded: they answer connections this node opened *from* the VIP (the port check of
//! [`super::portsec`] does, every 10 s while master), which no client opened and no old
//! holder knows. Forwarded, the port check's SYN-ACKs went to the old holder, the check
//! took the VIP for dropped by the port, and the node gave the VIP up (a VIP move that
//! nothing called for, under a rolling upgrade's load).
//! The old holder's side is in [`crate::net::vip::VipManager::retire`].

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;

use crate::net::nft::{self, NftError};

/// Longest time installing the rules may hold the VRRP runner up.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a backup is about to take the VIP from the router whose advert it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeOver {
    /// It said goodbye (priority 0).
    Leaving,
    /// It advertises a lower priority and this backup preempts.
    Preempted,
}

impl std::fmt::Display for TakeOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TakeOver::Leaving => "leaving",
            TakeOver::Preempted => "we preempt",
        })
    }
}

/// Whether a backup (`preempt`, at `own_priority`) that reads an advert at
/// `advert_priority` from the master is about to take the VIP from it: a goodbye, or a
/// lower priority it preempts (RFC 5798 §6.4.2: an equal or higher one only resets its
/// Master_Down timer).
pub fn takes_over(preempt: bool, own_priority: u8, advert_priority: u8) -> Option<TakeOver> {
    if advert_priority == 0 {
        Some(TakeOver::Leaving)
    } else if preempt && advert_priority < own_priority {
        Some(TakeOver::Preempted)
    } else {
        None
    }
}

/// The nftables table (family `netdev`) of one VRRP instance's forwarding.
pub fn table_name(instance: &str) -> String {
    let safe: String = instance
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("keelson_handback_{safe}")
}

/// The node's ephemeral ports, from `/proc/sys/net/ipv4/ip_local_port_range` (which IPv6
/// uses too): two numbers, low and high.
pub fn parse_local_port_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi)), None) if lo <= hi => Some(lo..=hi),
        _ => None,
    }
}

/// This node's ephemeral ports; the kernel's default when the file cannot be read.
fn local_port_range() -> RangeInclusive<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| parse_local_port_range(&t))
        .unwrap_or(32768..=60999)
}

/// The `nft -f` script that forwards, on `iface`'s ingress, the TCP segments to `vip` of
/// connections whose opening SYN this node did not see to `old_holder`, for `window`
/// (the set of flows opened here forgets each one `window` after its SYN), except those to
/// a port of `local_ports` (answers to connections this node opened from the VIP). It
/// replaces whatever the table held in one transaction.
pub fn forward_script(
    table: &str,
    iface: &str,
    vip: IpAddr,
    old_holder: IpAddr,
    window: Duration,
    local_ports: RangeInclusive<u16>,
) -> String {
    let (family, key) = if vip.is_ipv4() {
        ("ip", "ipv4_addr")
    } else {
        ("ip6", "ipv6_addr")
    };
    let secs = window.as_secs().max(1);
    let (lo, hi) = (local_ports.start(), local_ports.end());
    format!(
        "table netdev {table}\n\
         delete table netdev {table}\n\
         table netdev {table} {{\n\
         \tset opened {{\n\
         \t\ttype {key} . inet_service\n\
         \t\tflags dynamic,timeout\n\
         \t\ttimeout {secs}s\n\
         \t\tsize 65535\n\
         \t}}\n\
         \tchain ingress {{\n\
         \t\ttype filter hook ingress device \"{iface}\" priority -500; policy accept;\n\
         \t\t{family} daddr {vip} tcp flags & (syn | ack) == syn add @opened {{ {family} saddr . tcp sport }} accept\n\
         \t\t{family} daddr {vip} tcp dport != {lo}-{hi} {family} saddr . tcp sport != @opened fwd {family} to {old_holder} device \"{iface}\"\n\
         \t}}\n\
         }}\n"
    )
}

/// The script that removes the table (and nothing if there is none).
pub fn remove_script(table: &str) -> String {
    format!("table netdev {table}\ndelete table netdev {table}\n")
}

/// One instance's forwarding to an old holder, while it lasts.
#[derive(Debug)]
pub struct Handback {
    table: String,
    iface: String,
    vip: IpAddr,
    window: Duration,
    /// The old holder and when the forwarding ends.
    active: Option<(IpAddr, Instant)>,
    /// Whether a failure to install was logged already (the appliance has no `nft`).
    failure_logged: bool,
}

impl Handback {
    /// Forwarding for instance `instance`'s `vip` on `iface`, `window` long each time.
    pub fn new(instance: &str, iface: &str, vip: IpAddr, window: Duration) -> Self {
        Self {
            table: table_name(instance),
            iface: iface.to_owned(),
            vip,
            window,
            active: None,
            failure_logged: false,
        }
    }

    /// The old holder segments go to now, if any.
    pub fn target(&self) -> Option<IpAddr> {
        self.active.map(|(a, _)| a)
    }

    /// When the forwarding ends.
    pub fn ends_at(&self) -> Option<Instant> {
        self.active.map(|(_, t)| t)
    }

    /// Starts (or restarts) forwarding to `old_holder` for the window.
    pub async fn forward_to(&mut self, old_holder: IpAddr) -> Result<(), NftError> {
        let script = forward_script(
            &self.table,
            &self.iface,
            self.vip,
            old_holder,
            self.window,
            local_port_range(),
        );
        match tokio::time::timeout(INSTALL_TIMEOUT, nft::apply(&script)).await {
            Ok(Ok(())) => {
                self.active = Some((old_holder, Instant::now() + self.window));
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(NftError::Spawn(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("nft did not finish within {INSTALL_TIMEOUT:?}"),
            ))),
        }
    }

    /// Logs a failure to install once per run (later ones at debug level).
    pub fn log_failure(&mut self, instance: &str, e: &NftError) {
        if self.failure_logged {
            tracing::debug!("vrrp {instance}: hand-back: {e}");
        } else {
            self.failure_logged = true;
            tracing::warn!(
                "vrrp {instance}: hand-back not installed ({e}): connections the old holder opened are reset here"
            );
        }
    }

    /// Ends the forwarding (also one a crashed agent left): removes the table.
    pub async fn end(&mut self) {
        self.active = None;
        if let Err(e) = nft::apply(&remove_script(&self.table)).await {
            tracing::debug!("hand-back {}: removing: {e}", self.table);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_over_on_goodbye_or_preemption_only() {
        assert_eq!(takes_over(false, 100, 0), Some(TakeOver::Leaving));
        assert_eq!(takes_over(true, 100, 0), Some(TakeOver::Leaving));
        assert_eq!(takes_over(true, 100, 70), Some(TakeOver::Preempted));
        assert_eq!(takes_over(false, 100, 70), None, "no preemption");
        assert_eq!(takes_over(true, 100, 100), None, "equal: no preemption");
        assert_eq!(takes_over(true, 90, 100), None, "the master outranks us");
    }

    #[test]
    fn table_names_are_nft_identifiers() {
        assert_eq!(table_name("api"), "keelson_handback_api");
        assert_eq!(table_name("api-v6"), "keelson_handback_api_v6");
    }

    #[test]
    fn forwards_segments_of_flows_not_opened_here() {
        insta::assert_snapshot!(forward_script(
            "keelson_handback_api",
            "eth0",
            "10.0.0.5".parse().unwrap(),
            "10.0.0.11".parse().unwrap(),
            Duration::from_secs(30),
            32768..=60999,
        ), @r#"
        table netdev keelson_handback_api
        delete table netdev keelson_handback_api
        table netdev keelson_handback_api {
        	set opened {
        		type ipv4_addr . inet_service
        		flags dynamic,timeout
        		timeout 30s
        		size 65535
        	}
        	chain ingress {
        		type filter hook ingress device "eth0" priority -500; policy accept;
        		ip daddr 10.0.0.5 tcp flags & (syn | ack) == syn add @opened { ip saddr . tcp sport } accept
        		ip daddr 10.0.0.5 tcp dport != 32768-60999 ip saddr . tcp sport != @opened fwd ip to 10.0.0.11 device "eth0"
        	}
        }
        "#);
    }

    #[test]
    fn the_local_port_range_is_read_or_refused() {
        assert_eq!(
            parse_local_port_range("32768\t60999\n"),
            Some(32768..=60999)
        );
        assert_eq!(parse_local_port_range("1024 1024"), Some(1024..=1024));
        assert_eq!(parse_local_port_range("60999 32768"), None);
        assert_eq!(parse_local_port_range("32768"), None);
        assert_eq!(parse_local_port_range("1 2 3"), None);
        assert_eq!(parse_local_port_range("a b"), None);
        assert_eq!(parse_local_port_range("1 70000"), None);
    }

    #[test]
    fn ipv6_uses_the_ipv6_keys_and_forward() {
        let s = forward_script(
            "t",
            "eth0",
            "fd00::5".parse().unwrap(),
            "fe80::1".parse().unwrap(),
            Duration::from_secs(30),
            1024..=65535,
        );
        assert!(s.contains("type ipv6_addr . inet_service"), "{s}");
        assert!(s.contains("ip6 daddr fd00::5 tcp dport != 1024-65535 ip6 saddr . tcp sport != @opened fwd ip6 to fe80::1 device \"eth0\""), "{s}");
    }
}
