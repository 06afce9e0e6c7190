//! Waiting for a condition: polled, bounded, and failing with what was awaited.

use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds; the time that took. Panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    loop {
        if cond() {
            return t.elapsed();
        }
        assert!(
            t.elapsed() <= limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// [`wait_for`] inside a runtime (sleeps without blocking it).
pub async fn wait_for_async(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Duration {
    let t = Instant::now();
    loop {
        if cond() {
            return t.elapsed();
        }
        assert!(
            t.elapsed() <= limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}
