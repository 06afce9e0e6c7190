//! `keelson-agent run`: start the services for this node under the supervisor, print the
//! ready line when every one of them is up, stop them in order on SIGTERM/SIGINT.
//! PID 1 (`init`) uses [`run_node`] too.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::cluster::MembersTransport;
use keelson_cluster::routes::ExtraRoutes;
use keelson_cluster::server::{AccessList, default_allowed_networks};
use keelson_cluster::{ClusterConfig, Role};
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::members::registry::Registry;
use crate::node::NodeIdentity;
use crate::supervisor::{Follows, ServiceFn, Supervisor, boxed};

/// `keelson-agent run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// cluster.json.
    #[arg(long, default_value = keelson_cluster::paths::CLUSTER_JSON)]
    pub cluster: PathBuf,
    /// node.json: overrides the identity metadata would give.
    #[arg(long)]
    pub node: Option<PathBuf>,
    /// Only these services (comma list of members, ignition, dns, vrrp, proxy, bgp;
    /// default: the role's).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where to serve `keelson-agent status`.
    #[arg(long, default_value = crate::status::SOCKET)]
    pub status_socket: PathBuf,
    /// The cluster CA and the Ignition server's certificate and key.
    #[arg(long, default_value = crate::context::TLS_DIR)]
    pub tls_dir: PathBuf,
    /// State kept across restarts (the masters the unicast members transport remembers).
    #[arg(long, default_value = crate::context::STATE_DIR)]
    pub state_dir: PathBuf,
}

/// The services' names, in start order: members first (the others read the member list),
/// the Ignition server before DNS so masters can fetch as early as possible.
pub const SERVICE_NAMES: [&str; 6] = ["members", "ignition", "dns", "vrrp", "proxy", "bgp"];

/// The services of [`SERVICE_NAMES`], wired: `members` fills the members `registry` and the
/// Ignition server serves it (unicast transport), so it outlives restarts of either. With
/// each, whether it follows the node's address to another link (docs/agent.md, "The node's
/// address"): VRRP (its sockets, VIPs and announcements are the link's), BGP (its sessions
/// are the address's), members over mDNS (the link's multicast group) and members of either
/// transport when the addresses change. The proxy, DNS and the Ignition server listen on
/// the wildcard address and keep serving through a move.
pub fn services(
    ctx: &AgentContext,
    registry: Arc<Registry>,
) -> Vec<(&'static str, ServiceFn, Option<Follows>)> {
    let unicast = ctx.cluster.members.transport == MembersTransport::Unicast;
    let routes: Option<Arc<dyn ExtraRoutes>> = unicast.then(|| registry.clone() as _);
    let members_follow: Follows = if unicast {
        addresses_changed
    } else {
        link_changed
    };
    vec![
        (
            "members",
            Arc::new(move |c, s| boxed(crate::members::run(c, registry.clone(), s))),
            Some(members_follow),
        ),
        (
            "ignition",
            Arc::new(move |c, s| boxed(crate::ignition_server::run(c, routes.clone(), s))),
            None,
        ),
        ("dns", Arc::new(|c, s| boxed(crate::dns::run(c, s))), None),
        (
            "vrrp",
            Arc::new(|c, s| boxed(crate::vrrp::run(c, s))),
            Some(link_changed),
        ),
        (
            "proxy",
            Arc::new(|c, s| boxed(crate::proxy::run(c, s))),
            None,
        ),
        (
            "bgp",
            Arc::new(|c, s| boxed(crate::bgp::run(c, s))),
            Some(link_changed),
        ),
    ]
}

/// The node's link or its addresses changed.
fn link_changed(old: &NodeIdentity, new: &NodeIdentity) -> bool {
    old.interface != new.interface || addresses_changed(old, new)
}

/// The node's addresses changed (a move alone keeps them).
fn addresses_changed(old: &NodeIdentity, new: &NodeIdentity) -> bool {
    old.addresses != new.addresses
}

/// Which services a role runs (docs/architecture.md, "What each part promises"): the control plane (bootstrap and masters) serves
/// Ignition and balances the API; every node announces itself, answers DNS and takes part
/// in the VRRP instances its role has a priority in (workers: ingress).
pub fn services_for(role: Role) -> Vec<&'static str> {
    match role {
        Role::Bootstrap | Role::Master => vec!["members", "ignition", "dns", "vrrp", "proxy"],
        Role::Worker => vec!["members", "dns", "vrrp"],
    }
}

/// The exact ready line tests and the QEMU harness wait for.
pub fn ready_line(node: &NodeIdentity, services: &[&str]) -> String {
    format!(
        "keelson-agent ready: node={} role={} services={}",
        node.name,
        node.role.as_str(),
        services.join(",")
    )
}

/// Runs `services` (all of the role's when empty) plus the operator's processes until `stop`;
/// prints the ready line once every service marked itself ready.
pub async fn run_node(
    ctx: AgentContext,
    only: &[String],
    status_socket: PathBuf,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let wanted: Vec<&'static str> = if only.is_empty() {
        let mut wanted = services_for(ctx.node.role);
        // An external load balancer owns the VIPs (`loadBalancer.type: userManaged`): no
        // API proxy in front of it; VRRP runs only the instances the operator listed.
        if ctx.cluster.load_balancer.user_managed() {
            wanted.retain(|s| *s != "proxy");
        }
        // VIPs in bgp mode: only where the cluster has them for this role.
        if crate::bgp::takes_part(&ctx) {
            wanted.push("bgp");
        }
        wanted
    } else {
        let mut out = Vec::new();
        for name in only {
            let known = SERVICE_NAMES.iter().find(|n| *n == name).with_context(|| {
                format!(
                    "--only {name}: expected one of {}",
                    SERVICE_NAMES.join(", ")
                )
            })?;
            out.push(*known);
        }
        out
    };
    let mut supervisor = Supervisor::new(ctx.clone(), stop.clone());
    let registry = Arc::new(Registry::for_node(&ctx.cluster, &ctx.node));
    for (name, run, follows) in services(&ctx, registry) {
        if !wanted.contains(&name) {
            continue;
        }
        match follows {
            Some(f) => supervisor.service_following(name, f, move |c, s| run(c, s)),
            None => supervisor.service(name, move |c, s| run(c, s)),
        }
    }
    // The node's address, followed when OpenShift's networking moves it (br-ex, a bond).
    tokio::spawn(crate::node_address::watch(ctx.clone(), stop.clone()));
    tokio::spawn(crate::heap::trim_periodically(stop.clone()));
    let mut processes = Vec::new();
    // The routing daemon for bgp VIPs, where the agent runs it: its configuration is
    // written before it starts.
    if wanted.contains(&"bgp")
        && let Some(daemon) = crate::bgp::prepare(&ctx)?
    {
        processes.push(daemon.name.clone());
        supervisor.process(daemon);
    }
    for spec in ctx.cluster.services.clone() {
        let name = spec.name.clone();
        if supervisor.process(spec) {
            processes.push(name);
        }
    }
    let mut ready = ctx.bus.ready.subscribe();
    let line = ready_line(&ctx.node, &wanted);
    let announce = {
        let stop = stop.clone();
        let wanted = wanted.clone();
        async move {
            tokio::select! {
                r = ready.wait_for(|set| wanted.iter().all(|w| set.contains(*w))) => {
                    if r.is_ok() {
                        // Plain line (no log prefix): tests and the console grep for it.
                        eprintln!("{line}");
                        tracing::info!("{line}");
                    }
                }
                _ = stop.cancelled() => {}
            }
        }
    };
    tokio::spawn(announce);
    let started = std::time::Instant::now();
    let status_server = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tokio::spawn(async move {
            let status = move || ctx.status(started);
            if let Err(e) = crate::status::serve(status_socket, status, stop).await {
                tracing::warn!("status socket: {e:#}");
            }
        })
    };
    // `/metrics` runs beside the status socket, not as a supervised service: it is never
    // in the ready line, and a port it cannot bind must not hold the node's services back.
    {
        let access = AccessList::new(default_allowed_networks(&ctx.cluster), true);
        let port = ctx.cluster.metrics.port;
        let ctx = ctx.clone();
        let status = move || ctx.status(started);
        tokio::spawn(crate::metrics::serve(port, access, status, stop.clone()));
    }
    // The operator status port, beside them for the same reasons (control plane only).
    tokio::spawn(crate::operator::serve(ctx.clone(), started, stop.clone()));
    if !processes.is_empty() {
        tracing::info!("operator processes: {}", processes.join(", "));
    }
    stop.cancelled().await;
    tracing::info!("stopping services");
    supervisor.wait(Duration::from_secs(10)).await;
    // The status server removes its socket when it sees `stop`; wait for that rather than
    // let the runtime's shutdown drop the task first and leave a stale socket behind.
    let _ = tokio::time::timeout(Duration::from_secs(2), status_server).await;
    Ok(())
}

/// Runs `keelson-agent run`.
pub async fn cli(args: RunArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.cluster)
        .with_context(|| format!("reading {}", args.cluster.display()))?;
    let mut cluster =
        ClusterConfig::from_json(&bytes).with_context(|| format!("{}", args.cluster.display()))?;
    // Outside the appliance the host's network manager owns /etc/resolv.conf (on RHCOS,
    // NetworkManager, which the payload's profile points at the agent: docs/dns.md); the
    // agent writing it there would fight NetworkManager and, under the unit's
    // ProtectSystem=strict, fail.
    if cluster.dns.manage_resolv_conf {
        tracing::info!(
            "dns: leaving /etc/resolv.conf to the host (dns.manageResolvConf applies to the appliance)"
        );
        cluster.dns.manage_resolv_conf = false;
    }
    let node = match &args.node {
        Some(path) => NodeIdentity::load(path)?,
        // A link that comes up a little after the agent (`br-ex` made at boot) is waited
        // for; then systemd's restarts take over, each saying what is missing.
        None => {
            crate::node_address::from_system_waiting(
                &cluster,
                std::path::Path::new("/"),
                None,
                Duration::from_secs(60),
            )
            .await?
        }
    };
    tracing::info!(
        "node {} role {} on {} {:?}",
        node.name,
        node.role.as_str(),
        node.interface,
        node.addresses
    );
    let ctx = AgentContext::new(cluster, node).with_paths(crate::context::NodePaths {
        tls_dir: args.tls_dir,
        state_dir: args.state_dir,
    });
    let stop = CancellationToken::new();
    crate::signals::cancel_on_stop_signal(stop.clone())?;
    run_node(ctx, &args.only, args.status_socket, stop).await
}
