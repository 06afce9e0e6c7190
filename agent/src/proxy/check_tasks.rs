//! Active health checks: one task per backend, following backend set changes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use keelson_cluster::cluster::BackendCheck;
use tokio_util::sync::CancellationToken;

use super::backend::Backend;
use super::{Shared, backend_check};

/// One checking task per backend, following backend set changes.
pub(crate) async fn health_supervisor(sh: Arc<Shared>, stop: CancellationToken) {
    if sh.cfg.check == BackendCheck::None {
        return;
    }
    let timeout = sh
        .cfg
        .check_interval
        .clamp(Duration::from_secs(1), Duration::from_secs(10));
    let checker = backend_check::Checker::new(sh.cfg.check, timeout);
    let mut rx = sh.pool.subscribe_backends();
    // Keyed by address, but a task checks one `Backend` object: a backend removed and
    // added back between two wake-ups is a new object (fresh state) and needs a new task.
    let mut tasks: HashMap<SocketAddr, (Arc<Backend>, CancellationToken)> = HashMap::new();
    loop {
        let current = rx.borrow_and_update().clone();
        tasks.retain(|a, (checked, t)| {
            let keep = current
                .iter()
                .any(|b| b.addr == *a && Arc::ptr_eq(b, checked));
            if !keep {
                t.cancel();
            }
            keep
        });
        for b in current.iter() {
            if let std::collections::hash_map::Entry::Vacant(slot) = tasks.entry(b.addr) {
                let t = stop.child_token();
                slot.insert((b.clone(), t.clone()));
                tokio::spawn(check_loop(sh.clone(), checker.clone(), b.clone(), t));
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

async fn check_loop(
    sh: Arc<Shared>,
    checker: backend_check::Checker,
    b: Arc<Backend>,
    stop: CancellationToken,
) {
    // Checks start every interval (haproxy's `inter`), however long the last one took: a
    // dead backend whose checks time out is still down after `fall` intervals. While its
    // state is in doubt (failing but still up, or passing but still down) the next check
    // comes after the fast interval instead (haproxy's `fastinter`). A failed client
    // connect or a VRRP hint asks for a check at once.
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            () = b.check_now.notified() => {}
        }
        let started = tokio::time::Instant::now();
        let r = tokio::select! {
            () = stop.cancelled() => return,
            r = checker.check(b.addr) => r.map_err(|e| e.to_string()),
        };
        b.record_check_time(started.elapsed());
        let flipped = b.record_check(r.clone(), sh.pool.policy());
        let interval = if b.in_transition() {
            sh.cfg.fast_check_interval.min(sh.cfg.check_interval)
        } else {
            sh.cfg.check_interval
        };
        next = started + interval;
        if let Some(up) = flipped {
            match &r {
                Ok(()) => tracing::info!(backend = %b.addr, "backend up"),
                Err(e) => tracing::warn!(backend = %b.addr, error = %e, up, "backend down"),
            }
            sh.pool.refresh_healthy();
        }
    }
}
