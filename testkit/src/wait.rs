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

/// Polls `check` until it returns `Ok`; the time that took. After `limit` panics naming
/// `what` and the last `Err` (what was still missing, in the check's own words).
pub fn wait_for_ok(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return start.elapsed(),
            Err(missing) => assert!(
                start.elapsed() <= limit,
                "timed out after {limit:?} waiting for {what}: {missing}"
            ),
        }
        std::thread::sleep(POLL);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_for_ok_names_what_was_still_missing() {
        let mut n = 0;
        wait_for_ok("three polls", Duration::from_secs(5), || {
            n += 1;
            if n < 3 {
                Err(format!("{n} polls"))
            } else {
                Ok(())
            }
        });
        assert_eq!(n, 3);
        let err = std::panic::catch_unwind(|| {
            wait_for_ok(
                "never",
                Duration::from_millis(50),
                || Err("still no".into()),
            )
        })
        .unwrap_err();
        let text = err.downcast_ref::<String>().unwrap();
        assert!(text.contains("waiting for never: still no"), "{text}");
    }
}
