//! Gives the heap's free memory back to the kernel every [`TRIM_EVERY`].
//!
//! glibc's allocator keeps what a burst freed for reuse, in every thread's arena, and
//! gives back only what lies at the top of the main heap: after a burst (a machine set's
//! nodes registering through the API VIP before they know the masters, a boot storm
//! through the Ignition server) the agent's resident memory stayed at its peak for good,
//! a third above what it holds at rest on the VIP's holder of a 1,000-node cluster
//! (docs/scale.md). On a control-plane node the agent shares memory with etcd and the
//! apiserver, so what it no longer uses is given back. `malloc_trim` walks the arenas
//! under their locks: well under a millisecond at these sizes, run off the async workers.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often free memory is given back.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Gives the allocator's free pages back to the kernel; whether any were.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointer and is safe to call from any thread.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Trims every [`TRIM_EVERY`] until `stop`.
pub async fn trim_periodically(stop: CancellationToken) {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_memory_is_given_back() {
        fn rss_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap()
        }
        // Many small blocks, freed but for every 64th: the holes stay in the heap, below
        // the ones still held, where only a trim hands them back.
        let blocks: Vec<Vec<u8>> = (0..40_000).map(|i| vec![i as u8; 2048]).collect();
        let kept: Vec<Vec<u8>> = blocks
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| (i % 64 == 0).then_some(b))
            .collect();
        let before = rss_kib();
        trim();
        let after = rss_kib();
        assert_eq!(kept.len(), 625);
        assert!(
            after + 20 * 1024 < before,
            "expected at least 20 MiB of the 78 MiB freed given back: {before} KiB before the trim, {after} KiB after"
        );
    }
}
