//! Health checks whose results move VRRP priorities (docs/vrrp.md), like keepalived's
//! `track_script` but in-process: TCP connect, HTTP(S) GET expecting a status (HTTPS
//! without certificate verification), "the local proxy has a healthy backend" and "the
//! local Ignition server runs" (both read from the bus), and "this node's kube-apiserver
//! answers `/readyz`" (the proxy's backend check, aimed at this node).
//!
//! Each check has an interval, rise and fall, and a timeout: an answer within it passes
//! however slow, so a slow target is not taken for a dead one (docs/vrrp.md, "Slow is not
//! dead"). A check starts failing (a node does not claim weight it has not shown) and its
//! state is published on a watch channel from which the VRRP instance sums the weights of
//! passing checks.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use keelson_cluster::cluster::{BackendCheck, HealthCheckConfig, HealthCheckKind};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::{AgentContext, Bus};

pub mod http;

/// Rise/fall hysteresis of one check (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RiseFall {
    rise: u32,
    fall: u32,
    passing: bool,
    streak: u32,
}

impl RiseFall {
    /// A failing check that needs `rise` successes to pass and then `fall` failures to fail.
    pub fn new(rise: u32, fall: u32) -> Self {
        Self {
            rise: rise.max(1),
            fall: fall.max(1),
            passing: false,
            streak: 0,
        }
    }

    /// Whether the check passes now.
    pub fn passing(&self) -> bool {
        self.passing
    }

    /// Records one probe result; returns whether the passing state changed.
    pub fn record(&mut self, ok: bool) -> bool {
        if ok == self.passing {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        let need = if self.passing { self.fall } else { self.rise };
        if self.streak >= need {
            self.passing = ok;
            self.streak = 0;
            true
        } else {
            false
        }
    }
}

/// The state of one check, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckState {
    /// Check name.
    pub name: String,
    /// Whether it passes.
    pub passing: bool,
    /// Its weight.
    pub weight: i32,
    /// Times it changed between passing and failing.
    pub transitions: u64,
}

/// Sum of the weights of passing checks.
pub fn weight(states: &[CheckState]) -> i32 {
    states.iter().filter(|s| s.passing).map(|s| s.weight).sum()
}

/// Where this node's own kube-apiserver answers for a VIP: the node's address of the VIP's
/// family, at `api.backendPort` (the address the proxies check it at). `None` when the node
/// has no such address.
pub fn local_apiserver(ctx: &AgentContext, vip: IpAddr) -> Option<SocketAddr> {
    ctx.node
        .address(vip.is_ipv6())
        .map(|a| SocketAddr::new(a, ctx.cluster.api.backend_port))
}

/// Runs one probe; `true` when healthy. Never panics, never waits past `timeout`.
/// `local_apiserver` is where a `localApiserver` check looks ([`local_apiserver`]); without
/// it that check fails.
pub async fn probe(
    kind: &HealthCheckKind,
    bus: &Bus,
    local_apiserver: Option<SocketAddr>,
    timeout: Duration,
) -> bool {
    match kind {
        HealthCheckKind::Tcp { address } => {
            matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await,
                Ok(Ok(_))
            )
        }
        HealthCheckKind::Http { url, expect_status } => {
            match tokio::time::timeout(timeout, http::get_status(url)).await {
                Ok(Ok(status)) => status == *expect_status,
                Ok(Err(e)) => {
                    tracing::debug!("health GET {url}: {e}");
                    false
                }
                Err(_) => false,
            }
        }
        HealthCheckKind::ProxyHealthyBackend => *bus.proxy_healthy.borrow(),
        HealthCheckKind::IgnitionServer => *bus.ignition_running.borrow(),
        HealthCheckKind::LocalApiserver => {
            let Some(addr) = local_apiserver else {
                return false;
            };
            let checker =
                crate::proxy::backend_check::Checker::new(BackendCheck::TlsReadyz, timeout)
                    .user_agent("keelson-vrrp-check");
            match checker.check(addr).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!("local apiserver {addr}: {e}");
                    false
                }
            }
        }
    }
}

/// Starts one task per check; returns the channel carrying all their states (in config
/// order). Tasks end when `stop` is cancelled.
pub fn spawn(
    checks: &[HealthCheckConfig],
    bus: Arc<Bus>,
    local_apiserver: Option<SocketAddr>,
    stop: CancellationToken,
) -> watch::Receiver<Vec<CheckState>> {
    let initial: Vec<CheckState> = checks
        .iter()
        .map(|c| CheckState {
            name: c.name.clone(),
            passing: false,
            weight: c.weight,
            transitions: 0,
        })
        .collect();
    let (tx, rx) = watch::channel(initial);
    let tx = Arc::new(tx);
    for (i, check) in checks.iter().cloned().enumerate() {
        let tx = tx.clone();
        let bus = bus.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let interval = Duration::from_millis(u64::from(check.interval_ms.max(1)));
            // `timeoutMs`, else the interval clamped to 1-5 s. A probe that outlasts the
            // interval delays the next one rather than overlapping it.
            let timeout = check.timeout();
            let mut rf = RiseFall::new(check.rise, check.fall);
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let ok = tokio::select! {
                    _ = stop.cancelled() => return,
                    ok = probe(&check.check, &bus, local_apiserver, timeout) => ok,
                };
                if rf.record(ok) {
                    tracing::info!(
                        "health check {}: {}",
                        check.name,
                        if rf.passing() { "passing" } else { "failing" }
                    );
                    tx.send_modify(|v| {
                        v[i].passing = rf.passing();
                        v[i].transitions += 1;
                    });
                }
            }
        });
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall() {
        let mut rf = RiseFall::new(2, 3);
        assert!(!rf.passing());
        assert!(!rf.record(true));
        assert!(!rf.record(false), "a failure resets the rise streak");
        assert!(!rf.record(true));
        assert!(rf.record(true));
        assert!(rf.passing());
        assert!(!rf.record(false));
        assert!(!rf.record(false));
        assert!(!rf.record(true), "a success resets the fall streak");
        assert!(!rf.record(false));
        assert!(!rf.record(false));
        assert!(rf.record(false));
        assert!(!rf.passing());
    }

    #[test]
    fn weights_of_passing_checks_add() {
        let s = |passing, weight| CheckState {
            name: "c".into(),
            passing,
            weight,
            transitions: 0,
        };
        assert_eq!(weight(&[s(true, 50), s(false, 20), s(true, -5)]), 45);
        assert_eq!(weight(&[]), 0);
    }
}
