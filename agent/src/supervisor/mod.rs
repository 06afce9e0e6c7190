//! The supervisor: runs the agent's services and the operator's extra processes, restarts
//! what fails with exponential backoff (and says why), survives a panic in any service, and
//! stops everything in order when asked (docs/agent.md, "Supervisor").

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use keelson_cluster::cluster::{RestartPolicy, ServiceSpec};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use crate::node::NodeIdentity;

/// What a service's run returns: a future that ends when the service stops or fails.
pub type ServiceFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'static>>;

/// A service's entry point (the `run(ctx, stop)` convention every module follows), with
/// whatever else the run loop hands it captured.
pub type ServiceFn = Arc<dyn Fn(AgentContext, CancellationToken) -> ServiceFuture + Send + Sync>;

/// Whether a service bound to the node's link cares that the node's identity changed from
/// the first to the second (and so is restarted on the new one).
pub type Follows = fn(&NodeIdentity, &NodeIdentity) -> bool;

/// Process ids the supervisor owns; PID 1's orphan reaper leaves them to tokio.
static SUPERVISED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Whether `pid` is one of the supervisor's own children.
pub fn is_supervised(pid: i32) -> bool {
    SUPERVISED.lock().map(|s| s.contains(&pid)).unwrap_or(false)
}

/// Restart delay: the agent's one retry policy ([`crate::retry::Backoff`]: 1 s doubling to
/// 30 s, ±10 % jitter), back to the start after a run that lasted a minute (a service that ran
/// fine for a while and then failed is not crash-looping).
#[derive(Debug, Clone)]
pub struct Backoff {
    delays: crate::retry::Backoff,
    healthy_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(
            Duration::from_secs(1),
            Duration::from_secs(30),
            Duration::from_secs(60),
        )
    }
}

impl Backoff {
    /// A backoff starting at `initial`, capped at `max`, reset after runs of `healthy_after`.
    pub fn new(initial: Duration, max: Duration, healthy_after: Duration) -> Self {
        Backoff {
            delays: crate::retry::Backoff::new(initial, max),
            healthy_after,
        }
    }

    /// The same without jitter (tests that count delays).
    pub fn without_jitter(mut self) -> Self {
        self.delays = self.delays.with_jitter(0.0);
        self
    }

    /// The delay before the next start, given how long the last run lasted.
    pub fn delay_after(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.healthy_after {
            self.delays.reset();
        }
        self.delays.next_delay()
    }
}

/// Runs services until `stop` is cancelled.
pub struct Supervisor {
    ctx: AgentContext,
    stop: CancellationToken,
    tasks: JoinSet<()>,
    backoff: Backoff,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("tasks", &self.tasks.len())
            .finish()
    }
}

impl Supervisor {
    /// A supervisor whose services stop when `stop` is cancelled.
    pub fn new(ctx: AgentContext, stop: CancellationToken) -> Self {
        Supervisor {
            ctx,
            stop,
            tasks: JoinSet::new(),
            backoff: Backoff::default(),
        }
    }

    /// Uses a different backoff (tests).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Starts a built-in service, restarted whenever it returns or panics before `stop`.
    pub fn service(
        &mut self,
        name: &'static str,
        run: impl Fn(AgentContext, CancellationToken) -> ServiceFuture + Send + Sync + 'static,
    ) {
        self.spawn_service(name, None, run);
    }

    /// [`Supervisor::service`] for a service bound to the node's link or address: when the
    /// address watcher publishes a new identity (`bus.node`) and `follows(old, new)` says
    /// the service cares, it is stopped (cleanly, as at shutdown) and started again at once
    /// with the new identity — no backoff, not counted as a restart.
    pub fn service_following(
        &mut self,
        name: &'static str,
        follows: Follows,
        run: impl Fn(AgentContext, CancellationToken) -> ServiceFuture + Send + Sync + 'static,
    ) {
        self.spawn_service(name, Some(follows), run);
    }

    fn spawn_service(
        &mut self,
        name: &'static str,
        follows: Option<Follows>,
        run: impl Fn(AgentContext, CancellationToken) -> ServiceFuture + Send + Sync + 'static,
    ) {
        let ctx = self.ctx.clone();
        let stop = self.stop.clone();
        let mut backoff = self.backoff.clone();
        self.tasks.spawn(async move {
            let mut restarts = 0u64;
            let mut node_changes = ctx.bus.node.subscribe();
            loop {
                let started = Instant::now();
                let token = stop.child_token();
                let node = ctx.current_node();
                node_changes.borrow_and_update();
                // Spawned, so a panic is a JoinError here instead of unwinding the supervisor.
                let mut task = tokio::spawn(run(ctx.with_node(node.clone()), token.clone()));
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut task => break Some(outcome),
                        changed = node_changes.changed(), if follows.is_some() => {
                            let now = ctx.current_node();
                            if changed.is_ok() && follows.is_some_and(|f| f(&node, &now)) {
                                tracing::info!(
                                    "service {name}: the node's address is now on {} {:?}; restarting it there",
                                    now.interface, now.addresses
                                );
                                token.cancel();
                                let _ = task.await;
                                break None;
                            }
                        }
                    }
                };
                let Some(outcome) = outcome else {
                    if stop.is_cancelled() {
                        return;
                    }
                    continue;
                };
                let reason = match outcome {
                    Ok(Ok(())) if stop.is_cancelled() => {
                        tracing::info!("service {name} stopped");
                        return;
                    }
                    Ok(Ok(())) => "returned without being asked to stop".to_owned(),
                    Ok(Err(e)) => format!("failed: {e:#}"),
                    Err(e) if e.is_panic() => {
                        format!("panicked: {}", panic_message(e.into_panic()))
                    }
                    Err(e) => format!("was cancelled: {e}"),
                };
                if stop.is_cancelled() {
                    tracing::warn!("service {name} {reason} while stopping");
                    return;
                }
                restarts += 1;
                let delay = backoff.delay_after(started.elapsed());
                tracing::warn!("service {name} {reason}; restart {restarts} in {delay:?}");
                ctx.bus.record_restart(name, restarts, &reason);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
    }

    /// Starts an operator process from cluster.json `services`, if it runs on this role.
    /// Returns whether it was started.
    pub fn process(&mut self, spec: ServiceSpec) -> bool {
        if !spec.roles.is_empty() && !spec.roles.contains(&self.ctx.node.role) {
            return false;
        }
        let ctx = self.ctx.clone();
        let stop = self.stop.clone();
        let mut backoff = self.backoff.clone();
        self.tasks.spawn(async move {
            let mut restarts = 0u64;
            loop {
                let started = Instant::now();
                let outcome = run_process(&spec, &ctx, &stop).await;
                let (reason, failed) = match outcome {
                    Ok(None) => return, // stopped by us
                    Ok(Some(status)) => (format!("exited with {status}"), !status.success()),
                    Err(e) => (format!("could not start: {e}"), true),
                };
                let again = match spec.restart {
                    RestartPolicy::Always => true,
                    RestartPolicy::OnFailure => failed,
                    RestartPolicy::Never => false,
                };
                if !again {
                    tracing::info!("process {} {reason}; restart policy says done", spec.name);
                    return;
                }
                restarts += 1;
                let delay = backoff.delay_after(started.elapsed());
                tracing::warn!(
                    "process {} {reason}; restart {restarts} in {delay:?}",
                    spec.name
                );
                ctx.bus.record_restart(&spec.name, restarts, &reason);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        true
    }

    /// Waits for every service to finish after `stop` was cancelled, at most `deadline`.
    /// Returns whether all finished in time.
    pub async fn wait(mut self, deadline: Duration) -> bool {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        let finished = tokio::time::timeout(deadline, all).await.is_ok();
        if !finished {
            tracing::warn!("services still running after {deadline:?}; abandoning them");
            self.tasks.abort_all();
        }
        finished
    }
}

/// Runs the process once. `Ok(None)` when stopped by `stop` (SIGTERM, then SIGKILL after 5 s).
async fn run_process(
    spec: &ServiceSpec,
    ctx: &AgentContext,
    stop: &CancellationToken,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let vars = crate::node::node_vars(&ctx.node);
    let mut child = tokio::process::Command::new(&spec.path)
        .args(spec.args.iter().map(|a| crate::node::expand(a, &vars)))
        .envs(&spec.env)
        .envs(vars.iter().map(|(k, v)| (*k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().map(|p| p as i32);
    if let Some(pid) = pid
        && let Ok(mut set) = SUPERVISED.lock()
    {
        set.insert(pid);
    }
    tracing::info!("process {} started (pid {pid:?})", spec.name);
    let result = tokio::select! {
        status = child.wait() => status.map(Some),
        _ = stop.cancelled() => {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            Ok(None)
        }
    };
    if let Some(pid) = pid
        && let Ok(mut set) = SUPERVISED.lock()
    {
        set.remove(&pid);
    }
    result
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic payload)".into())
}

/// Wraps an async `run` function as a [`ServiceFn`] body.
pub fn boxed<F>(future: F) -> ServiceFuture
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    future.boxed()
}

#[cfg(test)]
mod tests;
