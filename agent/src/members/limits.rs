//! What one address may ask of a registry (docs/members.md, "Bounds"). Pure: time is an
//! argument.
//!
//! A node registers with each registry once per renewal interval (twice with the API VIP's
//! holder: at its address and through the VIP), every second while it knows nobody, and
//! once more when a VIP moves. [`SourceLimiter`] lets every address do that with room to
//! spare and refuses the rest: each registration costs a token of the address's bucket,
//! which holds [`BURST`] and refills [`PER_RENEWAL`] per renewal interval. As every member
//! must be renewed, that also bounds how many names one address can keep alive (about
//! [`PER_RENEWAL`]), authenticated or not; [`MEMBERS_PER_ADDRESS`] refuses a new name at
//! once when that many live members already list the address it comes from.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::table::MAX_MEMBERS;

/// Registrations an address may send at once.
pub const BURST: u32 = 16;

/// Registrations an address may send per renewal interval, once its burst is spent.
pub const PER_RENEWAL: u32 = 4;

/// Addresses the limiter keeps at most (one per member, with room for addresses that come
/// and go); a new address when it is full and none has been quiet long enough to forget is
/// refused like an address over its rate.
pub const MAX_SOURCES: usize = 2 * MAX_MEMBERS;

/// Live members that may list one address: a node, and its replacement at the same
/// address while the old record has not expired yet.
pub const MEMBERS_PER_ADDRESS: usize = 2;

/// A token bucket per source address.
#[derive(Debug)]
pub struct SourceLimiter {
    /// Tokens (in thousandths) and when they were last counted, per address.
    buckets: HashMap<IpAddr, (u64, Instant)>,
    /// Thousandths of a token gained per millisecond, times 1000 (so integer math keeps
    /// sub-token precision for renewal intervals up to hours).
    refill_per_ms_milli: u64,
}

const MILLI: u64 = 1000;

impl SourceLimiter {
    /// A limiter for members that renew every `renew`.
    pub fn new(renew: Duration) -> Self {
        let renew_ms = (renew.as_millis().max(1)).min(u128::from(u64::MAX)) as u64;
        Self {
            buckets: HashMap::new(),
            // PER_RENEWAL tokens per renew_ms, in thousandths of a token per ms, x1000.
            refill_per_ms_milli: (u64::from(PER_RENEWAL) * MILLI * MILLI / renew_ms).max(1),
        }
    }

    fn full() -> u64 {
        u64::from(BURST) * MILLI
    }

    fn refilled(&self, (tokens, at): (u64, Instant), now: Instant) -> u64 {
        let ms = now
            .saturating_duration_since(at)
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        tokens
            .saturating_add(ms.saturating_mul(self.refill_per_ms_milli) / MILLI)
            .min(Self::full())
    }

    /// Whether `source` may register now; takes a token when it may.
    pub fn allow(&mut self, source: IpAddr, now: Instant) -> bool {
        let source = source.to_canonical();
        if !self.buckets.contains_key(&source) && self.buckets.len() >= MAX_SOURCES {
            self.forget_quiet(now);
            if self.buckets.len() >= MAX_SOURCES {
                return false;
            }
        }
        let bucket = self
            .buckets
            .get(&source)
            .copied()
            .unwrap_or((Self::full(), now));
        let tokens = self.refilled(bucket, now);
        if tokens < MILLI {
            self.buckets.insert(source, (tokens, now));
            return false;
        }
        self.buckets.insert(source, (tokens - MILLI, now));
        true
    }

    /// Forgets the addresses whose bucket is full again: they have been quiet for as long
    /// as it takes to refill, so forgetting them changes nothing.
    pub fn forget_quiet(&mut self, now: Instant) {
        let full = Self::full();
        let buckets = std::mem::take(&mut self.buckets);
        self.buckets = buckets
            .into_iter()
            .filter(|(_, b)| self.refilled(*b, now) < full)
            .collect();
    }

    /// How many addresses it keeps.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_node_renewing_as_the_agent_does_is_never_refused() {
        // Alone for a while (every second, at the holder twice: VIP and address), then every
        // renewal interval at address and VIP, plus one round at each of 20 VIP moves.
        let renew = Duration::from_secs(10);
        let mut l = SourceLimiter::new(renew);
        let t0 = Instant::now();
        let a = ip("10.0.0.20");
        let mut t = t0;
        for _ in 0..5 {
            assert!(l.allow(a, t) && l.allow(a, t));
            t += Duration::from_secs(1);
        }
        for i in 0..200 {
            assert!(l.allow(a, t), "renewal {i}");
            assert!(l.allow(a, t), "renewal {i} through the VIP");
            if i % 10 == 0 {
                assert!(l.allow(a, t + Duration::from_millis(10)), "VIP moved");
            }
            t += renew;
        }
    }

    #[test]
    fn a_flood_from_one_address_gets_its_burst_then_its_rate_only() {
        let renew = Duration::from_secs(10);
        let mut l = SourceLimiter::new(renew);
        let t0 = Instant::now();
        let a = ip("10.0.0.66");
        let allowed = (0..1000).filter(|_| l.allow(a, t0)).count();
        assert_eq!(allowed, BURST as usize);
        // Another address is not held back by it.
        assert!(l.allow(ip("10.0.0.67"), t0));
        // Over the next minute: PER_RENEWAL per renewal interval.
        let mut later = 0;
        for ms in (0..60_000).step_by(100) {
            later += usize::from(l.allow(a, t0 + Duration::from_millis(ms + 100)));
        }
        assert_eq!(later, 6 * PER_RENEWAL as usize);
        // IPv4-mapped IPv6 is the same address.
        assert!(!l.allow(ip("::ffff:10.0.0.66"), t0 + Duration::from_secs(60)));
    }

    #[test]
    fn the_addresses_kept_are_bounded() {
        let mut l = SourceLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..MAX_SOURCES as u32 {
            assert!(l.allow(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)), t0));
        }
        assert_eq!(l.len(), MAX_SOURCES);
        let new = ip("192.0.2.1");
        assert!(!l.allow(new, t0), "full, and nobody quiet long enough");
        assert_eq!(l.len(), MAX_SOURCES);
        // A token refills in renew / PER_RENEWAL: every bucket is full again after that.
        let later = t0 + Duration::from_millis(2600);
        assert!(l.allow(new, later));
        assert_eq!(l.len(), 1, "the quiet ones forgotten");
    }
}
