//! A bridge segment: a bridge namespace and `n` node namespaces, each with `eth0` on the
//! bridge. Node `i` has IPv4 `10.<subnet>.0.<10+i>/24` (`<10+32i>` on
//! [`Segment::ipv4_only_same_tiebreak`]) and IPv6 `fd<subnet>::<10+i>/64` (hex), DAD off.
//! Everything is removed on drop.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cmd::{output_with_stdin, sh};
use crate::netns::{delete, unique_name};

/// Which address families the nodes get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Families {
    Both,
    V4Only,
    V6Only,
}

/// A bridge and the namespaces on it.
#[derive(Debug)]
pub struct Segment {
    /// The node namespaces' names, node `i` at index `i`.
    pub nodes: Vec<String>,
    /// The second octet of the IPv4 addresses (and the IPv6 prefix `fd<subnet>::/64`).
    pub subnet: u8,
    /// How far apart the nodes' IPv4 host numbers are (node `i` at `10 + step * i`).
    host_step: u8,
    bridge: String,
}

impl Segment {
    /// `count` nodes with IPv4 and IPv6 addresses, named after `tag`.
    pub fn new(tag: &str, count: usize, subnet: u8) -> Self {
        Self::build(tag, count, subnet, Families::Both)
    }

    /// `count` nodes with IPv4 addresses only (and IPv6 link-local ones, as any link).
    pub fn ipv4_only(tag: &str, count: usize, subnet: u8) -> Self {
        Self::build(tag, count, subnet, Families::V4Only)
    }

    /// `count` nodes with IPv6 addresses only (and their link-local ones).
    pub fn ipv6_only(tag: &str, count: usize, subnet: u8) -> Self {
        Self::build(tag, count, subnet, Families::V6Only)
    }

    /// `count` nodes (at most 8) with IPv4 addresses only, 32 apart: `10.<subnet>.0.10`,
    /// `.42`, `.74`... Their low five bits are equal, and so is the VRRP address
    /// tie-break keelson derives from them: only the ranks separate equal routers here.
    pub fn ipv4_only_same_tiebreak(tag: &str, count: usize, subnet: u8) -> Self {
        assert!(
            count <= 8,
            "host numbers 10 + 32 i stay under 255 for 8 nodes"
        );
        Self::build_stepped(tag, count, subnet, Families::V4Only, 32)
    }

    fn build(tag: &str, count: usize, subnet: u8, families: Families) -> Self {
        Self::build_stepped(tag, count, subnet, families, 1)
    }

    fn build_stepped(
        tag: &str,
        count: usize,
        subnet: u8,
        families: Families,
        host_step: u8,
    ) -> Self {
        let base = unique_name(tag);
        let seg = Segment {
            nodes: (0..count).map(|i| format!("{base}-n{i}")).collect(),
            subnet,
            host_step,
            bridge: format!("{base}-br"),
        };
        let br = seg.bridge.as_str();
        sh(&["ip", "netns", "add", br]);
        sh(&["ip", "-n", br, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", br, "link", "set", "br0", "up"]);
        for (i, ns) in seg.nodes.iter().enumerate() {
            sh(&["ip", "netns", "add", ns]);
            let port = Self::port(i);
            sh(&[
                "ip", "-n", br, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]);
            sh(&["ip", "-n", br, "link", "set", &port, "master", "br0", "up"]);
            for k in ["all", "default", "eth0"] {
                let dad = format!("net.ipv6.conf.{k}.accept_dad=0");
                sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", &dad]);
            }
            if families != Families::V6Only {
                sh(&["ip", "-n", ns, "addr", "add", &seg.v4(i), "dev", "eth0"]);
            }
            if families != Families::V4Only {
                let v6 = format!("{}/64", seg.v6(i));
                sh(&["ip", "-n", ns, "addr", "add", &v6, "dev", "eth0", "nodad"]);
            }
            sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        seg
    }

    /// The bridge port (in the bridge namespace) of node `i`.
    fn port(i: usize) -> String {
        format!("p{i}")
    }

    /// The bridge namespace's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Node `i`'s IPv4 address with its prefix (`10.<subnet>.0.<10+i>/24`; `<10+32i>` on
    /// [`Segment::ipv4_only_same_tiebreak`]).
    pub fn v4(&self, i: usize) -> String {
        format!("{}/24", self.ip4(i))
    }

    /// Node `i`'s IPv4 address.
    pub fn ip4(&self, i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, self.subnet, 0, 10 + self.host_step * i as u8)
    }

    /// Node `i`'s IPv6 address (no prefix).
    pub fn v6(&self, i: usize) -> String {
        format!("fd{:02x}::{}", self.subnet, 10 + i)
    }

    /// An IPv4 address of this segment that no node has, `10.<subnet>.0.<last>`.
    pub fn vip4(&self, last: u8) -> String {
        format!("10.{}.0.{last}", self.subnet)
    }

    /// Whether node `i` has `address` on `eth0`.
    pub fn holds(&self, i: usize, address: &str) -> bool {
        ns_holds(&self.nodes[i], address)
    }

    /// Waits (up to `limit`) until one node has held `address` alone for `steady`; that node.
    pub fn wait_steady_holder(&self, address: &str, steady: Duration, limit: Duration) -> usize {
        let mut holder = None;
        let mut since = Instant::now();
        crate::wait::wait_for_ok("one VIP holder that stays", limit, || {
            let h = self.holders(address);
            if h.len() != 1 || Some(h[0]) != holder {
                holder = h.first().copied().filter(|_| h.len() == 1);
                since = Instant::now();
            }
            if holder.is_some() && since.elapsed() >= steady {
                Ok(())
            } else {
                Err(format!("holders {h:?}"))
            }
        });
        holder.expect("wait_for_ok returned with a holder")
    }

    /// Watches `nodes` in the background for `address` until [`HolderWatch::stop`]: which
    /// of them held it at any moment (a claim of a few milliseconds included).
    pub fn watch_holders(&self, address: &str, nodes: &[usize]) -> HolderWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, address) = (stop.clone(), address.to_owned());
        let watched: Vec<(usize, String)> =
            nodes.iter().map(|&i| (i, self.nodes[i].clone())).collect();
        let thread = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !flag.load(Ordering::Relaxed) {
                for (i, ns) in &watched {
                    if ns_holds(ns, &address) {
                        seen.insert(*i);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen.into_iter().collect()
        });
        HolderWatch { stop, thread }
    }

    /// The nodes holding `address`.
    pub fn holders(&self, address: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.holds(i, address))
            .collect()
    }

    /// Waits until node `i`, and no other, holds `address`; the time it took (until the
    /// first scan that saw it). Panics naming the holders after `limit`.
    ///
    /// Two scans in a row must agree: one scan reads the nodes one after the other (an
    /// `ip` process each, tens of milliseconds apart on a loaded host), so it can read
    /// the old holder just before a claim and the new one just after, and miss both
    /// holding it through the 200 ms hand-over.
    pub fn wait_sole_holder(&self, i: usize, address: &str, limit: Duration) -> Duration {
        self.wait_stable_sole_holder(address, limit, |h| h == i)
            .unwrap_or_else(|h| {
                panic!(
                    "{address}: expected only node {i} to hold it within {limit:?}, holders {h:?}"
                )
            })
            .1
    }

    /// Waits (up to `limit`) until one of the nodes `among`, and no other node, holds
    /// `address`; that node. Two scans in a row must agree, as in
    /// [`Segment::wait_sole_holder`]: two nodes that claim in the same millisecond both hold
    /// it until one yields, and one scan can read the first just before its claim and the
    /// second just after.
    pub fn wait_sole_holder_among(&self, address: &str, among: &[usize], limit: Duration) -> usize {
        self.wait_stable_sole_holder(address, limit, |h| among.contains(&h))
            .unwrap_or_else(|h| {
                panic!("{address}: expected one of {among:?} alone to hold it within {limit:?}, holders {h:?}")
            })
            .0
    }

    /// Scans until two scans in a row find the same single holder, one that `accept`s;
    /// that holder and the time until the first of the two scans. After `limit`, the
    /// holders of the last scan as the error.
    fn wait_stable_sole_holder(
        &self,
        address: &str,
        limit: Duration,
        accept: impl Fn(usize) -> bool,
    ) -> Result<(usize, Duration), Vec<usize>> {
        let t = Instant::now();
        let mut first_seen: Option<(usize, Duration)> = None;
        loop {
            let h = self.holders(address);
            match (h.as_slice(), first_seen) {
                (&[one], Some((seen, at))) if one == seen => return Ok((one, at)),
                (&[one], _) if accept(one) => {
                    first_seen = Some((one, t.elapsed()));
                    continue;
                }
                _ => first_seen = None,
            }
            if t.elapsed() > limit {
                return Err(h);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts that node `i` stays the sole holder of `address` for `dur`.
    pub fn assert_stable(&self, i: usize, address: &str, dur: Duration) {
        let t = Instant::now();
        while t.elapsed() < dur {
            assert_eq!(self.holders(address), vec![i], "{address}: holders changed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sets node `i`'s port on the bridge up or down: the cable pulled at the switch, while
    /// the node's own `eth0` stays up and keeps its addresses.
    pub fn set_bridge_port(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        sh(&[
            "ip",
            "-n",
            &self.bridge,
            "link",
            "set",
            &Self::port(i),
            state,
        ]);
    }

    /// Sets node `i`'s `eth0` up or down.
    pub fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        sh(&["ip", "-n", &self.nodes[i], "link", "set", "eth0", state]);
    }

    /// Drops every multicast frame at the bridge, counting them (an nftables bridge rule,
    /// as a network that blocks multicast does).
    pub fn drop_multicast(&self) {
        nft(
            &self.bridge,
            "table bridge nomcast {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n    meta pkttype multicast counter drop\n  }\n}\n",
        );
    }

    /// Frames [`Segment::drop_multicast`]'s rule dropped so far.
    pub fn multicast_dropped(&self) -> u64 {
        let text = sh(&[
            "ip",
            "netns",
            "exec",
            &self.bridge,
            "nft",
            "-j",
            "list",
            "table",
            "bridge",
            "nomcast",
        ]);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        doc["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["rule"]["expr"].as_array())
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum()
    }

    /// Cuts nodes `isolated` off from the others at the bridge (their links stay up, as in
    /// a switch or fabric partition); [`Segment::heal`] undoes it.
    pub fn partition(&self, isolated: &[usize]) {
        let set = isolated
            .iter()
            .map(|&i| format!("\"{}\"", Self::port(i)))
            .collect::<Vec<_>>()
            .join(", ");
        nft(
            &self.bridge,
            &format!(
                "table bridge split {{\n  chain forward {{\n    type filter hook forward priority -1; policy accept;\n    iifname {{ {set} }} oifname != {{ {set} }} drop\n    oifname {{ {set} }} iifname != {{ {set} }} drop\n  }}\n}}\n"
            ),
        );
    }

    /// Drops frames from node `from` to node `to` at the bridge, one way only: those that
    /// match `what` (an nftables match such as `ip protocol 112`; empty: every frame, ARP
    /// included). [`Segment::heal_one_way`] undoes it.
    pub fn cut_one_way(&self, from: usize, to: usize, what: &str) {
        nft(
            &self.bridge,
            &format!(
                "table bridge oneway {{\n  chain forward {{\n    type filter hook forward priority -2; policy accept;\n    iifname \"{}\" oifname \"{}\" {what} drop\n  }}\n}}\n",
                Self::port(from),
                Self::port(to)
            ),
        );
    }

    /// Ends a [`Segment::cut_one_way`].
    pub fn heal_one_way(&self) {
        self.delete_bridge_table("oneway");
    }

    /// Ends a [`Segment::partition`].
    pub fn heal(&self) {
        self.delete_bridge_table("split");
    }

    fn delete_bridge_table(&self, table: &str) {
        sh(&[
            "ip",
            "netns",
            "exec",
            &self.bridge,
            "nft",
            "delete",
            "table",
            "bridge",
            table,
        ]);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain([&self.bridge]) {
            delete(ns);
        }
    }
}

/// Loads nftables `rules` in namespace `ns`.
pub fn nft(ns: &str, rules: &str) {
    let out = output_with_stdin(
        Command::new("ip").args(["netns", "exec", ns, "nft", "-f", "-"]),
        rules.as_bytes(),
    );
    assert!(
        out.status.success(),
        "nft in {ns}: {}\n{rules}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether namespace `ns` has `address` on `eth0`. Panics when `ip` fails (a namespace or
/// link gone, `ip` missing): "no holder" must come from a list `ip` printed, never from
/// an `ip` that printed nothing.
pub fn ns_holds(ns: &str, address: &str) -> bool {
    sh(&["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"])
        .split_whitespace()
        .any(|w| w.split('/').next() == Some(address))
}

/// A background watch of who holds an address ([`Segment::watch_holders`]).
#[derive(Debug)]
pub struct HolderWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<usize>>,
}

impl HolderWatch {
    /// Ends the watch: every watched node seen holding the address, in order.
    pub fn stop(self) -> Vec<usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("holder watch panicked")
    }
}
