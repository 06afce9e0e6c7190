//! Member discovery: who is in the cluster, with which address and role (docs/members.md).
//!
//! - [`mdns`] / [`mdns_net`]: mDNS + DNS-SD on the segment (RFC 6762/6763), coexisting
//!   with avahi.
//! - [`unicast`]: registration over HTTPS with every known control-plane node's Ignition
//!   server port ([`seeds`]: the peer set that does not depend on the API VIP), and its
//!   server side [`registry::Registry`] (the Ignition server's `/keelson/` routes).
//! - [`table`]: soft state that expires.
//! - [`auth`]: signed member records and the membership keys that verify them.
//! - [`limits`]: what one address may ask of a registry.
//!
//! Whatever the transport, the result is published on `ctx.bus.members`: sorted by name,
//! this node included, other clusters' members never.

pub mod auth;
pub mod limits;
pub mod mdns;
pub mod mdns_net;
pub mod registry;
pub mod seeds;
pub mod table;
pub mod unicast;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use keelson_cluster::ClusterConfig;
use keelson_cluster::cluster::MembersTransport;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::member::Member;
use crate::node::NodeIdentity;
use registry::Registry;

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
            auth: None,
            registry: None,
        }
    }
}

/// This node as a member.
pub fn own_member(ctx: &AgentContext) -> Member {
    Member::of(&ctx.node)
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

/// Runs this subsystem until `stop` is cancelled, filling `registry` (which the Ignition
/// server serves to the other nodes, unicast transport).
pub async fn run(
    ctx: AgentContext,
    registry: Arc<Registry>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    run_with(ctx, registry, stop, RunOptions::default()).await
}

/// [`run`] with explicit options.
pub async fn run_with(
    ctx: AgentContext,
    registry: Arc<Registry>,
    stop: CancellationToken,
    opts: RunOptions,
) -> anyhow::Result<()> {
    let counters = std::sync::Arc::new(Counters::default());
    let _view = {
        let (counters, transport) = (counters.clone(), ctx.cluster.members.transport);
        let registry = registry.clone();
        ctx.bus.views.discovery.install(move || {
            let mut st = counters.status(transport);
            st.auth = registry.auth_status();
            if transport == MembersTransport::Unicast {
                st.received = registry.registrations();
                st.registry = Some(registry.registry_status());
            }
            st
        })
    };
    let keys = load_keys(&ctx)?;
    // One verifier for both transports: its drop counters are the members status's
    // `auth.drops`, whichever transport heard the record.
    let verifier = std::sync::Arc::new(
        auth::Verifier::new(keys.clone()).with_window(ctx.cluster.members.max_clock_skew()),
    );
    registry.set_verifier(verifier.clone());
    match ctx.cluster.members.transport {
        MembersTransport::Mdns => mdns_net::run(ctx, stop, &counters, verifier, keys).await,
        MembersTransport::Unicast => {
            let ca = opts
                .ca_path
                .unwrap_or_else(|| ctx.paths.tls_dir.join(keelson_cluster::tls_files::CA_CERT));
            let state = ctx.paths.state_dir.clone();
            unicast::run(ctx, registry, stop, &counters, ca, state, keys).await
        }
    }
}

/// The membership keys `cluster.json` names (`members.keyId`), from the node's TLS
/// directory; `None`, with a loud warning, for a cluster built without one. A named key that
/// is missing or different is an error: the service does not run unauthenticated by mistake.
pub fn load_keys(ctx: &AgentContext) -> anyhow::Result<Option<std::sync::Arc<auth::Keys>>> {
    match &ctx.cluster.members.key_id {
        Some(id) => {
            let keys = auth::Keys::load(&ctx.paths.tls_dir, id)?;
            tracing::info!("members: records authenticated with membership key {id}");
            Ok(Some(std::sync::Arc::new(keys)))
        }
        None => {
            tracing::warn!(
                "members: cluster.json has no members.keyId: member records are NOT \
                 authenticated, and any host on the machine network can join this cluster as \
                 a master (an API backend, a DNS name, a VRRP peer). Rebuild the payloads with \
                 keelson build to get a membership key (docs/members.md)."
            );
            Ok(None)
        }
    }
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
    /// The node's TLS directory: the membership keys (`members.keyId`) and, unless `--ca`
    /// says otherwise, the cluster CA. Default: the directory of `--ca`, else
    /// /etc/keelson/tls.
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// The cluster CA (unicast transport). Default: `ca.crt` in the TLS directory.
    #[arg(long)]
    pub ca: Option<PathBuf>,
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
    let tls_dir = args
        .tls_dir
        .clone()
        .or_else(|| {
            args.ca
                .as_deref()
                .and_then(std::path::Path::parent)
                .map(std::path::Path::to_path_buf)
        })
        .unwrap_or_else(|| PathBuf::from(crate::context::TLS_DIR));
    let ca = args
        .ca
        .clone()
        .unwrap_or_else(|| tls_dir.join(keelson_cluster::tls_files::CA_CERT));
    let registry = Arc::new(Registry::for_node(&cluster, &node));
    let ctx = AgentContext::new(cluster, node).with_paths(crate::context::NodePaths {
        state_dir: args.state_dir.clone(),
        tls_dir,
    });
    let stop = CancellationToken::new();
    let mut rx = ctx.bus.members.subscribe();
    let printer = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let list = rx.borrow_and_update().clone();
            println!("{}", serde_json::to_string(&*list).unwrap_or_default());
        }
    });
    let opts = RunOptions { ca_path: Some(ca) };
    let mut task = tokio::spawn(run_with(ctx, registry, stop.clone(), opts));
    crate::signals::cancel_on_stop_signal(stop.clone())?;
    let result = tokio::select! {
        _ = stop.cancelled() => None,
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
