//! Waiting for a condition: polled, bounded, and failing with what was awaited.

use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Panics naming `what` once `limit` has passed since `start`.
fn within(what: &str, limit: Duration, start: Instant) {
    assert!(
        start.elapsed() <= limit,
        "timed out after {limit:?} waiting for {what}"
    );
}

/// Polls `cond` until it holds; the time that took. Panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        within(what, limit, start);
        std::thread::sleep(POLL);
    }
    start.elapsed()
}

/// [`wait_for`] inside a runtime (sleeps without blocking it).
pub async fn wait_for_async(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !cond() {
        within(what, limit, start);
        tokio::time::sleep(POLL).await;
    }
    start.elapsed()
}
