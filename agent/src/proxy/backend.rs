//! Backends: health state (rise/fall), round-robin selection and per-backend counters.
//!
//! Everything here is pure bookkeeping without sockets, so the rules that decide where a
//! client goes are unit-tested on their own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, watch};

use crate::status::histogram::Histogram;
use crate::status::model::BackendSnapshot;

/// How many consecutive results flip a backend (haproxy's `rise`/`fall`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive successes that mark a down backend up.
    pub rise: u32,
    /// Consecutive failures that mark an up backend down.
    pub fall: u32,
}

/// Everything that decides how a backend is checked and used, besides rise/fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Rise/fall.
    pub policy: HealthPolicy,
    /// After a backend comes back up, its share of new connections grows from nothing to
    /// full over this long (haproxy's `slowstart`); zero: full share at once.
    pub slowstart: Duration,
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
    /// Times the connect stagger ran out while waiting for this backend (another backend
    /// was tried alongside).
    pub staggers: AtomicU64,
    /// Client connections closed because this backend was marked down (haproxy's
    /// `on-marked-down shutdown-sessions`).
    pub sessions_shut_down: AtomicU64,
    /// Active checks that passed.
    pub checks_passed: AtomicU64,
    /// Active checks that failed.
    pub checks_failed: AtomicU64,
    /// Times the backend went up or down.
    pub transitions: AtomicU64,
    /// Duration of the last active check, nanoseconds (0: none yet).
    pub last_check_nanos: AtomicU64,
    /// Durations of active checks.
    pub check_latency: Histogram,
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
    /// Bumped each time the backend is marked down: connections to it watch this and close
    /// (`on-marked-down shutdown-sessions`).
    downs: watch::Sender<u64>,
    /// When it last came up after being down (slowstart), if ever.
    up_since: Mutex<Option<Instant>>,
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
            downs: watch::Sender::new(0),
            up_since: Mutex::new(None),
        }
    }

    /// Notified each time the backend is marked down.
    pub fn subscribe_downs(&self) -> watch::Receiver<u64> {
        self.downs.subscribe()
    }

    /// Bookkeeping of a flip: transitions, the down signal, the slowstart clock.
    fn flipped(&self, up: bool) {
        self.stats.transitions.fetch_add(1, Ordering::Relaxed);
        if up {
            *self.up_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        } else {
            self.downs.send_modify(|n| *n += 1);
        }
    }

    /// The share of new connections this backend takes now, in percent: 100, or less while
    /// it ramps up after coming back (`slowstart`).
    pub fn weight_percent(&self, slowstart: Duration, now: Instant) -> u8 {
        let since = *self.up_since.lock().unwrap_or_else(|p| p.into_inner());
        ramp_percent(since.map(|t| now.saturating_duration_since(t)), slowstart)
    }

    /// Marks the backend down at once because something other than its checks proved it
    /// gone (its node's VRRP adverts stopped); the checker looks at once and brings it back
    /// after `rise` passing checks if the hint was wrong. Returns whether it flipped.
    pub fn mark_down(&self, why: String) -> bool {
        let flipped = {
            let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let was_up = h.up;
            h.up = false;
            h.successes = 0;
            h.failures = h.failures.max(1);
            h.last_error = Some(why);
            self.up.store(false, Ordering::Release);
            self.failing.store(true, Ordering::Release);
            was_up
        };
        if flipped {
            self.flipped(false);
        }
        self.check_now.notify_one();
        flipped
    }

    /// Whether its state is in doubt: up but failing, or down but passing (haproxy's
    /// `fastinter` applies then).
    pub fn in_transition(&self) -> bool {
        let h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        (h.up && h.failures > 0) || (!h.up && h.successes > 0)
    }

    /// Records one active check's duration.
    pub fn record_check_time(&self, took: Duration) {
        self.stats.check_latency.observe(took);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.stats.last_check_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Whether it takes new connections.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Records a check result; returns the new state when it flipped.
    pub fn record_check(&self, result: Result<(), String>, policy: HealthPolicy) -> Option<bool> {
        let counter = if result.is_ok() {
            &self.stats.checks_passed
        } else {
            &self.stats.checks_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let flipped = {
            let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let flipped = h.record(result, policy, SystemTime::now());
            self.up.store(h.up, Ordering::Release);
            self.failing.store(h.failures > 0, Ordering::Release);
            flipped
        };
        if let Some(up) = flipped {
            self.flipped(up);
        }
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
        if let Some(up) = flipped {
            self.flipped(up);
        }
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

    /// A JSON-friendly snapshot; `slowstart` gives its current share.
    pub fn snapshot(&self, slowstart: Duration) -> BackendSnapshot {
        let h = self.health();
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let last_check = g(&self.stats.last_check_nanos);
        BackendSnapshot {
            addr: self.addr,
            state: if h.up { "up" } else { "down" }.to_string(),
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
            staggers: g(&self.stats.staggers),
            sessions_shut_down: g(&self.stats.sessions_shut_down),
            checks_passed: g(&self.stats.checks_passed),
            checks_failed: g(&self.stats.checks_failed),
            transitions: g(&self.stats.transitions),
            last_check_seconds: (last_check > 0).then(|| last_check as f64 / 1e9),
            check_latency: self.stats.check_latency.snapshot(),
            weight_percent: if h.up {
                self.weight_percent(slowstart, Instant::now())
            } else {
                0
            },
        }
    }
}

/// Slowstart share after `up_for` (`None`: up since the start, never ramped), in percent,
/// at least 1 so a ramping backend is never starved of its first connections.
pub fn ramp_percent(up_for: Option<Duration>, slowstart: Duration) -> u8 {
    match up_for {
        Some(d) if !slowstart.is_zero() && d < slowstart => {
            let pct = d.as_secs_f64() / slowstart.as_secs_f64() * 100.0;
            (pct as u8).clamp(1, 99)
        }
        _ => 100,
    }
}

/// The order in which to try `n` candidates for the `counter`-th connection: round-robin
/// start, then the others in turn (haproxy's `option redispatch`).
pub fn rotation(n: usize, counter: usize) -> impl Iterator<Item = usize> {
    let start = if n == 0 { 0 } else { counter % n };
    (0..n).map(move |i| (start + i) % n)
}

/// Where connection number `c` falls for backend `addr`, 0..100: a cheap mix of both so
/// that backends in slowstart are not all passed over by the same connections.
fn slot(c: usize, addr: &SocketAddr) -> u8 {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
        std::net::IpAddr::V6(v6) => {
            let n = u128::from(v6);
            (n as u64) ^ ((n >> 64) as u64)
        }
    };
    let mut x = (c as u64) ^ u64::from(addr.port()).rotate_left(17) ^ ip.rotate_left(31);
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) % 100) as u8
}

/// The backend set, shared between the accept loops, the health checker and the monitor.
#[derive(Debug)]
pub struct Pool {
    backends: watch::Sender<Arc<Vec<Arc<Backend>>>>,
    healthy: watch::Sender<bool>,
    counter: AtomicUsize,
    tuning: Tuning,
    initially_up: bool,
}

impl Pool {
    /// An empty pool without slowstart; new backends start `initially_up` (true when
    /// nothing checks them).
    pub fn new(policy: HealthPolicy, initially_up: bool) -> Self {
        Self::with_tuning(
            Tuning {
                policy,
                slowstart: Duration::ZERO,
            },
            initially_up,
        )
    }

    /// An empty pool with `tuning`.
    pub fn with_tuning(tuning: Tuning, initially_up: bool) -> Self {
        Self {
            backends: watch::Sender::new(Arc::new(Vec::new())),
            healthy: watch::Sender::new(false),
            counter: AtomicUsize::new(0),
            tuning,
            initially_up,
        }
    }

    /// The health policy.
    pub fn policy(&self) -> HealthPolicy {
        self.tuning.policy
    }

    /// The slowstart period.
    pub fn slowstart(&self) -> Duration {
        self.tuning.slowstart
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

    /// The up backends in the order a new connection should try them: round-robin, except
    /// that a backend in slowstart is passed over (moved to the end, still a fallback) for
    /// the share of connections it does not take yet.
    pub fn pick(&self) -> Vec<Arc<Backend>> {
        let all = self.backends();
        let up: Vec<&Arc<Backend>> = all.iter().filter(|b| b.is_up()).collect();
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        let order = rotation(up.len(), c).map(|i| up[i].clone());
        if self.tuning.slowstart.is_zero() {
            return order.collect();
        }
        let now = Instant::now();
        let (mut first, mut later) = (Vec::new(), Vec::new());
        for b in order {
            let w = b.weight_percent(self.tuning.slowstart, now);
            // A deterministic spread over the connection counter: w % of connections take it.
            if w >= 100 || slot(c, &b.addr) < w {
                first.push(b);
            } else {
                later.push(b);
            }
        }
        first.extend(later);
        first
    }

    /// Snapshots of every backend.
    pub fn snapshot(&self) -> Vec<BackendSnapshot> {
        let slowstart = self.tuning.slowstart;
        self.backends()
            .iter()
            .map(|b| b.snapshot(slowstart))
            .collect()
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

    #[test]
    fn slowstart_ramps_the_share_of_a_backend_that_came_back() {
        let ss = Duration::from_secs(10);
        assert_eq!(ramp_percent(None, ss), 100, "up since the start: no ramp");
        assert_eq!(ramp_percent(Some(Duration::ZERO), ss), 1);
        assert_eq!(ramp_percent(Some(Duration::from_secs(5)), ss), 50);
        assert_eq!(ramp_percent(Some(Duration::from_secs(10)), ss), 100);
        assert_eq!(ramp_percent(Some(Duration::ZERO), Duration::ZERO), 100);
        let pool = Pool::with_tuning(
            Tuning {
                policy: P,
                slowstart: ss,
            },
            true,
        );
        pool.set_backends(&[addr(1), addr(2), addr(3)]);
        let b2 = pool.backends()[1].clone();
        for _ in 0..3 {
            b2.record_check(Err("down".into()), P);
        }
        assert_eq!(b2.record_check(Ok(()), P), Some(true));
        pool.refresh_healthy();
        // Just back: it is tried first by (almost) no connection, but stays a fallback.
        let mut first = 0;
        for _ in 0..300 {
            let order = pool.pick();
            assert_eq!(order.len(), 3, "still a candidate");
            if order[0].addr.port() == 2 {
                first += 1;
            }
        }
        assert!(
            first <= 6,
            "a backend 0 s into slowstart went first {first} times of 300"
        );
        assert!(b2.snapshot(ss).weight_percent < 5);
    }

    #[tokio::test]
    async fn marked_down_wakes_its_sessions_and_the_checker() {
        let b = Backend::new(addr(1), true);
        let mut downs = b.subscribe_downs();
        assert!(b.mark_down("VRRP: adverts from 127.0.0.1 stopped".into()));
        assert!(!b.is_up());
        assert!(downs.has_changed().unwrap(), "sessions told");
        downs.borrow_and_update();
        tokio::time::timeout(std::time::Duration::from_secs(1), b.check_now.notified())
            .await
            .expect("checker woken");
        assert!(!b.mark_down("again".into()), "already down: no second flip");
        assert!(!downs.has_changed().unwrap());
        assert!(b.in_transition() || !b.is_up());
        // One passing check (rise 1) brings a wrongly suspected backend back.
        assert_eq!(b.record_check(Ok(()), P), Some(true));
        let s = b.snapshot(Duration::ZERO);
        assert_eq!((s.transitions, s.checks_passed), (2, 1));
        // Marked down by its checks: sessions told too.
        for _ in 0..3 {
            b.record_check(Err("refused".into()), P);
        }
        assert!(downs.has_changed().unwrap());
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
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
