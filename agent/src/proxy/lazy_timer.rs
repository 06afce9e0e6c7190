//! Timeouts that cost nothing for the connections that end before them.
//!
//! Every proxied connection has a connect timeout, maybe a connect stagger, and an idle
//! timeout, and almost every one ends long before any of them. A tokio timer per timeout
//! means taking the timer wheel's lock to arm and again to disarm it, and — whenever the
//! new deadline is the earliest one — a write to the runtime's eventfd to re-arm its
//! `epoll_wait` (measured: 1.6 eventfd writes per short connection, about a tenth of the
//! proxy's system calls per connection). A [`LazySleep`] of at least one tick first waits for
//! the shared [`Ticker`]'s next tick (a place in a wait list, no timer), and only a sleep
//! still alive then arms a real timer for what is left, so it still ends on time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// Time between the shared ticks; sleeps shorter than one tick use a timer at once.
pub const TICK: Duration = Duration::from_millis(250);

/// Whether a sleep of `d` waits for a shared tick before it arms its own timer: only when
/// the tick is sure to come by the deadline. It comes at most [`TICK`] after the sleep
/// starts (the ticker, idle or not, ticks one TICK after it is wanted), so a sleep of one
/// tick (the connect stagger) ends on time, or a scheduling moment late.
pub fn waits_for_tick(d: Duration) -> bool {
    d >= TICK
}

/// The shared tick: runs (see [`Ticker::run`]) only while someone waits for it.
#[derive(Debug, Default)]
pub struct Ticker {
    tick: Notify,
    /// Sleeps waiting for the next tick.
    waiting: AtomicUsize,
    /// Wakes the ticking task when the first sleep starts waiting.
    wanted: Notify,
}

/// Counts one sleep in [`Ticker::waiting`] while it lives.
struct Waiting<'a>(&'a Ticker);

impl<'a> Waiting<'a> {
    fn enter(t: &'a Ticker) -> Self {
        if t.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
            // A permit is stored if the ticker is not waiting yet: it cannot miss this.
            t.wanted.notify_one();
        }
        Self(t)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ticker {
    /// Ticks every [`TICK`] while sleeps wait for a tick, until `stop`. Sleeps waiting for
    /// a tick never end while this is not running.
    pub async fn run(&self, stop: CancellationToken) {
        loop {
            if self.waiting.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.wanted.notified() => {}
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            self.tick.notify_waiters();
        }
    }

    /// Sleeps for `d`, arming a timer only once a tick has passed (see the module doc).
    pub async fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        if waits_for_tick(d) {
            let _waiting = Waiting::enter(self);
            self.tick.notified().await;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

pin_project_lite::pin_project! {
    /// A wait for a deadline that only moves later (an idle timeout: last activity + the
    /// timeout), polled by a hand-written future with the current deadline each time. Like
    /// [`Ticker::sleep`] it waits for a shared tick before it arms a timer; a timer that
    /// fires before the (since moved) deadline is re-armed in place, without allocating.
    pub struct LazyDeadline<'a> {
        ticker: &'a Ticker,
        #[pin]
        phase: Phase<'a>,
    }
}

pin_project_lite::pin_project! {
    #[project = PhaseProj]
    enum Phase<'a> {
        Start,
        Tick {
            #[pin]
            tick: Notified<'a>,
            waiting: Waiting<'a>,
        },
        Timer {
            #[pin]
            sleep: Sleep,
        },
    }
}

impl<'a> LazyDeadline<'a> {
    /// A wait on `ticker`'s ticks; nothing is registered until it is polled.
    pub fn new(ticker: &'a Ticker) -> Self {
        Self {
            ticker,
            phase: Phase::Start,
        }
    }

    /// Ready once `deadline` has passed. The caller passes the current deadline on every
    /// poll; a later one than the last is picked up when the armed timer fires.
    pub fn poll_deadline(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        deadline: Instant,
    ) -> Poll<()> {
        let mut this = self.project();
        loop {
            let now = Instant::now();
            if now >= deadline {
                this.phase.set(Phase::Start);
                return Poll::Ready(());
            }
            match this.phase.as_mut().project() {
                PhaseProj::Start => {
                    if waits_for_tick(deadline - now) {
                        let waiting = Waiting::enter(this.ticker);
                        let tick = this.ticker.tick.notified();
                        this.phase.set(Phase::Tick { tick, waiting });
                    } else {
                        this.phase.set(Phase::Timer {
                            sleep: tokio::time::sleep_until(deadline),
                        });
                    }
                }
                PhaseProj::Tick { tick, .. } => {
                    ready!(tick.poll(cx));
                    this.phase.set(Phase::Timer {
                        sleep: tokio::time::sleep_until(deadline),
                    });
                }
                PhaseProj::Timer { mut sleep } => {
                    if sleep.is_elapsed() {
                        // Fired before the deadline, which moved since it was armed.
                        sleep.as_mut().reset(deadline);
                    }
                    ready!(sleep.poll(cx));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn only_sleeps_of_a_tick_or_more_wait_for_a_tick() {
        assert!(!waits_for_tick(Duration::ZERO));
        assert!(!waits_for_tick(TICK - Duration::from_millis(1)));
        assert!(waits_for_tick(TICK));
        assert!(waits_for_tick(2 * TICK));
        assert!(waits_for_tick(Duration::from_secs(86400)));
    }

    async fn ticking() -> (Arc<Ticker>, CancellationToken) {
        let t = Arc::new(Ticker::default());
        let stop = CancellationToken::new();
        tokio::spawn({
            let (t, stop) = (t.clone(), stop.clone());
            async move { t.run(stop).await }
        });
        (t, stop)
    }

    #[tokio::test]
    async fn a_long_sleep_ends_on_time_not_a_tick_late() {
        let (t, stop) = ticking().await;
        for ms in [100u64, 250, 600, 900] {
            let start = std::time::Instant::now();
            t.sleep(Duration::from_millis(ms)).await;
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(ms),
                "{ms} ms sleep took {took:?}"
            );
            assert!(
                took < Duration::from_millis(ms) + TICK,
                "{ms} ms sleep took {took:?}"
            );
        }
        assert_eq!(t.waiting.load(Ordering::Relaxed), 0);
        stop.cancel();
    }

    #[tokio::test]
    async fn many_sleeps_all_end_and_a_dropped_one_stops_counting() {
        let (t, stop) = ticking().await;
        let dropped = tokio::time::timeout(Duration::from_millis(50), t.sleep(TICK * 8)).await;
        assert!(dropped.is_err());
        assert_eq!(t.waiting.load(Ordering::Relaxed), 0);
        let start = std::time::Instant::now();
        let all = (0..100).map(|i| t.sleep(TICK * 2 + Duration::from_millis(i)));
        futures::future::join_all(all).await;
        assert!(start.elapsed() >= TICK * 2 + Duration::from_millis(99));
        assert!(start.elapsed() < TICK * 4, "took {:?}", start.elapsed());
        stop.cancel();
    }

    #[tokio::test]
    async fn a_deadline_moved_later_is_waited_for() {
        let (t, stop) = ticking().await;
        let start = Instant::now();
        let first = start + TICK * 2;
        let moved = start + TICK * 4;
        let mut wait = std::pin::pin!(LazyDeadline::new(&t));
        // Polled with the first deadline until its timer is armed, then with the later one.
        let early = std::future::poll_fn(|cx| {
            let d = if Instant::now() < start + TICK + TICK / 2 {
                first
            } else {
                moved
            };
            wait.as_mut().poll_deadline(cx, d)
        });
        tokio::time::timeout(TICK * 40, early).await.unwrap();
        assert!(
            start.elapsed() >= moved - start,
            "ended {:?} after start",
            start.elapsed()
        );
        assert_eq!(t.waiting.load(Ordering::Relaxed), 0);
        stop.cancel();
    }
}
