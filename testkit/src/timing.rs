//! The VRRP tests' timing bounds, derived from RFC 5798 (§6.1, §6.4) with the margins
//! stated here, in one place.
//!
//! Two kinds of bound, with two margins:
//!
//! - **A wait** ("node 1 takes the VIP over") passes the moment the event happens: its
//!   limit is the protocol's time plus [`WAIT_MARGIN`], generous because a larger margin
//!   costs nothing when the test passes; it only bounds how long a failure takes to show.
//!   It covers a loaded 2-core machine: process start-up, `ip` scans tens of milliseconds
//!   each, and the scheduling stalls that made a 2 s margin fail once in CI.
//! - **An ordering** ("a priority-0 advert beats Master_Down") asserts that one path is
//!   faster than another, so its margin must stay below the gap between the two paths or
//!   the assertion proves nothing: [`ORDER_MARGIN`], measured from the agents' own status
//!   lines as they are printed ([`crate::cmd::JsonLines::first_since`]), not from scans
//!   of the namespaces, whose own latency under load is larger than the gap.

use std::time::Duration;

/// Added to a protocol time for a wait ([`takeover_within`]).
pub const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// Added to a protocol time for an ordering: less than the three advert intervals (300 ms
/// at the tests' 100 ms adverts) that separate Skew_Time from Master_Down_Interval.
pub const ORDER_MARGIN: Duration = Duration::from_millis(200);

/// Skew_Time for an advert interval (ms) and a backup priority: `(256 - priority) *
/// interval / 256` (RFC 5798 §6.1, in the interval's units). How long a backup waits after
/// a priority-0 advert before it claims.
pub fn skew_time(interval_ms: u64, prio: u64) -> Duration {
    Duration::from_micros((256 - prio) * interval_ms * 1000 / 256)
}

/// Master_Down_Interval for an advert interval (ms) and a backup priority: `3 * interval +
/// Skew_Time` (RFC 5798 §6.1). How long a backup waits for a silent master.
pub fn master_down(interval_ms: u64, prio: u64) -> Duration {
    Duration::from_millis(3 * interval_ms) + skew_time(interval_ms, prio)
}

/// The limit of a wait for a backup of priority `prio` to take over from a master that
/// went silent (or, the more so, sent priority 0): Master_Down plus [`WAIT_MARGIN`].
pub fn takeover_within(interval_ms: u64, prio: u64) -> Duration {
    master_down(interval_ms, prio) + WAIT_MARGIN
}

/// The bound on a takeover after a priority-0 advert, for the assertion that it beats
/// Master_Down: Skew_Time plus [`ORDER_MARGIN`]. Panics if that would not be below
/// Master_Down (the assertion would prove nothing).
pub fn priority_zero_within(interval_ms: u64, prio: u64) -> Duration {
    let bound = skew_time(interval_ms, prio) + ORDER_MARGIN;
    assert!(
        bound < master_down(interval_ms, prio),
        "adverts every {interval_ms} ms are too close for the priority-0 bound ({bound:?}) to \
         separate Skew_Time from Master_Down"
    );
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rfc_times_for_the_tests_adverts() {
        // 100 ms adverts, priority 40: Skew_Time 84.375 ms, Master_Down 384.375 ms.
        assert_eq!(skew_time(100, 40), Duration::from_micros(84_375));
        assert_eq!(master_down(100, 40), Duration::from_micros(384_375));
        // 1 s adverts, priority 100: 609.375 ms and 3.609375 s.
        assert_eq!(master_down(1000, 100), Duration::from_micros(3_609_375));
        assert!(priority_zero_within(100, 40) < master_down(100, 40));
        assert_eq!(takeover_within(100, 40), Duration::from_micros(5_384_375));
    }
}
