//! Backends: health state (rise/fall), round-robin selection and per-backend counters.
//!
//! Everything here is pure bookkeeping without sockets, so the rules that decide where a
//! client goes are unit-tested on their own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::{Notify, watch};

/// How many consecutive results flip a backend (haproxy's `rise`/`fall`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive successes that mark a down backend up.
    pub rise: u32,
    /// Consecutive failures that mark an up backend down.
    pub fall: u32,
}

/// The health of one backend as the checks have seen it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthState {
    /// Whether the backend takes new connections.
    pub up: bool,
    /// Consecutive successful checks (reset by a failure).
    pub successes: u32,
    /// Consecutive failed checks (reset by a success).
    pub failures: u32,
    /// When the last check finished.
    pub last_check: Option<SystemTime>,
    /// Why the last check failed, if it did.
    pub last_error: Option<String>,
}

impl HealthState {
    /// A backend that has not been checked yet: `up` is the assumed initial state.
    pub fn new(up: bool) -> Self {
        Self {
            up,
            successes: 0,
            failures: 0,
            last_check: None,
            last_error: None,
        }
    }

    /// Records one check result; returns the new state when the backend flipped.
    pub fn record(
        &mut self,
        result: Result<(), String>,
        policy: HealthPolicy,
        at: SystemTime,
    ) -> Option<bool> {
        self.last_check = Some(at);
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                self.last_error = None;
                if !self.up && self.successes >= policy.rise.max(1) {
                    self.up = true;
                    return Some(true);
                }
            }
            Err(e) => {
                self.successes = 0;
                self.failures = self.failures.saturating_add(1);
                self.last_error = Some(e);
                if self.up && self.failures >= policy.fall.max(1) {
                    self.up = false;
                    return Some(false);
                }
            }
        }
        None
    }

    /// Records how a connect made for a client went (passive health, haproxy's
    /// `observe layer4` with `on-error fail-check`): a failure counts as a failed check, so a
    /// backend that died between two checks leaves the rotation after `fall` failed client
    /// connects instead of `fall` check intervals. A success clears the failure count only:
    /// bringing a down backend back is the checks' job (it gets no client connects anyway).
    pub fn record_connect(
        &mut self,
        result: Result<(), String>,
        policy: HealthPolicy,
        at: SystemTime,
    ) -> Option<bool> {
        match result {
            Ok(()) => {
                self.failures = 0;
                None
            }
            Err(e) => self.record(Err(format!("client connect: {e}")), policy, at),
        }
    }
}

/// Traffic counters of one backend (updated lock-free from connection tasks).
#[derive(Debug, Default)]
pub struct BackendStats {
    /// Connections open right now.
    pub active: AtomicU64,
    /// Connections proxied since start.
    pub total: AtomicU64,
    /// Connect attempts that failed.
    pub connect_failures: AtomicU64,
    /// Bytes from clients to this backend.
    pub bytes_in: AtomicU64,
    /// Bytes from this backend to clients.
    pub bytes_out: AtomicU64,
}

/// One backend server.
#[derive(Debug)]
pub struct Backend {
    /// Where it listens.
    pub addr: SocketAddr,
    up: AtomicBool,
    /// Set while `health` counts failures: lets a successful client connect skip the lock.
    failing: AtomicBool,
    health: Mutex<HealthState>,
    /// Woken when a client connect failed, so the checker looks again at once (haproxy's
    /// `fastinter` after an error).
    pub check_now: Notify,
    /// Traffic counters.
    pub stats: BackendStats,
}

impl Backend {
    /// A backend, initially up or down.
    pub fn new(addr: SocketAddr, up: bool) -> Self {
        Self {
            addr,
            up: AtomicBool::new(up),
            failing: AtomicBool::new(false),
            health: Mutex::new(HealthState::new(up)),
            check_now: Notify::new(),
            stats: BackendStats::default(),
        }
    }

    /// Whether it takes new connections.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Records a check result; returns the new state when it flipped.
    pub fn record_check(&self, result: Result<(), String>, policy: HealthPolicy) -> Option<bool> {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let flipped = h.record(result, policy, SystemTime::now());
        self.up.store(h.up, Ordering::Release);
        self.failing.store(h.failures > 0, Ordering::Release);
        flipped
    }

    /// Records how a client connect went (see [`HealthState::record_connect`]); returns the
    /// new state when it flipped. A failure also wakes the checker.
    pub fn record_connect(&self, result: Result<(), String>, policy: HealthPolicy) -> Option<bool> {
        let failed = result.is_err();
        if !failed && !self.failing.load(Ordering::Acquire) {
            return None;
        }
        let flipped = {
            let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let flipped = h.record_connect(result, policy, SystemTime::now());
            self.up.store(h.up, Ordering::Release);
            self.failing.store(h.failures > 0, Ordering::Release);
            flipped
        };
        if failed {
            self.check_now.notify_one();
        }
        flipped
    }

    /// A copy of the health state.
    pub fn health(&self) -> HealthState {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A JSON-friendly snapshot.
    pub fn snapshot(&self) -> BackendSnapshot {
        let h = self.health();
        BackendSnapshot {
            addr: self.addr,
            state: if h.up { "up" } else { "down" },
            last_check_unix_ms: h.last_check.and_then(|t| {
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
            last_error: h.last_error,
            active: self.stats.active.load(Ordering::Relaxed),
            total: self.stats.total.load(Ordering::Relaxed),
            connect_failures: self.stats.connect_failures.load(Ordering::Relaxed),
            bytes_in: self.stats.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.stats.bytes_out.load(Ordering::Relaxed),
        }
    }
}

/// What `/stats` and the bus show for one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendSnapshot {
    /// Backend address.
    pub addr: SocketAddr,
    /// `up` or `down`.
    pub state: &'static str,
    /// When the last check finished (Unix milliseconds), if ever.
    pub last_check_unix_ms: Option<u64>,
    /// Why the last check failed.
    pub last_error: Option<String>,
    /// Open connections.
    pub active: u64,
    /// Connections since start.
    pub total: u64,
    /// Failed connect attempts.
    pub connect_failures: u64,
    /// Bytes client → backend.
    pub bytes_in: u64,
    /// Bytes backend → client.
    pub bytes_out: u64,
}

/// The order in which to try `n` candidates for the `counter`-th connection: round-robin
/// start, then the others in turn (haproxy's `option redispatch`).
pub fn rotation(n: usize, counter: usize) -> impl Iterator<Item = usize> {
    let start = if n == 0 { 0 } else { counter % n };
    (0..n).map(move |i| (start + i) % n)
}

/// The backend set, shared between the accept loops, the health checker and the monitor.
#[derive(Debug)]
pub struct Pool {
    backends: watch::Sender<Arc<Vec<Arc<Backend>>>>,
    healthy: watch::Sender<bool>,
    counter: AtomicUsize,
    policy: HealthPolicy,
    initially_up: bool,
}

impl Pool {
    /// An empty pool; new backends start `initially_up` (true when nothing checks them).
    pub fn new(policy: HealthPolicy, initially_up: bool) -> Self {
        Self {
            backends: watch::Sender::new(Arc::new(Vec::new())),
            healthy: watch::Sender::new(false),
            counter: AtomicUsize::new(0),
            policy,
            initially_up,
        }
    }

    /// The health policy.
    pub fn policy(&self) -> HealthPolicy {
        self.policy
    }

    /// Replaces the backend set, keeping state and counters of addresses that stay.
    /// Returns whether anything changed.
    pub fn set_backends(&self, addrs: &[SocketAddr]) -> bool {
        let changed = self.backends.send_if_modified(|cur| {
            let mut wanted: Vec<SocketAddr> = addrs.to_vec();
            wanted.sort();
            wanted.dedup();
            let now: Vec<SocketAddr> = cur.iter().map(|b| b.addr).collect();
            if now == wanted {
                return false;
            }
            let next = wanted
                .iter()
                .map(|a| {
                    cur.iter()
                        .find(|b| b.addr == *a)
                        .cloned()
                        .unwrap_or_else(|| Arc::new(Backend::new(*a, self.initially_up)))
                })
                .collect();
            *cur = Arc::new(next);
            true
        });
        self.refresh_healthy();
        changed
    }

    /// The current backends.
    pub fn backends(&self) -> Arc<Vec<Arc<Backend>>> {
        self.backends.borrow().clone()
    }

    /// Subscribes to backend set changes.
    pub fn subscribe_backends(&self) -> watch::Receiver<Arc<Vec<Arc<Backend>>>> {
        self.backends.subscribe()
    }

    /// Subscribes to "at least one backend is up".
    pub fn subscribe_healthy(&self) -> watch::Receiver<bool> {
        self.healthy.subscribe()
    }

    /// Whether at least one backend is up.
    pub fn is_healthy(&self) -> bool {
        *self.healthy.borrow()
    }

    /// Recomputes the "at least one backend up" signal.
    pub fn refresh_healthy(&self) {
        let any = self.backends.borrow().iter().any(|b| b.is_up());
        self.healthy.send_if_modified(|h| {
            let changed = *h != any;
            *h = any;
            changed
        });
    }

    /// The up backends in the order a new connection should try them.
    pub fn pick(&self) -> Vec<Arc<Backend>> {
        let all = self.backends();
        let up: Vec<&Arc<Backend>> = all.iter().filter(|b| b.is_up()).collect();
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        rotation(up.len(), c).map(|i| up[i].clone()).collect()
    }

    /// Snapshots of every backend.
    pub fn snapshot(&self) -> Vec<BackendSnapshot> {
        self.backends().iter().map(|b| b.snapshot()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: HealthPolicy = HealthPolicy { rise: 1, fall: 3 };

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn down_after_fall_failures_up_after_rise_successes() {
        let mut h = HealthState::new(true);
        let t = SystemTime::now();
        assert_eq!(h.record(Err("x".into()), P, t), None);
        assert_eq!(h.record(Err("x".into()), P, t), None);
        assert!(h.up);
        assert_eq!(h.record(Err("x".into()), P, t), Some(false));
        assert!(!h.up);
        assert_eq!(h.last_error.as_deref(), Some("x"));
        assert_eq!(h.record(Err("x".into()), P, t), None);
        assert_eq!(h.record(Ok(()), P, t), Some(true));
        assert!(h.up && h.last_error.is_none());
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let mut h = HealthState::new(true);
        let t = SystemTime::now();
        h.record(Err("a".into()), P, t);
        h.record(Err("a".into()), P, t);
        h.record(Ok(()), P, t);
        h.record(Err("a".into()), P, t);
        h.record(Err("a".into()), P, t);
        assert!(h.up, "2 failures after a success must not reach fall=3");
    }

    #[test]
    fn rise_two_needs_two_successes() {
        let p = HealthPolicy { rise: 2, fall: 1 };
        let mut h = HealthState::new(false);
        let t = SystemTime::now();
        assert_eq!(h.record(Ok(()), p, t), None);
        assert_eq!(h.record(Ok(()), p, t), Some(true));
        assert_eq!(h.record(Err("e".into()), p, t), Some(false));
    }

    #[test]
    fn rotation_round_robins_and_covers_all() {
        assert_eq!(rotation(3, 0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(rotation(3, 4).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(rotation(0, 7).count(), 0);
    }

    #[test]
    fn pick_skips_down_backends_and_rotates() {
        let pool = Pool::new(P, true);
        pool.set_backends(&[addr(1), addr(2), addr(3)]);
        assert!(pool.is_healthy());
        let firsts: Vec<u16> = (0..6).map(|_| pool.pick()[0].addr.port()).collect();
        assert_eq!(firsts, vec![1, 2, 3, 1, 2, 3]);
        let b2 = pool.backends()[1].clone();
        for _ in 0..3 {
            b2.record_check(Err("refused".into()), P);
        }
        pool.refresh_healthy();
        for _ in 0..4 {
            let order = pool.pick();
            assert_eq!(order.len(), 2);
            assert!(order.iter().all(|b| b.addr.port() != 2));
        }
    }

    #[test]
    fn healthy_signal_follows_backends() {
        let pool = Pool::new(P, false);
        let rx = pool.subscribe_healthy();
        pool.set_backends(&[addr(1)]);
        assert!(!*rx.borrow());
        pool.backends()[0].record_check(Ok(()), P);
        pool.refresh_healthy();
        assert!(*rx.borrow());
        pool.set_backends(&[]);
        assert!(!*rx.borrow());
    }

    #[test]
    fn set_backends_keeps_state_of_staying_addresses() {
        let pool = Pool::new(P, true);
        pool.set_backends(&[addr(1), addr(2)]);
        let b1 = pool.backends()[0].clone();
        b1.stats.total.fetch_add(5, Ordering::Relaxed);
        assert!(pool.set_backends(&[addr(2), addr(1), addr(3)]));
        assert!(Arc::ptr_eq(&b1, &pool.backends()[0]));
        assert!(!pool.set_backends(&[addr(3), addr(2), addr(1), addr(1)]));
        assert_eq!(pool.snapshot()[0].total, 5);
    }

    #[test]
    fn failed_client_connects_count_as_failed_checks() {
        let mut h = HealthState::new(true);
        let t = SystemTime::now();
        assert_eq!(h.record_connect(Err("refused".into()), P, t), None);
        assert_eq!(h.record(Err("timeout".into()), P, t), None);
        assert_eq!(h.record_connect(Err("refused".into()), P, t), Some(false));
        assert_eq!(h.last_error.as_deref(), Some("client connect: refused"));
        // Only a check brings it back.
        assert_eq!(h.record_connect(Ok(()), P, t), None);
        assert!(!h.up);
        assert_eq!(h.record(Ok(()), P, t), Some(true));
    }

    #[test]
    fn a_successful_client_connect_clears_the_failures() {
        let mut h = HealthState::new(true);
        let t = SystemTime::now();
        h.record_connect(Err("a".into()), P, t);
        h.record(Err("a".into()), P, t);
        h.record_connect(Ok(()), P, t);
        h.record_connect(Err("a".into()), P, t);
        h.record_connect(Err("a".into()), P, t);
        assert!(
            h.up,
            "2 failures after a good connect must not reach fall=3"
        );
    }

    #[tokio::test]
    async fn a_failed_client_connect_wakes_the_checker() {
        let b = Backend::new(addr(1), true);
        assert_eq!(b.record_connect(Ok(()), P), None);
        b.record_connect(Err("refused".into()), P);
        tokio::time::timeout(std::time::Duration::from_secs(1), b.check_now.notified())
            .await
            .expect("checker woken");
        b.record_connect(Err("refused".into()), P);
        assert_eq!(b.record_connect(Err("refused".into()), P), Some(false));
        assert!(!b.is_up());
    }

    proptest! {
        #[test]
        fn rotation_is_a_permutation(n in 0usize..50, c in any::<usize>()) {
            let mut v: Vec<usize> = rotation(n, c).collect();
            v.sort();
            prop_assert_eq!(v, (0..n).collect::<Vec<_>>());
        }

        #[test]
        fn health_never_flips_against_the_result(results in proptest::collection::vec(any::<bool>(), 0..64), rise in 1u32..4, fall in 1u32..4) {
            let p = HealthPolicy { rise, fall };
            let mut h = HealthState::new(true);
            for ok in results {
                let r = if ok { Ok(()) } else { Err(String::from("e")) };
                if let Some(up) = h.record(r, p, SystemTime::now()) {
                    prop_assert_eq!(up, ok);
                }
            }
        }
    }
}
