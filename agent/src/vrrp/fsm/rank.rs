//! Goodbye and Master_Down ranks, keelson's addition to the RFC machine: backups of equal
//! priority share Skew_Time and would claim together, so each waits one rank step more
//! per known router that outranks it, plus a tie-break by the low bits of its address.
//! The rivals come from the I/O layer ([`Machine::set_rivals`]); the waits are arithmetic
//! on the machine's state.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::{Machine, State};

/// The most routers that wait behind others after a goodbye: the last of them waits two
/// rank steps more than the first, and at advert intervals of [`RANK_STEP_MIN`] and more
/// that, with the address tie-break (under 0.16 of a step), stays inside
/// Master_Down_Interval, the bound of a failover.
pub const MAX_GOODBYE_RANK: u32 = 2;

/// The least one rank is worth, whatever the advert interval ([`Machine::rank_step`]): a
/// backup ranked behind another must still be waiting when the other's first advert as
/// master arrives, and that takes a loaded or virtualised host's scheduling delay as well
/// as the network's (0.3 s between two claims in the QEMU cluster under TCG). At 1 s adverts
/// a step is the interval, as before; at 100 ms adverts it is this.
pub const RANK_STEP_MIN: Duration = Duration::from_millis(500);

impl Machine {
    /// One rank's wait: Master_Adver_Interval, and at least [`RANK_STEP_MIN`].
    pub fn rank_step(&self) -> Duration {
        self.master_interval().max(RANK_STEP_MIN)
    }

    /// Tells the machine which other routers could take over after a goodbye and the
    /// priority each is assumed to run at (the I/O layer knows them from members and from
    /// adverts heard). Used only to rank this router after a goodbye.
    pub fn set_rivals(&mut self, rivals: BTreeMap<IpAddr, u8>) {
        self.rivals = rivals;
    }

    /// Our place after the goodbye of `leaving`, 0 first: how many known rivals (the
    /// leaving router and ourselves aside) outrank us, by priority and then by the higher
    /// address, as the RFC breaks ties. A router whose checks do not all pass (priority
    /// under [`Params::full_priority`]) goes after every rival: they assume it whole, so it
    /// must not wait the same time as one of them. At most [`MAX_GOODBYE_RANK`].
    ///
    /// Routers of equal priority have the same Skew_Time: without ranks they all take over
    /// at once after a goodbye, every one announces the VIP, and a host that believed one
    /// that then yields loses its connections. The address tie-break alone staggers them by
    /// a few milliseconds, less than a loaded or virtualised host's scheduling jitter
    /// (0.3 s seen in the QEMU cluster). Ranked, the second waits a whole advert interval
    /// more, time for the first one's advert to arrive.
    pub fn goodbye_rank(&self, leaving: IpAddr) -> u32 {
        let me = self.params.primary;
        let rivals = self
            .rivals
            .iter()
            .filter(|&(&a, &p)| a != leaving && a != me && p > 0);
        let rank = if self.priority < self.params.full_priority {
            let n = rivals.count();
            n + usize::from(n > 0)
        } else {
            rivals
                .filter(|&(&a, &p)| (p, a) > (self.priority, me))
                .count()
        };
        u32::try_from(rank).map_or(MAX_GOODBYE_RANK, |r| r.min(MAX_GOODBYE_RANK))
    }

    /// How long a backup waits after the goodbye (priority 0) of `leaving` before it takes
    /// over: Skew_Time, plus one Master_Adver_Interval per [`Machine::goodbye_rank`], plus
    /// the address tie-break (0-15.5 % of an interval by the low bits of our address,
    /// higher addresses first, for routers that rank themselves alike). Under
    /// Master_Down_Interval whatever the rank. A leaving keelson master keeps the VIP
    /// until its successor's first advert, so the wait costs clients nothing.
    pub fn goodbye_wait(&self, leaving: IpAddr) -> Duration {
        self.skew() + self.rank_step() * self.goodbye_rank(leaving) + self.tiebreak()
    }

    /// The longest any backup waits after this router's goodbye (a leaving master keeps
    /// the VIP that long at most for a successor to advertise): the longest Skew_Time
    /// (priority 1), [`MAX_GOODBYE_RANK`] rank steps and the longest tie-break, and never
    /// less than Master_Down_Interval.
    pub fn successor_bound(&self) -> Duration {
        let step = self.rank_step();
        let longest =
            self.master_interval() * 255 / 256 + step * MAX_GOODBYE_RANK + step * 31 / 200;
        longest.max(self.master_down_interval())
    }

    /// The address tie-break: 0-15.5 % of a rank step by the low bits of our address,
    /// higher addresses first.
    fn tiebreak(&self) -> Duration {
        let low = match self.params.primary {
            IpAddr::V4(a) => a.octets()[3],
            IpAddr::V6(a) => a.octets()[15],
        };
        self.rank_step() * u32::from(31 - low % 32) / 200
    }

    /// In Backup, when Master_Down has just run out: how much longer this backup waits
    /// before it claims, if at all — one Master_Adver_Interval per
    /// [`Machine::goodbye_rank`] (the master we followed counting as the one leaving),
    /// plus the address tie-break; `None` for the first-ranked backup, which claims at
    /// once as the RFC says, and once the wait was taken (or was a goodbye's, which
    /// includes it).
    ///
    /// Master_Down runs out at the same moment on every backup that heard the same last
    /// advert: when the master died (its adverts stopped), and when it lives but advertises
    /// a priority the backups preempt (its apiserver check failed). Backups of equal
    /// priority then all claim together, as after a goodbye without ranks: each announces
    /// the VIP, and a host that believed one that then yields loses its connections. With
    /// the rank, the second waits an interval more and hears the first one's advert (on
    /// the real OpenStack, TCG guests, two masters claimed 0.6 s apart when the holder was
    /// powered off, each gave way to the other and the VIP was dark for 4 s).
    /// Without a master heard (startup) every backup claims at Master_Down as before.
    pub fn rank_wait(&self) -> Option<Duration> {
        if self.ranked || self.state != State::Backup {
            return None;
        }
        let (master, _) = self.master?;
        let rank = self.goodbye_rank(master);
        (rank > 0).then(|| self.rank_step() * rank + self.tiebreak())
    }
}
