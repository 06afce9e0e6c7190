//! The mDNS socket: 224.0.0.251:5353 on the node's interface, shared with avahi
//! (SO_REUSEADDR + SO_REUSEPORT), driving [`super::mdns`].

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::mdns::{self, Announce, Cache, MDNS_PORT, MDNS_V4, Received, Rejected};
use super::{Counters, publish};
use crate::context::AgentContext;

/// Opens the mDNS socket on `ifname` whose IPv4 address is `ifaddr`.
pub fn open_socket(ifname: &str, ifaddr: Ipv4Addr) -> anyhow::Result<UdpSocket> {
    let index = nix::net::if_::if_nametoindex(ifname)
        .with_context(|| format!("interface {ifname:?}: not found"))?;
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // avahi (or another agent) may hold 5353 too: both get every multicast datagram.
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, MDNS_PORT)).into())
        .context("binding 0.0.0.0:5353")?;
    s.join_multicast_v4_n(&MDNS_V4, &InterfaceIndexOrAddress::Index(index))
        .with_context(|| format!("joining 224.0.0.251 on {ifname}"))?;
    s.set_multicast_if_v4(&ifaddr)?;
    // RFC 6762 §11: sent with TTL 255 so receivers can check it came from the link.
    s.set_multicast_ttl_v4(255)?;
    s.set_multicast_loop_v4(true)?;
    s.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(s.into())?)
}

/// Runs the mDNS transport until `stop`; sends a goodbye on the way out.
pub async fn run(
    ctx: AgentContext,
    stop: CancellationToken,
    counters: &Counters,
) -> anyhow::Result<()> {
    let me = super::own_member(&ctx);
    let ifaddr = me
        .addresses
        .iter()
        .find_map(|a| match a {
            std::net::IpAddr::V4(v4) => Some(*v4),
            _ => None,
        })
        .context("node.json addresses: expected an IPv4 address for mDNS")?;
    let settings = &ctx.cluster.members;
    let expiry = Duration::from_secs(u64::from(settings.expiry_secs.max(1)));
    let renew = Duration::from_secs(u64::from(settings.renew_interval_secs.max(1)));
    let announce = Announce {
        member: me.clone(),
        zone: ctx.cluster.zone(),
        port: ctx.cluster.ignition.tls_port,
        ttl: settings.expiry_secs.max(1),
    };
    let hello = announce.packet(announce.ttl)?;
    let goodbye = announce.packet(0)?;
    let sock = open_socket(&ctx.node.interface, ifaddr)?;
    let group = SocketAddr::V4(SocketAddrV4::new(MDNS_V4, MDNS_PORT));
    let mut cache = Cache::new(&ctx.cluster.zone(), &me.name, expiry);

    // Startup: announce twice, one second apart (RFC 6762 §8.3), and browse.
    send(&sock, &hello, group).await;
    send(&sock, &mdns::browse_query(), group).await;
    ctx.bus.mark_ready("members");
    publish(&ctx, &me, Vec::new());

    let mut tick = tokio::time::interval(renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut second = Box::pin(tokio::time::sleep(Duration::from_secs(1)));
    let mut last_answer = Instant::now() - Duration::from_secs(10);
    let mut buf = vec![0u8; 9000];
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = &mut second => {
                send(&sock, &hello, group).await;
                second.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(86400 * 365));
            }
            _ = tick.tick() => {
                send(&sock, &hello, group).await;
                // Ask too: responders that do not announce periodically (avahi) answer.
                send(&sock, &mdns::browse_query(), group).await;
                cache.expire(Instant::now());
                publish(&ctx, &me, cache.members());
            }
            r = sock.recv_from(&mut buf) => {
                let (n, peer) = match r {
                    Ok(r) => r,
                    Err(e) => { tracing::debug!(error = %e, "mdns receive"); continue; }
                };
                counters.packets.fetch_add(1, Ordering::Relaxed);
                match cache.receive(&buf[..n], peer.port(), Instant::now()) {
                    Received::Query(q) => {
                        // RFC 6762 §6.2: no more than one multicast answer per second.
                        if announce.is_asked(&q) && last_answer.elapsed() >= Duration::from_secs(1) {
                            last_answer = Instant::now();
                            send(&sock, &hello, group).await;
                        }
                    }
                    Received::Response { rejected, incomplete } => {
                        for r in rejected { counters.count(r); }
                        for (inst, host) in incomplete {
                            send(&sock, &mdns::resolve_query(&inst, host.as_ref()), group).await;
                        }
                        cache.expire(Instant::now());
                        publish(&ctx, &me, cache.members());
                    }
                    Received::Dropped(r) => counters.count(r),
                }
            }
        }
    }
    // Goodbye: TTL 0 so the others drop us now rather than at expiry (RFC 6762 §10.1).
    let _ = sock.send_to(&goodbye, group).await;
    Ok(())
}

/// Sends, logging failures: a link that is down for a moment must not stop discovery.
async fn send(sock: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    if let Err(e) = sock.send_to(bytes, to).await {
        tracing::debug!(error = %e, "mdns send");
    }
}

impl Counters {
    fn count(&self, r: Rejected) {
        let c = match r {
            Rejected::Malformed => &self.malformed,
            Rejected::BadSourcePort => &self.bad_source_port,
            Rejected::Bogus => &self.bogus,
            Rejected::OtherCluster => &self.other_cluster,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}
