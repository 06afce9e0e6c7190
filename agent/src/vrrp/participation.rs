//! Taking part in an instance only while its required checks pass (`cluster.json`
//! `requiredChecks`; docs/vrrp.md, "Ingress follows the routers"): the ingress VIP belongs
//! on a node whose router answers, and a node without one must never hold it, whatever its
//! priority. keepalived does this with a `track_script` without weight (the instance goes
//! to FAULT); here the instance itself is started when every required check passes and
//! stopped, as at shutdown, when one fails: a holder says goodbye (priority 0) and keeps
//! the VIP until its successor's first advert, so the VIP moves cleanly to a node with a
//! router, and a node that does not take part sends no adverts and holds nothing.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::instance;
use super::spec::Spec;
use super::status::StatusMap;
use crate::context::AgentContext;
use crate::health::{self, CheckState};

/// Whether every required check passes.
pub fn all_pass(states: &[CheckState]) -> bool {
    states.iter().all(|s| s.passing)
}

/// The failing checks' names (logs).
fn failing(states: &[CheckState]) -> String {
    states
        .iter()
        .filter(|s| !s.passing)
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `spec`'s instance whenever its required checks all pass, until `stop`.
pub async fn run(
    spec: Spec,
    ctx: AgentContext,
    status: StatusMap,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let name = spec.config.name.clone();
    let checks_stop = stop.child_token();
    let mut gate = health::spawn(
        &spec.config.required_checks,
        ctx.bus.clone(),
        health::local_apiserver(&ctx, spec.config.vip),
        checks_stop.clone(),
    );
    let _stop_checks = checks_stop.drop_guard();
    tracing::info!(
        "vrrp {name}: taking part only while {} pass",
        spec.config
            .required_checks
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    loop {
        // Out: wait until every required check passes.
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = gate.wait_for(|s| all_pass(s)) => {
                if r.is_err() {
                    anyhow::bail!("its required checks stopped");
                }
            }
        }
        tracing::info!("vrrp {name}: required checks pass: taking part");
        let inner = stop.child_token();
        let mut task = tokio::spawn(instance::run(
            spec.clone(),
            ctx.clone(),
            status.clone(),
            inner.clone(),
        ));
        // In: until a required check fails, the instance fails, or we stop.
        let left = tokio::select! {
            r = &mut task => return r.map_err(|e| anyhow::anyhow!("{e}"))?,
            _ = stop.cancelled() => None,
            r = gate.wait_for(|s| !all_pass(s)) => Some(r.map(|s| failing(&s)).unwrap_or_default()),
        };
        inner.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(30), &mut task).await;
        match left {
            None => {
                if let Ok(r) = ended {
                    r.map_err(|e| anyhow::anyhow!("{e}"))??;
                }
                return Ok(());
            }
            Some(which) => {
                match ended {
                    Ok(r) => r.map_err(|e| anyhow::anyhow!("{e}"))??,
                    Err(_) => anyhow::bail!("the instance did not stop within 30 s"),
                }
                status.remove(&name);
                tracing::warn!(
                    "vrrp {name}: {which} failing: left the instance (no adverts, never the VIP) until it passes again"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_required_check_must_pass() {
        let s = |name: &str, passing| CheckState {
            name: name.into(),
            passing,
            weight: 0,
            transitions: 0,
        };
        assert!(all_pass(&[s("router", true)]));
        assert!(!all_pass(&[s("router", true), s("other", false)]));
        assert_eq!(failing(&[s("router", false), s("x", true)]), "router");
    }
}
