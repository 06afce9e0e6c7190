//! One retry policy for everything that waits on the outside world: metadata sources,
//! Ignition and asset fetches, the DHCP client's retransmissions and the supervisor's
//! restarts. Exponential backoff with jitter, so a rack of nodes booting at once does not
//! knock on the metadata service or the Ignition server in lock step.
//!
//! Written here rather than taken from `backon`/`backoff`: the DHCP client is a pure state
//! machine that takes time (and so its randomness) as an argument, and the supervisor resets
//! the delay after a healthy run; both need the policy as a plain value with the random
//! sample passed in, which those crates do not offer.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// Exponential backoff with jitter: `initial`, doubling up to `max`, each delay moved by up to
/// `jitter` (a fraction) either way.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: f64,
    base: Duration,
    attempts: u32,
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max`, ±10 % jitter.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            jitter: 0.1,
            base: initial,
            attempts: 0,
        }
    }

    /// The same with `fraction` of jitter either way (0 for none; clamped to 0..=1).
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// The next delay, with fresh jitter from [`random_unit`].
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(random_unit())
    }

    /// The next delay for a uniform sample `unit` in `[0, 1)` (pure: tests and state machines
    /// pass their own).
    pub fn next_delay_with(&mut self, unit: f64) -> Duration {
        let base = self.base;
        self.base = (self.base * 2).min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        base.mul_f64(factor.max(0.0))
    }

    /// Back to `initial` (after a success, or a run that lasted).
    pub fn reset(&mut self) {
        self.base = self.initial;
        self.attempts = 0;
    }

    /// Delays handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// 64 random bits that never wait for the kernel's random number generator.
///
/// `getrandom(2)` (what `rand::random` and `OsRng` use) blocks until the kernel's CRNG is
/// initialised, and an appliance booting on a CPU without RDRAND and without a virtio-rng
/// device may wait for that a long time: its CRNG fills from interrupts, and before DHCP has
/// an address there is no traffic to make any. A DHCP transaction id or a retry's jitter needs
/// no secrecy, so they come from here: std seeds its hash maps from `getrandom(GRND_INSECURE)`,
/// which does not block, and SipHash under those keys gives well-spread bits.
/// Secrets (TLS, DNS query ids) keep using the blocking generator.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// A uniform sample in `[0, 1)` from [`random_u64`].
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether a failed attempt is worth another.
pub trait Transient {
    /// True when retrying may help (timeouts, refused connections, 5xx...).
    fn is_transient(&self) -> bool;
}

/// Runs `op` until it succeeds, fails permanently, or `timeout` would pass before the next
/// attempt (`None`: forever, as PID 1 waits). Every retry is logged as
/// `<what>: <error>; retrying in <delay> (attempt <n>, waited <t>)`, so a console always says
/// what a node waits for.
pub async fn retry<T, E, F, Fut>(
    what: &str,
    mut backoff: Backoff,
    timeout: Option<Duration>,
    mut op: F,
) -> Result<T, E>
where
    E: Transient + Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = tokio::time::Instant::now();
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                let delay = backoff.next_delay();
                if let Some(timeout) = timeout
                    && start.elapsed() + delay > timeout
                {
                    return Err(e);
                }
                tracing::warn!(
                    "{what}: {e}; retrying in {:.1} s (attempt {}, waited {:.0} s)",
                    delay.as_secs_f64(),
                    backoff.attempts(),
                    start.elapsed().as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b =
            Backoff::new(Duration::from_millis(500), Duration::from_secs(4)).with_jitter(0.0);
        let got: Vec<u64> = (0..6)
            .map(|_| b.next_delay_with(0.9).as_millis() as u64)
            .collect();
        assert_eq!(got, [500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(b.attempts(), 6);
        b.reset();
        assert_eq!(b.next_delay_with(0.0), Duration::from_millis(500));
    }

    #[test]
    fn quick_randomness_varies_and_stays_in_range() {
        let draws: std::collections::BTreeSet<u64> = (0..64).map(|_| random_u64()).collect();
        assert!(draws.len() > 60, "64 draws, {} distinct", draws.len());
        assert!(
            (0..1000)
                .map(|_| random_unit())
                .all(|u| (0.0..1.0).contains(&u))
        );
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let mut b = Backoff::new(Duration::from_secs(4), Duration::from_secs(64)).with_jitter(0.25);
        assert_eq!(b.next_delay_with(0.0), Duration::from_secs(3));
        assert_eq!(b.next_delay_with(1.0), Duration::from_secs(10));
        assert_eq!(b.next_delay_with(0.5), Duration::from_secs(16));
        // Nonsense samples never give a negative or infinite delay.
        assert_eq!(b.next_delay_with(f64::NAN), Duration::from_secs(32));
        assert_eq!(b.next_delay_with(-3.0), Duration::from_secs(48));
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn never_panics_and_stays_bounded(initial in 0u64..100_000, max in 0u64..1_000_000,
                                          jitter in proptest::num::f64::ANY,
                                          samples in proptest::collection::vec(proptest::num::f64::ANY, 1..40)) {
            let mut b = Backoff::new(Duration::from_millis(initial), Duration::from_millis(max))
                .with_jitter(jitter);
            let cap = Duration::from_millis(initial.max(max)) * 2;
            for s in samples {
                proptest::prop_assert!(b.next_delay_with(s) <= cap);
            }
        }
    }

    #[derive(Debug)]
    struct Flaky(bool);
    impl Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "flaky")
        }
    }
    impl Transient for Flaky {
        fn is_transient(&self) -> bool {
            self.0
        }
    }

    #[tokio::test]
    async fn retries_transient_failures_and_stops_on_permanent_ones() {
        let mut calls = 0;
        let quick = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let r: Result<u32, Flaky> = retry("test", quick.clone(), None, || {
            calls += 1;
            let n = calls;
            async move { if n < 4 { Err(Flaky(true)) } else { Ok(n) } }
        })
        .await;
        assert_eq!(r.unwrap(), 4);

        let mut calls = 0;
        let r: Result<u32, Flaky> = retry("test", quick.clone(), None, || {
            calls += 1;
            async { Err(Flaky(false)) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, 1, "a permanent failure is not retried");

        let r: Result<u32, Flaky> =
            retry("test", quick, Some(Duration::from_millis(100)), || async {
                Err(Flaky(true))
            })
            .await;
        assert!(r.is_err(), "gives up at the timeout");
    }
}
