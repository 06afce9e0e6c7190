//! VRRP (RFC 5798 v3, RFC 3768 v2) keepalived-compatible virtual IPs (docs/vrrp.md).
//!
//! - [`codec`]: advertisement parse/encode (pure).
//! - [`fsm`]: the RFC state machine with a caller-supplied clock (pure).
//! - [`socket`], [`announce`]: raw sockets, GARP / unsolicited NA (the VIP on the link:
//!   [`crate::net::vip`]).
//! - [`gate`]: in unicast mode, no claim before a peer is heard or a grace period ran out
//!   (pure).
//! - [`conflict`]: in unicast mode, another holder of the VIP seen through ARP (pure).
//! - [`portsec`]: cloud port security that drops the VIP or VRRP itself (pure), with
//!   [`reach`], the connects the holder's check makes.
//! - [`handback`]: connections across a clean hand-over (nftables rules, pure script).
//! - [`confirm`]: no claim on a silent master before a second path (ARP / neighbour
//!   solicitation for the VIP) confirms its death (pure).
//! - [`spec`]: an instance resolved from the config, and the checks a packet passes (pure).
//! - [`router`]: one virtual router's decisions around the state machine: peers, timers,
//!   the confirmation, the ARP yield, the port check (pure).
//! - [`instance`]: the I/O runner of one virtual router: sockets, VIP, health weights.
//! - [`status`]: what the instances report.
//! - [`participation`]: an instance with required checks runs only while they pass.

pub mod announce;
pub mod codec;
pub mod confirm;
pub mod conflict;
pub mod fsm;
pub mod gate;
pub mod handback;
pub mod instance;
pub mod participation;
pub mod portsec;
pub mod reach;
pub mod router;
pub mod socket;
pub mod spec;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;

/// The instances this node takes part in, resolved against its identity: those whose
/// priorities name this node's role and whose VIP family the node has an address in, and
/// that are not announced by BGP (`cluster.json` `bgp.vips`). An instance that `follows`
/// another is no router of its own: its VIP rides with that one's ([`companions`]).
pub async fn specs(ctx: &AgentContext) -> anyhow::Result<Vec<spec::Spec>> {
    let node = &ctx.node;
    let mut out = Vec::new();
    for cfg in &ctx.cluster.vrrp.instances {
        if cfg.follows.is_some() {
            continue;
        }
        let Some(base) = cfg.priorities.for_role(node.role) else {
            continue;
        };
        // Announced by BGP instead (`bgp` service).
        if ctx.cluster.bgp_mode(&cfg.name) {
            continue;
        }
        let v6 = cfg.vip.is_ipv6();
        let Some(addr) = node.address(v6) else {
            tracing::warn!(
                "vrrp {}: node has no {} address on {}; skipping",
                cfg.name,
                if v6 { "IPv6" } else { "IPv4" },
                node.interface
            );
            continue;
        };
        let mut own: Vec<std::net::IpAddr> = node.addresses.iter().map(|n| n.addr()).collect();
        // RFC 5798 §5.1.2.1: IPv6 multicast adverts come from the link-local address.
        let primary = if v6 && cfg.transport == keelson_cluster::cluster::VrrpTransport::Multicast {
            let ll = wait_link_local(&node.interface)
                .await
                .with_context(|| format!("vrrp {}: link-local address", cfg.name))?;
            own.push(ll.into());
            ll.into()
        } else {
            addr
        };
        out.push(spec::Spec {
            config: cfg.clone(),
            base,
            iface: node.interface.clone(),
            primary,
            own,
            companions: companions(ctx, &cfg.name),
        });
    }
    Ok(out)
}

/// The VIPs held with `leader`'s: its followers' (announced as it is, `cluster.json` checks)
/// whose family this node has an address of (a VIP of a family the node cannot reach is no
/// use to its clients; the node still takes part for the others).
fn companions(ctx: &AgentContext, leader: &str) -> Vec<std::net::IpAddr> {
    ctx.cluster
        .vrrp
        .instances
        .iter()
        .filter(|f| f.follows.as_deref() == Some(leader))
        .filter(|f| {
            let reachable = ctx.node.address(f.vip.is_ipv6()).is_some();
            if !reachable {
                tracing::warn!(
                    "vrrp {}: node has no {} address on {}; {} is not held with {leader}",
                    f.name,
                    if f.vip.is_ipv6() { "IPv6" } else { "IPv4" },
                    ctx.node.interface,
                    f.vip
                );
            }
            reachable
        })
        .map(|f| f.vip)
        .collect()
}

async fn wait_link_local(iface: &str) -> anyhow::Result<std::net::Ipv6Addr> {
    // DAD takes about a second after the link comes up.
    for _ in 0..50 {
        if let Some(ll) = crate::net::vip::link_local(iface) {
            return Ok(ll);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("{iface} has no usable IPv6 link-local address")
}

/// Runs every VRRP instance of this node until `stop` is cancelled; then each master sends
/// priority 0 and every VIP is removed.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    run_with(ctx, stop, status::StatusMap::default()).await
}

/// [`run`] keeping the instances' status in `status`.
pub async fn run_with(
    ctx: AgentContext,
    stop: CancellationToken,
    status: status::StatusMap,
) -> anyhow::Result<()> {
    let specs = specs(&ctx).await?;
    let _view = {
        let status = status.clone();
        ctx.bus
            .views
            .vrrp
            .install(move || status.views(std::time::Instant::now()))
    };
    let mut tasks = tokio::task::JoinSet::new();
    for spec in specs {
        let name = spec.config.name.clone();
        let (ctx, status, stop) = (ctx.clone(), status.clone(), stop.clone());
        tasks.spawn(async move {
            if spec.config.required_checks.is_empty() {
                instance::run(spec, ctx, status, stop).await
            } else {
                participation::run(spec, ctx, status, stop).await
            }
            .with_context(|| format!("vrrp instance {name}"))
        });
    }
    ctx.bus.mark_ready("vrrp");
    let mut result = Ok(());
    while let Some(res) = tasks.join_next().await {
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // One failing instance stops the others (they clean up), and the
                // supervisor restarts us.
                stop.cancel();
                if result.is_ok() {
                    result = Err(e);
                }
            }
            Err(e) => {
                stop.cancel();
                if result.is_ok() {
                    result = Err(anyhow::anyhow!("vrrp instance task: {e}"));
                }
            }
        }
    }
    result
}

/// Arguments of the hidden `keelson-agent vrrp` subcommand.
#[derive(Debug, clap::Args)]
pub struct VrrpArgs {
    /// cluster.json.
    #[arg(long)]
    pub cluster: PathBuf,
    /// node.json.
    #[arg(long)]
    pub node: PathBuf,
}

/// Runs `keelson-agent vrrp`: VRRP and its health checks alone, printing the `vrrp`
/// status as one JSON line on stdout whenever it changes (tests, debugging). SIGTERM or
/// SIGINT stop it cleanly (priority 0, VIPs removed).
pub async fn cli(args: VrrpArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.cluster)
        .with_context(|| format!("reading {}", args.cluster.display()))?;
    let cluster = keelson_cluster::ClusterConfig::from_json(&bytes)?;
    let node = crate::node::NodeIdentity::load(&args.node)?;
    let ctx = AgentContext::new(cluster, node);
    let stop = CancellationToken::new();
    let status = status::StatusMap::default();
    let mut changes = status.subscribe();
    let printer = {
        let status = status.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                println!("{}", status.to_json());
            }
        })
    };
    let signals = crate::signals::cancel_on_stop_signal(stop.clone())?;
    let res = run_with(ctx, stop, status).await;
    signals.abort();
    printer.abort();
    res
}
