//! The VIP frontend (docs/proxy.md): while this node holds an API VIP and has a healthy
//! backend, clients of `VIP:6443` reach the proxy.
//!
//! - Where nothing else listens on the port (the appliance image), the proxy binds
//!   `VIP:6443` itself, with `IP_FREEBIND` so the bind does not race VRRP adding the address.
//! - Where a wildcard listener owns the port — kube-apiserver binds `*:6443` on an RHCOS
//!   master — that bind fails with `EADDRINUSE`. Then an nftables rule redirects `VIP:6443`
//!   to the proxy's own frontend port instead (what OpenShift's haproxy-monitor does with
//!   iptables). The rules live in a table of their own, rewritten in one `nft -f`
//!   transaction, and removed when the VIP or the healthy backend goes (the chains stay,
//!   empty: [`nft_script`]), so `VIP:6443` falls back to the local kube-apiserver.
//!
//! The rules are written by the `nft` tool rather than over netlink: nftables' netlink
//! protocol (expressions, sets, transactions) has no maintained, small Rust crate, RHCOS ships
//! `nft`, and the appliance, which has no `nft`, never needs a redirect.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;

use super::Proxy;
use crate::net::nft;

/// The nftables table (family `inet`) that holds keelson's redirects and nothing else.
pub const NFT_TABLE: &str = "keelson_api";

/// [`NFT_TABLE`]'s chains, each named after the `nat` hook it sits on: `prerouting` for
/// connections from other hosts, `output` for this host's own.
const NFT_CHAINS: [&str; 2] = ["prerouting", "output"];

/// The `nft -f` script that makes [`NFT_TABLE`] redirect every address in `redirects` to
/// local port `to_port`: from other hosts (prerouting) and from this host (output). The
/// chains are created if missing and flushed, never deleted, and the rules added, in one
/// transaction. Each chain ends with a rule that looks at conntrack (`ct state new accept`,
/// which changes nothing: the policy accepts too). Connections redirected before keep their
/// translation only while the kernel tracks connections in the network namespace, and it
/// does only while some rule needs it: with the `redirect` rules gone and nothing else
/// using conntrack, the segments of established redirected connections reached the
/// wildcard listener as `VIP:6443` untranslated and were reset (found by
/// `agent/tests/vrrp_handback.rs`: after a VRRP hand-over the old holder's proxy goes on
/// serving the connections the new holder hands back, `vrrp::handback`). The same rule keeps
/// connections tracked from the table's first write on, before any redirect is needed.
pub fn nft_script(redirects: &BTreeSet<SocketAddr>, to_port: u16) -> String {
    let mut s = format!("table inet {NFT_TABLE} {{\n");
    for chain in NFT_CHAINS {
        let _ = writeln!(
            s,
            "\tchain {chain} {{ type nat hook {chain} priority -100; policy accept; }}"
        );
    }
    s.push_str("}\n");
    for chain in NFT_CHAINS {
        let _ = writeln!(s, "flush chain inet {NFT_TABLE} {chain}");
    }
    for chain in NFT_CHAINS {
        for a in redirects {
            let family = if a.is_ipv4() { "ip" } else { "ip6" };
            // Only a connection's opening SYN is redirected. A node that has just taken the
            // VIP over serves it from the wildcard listener (the local kube-apiserver) until
            // this rule lands; where nothing had made the kernel track connections before
            // (conntrack starts with the first table that needs it), the next segment of a
            // connection opened in that moment is taken up mid-stream as a new one, and a
            // plain rule redirected it to the proxy, which knows no such connection and
            // reset it (`bench/api_outage.sh` case `stop`: one request at the takeover in 2
            // of 6 rounds). Unredirected, it stays with the apiserver that accepted it.
            let _ = writeln!(
                s,
                "add rule inet {NFT_TABLE} {chain} {family} daddr {} tcp dport {} tcp flags & (syn | ack) == syn redirect to :{to_port}",
                a.ip(),
                a.port()
            );
        }
        let _ = writeln!(s, "add rule inet {NFT_TABLE} {chain} ct state new accept");
    }
    s
}

/// The `nft -f` script that removes [`NFT_TABLE`] (and nothing if there is none).
pub fn remove_script() -> String {
    format!("table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n")
}

/// How one VIP frontend is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VipMode {
    /// The proxy listens on the VIP address itself.
    Bound,
    /// An nftables rule redirects it to the proxy's frontend port.
    Redirected,
}

/// The VIP frontends this node serves, and how.
#[derive(Debug)]
pub struct VipFrontends {
    redirect_to: u16,
    bound: BTreeSet<SocketAddr>,
    redirected: BTreeSet<SocketAddr>,
    /// The last error logged, so a lasting failure is logged once, not every second.
    last_error: Option<String>,
}

impl VipFrontends {
    /// No VIP frontends yet; redirects go to local port `redirect_to`.
    pub fn new(redirect_to: u16) -> Self {
        Self {
            redirect_to,
            bound: BTreeSet::new(),
            redirected: BTreeSet::new(),
            last_error: None,
        }
    }

    /// Removes the redirect table a previous agent may have left behind (it crashed, or the
    /// node rebooted without its nftables state being flushed). Quiet where there is no `nft`.
    pub async fn remove_stale_redirects(&self) {
        if let Err(e) = nft::apply(&remove_script()).await {
            tracing::debug!(error = %e, "no stale VIP redirects removed");
        }
    }

    /// The VIP frontends served now, and how.
    pub fn active(&self) -> Vec<(SocketAddr, VipMode)> {
        let mut v: Vec<(SocketAddr, VipMode)> = self
            .bound
            .iter()
            .map(|a| (*a, VipMode::Bound))
            .chain(self.redirected.iter().map(|a| (*a, VipMode::Redirected)))
            .collect();
        v.sort();
        v
    }

    /// Serves exactly `want`: binds what can be bound, redirects what another process's
    /// wildcard listener owns, and stops serving the rest. Failures are logged and retried
    /// on the next call.
    pub async fn sync(&mut self, proxy: &Proxy, want: &BTreeSet<SocketAddr>) {
        for a in self.bound.difference(want) {
            proxy.remove_frontend(*a);
        }
        self.bound.retain(|a| want.contains(a));
        let mut redirect: BTreeSet<SocketAddr> =
            self.redirected.intersection(want).copied().collect();
        let mut errors = Vec::new();
        for a in want {
            if self.bound.contains(a) || redirect.contains(a) {
                continue;
            }
            match proxy.add_frontend(*a, true) {
                Ok(_) => {
                    self.bound.insert(*a);
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    redirect.insert(*a);
                }
                Err(e) => errors.push(format!("binding {a}: {e}")),
            }
        }
        if redirect != self.redirected {
            match nft::apply(&nft_script(&redirect, self.redirect_to)).await {
                Ok(()) => {
                    tracing::info!(
                        redirects = ?redirect,
                        to_port = self.redirect_to,
                        "VIP redirects set (the port is another process's)"
                    );
                    self.redirected = redirect;
                }
                Err(e) => errors.push(format!(
                    "redirecting {redirect:?} to :{} (the port is in use): {e}",
                    self.redirect_to
                )),
            }
        }
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        if error.is_some() && error != self.last_error {
            tracing::warn!(error = error.as_deref().unwrap_or_default(), "VIP frontend");
        }
        self.last_error = error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_redirects_keeps_the_chains_and_conntrack() {
        let s = nft_script(&BTreeSet::new(), 9445);
        assert!(!s.contains("delete"), "{s}");
        assert!(s.contains("type nat hook prerouting"), "{s}");
        assert!(s.contains("type nat hook output"), "{s}");
        assert!(!s.contains("redirect"), "{s}");
        assert_eq!(s.matches("ct state new accept").count(), 2, "{s}");
    }

    #[test]
    fn the_stale_table_is_removed_whole() {
        assert_eq!(
            remove_script(),
            "table inet keelson_api\ndelete table inet keelson_api\n"
        );
    }

    #[test]
    fn redirects_both_families_from_outside_and_from_this_host() {
        let want: BTreeSet<SocketAddr> = ["10.0.0.5:6443", "[fd00::5]:6443"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        insta::assert_snapshot!(nft_script(&want, 9445), @r"
        table inet keelson_api {
        	chain prerouting { type nat hook prerouting priority -100; policy accept; }
        	chain output { type nat hook output priority -100; policy accept; }
        }
        flush chain inet keelson_api prerouting
        flush chain inet keelson_api output
        add rule inet keelson_api prerouting ip daddr 10.0.0.5 tcp dport 6443 tcp flags & (syn | ack) == syn redirect to :9445
        add rule inet keelson_api prerouting ip6 daddr fd00::5 tcp dport 6443 tcp flags & (syn | ack) == syn redirect to :9445
        add rule inet keelson_api prerouting ct state new accept
        add rule inet keelson_api output ip daddr 10.0.0.5 tcp dport 6443 tcp flags & (syn | ack) == syn redirect to :9445
        add rule inet keelson_api output ip6 daddr fd00::5 tcp dport 6443 tcp flags & (syn | ack) == syn redirect to :9445
        add rule inet keelson_api output ct state new accept
        ");
    }
}
