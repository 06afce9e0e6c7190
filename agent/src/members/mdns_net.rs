//! The mDNS sockets: 224.0.0.251:5353 and [ff02::fb]:5353 on the node's interface, shared
//! with avahi (SO_REUSEADDR + SO_REUSEPORT), driving [`super::mdns`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::auth::{Keys, Signer, Verifier};
use super::mdns::{self, Announce, Cache, MDNS_PORT, MDNS_V4, Received, Rejected};
use super::{Counters, publish};
use crate::context::AgentContext;

/// The IPv6 mDNS group.
pub const MDNS_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0xfb);

fn shared_socket(domain: Domain, bind: SocketAddr) -> anyhow::Result<Socket> {
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    // avahi (or another agent) may hold 5353 too: both get every multicast datagram.
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if domain == Domain::IPV6 {
        s.set_only_v6(true)?;
    }
    s.bind(&bind.into())
        .with_context(|| format!("binding {bind}"))?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Opens the IPv4 mDNS socket on interface `index` whose IPv4 address is `ifaddr`.
pub fn open_socket(index: u32, ifaddr: Ipv4Addr) -> anyhow::Result<UdpSocket> {
    let bind = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, MDNS_PORT));
    let s = shared_socket(Domain::IPV4, bind)?;
    s.join_multicast_v4_n(&MDNS_V4, &InterfaceIndexOrAddress::Index(index))
        .context("joining 224.0.0.251")?;
    s.set_multicast_if_v4(&ifaddr)?;
    // RFC 6762 §11: sent with TTL 255 so receivers can check it came from the link.
    s.set_multicast_ttl_v4(255)?;
    s.set_multicast_loop_v4(true)?;
    Ok(UdpSocket::from_std(s.into())?)
}

/// Opens the IPv6 mDNS socket on interface `index`.
pub fn open_socket_v6(index: u32) -> anyhow::Result<UdpSocket> {
    let bind = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, MDNS_PORT, 0, 0));
    let s = shared_socket(Domain::IPV6, bind)?;
    s.join_multicast_v6(&MDNS_V6, index)
        .context("joining ff02::fb")?;
    s.set_multicast_if_v6(index)?;
    s.set_multicast_hops_v6(255)?;
    s.set_multicast_loop_v6(true)?;
    Ok(UdpSocket::from_std(s.into())?)
}

/// The sockets of one interface: IPv4 when the node has an IPv4 address, IPv6 when the
/// interface takes it; at least one.
struct Links {
    v4: Option<UdpSocket>,
    v6: Option<UdpSocket>,
    index: u32,
}

impl Links {
    fn open(ifname: &str, addrs: &[IpAddr]) -> anyhow::Result<Self> {
        let index = nix::net::if_::if_nametoindex(ifname)
            .with_context(|| format!("node.json interface {ifname:?}: not found"))?;
        let v4addr = addrs.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            _ => None,
        });
        let v4 = match v4addr {
            Some(a) => Some(open_socket(index, a).with_context(|| format!("mDNS on {ifname}"))?),
            None => None,
        };
        let v6 = match open_socket_v6(index) {
            Ok(s) => Some(s),
            Err(e) if v4.is_some() => {
                tracing::info!(error = %format!("{e:#}"), "members: no IPv6 mDNS on {ifname}");
                None
            }
            Err(e) => return Err(e).with_context(|| format!("mDNS on {ifname} (no IPv4 address)")),
        };
        Ok(Self { v4, v6, index })
    }

    /// Multicasts `bytes` on every family, logging failures: a link that is down for a
    /// moment must not stop discovery.
    async fn send(&self, bytes: &[u8]) {
        if let Some(s) = &self.v4 {
            send(
                s,
                bytes,
                SocketAddr::V4(SocketAddrV4::new(MDNS_V4, MDNS_PORT)),
            )
            .await;
        }
        if let Some(s) = &self.v6 {
            let to = SocketAddr::V6(SocketAddrV6::new(MDNS_V6, MDNS_PORT, 0, self.index));
            send(s, bytes, to).await;
        }
    }

    async fn recv(
        &self,
        b4: &mut [u8],
        b6: &mut [u8],
    ) -> std::io::Result<(usize, SocketAddr, bool)> {
        async fn on(s: Option<&UdpSocket>, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
            match s {
                Some(s) => s.recv_from(buf).await,
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            r = on(self.v4.as_ref(), b4) => r.map(|(n, a)| (n, a, false)),
            r = on(self.v6.as_ref(), b6) => r.map(|(n, a)| (n, a, true)),
        }
    }
}

/// Runs the mDNS transport until `stop`; sends a goodbye on the way out. With `keys`, every
/// announcement is signed afresh (a new time and sequence number each time) and `verifier`
/// decides which records of the others are believed.
pub async fn run(
    ctx: AgentContext,
    stop: CancellationToken,
    counters: &Counters,
    verifier: Arc<Verifier>,
    keys: Option<Arc<Keys>>,
) -> anyhow::Result<()> {
    let me = super::own_member(&ctx);
    let settings = &ctx.cluster.members;
    let expiry = Duration::from_secs(u64::from(settings.expiry_secs.max(1)));
    let renew = Duration::from_secs(u64::from(settings.renew_interval_secs.max(1)));
    let announce = Announce {
        member: me.clone(),
        zone: ctx.cluster.zone(),
        port: ctx.cluster.ignition.tls_port,
        ttl: settings.expiry_secs.max(1),
    };
    let signer = keys.map(|k| Signer::new(k, SystemTime::now()));
    let hello = || announce.packet_signed(announce.ttl, signer.as_ref(), SystemTime::now());
    // Checked once here: the name is the only thing that can make a packet fail.
    hello()?;
    let links = Links::open(&ctx.node.interface, &me.addresses)?;
    let mut cache = Cache::new(&ctx.cluster.zone(), &me.name, expiry).with_verifier(verifier);

    // Startup: announce twice, one second apart (RFC 6762 §8.3), and browse.
    links.send(&hello()?).await;
    links.send(&mdns::browse_query()).await;
    ctx.bus.mark_ready("members");
    publish(&ctx, &me, Vec::new());

    let mut tick = tokio::time::interval(renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut second = Box::pin(tokio::time::sleep(Duration::from_secs(1)));
    let mut last_answer = Instant::now() - Duration::from_secs(10);
    let mut b4 = vec![0u8; 9000];
    let mut b6 = vec![0u8; 9000];
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = &mut second => {
                links.send(&hello()?).await;
                second.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(86400 * 365));
            }
            _ = tick.tick() => {
                links.send(&hello()?).await;
                // Ask too: responders that do not announce periodically (avahi) answer.
                links.send(&mdns::browse_query()).await;
                cache.expire(Instant::now());
                publish(&ctx, &me, cache.members());
            }
            r = links.recv(&mut b4, &mut b6) => {
                let (n, peer, v6) = match r {
                    Ok(r) => r,
                    Err(e) => { tracing::debug!(error = %e, "mdns receive"); continue; }
                };
                counters.packets.fetch_add(1, Ordering::Relaxed);
                let packet = if v6 { &b6[..n] } else { &b4[..n] };
                match cache.receive_from(packet, peer, Instant::now(), SystemTime::now()) {
                    Received::Query(q) => {
                        // RFC 6762 §6.2: no more than one multicast answer per second.
                        if announce.is_asked(&q) && last_answer.elapsed() >= Duration::from_secs(1) {
                            last_answer = Instant::now();
                            links.send(&hello()?).await;
                        }
                    }
                    Received::Response { rejected, incomplete } => {
                        for r in rejected { counters.count(r); }
                        for (inst, host) in incomplete {
                            links.send(&mdns::resolve_query(&inst, host.as_ref())).await;
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
    let goodbye = announce.packet_signed(0, signer.as_ref(), SystemTime::now())?;
    links.send(&goodbye).await;
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
