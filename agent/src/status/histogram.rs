//! A latency histogram with fixed buckets, lock-free to observe: the DNS forwarder and the
//! proxy's checks record into one, `status` snapshots it, `/metrics` exports it as a
//! Prometheus histogram.
//!
//! Our own rather than `fastmetrics::Histogram`: the snapshot has to travel in the typed
//! status document (serde) to `keelson-agent status`, and the subsystems that observe
//! should not depend on the exposition crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds (seconds) for network round trips on a LAN and a WAN upstream: 0.5 ms to 5 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Observations so far: per-bucket counts (not cumulative), their sum and count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One more than `bounds`: the last counts observations above every bound.
    counts: Box<[AtomicU64]>,
    /// Sum in nanoseconds.
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new(LATENCY_BUCKETS)
    }
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, seconds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// A copy of the current values.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds.to_vec(),
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// A histogram's values at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HistogramSnapshot {
    /// Upper bounds of the buckets, seconds.
    pub bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); one more than `bounds` (the `+Inf` bucket).
    pub counts: Vec<u64>,
    /// Sum of all observations, seconds.
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The mean, if anything was observed.
    pub fn mean(&self) -> Option<Duration> {
        let n = self.count();
        (n > 0).then(|| Duration::from_secs_f64(self.sum_seconds / n as f64))
    }

    /// `(upper bound, cumulative count)` pairs, the last with bound `+Inf`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                acc += c;
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(3));
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 1, 1]);
        assert_eq!(s.count(), 4);
        assert_eq!(
            s.cumulative(),
            vec![(0.001, 2), (0.01, 3), (f64::INFINITY, 4)]
        );
        assert!((s.sum_seconds - 3.0065).abs() < 1e-9);
        assert_eq!(s.mean(), Some(Duration::from_secs_f64(3.0065 / 4.0)));
        assert_eq!(HistogramSnapshot::default().mean(), None);
    }
}
