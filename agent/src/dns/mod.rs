//! The cluster DNS server: authoritative zone plus forwarding (docs/dns.md).
//!
//! - [`zone`]: the cluster zone as data (`api`, `api-int`, `*.apps`, node names, the etcd
//!   names of [`etcd`]).
//! - [`handler`]: one request in, one decision out (reply, forward, drop); all the
//!   malformed-input rules.
//! - [`wire`] and [`answer`]: the plain query read in place, the zone's answer written.
//! - [`forward`]: upstreams in order with timeout/fallback and a TTL-respecting cache.
//! - [`server`]: the UDP and TCP loops and their counters ([`udp`]: batched
//!   `recvmmsg`/`sendmmsg` for the UDP one).
//! - [`resolv`]: `/etc/resolv.conf` on the appliance.
//!
//! The wire format is hickory-proto's. The I/O loops are our own rather than
//! hickory-server's `Server`: it spawns a task per UDP query and drops undecodable packets
//! without a hook to count them, while we answer the zone inline on one thread (the NSD
//! bench) and count every drop and FORMERR for `status`.

pub mod answer;
pub mod etcd;
pub mod forward;
pub mod handler;
pub mod resolv;
pub mod server;
pub mod udp;
pub mod wire;
pub mod zone;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use keelson_cluster::ClusterConfig;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::member::Member;
use forward::{Forwarder, UPSTREAM_TIMEOUT};
use server::Shared;
use zone::Zone;

/// `keelson-agent dns`: run the DNS server alone.
#[derive(Debug, clap::Args)]
pub struct DnsArgs {
    /// cluster.json.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Address to answer on (UDP and TCP; port 0 picks one, printed on stdout).
    #[arg(long, default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// A JSON file with the member list (array of members).
    #[arg(long)]
    pub members: Option<PathBuf>,
    /// Upstream resolver (repeat for more); tried after cluster.json's.
    #[arg(long = "upstream")]
    pub upstreams: Vec<SocketAddr>,
    /// Serve from one thread (a current-thread runtime), as the benchmark pins it.
    #[arg(long)]
    pub single_thread: bool,
}

/// Runs `keelson-agent dns`.
pub async fn cli(args: DnsArgs) -> anyhow::Result<()> {
    if !args.single_thread {
        return serve_cli(args).await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("dns".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(serve_cli(args)));
            let _ = tx.send(result);
        })?;
    rx.await.context("dns thread ended without a result")?
}

async fn serve_cli(args: DnsArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.cluster)
        .with_context(|| format!("reading {}", args.cluster.display()))?;
    let cluster = ClusterConfig::from_json(&bytes)?;
    let members: Vec<Member> = match &args.members {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: expected a JSON array of members", path.display()))?
        }
        None => Vec::new(),
    };
    let zone = build_zone(&cluster, &members)?;
    let (_zone_tx, zone_rx) = watch::channel(Arc::new(zone));
    let mut upstreams = cluster.dns.upstreams.clone();
    upstreams.extend(args.upstreams.iter().copied());
    let shared = Shared::new(
        zone_rx,
        Arc::new(Forwarder::new(upstreams, UPSTREAM_TIMEOUT)),
    );
    let stop = CancellationToken::new();
    let bound = listen(args.listen, &shared, &stop).await?;
    println!("keelson-agent dns: listening on {bound}");
    crate::signals::cancel_on_stop_signal(stop.clone())?;
    stop.cancelled().await;
    Ok(())
}

/// Builds the zone from the configuration and the members.
pub fn build_zone(cluster: &ClusterConfig, members: &[Member]) -> anyhow::Result<Zone> {
    let zone = Zone::new(
        &cluster.zone(),
        cluster.dns.ttl,
        &cluster.api_vips,
        &cluster.ingress_vips,
        members,
    )?;
    let etcd = cluster.etcd_records();
    Ok(if etcd.enabled {
        zone.with_etcd(members, etcd.masters)
    } else {
        zone
    })
}

/// Binds UDP and TCP on `addr` (the same port for both, even when `addr` has port 0)
/// and spawns the loops; returns the bound address.
pub async fn listen(
    addr: SocketAddr,
    shared: &Shared,
    stop: &CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let mut last_err = None;
    // With port 0 the UDP port the kernel picks may be taken for TCP: retry a few times.
    for _ in 0..10 {
        let udp = crate::net::listen::udp_one_family(addr)
            .with_context(|| format!("binding UDP {addr}"))?;
        if addr.ip().is_unspecified() {
            udp::report_destinations(&udp, addr.is_ipv6())
                .with_context(|| format!("asking for destination addresses on UDP {addr}"))?;
        }
        let bound = udp.local_addr()?;
        match crate::net::listen::tcp_one_family(bound) {
            Ok(tcp) => {
                tokio::spawn(server::serve_udp(udp, shared.clone(), stop.clone()));
                tokio::spawn(server::serve_tcp(tcp, shared.clone(), stop.clone()));
                return Ok(bound);
            }
            Err(e) if addr.port() == 0 => last_err = Some(e),
            Err(e) => return Err(e).with_context(|| format!("binding TCP {bound}")),
        }
    }
    Err(last_err
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow::anyhow!("no port")))
    .with_context(|| format!("binding TCP on {addr}"))
}

/// Options of [`run_with`] that tests change.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Addresses to serve on; default: every IPv4 and IPv6 address on the config's port.
    pub listen: Vec<SocketAddr>,
    /// The resolv.conf written when `manage_resolv_conf` is set.
    pub resolv_conf: PathBuf,
}

impl RunOptions {
    /// The defaults for `ctx`.
    pub fn for_context(ctx: &AgentContext) -> Self {
        let port = ctx.cluster.dns.port;
        Self {
            listen: vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            ],
            resolv_conf: PathBuf::from(resolv::RESOLV_CONF),
        }
    }
}

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    let opts = RunOptions::for_context(&ctx);
    run_with(ctx, stop, opts).await
}

/// The upstreams in order: cluster.json's first, then those learned from metadata/DHCP.
fn upstreams(cluster: &ClusterConfig, learned: &[IpAddr], ours: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut out = cluster.dns.upstreams.clone();
    for ip in learned {
        let sa = SocketAddr::new(*ip, 53);
        if !out.contains(&sa) {
            out.push(sa);
        }
    }
    // Never forward to ourselves: that would loop until the timeout. Nor to the cluster's
    // VIPs: a network whose DHCP names the API VIP as its DNS server (so a booting node's
    // initramfs resolves `api-int`, docs/own-ignition.md) would send every other name from
    // the VIP's holder back to itself.
    out.retain(|u| {
        !ours
            .iter()
            .any(|o| o.port() == u.port() && (o.ip() == u.ip() || u.ip().is_loopback()))
            && !cluster.api_vips.contains(&u.ip())
            && !cluster.ingress_vips.contains(&u.ip())
    });
    out
}

/// [`run`] with explicit options.
pub async fn run_with(
    ctx: AgentContext,
    stop: CancellationToken,
    opts: RunOptions,
) -> anyhow::Result<()> {
    let cluster = ctx.cluster.clone();
    let zone = build_zone(&cluster, &ctx.bus.members.borrow())?;
    let (zone_tx, zone_rx) = watch::channel(Arc::new(zone));
    let forwarder = Arc::new(Forwarder::new(Vec::new(), UPSTREAM_TIMEOUT));
    let shared = Shared::new(zone_rx, forwarder.clone());
    let child = stop.child_token();
    let mut bound = Vec::new();
    for addr in &opts.listen {
        match listen(*addr, &shared, &child).await {
            Ok(b) => bound.push(b),
            // A node without IPv6 cannot bind `[::]`; IPv4 alone is fine.
            Err(e) if addr.is_ipv6() && !bound.is_empty() => {
                tracing::info!(error = %e, "dns: not serving IPv6");
            }
            Err(e) => {
                child.cancel();
                return Err(e);
            }
        }
    }
    tracing::info!(?bound, zone = %cluster.zone(), "dns: serving");
    forwarder.set_upstreams(upstreams(&cluster, &ctx.bus.dns_upstreams.borrow(), &bound));
    if cluster.dns.manage_resolv_conf {
        let ups = forwarder.upstreams();
        resolv::write(&opts.resolv_conf, &cluster.zone(), &ups)
            .with_context(|| format!("writing {}", opts.resolv_conf.display()))?;
    }
    let _view = {
        let (shared, forwarder, bound) = (shared.clone(), forwarder.clone(), bound.clone());
        let zone_name = cluster.zone();
        ctx.bus.views.dns.install(move || {
            let mut st = shared.stats.status();
            st.zone = zone_name.clone();
            let zone = shared.zone.borrow().clone();
            st.nodes = zone.node_count() as u64;
            st.etcd = zone.etcd().map(etcd::EtcdNames::status);
            st.listen = bound.clone();
            st.upstreams = forwarder.upstreams();
            st
        })
    };
    ctx.bus.mark_ready("dns");

    let mut members_rx = ctx.bus.members.subscribe();
    let mut upstreams_rx = ctx.bus.dns_upstreams.subscribe();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            r = members_rx.changed() => {
                if r.is_err() { break; }
                let members = members_rx.borrow_and_update().clone();
                match build_zone(&cluster, &members) {
                    Ok(z) => { zone_tx.send_replace(Arc::new(z)); }
                    Err(e) => tracing::warn!(error = %e, "dns: zone rebuild failed"),
                }
            }
            r = upstreams_rx.changed() => {
                if r.is_err() { break; }
                let learned = upstreams_rx.borrow_and_update().clone();
                forwarder.set_upstreams(upstreams(&cluster, &learned, &bound));
                if cluster.dns.manage_resolv_conf
                    && let Err(e) = resolv::write(&opts.resolv_conf, &cluster.zone(), &forwarder.upstreams())
                {
                    tracing::warn!(error = %e, "dns: resolv.conf update failed");
                }
            }
        }
    }
    child.cancel();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_order_and_no_self_loop() {
        let json = serde_json::json!({"port": 53, "ttl": 60, "upstreams": ["192.0.2.53:53"], "manageResolvConf": false});
        let dns: keelson_cluster::cluster::DnsSettings = serde_json::from_value(json).unwrap();
        let mut cluster = crate::dns::tests::cluster_stub();
        cluster.dns = dns;
        // DHCP may name the API VIP first (docs/own-ignition.md): never an upstream.
        let learned: Vec<IpAddr> = vec![
            cluster.api_vips[0],
            "198.51.100.1".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
            cluster.ingress_vips[0],
        ];
        let ours = vec!["0.0.0.0:53".parse().unwrap()];
        let ups = upstreams(&cluster, &learned, &ours);
        assert_eq!(
            ups,
            vec![
                "192.0.2.53:53".parse::<SocketAddr>().unwrap(),
                "198.51.100.1:53".parse().unwrap()
            ]
        );
    }

    /// A minimal valid cluster config for unit tests.
    pub(crate) fn cluster_stub() -> ClusterConfig {
        let text = include_str!("testdata/cluster.json");
        ClusterConfig::from_json(text.as_bytes()).expect("test cluster.json")
    }
}
