//! Member discovery: who is in the cluster, with which address and role (DESIGN §4.6).
//!
//! - [`mdns`] / [`mdns_net`]: mDNS + DNS-SD on the segment (RFC 6762/6763), coexisting
//!   with avahi.
//! - [`unicast`]: registration over HTTPS with every known control-plane node's Ignition
//!   server port ([`seeds`]: the peer set that does not depend on the API VIP), and its
//!   server side [`registry::Registry`] (the Ignition server's `/keelson/` routes).
//! - [`table`]: soft state that expires.
//!
//! Whatever the transport, the result is published on `ctx.bus.members`: sorted by name,
//! this node included, other clusters' members never.

pub mod mdns;
pub mod mdns_net;
pub mod registry;
pub mod seeds;
pub mod table;
pub mod unicast;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use keelson_ignition::ClusterConfig;
use keelson_ignition::cluster::MembersTransport;
use tokio_util::sync::CancellationToken;

use crate::context::{AgentContext, Member};
use crate::node::NodeIdentity;

/// Packets and records seen, dropped and why (status snapshot).
#[derive(Debug, Default)]
pub struct Counters {
    /// Packets received.
    pub packets: AtomicU64,
    /// Packets that did not decode.
    pub malformed: AtomicU64,
    /// Responses from a port other than 5353.
    pub bad_source_port: AtomicU64,
    /// Records of our service that make no sense.
    pub bogus: AtomicU64,
    /// Records of another cluster's members.
    pub other_cluster: AtomicU64,
    /// Unicast: registrations a registry refused or answered with something unusable.
    pub refused: AtomicU64,
    /// Unicast: the outcome of the last registration with each registry.
    pub registries: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl Counters {
    /// A JSON snapshot.
    pub fn snapshot(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let registries = self
            .registries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut v = serde_json::json!({
            "packets": g(&self.packets),
            "malformed": g(&self.malformed),
            "badSourcePort": g(&self.bad_source_port),
            "bogus": g(&self.bogus),
            "otherCluster": g(&self.other_cluster),
        });
        if !registries.is_empty() || g(&self.refused) > 0 {
            v["refused"] = g(&self.refused).into();
            v["registries"] = serde_json::to_value(registries).unwrap_or_default();
        }
        v
    }

    /// The typed status section (`status`, `/metrics`).
    pub fn status(&self, transport: MembersTransport) -> crate::status::model::DiscoveryStatus {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::status::model::DiscoveryStatus {
            transport: match transport {
                MembersTransport::Mdns => "mdns",
                MembersTransport::Unicast => "unicast",
            }
            .to_string(),
            received: g(&self.packets),
            drops: [
                ("malformed", &self.malformed),
                ("bad_source_port", &self.bad_source_port),
                ("bogus", &self.bogus),
                ("other_cluster", &self.other_cluster),
            ]
            .into_iter()
            .map(|(k, c)| (k.to_string(), g(c)))
            .collect(),
            refused: g(&self.refused),
            registries: self
                .registries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

/// This node as a member.
pub fn own_member(ctx: &AgentContext) -> Member {
    member_of(&ctx.node)
}

/// `node` as a member.
pub fn member_of(node: &NodeIdentity) -> Member {
    Member {
        name: node.name.clone(),
        role: node.role,
        addresses: node.addresses.iter().map(|n| n.addr()).collect(),
        version: crate::VERSION.to_string(),
    }
}

/// Publishes `others` plus this node, sorted by name, if the list changed.
pub fn publish(ctx: &AgentContext, me: &Member, others: Vec<Member>) {
    let mut list: Vec<Member> = others.into_iter().filter(|m| m.name != me.name).collect();
    list.push(me.clone());
    list.sort_by(|a, b| a.name.cmp(&b.name));
    ctx.bus.members.send_if_modified(|cur| {
        if **cur == list {
            false
        } else {
            *cur = std::sync::Arc::new(list);
            true
        }
    });
}

/// Options of [`run_with`] that tests change.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The cluster CA the unicast transport trusts (default: `ca.crt` in the node's TLS
    /// directory).
    pub ca_path: Option<PathBuf>,
}

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    run_with(ctx, stop, RunOptions::default()).await
}

/// [`run`] with explicit options.
pub async fn run_with(
    ctx: AgentContext,
    stop: CancellationToken,
    opts: RunOptions,
) -> anyhow::Result<()> {
    let counters = std::sync::Arc::new(Counters::default());
    let _view = {
        let (counters, transport) = (counters.clone(), ctx.cluster.members.transport);
        ctx.bus
            .views
            .discovery
            .install(move || counters.status(transport))
    };
    let status = {
        let ctx = ctx.clone();
        let counters = counters.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        let mut v = counters.snapshot();
                        v["members"] = serde_json::to_value(&**ctx.bus.members.borrow()).unwrap_or_default();
                        ctx.bus.publish_status("members", v);
                    }
                }
            }
        })
    };
    let result = match ctx.cluster.members.transport {
        MembersTransport::Mdns => mdns_net::run(ctx, stop, &counters).await,
        MembersTransport::Unicast => {
            let ca = opts
                .ca_path
                .unwrap_or_else(|| ctx.paths.tls_dir.join(keelson_ignition::tls_files::CA_CERT));
            let state = ctx.paths.state_dir.clone();
            unicast::run(ctx, stop, &counters, ca, state).await
        }
    };
    status.abort();
    result
}

/// `keelson-agent members`: run member discovery alone and print the member list (one JSON
/// line each time it changes). For tests and debugging.
#[derive(Debug, clap::Args)]
pub struct MembersArgs {
    /// cluster.json.
    #[arg(long)]
    pub cluster: PathBuf,
    /// node.json.
    #[arg(long)]
    pub node: PathBuf,
    /// The cluster CA (unicast transport).
    #[arg(long, default_value = unicast::CA_PATH)]
    pub ca: PathBuf,
    /// Where the unicast transport remembers the masters.
    #[arg(long, default_value = crate::context::STATE_DIR)]
    pub state_dir: PathBuf,
}

/// Runs `keelson-agent members`.
pub async fn cli(args: MembersArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.cluster)
        .with_context(|| format!("reading {}", args.cluster.display()))?;
    let cluster = ClusterConfig::from_json(&bytes)?;
    let node = NodeIdentity::load(&args.node)?;
    let ctx = AgentContext::new(cluster, node).with_paths(crate::context::NodePaths {
        state_dir: args.state_dir,
        ..Default::default()
    });
    let stop = CancellationToken::new();
    let mut rx = ctx.bus.members.subscribe();
    let printer = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let list = rx.borrow_and_update().clone();
            println!("{}", serde_json::to_string(&*list).unwrap_or_default());
        }
    });
    let opts = RunOptions {
        ca_path: Some(args.ca),
    };
    let mut task = tokio::spawn(run_with(ctx, stop.clone(), opts));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        r = &mut task => Some(r),
    };
    stop.cancel();
    let result = match result {
        Some(r) => r?,
        None => task.await?,
    };
    printer.abort();
    result
}
