//! The proxy in the agent: its backends follow the member list, VRRP's word that a
//! master's adverts stopped marks that master's backend down at once, and the `VIP:6443`
//! frontend opens where this node holds the API VIP and has a healthy backend.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::{ClusterConfig, Role};
use tokio_util::sync::CancellationToken;

use super::backend::Pool;
use super::{Proxy, ProxyConfig, frontend};
use crate::context::AgentContext;
use crate::member::Member;

/// Backends from the member list: one address per bootstrap/master node (the one on the
/// machine network if any) at `port`. The bootstrap node counts: its temporary
/// kube-apiserver serves the API until the masters' are up, and its check fails once it
/// is gone.
pub fn backends_from_members(cluster: &ClusterConfig, members: &[Member]) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = cluster.api.static_backends.clone();
    for m in members {
        if !matches!(m.role, Role::Master | Role::Bootstrap) {
            continue;
        }
        let ip = m
            .addresses
            .iter()
            .find(|a| cluster.machine_networks.iter().any(|n| n.contains(*a)))
            .or_else(|| m.addresses.first());
        if let Some(ip) = ip {
            out.push(SocketAddr::new(*ip, cluster.api.backend_port));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Marks down the backends at `ip`: VRRP saw that node's adverts stop (its Master_Down
/// timer ran out), which a dead node shows seconds before its checks or its clients' connect
/// stagger would. Returns how many backends flipped.
pub fn mark_node_down(pool: &Pool, ip: IpAddr) -> usize {
    let mut flipped = 0;
    for b in pool.backends().iter().filter(|b| b.addr.ip() == ip) {
        if b.mark_down(format!("VRRP: adverts from {ip} stopped")) {
            tracing::warn!(backend = %b.addr, "backend down: its node's VRRP adverts stopped");
            flipped += 1;
        }
    }
    pool.refresh_healthy();
    flipped
}

/// How long a stopping proxy keeps serving the VIP for VRRP to hand it over (VRRP waits
/// at most Master_Down_Interval, under 4 s at the default 1 s adverts).
const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(ctx: AgentContext, stop: CancellationToken) -> anyhow::Result<()> {
    let cfg = ProxyConfig::from_settings(&ctx.cluster.api);
    let initial = backends_from_members(&ctx.cluster, &ctx.bus.members.borrow());
    let proxy = Proxy::bind(cfg, &initial)?;
    tracing::info!(frontends = ?proxy.local_addrs(), backends = ?initial, "proxy listening");
    let inner_stop = CancellationToken::new();
    let serve = {
        let p = proxy.clone();
        let s = inner_stop.clone();
        tokio::spawn(async move { p.serve(s).await })
    };
    ctx.bus.mark_ready("proxy");

    let pool = proxy.pool();
    let mut members = ctx.bus.members.subscribe();
    let mut vips = ctx.bus.vips_held.subscribe();
    let mut peers_down = ctx.bus.vrrp_peer_down.subscribe();
    let redirects: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    let _view = {
        let (proxy, redirects) = (proxy.clone(), redirects.clone());
        ctx.bus.views.proxy.install(move || {
            let r = redirects.lock().unwrap_or_else(|p| p.into_inner()).clone();
            proxy.status(r)
        })
    };
    let mut healthy = pool.subscribe_healthy();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut vip_frontends = frontend::VipFrontends::new(ctx.cluster.api.frontend_port);
    vip_frontends.remove_stale_redirects().await;
    loop {
        // Before anything else, so a hint that came with the VIP is applied before the VIP
        // frontend opens.
        if peers_down.has_changed().unwrap_or(false)
            && let Some(ip) = *peers_down.borrow_and_update()
        {
            mark_node_down(&pool, ip);
        }
        pool.set_backends(&backends_from_members(
            &ctx.cluster,
            &members.borrow_and_update(),
        ));
        let is_healthy = *healthy.borrow_and_update();
        ctx.bus.proxy_healthy.send_if_modified(|h| {
            let changed = *h != is_healthy;
            *h = is_healthy;
            changed
        });
        let held = vips.borrow_and_update().clone();
        let want: BTreeSet<SocketAddr> = if is_healthy {
            ctx.cluster
                .api_vips
                .iter()
                .filter(|v| held.contains(v))
                .map(|v| SocketAddr::new(*v, ctx.cluster.api.vip_port))
                .collect()
        } else {
            BTreeSet::new()
        };
        vip_frontends.sync(&proxy, &want).await;
        *redirects.lock().unwrap_or_else(|p| p.into_inner()) = vip_frontends
            .active()
            .into_iter()
            .filter(|(_, m)| *m == frontend::VipMode::Redirected)
            .map(|(a, _)| a)
            .collect();
        tokio::select! {
            () = stop.cancelled() => break,
            r = peers_down.changed() => {
                if r.is_ok() && let Some(ip) = *peers_down.borrow_and_update() {
                    mark_node_down(&pool, ip);
                }
            }
            _ = members.changed() => {}
            _ = vips.changed() => {}
            _ = healthy.changed() => {}
            _ = tick.tick() => {}
        }
    }
    // Before the VIP goes: a stopping VRRP holder that retires it waits on this.
    ctx.bus.proxy_draining.send_replace(true);
    // A clean stop: VRRP hands the VIP over before it removes it (see
    // `vrrp::instance`); until then clients still come here and are served.
    let api_vips: BTreeSet<IpAddr> = ctx.cluster.api_vips.iter().copied().collect();
    let released = vips.wait_for(|held| held.is_disjoint(&api_vips));
    if tokio::time::timeout(HANDOVER_WAIT, released).await.is_err() {
        tracing::warn!("the API VIP is still held {HANDOVER_WAIT:?} after stop; closing anyway");
    }
    vip_frontends.sync(&proxy, &BTreeSet::new()).await;
    inner_stop.cancel();
    let r = serve.await.context("proxy task");
    ctx.bus.proxy_draining.send_replace(false);
    ctx.bus.proxy_healthy.send_replace(false);
    r?
}
