//! The ingress routers scenario: the ingress VIP moved by the routers (a router stopped,
//! the VIP landing on a node whose router runs) while a client asks through it.

use super::*;

/// Starts (`start`) or stops the router stand-in on `node` (`kube-standin --control`): its
/// readiness endpoint answers 200 or 503, as a router that runs or stops.
pub(super) fn router(c: &dyn Testbed, node: &str, start: bool) -> Result<()> {
    let addr = c.node(node)?.address;
    let url = format!(
        "http://{addr}:1936/router/{}",
        if start { "start" } else { "stop" }
    );
    let status = probe::http_status(c.outside().netns, &url, Duration::from_secs(5), &[]);
    ensure!(status == 200, "{url} answered {status}");
    Ok(())
}

/// Moves the ingress VIP by the routers while a client asks through it every 100 ms: `stop`'s
/// router stops; the VIP must land on `to`, the one other node whose router runs, and stay
/// there alone. Returns (moved after, failed requests, requests).
pub(super) fn ingress_move(
    c: &mut dyn Testbed,
    stop: &str,
    to: &str,
) -> Result<(Duration, usize, usize)> {
    let client = ClientLoop::start(
        c.outside().netns.name(),
        &format!("http://{INGRESS_VIP}:1936/version"),
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    let steady = Duration::from_secs(2);
    let since = client
        .wait_steady(steady, Duration::from_secs(30))
        .context("the ingress VIP did not answer steadily before the router stopped")?;
    let at = Instant::now();
    router(c, stop, false)?;
    let holder = c.wait_holder(INGRESS_VIP, Duration::from_secs(30), &|h| h == to)?;
    let moved = at.elapsed();
    client
        .wait_success_after(Instant::now(), Duration::from_secs(20))
        .context("the ingress VIP never answered after it moved")?;
    std::thread::sleep(Duration::from_secs(2));
    let samples: Vec<_> = client
        .finish()
        .into_iter()
        .filter(|s| s.sent >= since)
        .collect();
    let outage = probe::outage(&samples, at);
    ensure!(
        outage.failures_before == 0,
        "{} requests through the ingress VIP failed before {stop}'s router stopped",
        outage.failures_before
    );
    let sole = c.sole_holder(INGRESS_VIP, Duration::from_secs(10))?;
    ensure!(
        sole == holder,
        "{INGRESS_VIP} answered by {sole}, expected {holder} alone"
    );
    Ok((moved, outage.failures_after, outage.requests_after))
}

/// 5b. Ingress follows the routers: a node takes part in the ingress instance only while its
///     router answers `:1936/healthz/ready`, masters included. A router started on a master
///     lets it hold the VIP when the worker's router stops (the VIP moves there, to no other
///     master, none of which runs a router); the worker's router started again and the
///     master's stopped, the VIP goes back to the worker.
pub fn ingress_routers(c: &mut dyn Testbed) -> Result<String> {
    let worker = c.wait_holder(INGRESS_VIP, Duration::from_secs(30), &|h| {
        h.starts_with("worker-")
    })?;
    let master = names(c, "master")
        .into_iter()
        .find(|m| c.is_running(m))
        .context("no master running")?;
    // The master's router starts: it takes part, and the worker keeps the VIP (an equal
    // priority does not preempt).
    router(c, &master, true)?;
    std::thread::sleep(Duration::from_secs(4));
    let still = c.sole_holder(INGRESS_VIP, Duration::from_secs(10))?;
    ensure!(
        still == worker,
        "{INGRESS_VIP} moved to {still} when {master}'s router started"
    );
    let bound = vip_move_bound(c, "ingress")?;
    let (there, failed, sent) = ingress_move(c, &worker, &master)?;
    ensure!(
        there <= bound + Duration::from_secs(5),
        "the ingress VIP reached {master} {} after {worker}'s router stopped (its check's fall, 3 s, and a move bound {})",
        secs(there),
        secs(bound)
    );
    // Back: the worker's router runs again, the master's stops.
    router(c, &worker, true)?;
    std::thread::sleep(Duration::from_secs(3));
    let (back, failed_back, sent_back) = ingress_move(c, &master, &worker)?;
    Ok(format!(
        "{master}'s router started: {worker} kept {INGRESS_VIP}; {worker}'s router stopped: on {master} after {} ({failed} of {sent} requests failed); \
         {worker}'s started, {master}'s stopped: back on {worker} after {} ({failed_back} of {sent_back} failed); never on a node without a router",
        secs(there),
        secs(back)
    ))
}
