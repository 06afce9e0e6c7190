//! VIPs announced by BGP (`docs/bgp.md`): anycast, health-gated, through a
//! real routing daemon. keelson never speaks BGP itself; it decides who may announce which
//! VIP, and when.
//!
//! - [`plan`]: which VIPs this node takes part in, with which checks and AS-path prepend,
//!   and which peers it has (pure).
//! - [`render`]: the daemon's configuration, BIRD 2 or FRR (pure).
//! - [`routes`]: the VIP on `lo` and its host route in the keelson kernel table (netlink).
//! - [`birdc`]: BIRD's control socket, for the sessions' state.
//! - [`status`]: per VIP, announced or why not (pure).
//!
//! Where the agent runs the daemon (`bgp.daemon.run: agent`, the appliance), [`prepare`]
//! writes its configuration and hands the supervisor the process to run; [`run`] is the
//! `bgp` service: it runs each VIP's checks, adds the route while they all pass and removes
//! it as soon as one fails, empties the table at start (leftovers of an agent that died)
//! and at stop.

pub mod birdc;
pub mod plan;
pub mod render;
pub mod routes;
pub mod status;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use keelson_cluster::bgp::{DaemonKind, DaemonRun};
use keelson_cluster::cluster::{RestartPolicy, ServiceSpec};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::health::{self, CheckState};
use plan::NodePlan;
use routes::VipRoutes;

/// The rendered BIRD configuration's file name in `bgp.daemon.runDir`.
pub const BIRD_CONF: &str = "bird.conf";
/// BIRD's control socket's file name in `bgp.daemon.runDir`.
pub const BIRD_SOCKET: &str = "bird.ctl";
/// The rendered FRR configuration's file name in `bgp.daemon.runDir`.
pub const FRR_CONF: &str = "frr.conf";

/// How often the daemon is asked about its sessions and the table is checked.
const POLL: Duration = Duration::from_secs(1);

/// Whether this node announces any VIP by BGP (and so runs the `bgp` service).
pub fn takes_part(ctx: &AgentContext) -> bool {
    plan::plan(&ctx.cluster, &ctx.node).is_some_and(|p| !p.vips.is_empty())
}

fn run_dir(ctx: &AgentContext) -> Option<PathBuf> {
    ctx.cluster
        .bgp
        .as_ref()
        .map(|b| PathBuf::from(&b.daemon.run_dir))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a daemon never reads
/// half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Renders the daemon's configuration into `bgp.daemon.runDir` and, where the agent runs
/// the daemon, returns the process for the supervisor (BIRD in the foreground, logging to
/// the agent's console, its control socket beside the configuration). `None` when this
/// node announces nothing by BGP.
pub fn prepare(ctx: &AgentContext) -> anyhow::Result<Option<ServiceSpec>> {
    let Some(plan) = plan::plan(&ctx.cluster, &ctx.node).filter(|p| !p.vips.is_empty()) else {
        return Ok(None);
    };
    let bgp = ctx.cluster.bgp.as_ref().context("bgp settings")?;
    let dir = PathBuf::from(&bgp.daemon.run_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (name, text) = match plan.daemon {
        DaemonKind::Bird => (BIRD_CONF, render::bird_conf(&plan)),
        DaemonKind::Frr => (FRR_CONF, render::frr_conf(&plan, &ctx.node.name)),
    };
    let conf = dir.join(name);
    write_atomic(&conf, text.as_bytes()).with_context(|| format!("writing {}", conf.display()))?;
    tracing::info!("bgp: wrote {}", conf.display());
    if plan.run != DaemonRun::Agent || plan.daemon != DaemonKind::Bird {
        return Ok(None);
    }
    Ok(Some(ServiceSpec {
        name: "bird".into(),
        path: bgp.daemon.path.clone(),
        args: vec![
            "-f".into(),
            "-c".into(),
            conf.display().to_string(),
            "-s".into(),
            dir.join(BIRD_SOCKET).display().to_string(),
        ],
        env: Default::default(),
        restart: RestartPolicy::Always,
        roles: vec![],
        asset: None,
    }))
}

/// One VIP at run time.
struct Vip {
    plan: plan::VipPlan,
    checks: watch::Receiver<Vec<CheckState>>,
    /// False once the check tasks are gone (a VIP without checks has none).
    checks_alive: bool,
    /// Whether the route is (meant to be) in the table.
    installed: bool,
}

/// Waits for any live check channel to change; pending forever when none is live.
async fn any_check_changed(vips: &mut [Vip]) -> Option<usize> {
    let futs: Vec<_> = vips
        .iter_mut()
        .enumerate()
        .filter(|(_, v)| v.checks_alive)
        .map(|(i, v)| Box::pin(async move { (i, v.checks.changed().await.is_ok()) }))
        .collect();
    if futs.is_empty() {
        return std::future::pending().await;
    }
    let ((i, ok), _, _) = futures::future::select_all(futs).await;
    if ok {
        Some(i)
    } else {
        vips[i].checks_alive = false;
        None
    }
}

/// Adds or removes `vip`'s route to match its checks; publishes what this node holds.
async fn reconcile(ctx: &AgentContext, routes: &VipRoutes, vip: &mut Vip) {
    let want = status::checks_pass(&vip.checks.borrow_and_update());
    if want == vip.installed {
        return;
    }
    let (name, addr) = (vip.plan.name.clone(), vip.plan.vip);
    let res = if want {
        tracing::info!("bgp {name}: checks pass, announcing {addr}");
        routes.announce(addr).await
    } else {
        tracing::info!("bgp {name}: a check fails, withdrawing {addr}");
        routes.withdraw(addr).await
    };
    match res {
        Ok(()) => {
            vip.installed = want;
            ctx.bus.vips_held.send_modify(|s| {
                if want {
                    s.insert(addr);
                } else {
                    s.remove(&addr);
                }
            });
        }
        // Retried at the next poll.
        Err(e) => tracing::warn!("bgp {name}: {e}"),
    }
}

/// Asks the daemon for its sessions, where the agent can (BIRD).
async fn ask_daemon(
    plan: &NodePlan,
    socket: Option<&Path>,
) -> (Option<Vec<birdc::Protocol>>, Option<String>) {
    match (plan.daemon, socket) {
        (DaemonKind::Bird, Some(sock)) => {
            match birdc::show_protocols(sock, Duration::from_millis(500)).await {
                Ok(p) => (Some(p), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
        _ => (None, None),
    }
}

/// The `bgp` section of the status document now.
fn status_now(
    plan: &NodePlan,
    vips: &[Vip],
    protocols: Option<&[birdc::Protocol]>,
    daemon_error: Option<&str>,
) -> crate::status::model::BgpStatus {
    let sessions_known = plan.daemon == DaemonKind::Bird;
    let sessions = status::sessions(plan, protocols);
    crate::status::model::BgpStatus {
        table: plan.table,
        daemon: match plan.daemon {
            DaemonKind::Bird => "bird",
            DaemonKind::Frr => "frr",
        }
        .into(),
        daemon_run: match plan.run {
            DaemonRun::Agent => "agent",
            DaemonRun::External => "external",
        }
        .into(),
        daemon_error: daemon_error.map(str::to_owned),
        router_id: plan.router_id.to_string(),
        vips: vips
            .iter()
            .map(|v| {
                status::vip_status(
                    &v.plan,
                    &v.checks.borrow(),
                    v.installed,
                    &sessions,
                    sessions_known,
                    daemon_error,
                )
            })
            .collect(),
        sessions,
    }
}

/// The `bgp` service: runs until `stop`, then withdraws every VIP and empties the table.
// Over 100 lines on purpose: set-up, the reconcile loop and the withdrawal at stop share the VIPs' route state; the loop's arms are short.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    let Some(plan) = plan::plan(&ctx.cluster, &ctx.node).filter(|p| !p.vips.is_empty()) else {
        ctx.bus.mark_ready("bgp");
        stop.cancelled().await;
        return Ok(());
    };
    let routes = VipRoutes::new(plan.table)?;
    // Every bgp VIP of the cluster, not only this role's: a node whose role changed must
    // not keep a VIP it no longer takes part in.
    let every_vip: Vec<IpAddr> = ctx
        .cluster
        .vrrp
        .instances
        .iter()
        .filter(|i| ctx.cluster.bgp_mode(&i.name))
        .map(|i| i.vip)
        .collect();
    let stale = routes
        .flush(&every_vip)
        .await
        .with_context(|| format!("emptying table {}", plan.table))?;
    if stale > 0 {
        tracing::info!(
            "bgp: removed {stale} stale route(s) from table {}",
            plan.table
        );
    }
    let socket = run_dir(&ctx).map(|d| d.join(BIRD_SOCKET));
    let check_stop = stop.child_token();
    let mut vips: Vec<Vip> = plan
        .vips
        .iter()
        .map(|v| Vip {
            plan: v.clone(),
            checks: health::spawn(
                &v.checks,
                ctx.bus.clone(),
                health::local_apiserver(&ctx, v.vip),
                check_stop.clone(),
            ),
            checks_alive: !v.checks.is_empty(),
            installed: false,
        })
        .collect();
    tracing::info!(
        "bgp: {} VIP(s) via {:?} ({:?}), table {}, {} peer(s)",
        vips.len(),
        plan.daemon,
        plan.run,
        plan.table,
        plan.peers.len()
    );
    ctx.bus.mark_ready("bgp");
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut protocols, mut daemon_error) = (None, None);
    let latest = Arc::new(Mutex::new(status_now(&plan, &vips, None, None)));
    let _view = {
        let latest = latest.clone();
        ctx.bus
            .views
            .bgp
            .install(move || latest.lock().unwrap_or_else(|p| p.into_inner()).clone())
    };
    loop {
        for v in vips.iter_mut() {
            reconcile(&ctx, &routes, v).await;
        }
        *latest.lock().unwrap_or_else(|p| p.into_inner()) =
            status_now(&plan, &vips, protocols.as_deref(), daemon_error.as_deref());
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = any_check_changed(&mut vips) => {}
            _ = tick.tick() => {
                // The table is ours: put back a route someone removed while the checks
                // pass, take away one that should not be there.
                match routes.announced().await {
                    Ok(present) => {
                        let present: BTreeSet<IpAddr> = present.into_iter().collect();
                        for v in vips.iter_mut() {
                            if v.installed && !present.contains(&v.plan.vip) {
                                tracing::warn!("bgp {}: route for {} went missing; adding it again", v.plan.name, v.plan.vip);
                                v.installed = false;
                            }
                        }
                        let wanted: BTreeSet<IpAddr> =
                            vips.iter().filter(|v| v.installed).map(|v| v.plan.vip).collect();
                        for extra in present.difference(&wanted) {
                            tracing::warn!("bgp: removing {extra} from table {} (not a VIP this node announces now)", plan.table);
                            if let Err(e) = routes.withdraw(*extra).await {
                                tracing::warn!("bgp: {e}");
                            }
                        }
                    }
                    Err(e) => tracing::warn!("bgp: {e}"),
                }
                (protocols, daemon_error) = ask_daemon(&plan, socket.as_deref()).await;
            }
        }
    }
    check_stop.cancel();
    for v in vips.iter_mut() {
        if let Err(e) = routes.withdraw(v.plan.vip).await {
            tracing::warn!("bgp {}: {e}", v.plan.name);
        }
        v.installed = false;
        let addr = v.plan.vip;
        ctx.bus.vips_held.send_modify(|s| {
            s.remove(&addr);
        });
    }
    if let Err(e) = routes.flush(&[]).await {
        tracing::warn!("bgp: emptying table {}: {e}", plan.table);
    }
    tracing::info!("bgp: withdrew every VIP");
    Ok(())
}
