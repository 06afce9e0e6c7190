//! The node's own address: which of the machine's addresses it is (`cluster.json`
//! `nodeAddress`: the machine networks, narrowed by a hint or an interface), and where it is
//! now. OpenShift's networking moves it under a running agent: `ovs-configuration` takes the
//! NIC's address onto the OVS bridge `br-ex` at boot (the NIC becomes its port), and bonds or
//! VLANs can be set up the same way. The watcher here follows the address to its new link
//! and publishes the node's new identity on the bus; the supervisor restarts the services
//! bound to the link on it (docs/agent.md, "The node's address").
//!
//! What to follow is pure ([`select`], [`follow`]); reading the machine's addresses and
//! listening for netlink's address and link events sit at the edge ([`observe`], [`watch`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipnet::IpNet;
use keelson_cluster::ClusterConfig;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::node::NodeIdentity;

/// One address the machine has: its link's name, and the address with its on-link prefix.
pub type Seen = (String, IpNet);

/// Every address of the machine now (`getifaddrs`), in the kernel's order.
pub fn observe() -> Vec<Seen> {
    let mut out = Vec::new();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return out;
    };
    for ifa in addrs {
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let pair = match (
            addr.as_sockaddr_in(),
            mask.as_sockaddr_in(),
            addr.as_sockaddr_in6(),
            mask.as_sockaddr_in6(),
        ) {
            (Some(a), Some(m), _, _) => {
                Some((IpAddr::V4(a.ip()), u32::from(m.ip()).leading_ones() as u8))
            }
            (_, _, Some(a), Some(m)) => {
                Some((IpAddr::V6(a.ip()), u128::from(m.ip()).leading_ones() as u8))
            }
            _ => None,
        };
        if let Some((ip, prefix)) = pair
            && let Ok(net) = IpNet::new(ip, prefix)
        {
            out.push((ifa.interface_name.clone(), net));
        }
    }
    out
}

/// What the cluster's `nodeAddress` asks for, in words (errors and findings).
pub fn describe_hint(cluster: &ClusterConfig) -> String {
    let na = &cluster.node_address;
    let mut parts = vec![match &na.hint {
        Some(h) => format!("nodeAddress.hint {h}"),
        None => format!(
            "the machine networks {}",
            cluster
                .machine_networks
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }];
    if let Some(i) = &na.interface {
        parts.push(format!("nodeAddress.interface {i}"));
    }
    parts.join(", ")
}

/// Whether `addr` is one of the cluster's VIPs (a holder has them on its link, inside the
/// machine network: never the node's own address).
fn is_vip(cluster: &ClusterConfig, addr: IpAddr) -> bool {
    cluster.api_vips.contains(&addr)
        || cluster.ingress_vips.contains(&addr)
        || cluster.vrrp.instances.iter().any(|i| i.vip == addr)
}

/// Whether `seen` may be the node's address: inside a machine network, what the hint asks
/// for, on the pinned link if one is, not a VIP and not IPv6 link-local.
pub fn eligible(cluster: &ClusterConfig, (link, net): &Seen) -> bool {
    let na = &cluster.node_address;
    let ip = net.addr();
    let link_local = matches!(ip, IpAddr::V6(a) if a.is_unicast_link_local());
    !link_local
        && !is_vip(cluster, ip)
        && cluster.machine_networks.iter().any(|n| n.contains(&ip))
        && na.hint.as_ref().is_none_or(|h| h.matches(net))
        && na.interface.as_ref().is_none_or(|i| i == link)
}

/// The node's link and addresses at start: the first eligible address's link, with every
/// eligible address on it. The error says what was asked for and what the machine has.
pub fn select(cluster: &ClusterConfig, seen: &[Seen]) -> Result<(String, Vec<IpNet>), String> {
    let Some((link, _)) = seen.iter().find(|s| eligible(cluster, s)) else {
        let pin = cluster.node_address.interface.as_deref();
        let has: Vec<String> = seen
            .iter()
            .filter(|(l, n)| l != "lo" && !n.addr().is_loopback())
            .map(|(l, n)| format!("{l} {n}"))
            .collect();
        let why = match pin {
            Some(p) if !seen.iter().any(|(l, _)| l == p) => {
                format!("nodeAddress.interface {p} has no address (or no such link)")
            }
            _ => format!("no address matches {}", describe_hint(cluster)),
        };
        return Err(format!(
            "{why}; the machine has: {}",
            if has.is_empty() {
                "no addresses".to_owned()
            } else {
                has.join(", ")
            }
        ));
    };
    let addrs = seen
        .iter()
        .filter(|s| s.0 == *link && eligible(cluster, s))
        .map(|(_, n)| *n)
        .collect();
    Ok((link.clone(), addrs))
}

/// What the watcher concluded from the machine's addresses now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Follow {
    /// The node's address is where it was, with the same addresses beside it.
    Same,
    /// The node's address is now on `link` (another link, or the same with other
    /// addresses), with these addresses: the node's first address first.
    Moved(String, Vec<IpNet>),
    /// The address cannot be followed; the node keeps its identity, and this says why.
    Problem(String),
}

/// Where the node's address (the first of `addresses`, on `link`) is in `seen` now. An
/// address that is on no link, or moved to one the hint excludes, is a problem: the node
/// never takes another address silently.
pub fn follow(cluster: &ClusterConfig, link: &str, addresses: &[IpNet], seen: &[Seen]) -> Follow {
    let Some(own) = addresses.first() else {
        return Follow::Same;
    };
    let ip = own.addr();
    let here: Vec<&Seen> = seen.iter().filter(|(_, n)| n.addr() == ip).collect();
    let now = match here.iter().find(|(l, _)| l == link).or(here.first()) {
        Some((l, _)) => l.clone(),
        None => {
            return Follow::Problem(format!(
                "the node's address {ip} is on no link (it was on {link})"
            ));
        }
    };
    if let Some(pin) = &cluster.node_address.interface
        && *pin != now
    {
        return Follow::Problem(format!(
            "the node's address {ip} is on {now}, but nodeAddress.interface is {pin}: not following"
        ));
    }
    // The addresses kept in their order (the first of each family is the one the services
    // use), then any new eligible ones on the link.
    let on_link: Vec<IpNet> = seen
        .iter()
        .filter(|s| s.0 == now && (s.1.addr() == ip || eligible(cluster, s)))
        .map(|(_, n)| *n)
        .collect();
    let mut next: Vec<IpNet> = addresses
        .iter()
        .filter_map(|a| on_link.iter().find(|n| n.addr() == a.addr()).copied())
        .collect();
    for n in on_link {
        if !next.iter().any(|a| a.addr() == n.addr()) {
            next.push(n);
        }
    }
    if now == link && next == addresses {
        Follow::Same
    } else {
        Follow::Moved(now, next)
    }
}

/// The watcher's state, for `status` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressWatch {
    /// Why the node's address cannot be followed now, and since when.
    pub problem: Option<(String, Instant)>,
    /// Times the node's identity changed (its address moved to another link, or the
    /// addresses beside it changed).
    pub moves: u64,
}

/// After an event, how long the addresses must stay quiet before they are read: a move is
/// several netlink changes (the address off the NIC, the bridge up, the address onto it).
const SETTLE: Duration = Duration::from_millis(250);

/// A read without an event now and then, in case one was lost (netlink drops events when
/// its socket's buffer is full).
const POLL: Duration = Duration::from_secs(5);

/// Follows the node's address until `stop`: publishes the node's new identity on
/// `bus.node` when it moved, and a problem on `bus.node_address` when it cannot follow.
pub async fn watch(ctx: AgentContext, stop: CancellationToken) {
    let mut events = match subscribe() {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!("node address: no netlink events ({e}); reading every {POLL:?}");
            None
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
            ev = next_event(&mut events) => {
                if !ev {
                    events = None;
                    continue;
                }
                // Let the rest of a move arrive before reading.
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(SETTLE) => break,
                        more = next_event(&mut events) => if !more { break },
                    }
                }
            }
        }
        check(&ctx, &observe());
    }
}

/// One round of the watcher against `seen`.
pub fn check(ctx: &AgentContext, seen: &[Seen]) {
    let node = ctx.current_node();
    match follow(&ctx.cluster, &node.interface, &node.addresses, seen) {
        Follow::Same => clear_problem(ctx),
        Follow::Moved(link, addresses) => {
            tracing::info!(
                "node address: {} now on {link} (was on {}), addresses {:?}: the services bound to the link follow",
                node.addresses
                    .first()
                    .map(|a| a.addr().to_string())
                    .unwrap_or_default(),
                node.interface,
                addresses
            );
            let moved = NodeIdentity {
                interface: link,
                addresses,
                ..(*node).clone()
            };
            clear_problem(ctx);
            ctx.bus.node_address.send_modify(|w| w.moves += 1);
            ctx.bus.node.send_replace(Some(Arc::new(moved)));
        }
        Follow::Problem(why) => {
            let fresh = ctx
                .bus
                .node_address
                .borrow()
                .problem
                .as_ref()
                .is_none_or(|(p, _)| *p != why);
            if fresh {
                tracing::warn!(
                    "node address: {why}; keeping {} on {} ({})",
                    node.addresses
                        .first()
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    node.interface,
                    describe_hint(&ctx.cluster)
                );
                ctx.bus
                    .node_address
                    .send_modify(|w| w.problem = Some((why, Instant::now())));
            }
        }
    }
}

fn clear_problem(ctx: &AgentContext) {
    let had = ctx.bus.node_address.borrow().problem.clone();
    if let Some((why, since)) = had {
        tracing::info!(
            "node address: resolved after {:.1}s ({why})",
            since.elapsed().as_secs_f64()
        );
        ctx.bus.node_address.send_modify(|w| w.problem = None);
    }
}

type Events = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

/// A netlink socket that hears every link and address change.
fn subscribe() -> std::io::Result<Events> {
    use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK};
    use rtnetlink::sys::AsyncSocket as _;
    let (mut conn, _handle, messages) = rtnetlink::new_connection()?;
    let groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    conn.socket_mut()
        .socket_mut()
        .bind(&rtnetlink::sys::SocketAddr::new(0, groups))?;
    tokio::spawn(conn);
    Ok(messages)
}

/// Waits for the next event; `false` when the socket is gone (never returns without one).
async fn next_event(events: &mut Option<Events>) -> bool {
    match events {
        Some(rx) => rx.next().await.is_some(),
        None => std::future::pending().await,
    }
}

/// The identity from the running system, waiting up to `limit` for an address that the
/// hint accepts (a link that comes up a little after the agent, `br-ex` made at boot); says
/// once what it waits for.
pub async fn from_system_waiting(
    cluster: &ClusterConfig,
    root: &std::path::Path,
    metadata: Option<&crate::metadata::Metadata>,
    limit: Duration,
) -> Result<NodeIdentity, crate::node::IdentityError> {
    let started = Instant::now();
    let mut said = false;
    loop {
        match crate::node::from_system(cluster, root, metadata) {
            Err(crate::node::IdentityError::NoAddress { why, .. }) if started.elapsed() < limit => {
                if !said {
                    tracing::warn!("node address: {why}; waiting up to {limit:?}");
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(patch: serde_json::Value) -> ClusterConfig {
        let base = ClusterConfig::from_json(include_bytes!("dns/testdata/cluster.json")).unwrap();
        base.with_merge_patch(&serde_json::json!({"machineNetworks": ["10.0.0.0/16", "fd00::/64"]}))
            .unwrap()
            .with_merge_patch(&patch)
            .unwrap()
    }

    fn seen(list: &[(&str, &str)]) -> Vec<Seen> {
        list.iter()
            .map(|(l, n)| (l.to_string(), n.parse().unwrap()))
            .collect()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_start_takes_the_machine_network_address_unless_a_hint_narrows_it() {
        let c = cluster(serde_json::json!({}));
        let vip = c.api_vips[0].to_string();
        let machine = seen(&[
            ("lo", "127.0.0.1/8"),
            ("eth0", &format!("{vip}/32")),
            ("eth1", "192.168.1.4/24"),
            ("eth0", "10.0.0.11/24"),
            ("eth0", "fe80::1/64"),
            ("eth2", "10.0.9.3/24"),
        ]);
        // The VIP on the link is never the node's address.
        assert_eq!(
            select(&c, &machine).unwrap(),
            ("eth0".into(), nets(&["10.0.0.11/24"]))
        );
        // OpenShift's NODEIP_HINT: an address in the node address's subnet.
        let hinted = cluster(serde_json::json!({"nodeAddress": {"hint": "10.0.9.1"}}));
        assert_eq!(
            select(&hinted, &machine).unwrap(),
            ("eth2".into(), nets(&["10.0.9.3/24"]))
        );
        let pinned = cluster(serde_json::json!({"nodeAddress": {"interface": "eth2"}}));
        assert_eq!(select(&pinned, &machine).unwrap().0, "eth2");
        // Nothing matches: an error naming the hint and what there is, never another address.
        let none = cluster(serde_json::json!({"nodeAddress": {"hint": "10.0.77.1"}}));
        let e = select(&none, &machine).unwrap_err();
        assert!(
            e.contains("nodeAddress.hint 10.0.77.1") && e.contains("eth0 10.0.0.11/24"),
            "{e}"
        );
        let gone = cluster(serde_json::json!({"nodeAddress": {"interface": "br-ex"}}));
        let e = select(&gone, &machine).unwrap_err();
        assert!(
            e.contains("nodeAddress.interface br-ex has no address"),
            "{e}"
        );
    }

    #[test]
    fn the_address_is_followed_onto_br_ex_and_nowhere_else() {
        let c = cluster(serde_json::json!({}));
        let before = seen(&[("eth0", "10.0.0.11/16"), ("eth0", "fd00::11/64")]);
        let own = nets(&["10.0.0.11/16", "fd00::11/64"]);
        assert_eq!(follow(&c, "eth0", &own, &before), Follow::Same);
        // Off the NIC, not yet on the bridge: a problem, the identity kept.
        let between = seen(&[("eth0", "fd00::11/64")]);
        assert!(matches!(
            follow(&c, "eth0", &own, &between),
            Follow::Problem(p) if p.contains("10.0.0.11 is on no link (it was on eth0)")
        ));
        // On br-ex (ovs-configuration), the IPv6 address too, the order kept.
        let after = seen(&[
            ("eth0", "fe80::1/64"),
            ("br-ex", "fd00::11/64"),
            ("br-ex", "10.0.0.11/16"),
        ]);
        assert_eq!(
            follow(&c, "eth0", &own, &after),
            Follow::Moved("br-ex".into(), own.clone())
        );
        // A new address beside it on the same link counts; a VIP added there does not.
        let vip = format!("{}/32", c.api_vips[0]);
        let with_vip = seen(&[("br-ex", "10.0.0.11/16"), ("br-ex", &vip)]);
        assert_eq!(
            follow(&c, "br-ex", &nets(&["10.0.0.11/16"]), &with_vip),
            Follow::Same
        );
        let more = seen(&[("br-ex", "10.0.0.11/16"), ("br-ex", "10.0.0.99/16")]);
        assert_eq!(
            follow(&c, "br-ex", &nets(&["10.0.0.11/16"]), &more),
            Follow::Moved("br-ex".into(), nets(&["10.0.0.11/16", "10.0.0.99/16"]))
        );
        // Pinned to a link: a move elsewhere is a finding, not followed.
        let pinned = cluster(serde_json::json!({"nodeAddress": {"interface": "eth0"}}));
        assert!(matches!(
            follow(&pinned, "eth0", &own, &after),
            Follow::Problem(p) if p.contains("on br-ex, but nodeAddress.interface is eth0")
        ));
        // Another address in the machine network does not replace the node's own.
        let renumbered = seen(&[("eth0", "10.0.0.12/16")]);
        assert!(matches!(
            follow(&c, "eth0", &nets(&["10.0.0.11/16"]), &renumbered),
            Follow::Problem(_)
        ));
    }
}
