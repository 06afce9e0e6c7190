//! The VRRP state machine of RFC 5798 §6.4 (which RFC 3768 §6.4 matches apart from units),
//! pure: time is a [`Duration`] since any fixed origin that the caller passes in, and the
//! machine answers with [`Action`]s for the I/O layer. No sockets, no clocks, no netlink.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::codec::Advert;

/// The three RFC states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Not started, or stopped.
    Initialize,
    /// Listening to a master.
    Backup,
    /// Holding the VIP and advertising.
    Master,
}

/// What the I/O layer must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send an advertisement with this priority (0 when leaving).
    SendAdvert {
        /// Priority to put in the packet.
        priority: u8,
    },
    /// Add the VIP to the interface.
    AddVip,
    /// Remove the VIP from the interface.
    RemoveVip,
    /// A router that outranks us took over (its advert just arrived, its gratuitous ARP goes
    /// out with it): remove the VIP after a short grace, as a clean stop does after its
    /// successor's first advert, so requests still on their way to us are served rather than
    /// dropped while hosts switch over.
    HandOverVip,
    /// Send gratuitous ARP (IPv4) / unsolicited neighbour advertisement (IPv6) for the VIP.
    Announce,
}

/// Fixed parameters of one virtual router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Our own advertisement interval, centiseconds.
    pub interval_cs: u16,
    /// Whether a higher-priority backup preempts a lower-priority master.
    pub preempt: bool,
    /// Our primary address (source of our adverts; tie-breaks equal priorities).
    pub primary: IpAddr,
    /// Our priority with every check passing: what the other routers assume of us when
    /// they rank themselves after a goodbye ([`Machine::goodbye_rank`]).
    pub full_priority: u8,
}

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

/// One virtual router's state machine.
#[derive(Debug, Clone)]
pub struct Machine {
    params: Params,
    state: State,
    priority: u8,
    /// Master_Adver_Interval: the interval learned from the current master.
    master_interval_cs: u16,
    master_down_at: Option<Duration>,
    adver_at: Option<Duration>,
    /// Address and priority of the master we last heard (ourselves when master).
    master: Option<(IpAddr, u8)>,
    /// In Backup: when an advert (priority > 0, whatever the priority) from that master last
    /// arrived. A preempting backup lets lower-priority adverts pass without refreshing
    /// Master_Down, but they show the master is alive ([`Machine::silent_master`]).
    master_heard: Option<Duration>,
    transitions: u64,
    /// The other routers that could take over after a goodbye, by address, with the
    /// priority each is assumed to run at ([`Machine::set_rivals`]).
    rivals: BTreeMap<IpAddr, u8>,
    /// The current Master_Down wait already includes our rank ([`Machine::rank_wait`]):
    /// a goodbye's wait does, and so does the extension a ranked backup takes once when
    /// Master_Down runs out.
    ranked: bool,
    /// A router this backup follows whatever its priority ([`Machine::defer_to`]).
    deferred: Option<IpAddr>,
}

fn cs(c: u64) -> Duration {
    Duration::from_millis(c * 10)
}

impl Machine {
    /// A machine in Initialize with effective `priority` (1..=255).
    pub fn new(params: Params, priority: u8) -> Self {
        Self {
            master_interval_cs: params.interval_cs,
            params,
            state: State::Initialize,
            priority: priority.max(1),
            master_down_at: None,
            adver_at: None,
            master: None,
            master_heard: None,
            transitions: 0,
            rivals: BTreeMap::new(),
            ranked: false,
            deferred: None,
        }
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Current effective priority.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The master we last heard from (or ourselves), with its priority.
    pub fn master(&self) -> Option<(IpAddr, u8)> {
        self.master
    }

    /// How many times the state changed.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    /// Master_Adver_Interval: ours while master, else the one the master we follow
    /// advertises.
    pub fn master_interval(&self) -> Duration {
        cs(self.master_interval_cs.into())
    }

    /// One rank's wait: Master_Adver_Interval, and at least [`RANK_STEP_MIN`].
    pub fn rank_step(&self) -> Duration {
        self.master_interval().max(RANK_STEP_MIN)
    }

    /// A router whose adverts this backup follows (refreshing Master_Down) even when it
    /// could preempt it, or `None`: a router that cannot hear this one (adverts lost one
    /// way), to which it gave the VIP up ([`Machine::give_way`]). Preempting it would only
    /// make two holders again: it never hears the preemption.
    pub fn defer_to(&mut self, router: Option<IpAddr>) {
        self.deferred = router;
    }

    /// The router this backup defers to ([`Machine::defer_to`]).
    pub fn deferred(&self) -> Option<IpAddr> {
        self.deferred
    }

    /// In Backup: the master we followed, if nothing has come from it for three of its
    /// advert intervals — its adverts stopped (it died, or its link did). `None` while it
    /// still advertises, even at a priority we preempt: then a takeover at Master_Down is a
    /// preemption of a live master, not a death. Ask before [`Machine::on_timer`].
    pub fn silent_master(&self, now: Duration) -> Option<IpAddr> {
        if self.state != State::Backup {
            return None;
        }
        let (addr, _) = self.master?;
        let quiet = cs(3 * u64::from(self.master_interval_cs));
        self.master_heard
            .is_none_or(|t| now.saturating_sub(t) >= quiet)
            .then_some(addr)
    }

    /// Skew_Time = ((256 - Priority) * Master_Adver_Interval) / 256 (RFC 5798 §6.1).
    pub fn skew(&self) -> Duration {
        Duration::from_micros(
            (256 - u64::from(self.priority)) * u64::from(self.master_interval_cs) * 10_000 / 256,
        )
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

    /// Master_Down_Interval = 3 * Master_Adver_Interval + Skew_Time.
    pub fn master_down_interval(&self) -> Duration {
        cs(3 * u64::from(self.master_interval_cs)) + self.skew()
    }

    /// When [`Machine::on_timer`] must be called next, if ever.
    pub fn next_deadline(&self) -> Option<Duration> {
        match self.state {
            State::Initialize => None,
            State::Backup => self.master_down_at,
            State::Master => self.adver_at,
        }
    }

    fn become_master(&mut self, now: Duration) -> Vec<Action> {
        self.state = State::Master;
        self.transitions += 1;
        self.master_down_at = None;
        self.adver_at = Some(now + cs(self.params.interval_cs.into()));
        self.master = Some((self.params.primary, self.priority));
        // The VIP first: clients waiting out a failover need the address, and the advert
        // going out a netlink round-trip later changes nothing for the other routers.
        vec![
            Action::AddVip,
            Action::SendAdvert {
                priority: self.priority,
            },
            Action::Announce,
        ]
    }

    fn become_backup(&mut self, now: Duration) {
        self.state = State::Backup;
        self.transitions += 1;
        self.adver_at = None;
        self.master_down_at = Some(now + self.master_down_interval());
        self.ranked = false;
    }

    /// Startup event (RFC 5798 §6.4.1): the address owner (255) goes master at once,
    /// everyone else waits a Master_Down_Interval in Backup.
    pub fn startup(&mut self, now: Duration) -> Vec<Action> {
        if self.state != State::Initialize {
            return Vec::new();
        }
        if self.priority == 255 {
            self.become_master(now)
        } else {
            self.master_interval_cs = self.params.interval_cs;
            self.become_backup(now);
            Vec::new()
        }
    }

    /// Shutdown event: a master sends priority 0 and drops the VIP; everyone goes back to
    /// Initialize.
    pub fn shutdown(&mut self) -> Vec<Action> {
        let out = match self.state {
            State::Master => vec![Action::SendAdvert { priority: 0 }, Action::RemoveVip],
            _ => Vec::new(),
        };
        if self.state != State::Initialize {
            self.transitions += 1;
        }
        self.state = State::Initialize;
        self.master_down_at = None;
        self.adver_at = None;
        self.master = None;
        out
    }

    /// Timer expiry: call at or after [`Machine::next_deadline`]; earlier calls do nothing.
    pub fn on_timer(&mut self, now: Duration) -> Vec<Action> {
        match self.state {
            State::Backup if self.master_down_at.is_some_and(|t| now >= t) => {
                if let Some(wait) = self.rank_wait() {
                    // Ranked behind another backup: give its claim an interval to arrive.
                    self.ranked = true;
                    self.master_down_at = Some(now + wait);
                    return Vec::new();
                }
                self.become_master(now)
            }
            State::Master if self.adver_at.is_some_and(|t| now >= t) => {
                self.adver_at = Some(now + cs(self.params.interval_cs.into()));
                vec![Action::SendAdvert {
                    priority: self.priority,
                }]
            }
            _ => Vec::new(),
        }
    }

    /// A valid advertisement for our VRID from `src` (already checked by the I/O layer:
    /// TTL, checksum, auth, addresses). Adverts from our own address are ignored.
    pub fn on_advert(&mut self, now: Duration, src: IpAddr, advert: &Advert) -> Vec<Action> {
        if src == self.params.primary {
            return Vec::new();
        }
        match self.state {
            State::Initialize => Vec::new(),
            State::Backup => {
                if advert.priority == 0 {
                    // The master is leaving: take over after Skew_Time, plus our rank's
                    // wait and the address tie-break.
                    self.master_down_at = Some(now + self.goodbye_wait(src));
                    self.ranked = true;
                } else if !self.params.preempt
                    || advert.priority >= self.priority
                    || self.deferred == Some(src)
                {
                    self.master_interval_cs = advert.interval_cs;
                    self.master_down_at = Some(now + self.master_down_interval());
                    self.ranked = false;
                    self.master = Some((src, advert.priority));
                    self.master_heard = Some(now);
                } else if self.master.is_some_and(|(m, _)| m == src) {
                    // A lower-priority master and we preempt: let Master_Down expire, but
                    // note that it is alive.
                    self.master_heard = Some(now);
                }
                Vec::new()
            }
            State::Master => {
                if advert.priority == 0 {
                    // Another master is leaving; assert ourselves at once.
                    self.adver_at = Some(now + cs(self.params.interval_cs.into()));
                    vec![Action::SendAdvert {
                        priority: self.priority,
                    }]
                } else if advert.priority > self.priority
                    || (advert.priority == self.priority && src > self.params.primary)
                {
                    self.master_interval_cs = advert.interval_cs;
                    self.master = Some((src, advert.priority));
                    self.master_heard = Some(now);
                    self.become_backup(now);
                    vec![Action::HandOverVip]
                } else {
                    // Another router thinks it is master (two took over at once, or one came
                    // back from a partition) and has announced the VIP with its MAC: assert
                    // ourselves and announce again so hosts fix their ARP caches, as
                    // keepalived's `garp_lower_prio_repeat`. It yields on our advert.
                    self.adver_at = Some(now + cs(self.params.interval_cs.into()));
                    vec![
                        Action::SendAdvert {
                            priority: self.priority,
                        },
                        Action::Announce,
                    ]
                }
            }
        }
    }

    /// Another holder of the VIP that sends us no adverts was seen (ARP conflict, in
    /// unicast mode) and wins the tie-break: a master goes back to Backup, hands the VIP
    /// over and waits a Master_Down interval as after startup. A hand-over, not a removal
    /// at once: the other holder has just announced the VIP, and most often it is a router
    /// that preempted us and whose gratuitous ARP got here before its advert.
    pub fn yield_to_unknown(&mut self, now: Duration) -> Vec<Action> {
        if self.state != State::Master {
            return Vec::new();
        }
        self.master_interval_cs = self.params.interval_cs;
        self.master = None;
        self.become_backup(now);
        vec![Action::HandOverVip]
    }

    /// A backup starts its Master_Down wait afresh at `now` (a peer just became known in
    /// unicast mode: its adverts get a whole interval to arrive before we claim).
    pub fn restart_master_down(&mut self, now: Duration) {
        self.hold_until(now + self.master_down_interval());
    }

    /// A backup does not claim before `at` (the master is silent but its death is not
    /// confirmed: the VIP's holder answered); then it decides again.
    pub fn hold_until(&mut self, at: Duration) {
        if self.state == State::Backup {
            self.master_down_at = Some(at);
            self.ranked = false;
        }
    }

    /// A master that another router, `src`, keeps contesting as if it never heard us (its
    /// adverts as master go on after ours answered them): it cannot hear us, and as long as
    /// it cannot, it never yields. This router gives the VIP up to it at once (the other
    /// one has announced it, and goes on announcing it; nothing would tell hosts to come
    /// back here) and follows it as a backup.
    pub fn give_way(&mut self, now: Duration, src: IpAddr, advert: &Advert) -> Vec<Action> {
        if self.state != State::Master || src == self.params.primary {
            return Vec::new();
        }
        self.master_interval_cs = advert.interval_cs;
        self.master = Some((src, advert.priority));
        self.master_heard = Some(now);
        self.become_backup(now);
        vec![Action::RemoveVip]
    }

    /// Changes the effective priority (health weights moved). The owner priority 255 is
    /// never reached by weights: callers clamp to 1..=254 unless the base is 255. As in the
    /// RFC, a backup that now outranks the master takes over when Master_Down expires (it
    /// stops refreshing the timer from the lower-priority adverts), and a master simply
    /// advertises the new priority, at once so that backups react without waiting.
    pub fn set_priority(&mut self, now: Duration, priority: u8) -> Vec<Action> {
        let priority = priority.max(1);
        if priority == self.priority {
            return Vec::new();
        }
        self.priority = priority;
        match self.state {
            State::Master => {
                self.master = Some((self.params.primary, priority));
                self.adver_at = Some(now + cs(self.params.interval_cs.into()));
                vec![Action::SendAdvert { priority }]
            }
            _ => Vec::new(),
        }
    }
}

/// Effective priority: base plus the weights of passing checks, kept in 1..=254 (255 is
/// reserved for the address owner, which only a base of 255 gives).
pub fn effective_priority(base: u8, weights: i32) -> u8 {
    if base == 255 {
        return 255;
    }
    (i32::from(base) + weights).clamp(1, 254) as u8
}

#[cfg(test)]
mod tests {
    use super::super::codec::{Auth, Version};
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn machine(prio: u8, preempt: bool, primary: &str) -> Machine {
        Machine::new(
            Params {
                interval_cs: 100,
                preempt,
                primary: ip(primary),
                full_priority: prio,
            },
            prio,
        )
    }

    fn adv(prio: u8) -> Advert {
        Advert {
            version: Version::V3,
            vrid: 1,
            priority: prio,
            interval_cs: 100,
            addresses: vec![ip("10.0.0.5")],
            auth: Auth::None,
        }
    }

    #[test]
    fn skew_and_master_down_follow_rfc() {
        let m = machine(100, true, "10.0.0.1");
        // (256-100)*1s/256 = 609.375 ms; 3 s + that.
        assert_eq!(m.skew(), Duration::from_micros(609_375));
        assert_eq!(m.master_down_interval(), Duration::from_micros(3_609_375));
        let m = machine(254, true, "10.0.0.1");
        assert_eq!(m.skew(), Duration::from_micros(7_812));
    }

    #[test]
    fn lone_backup_becomes_master_after_master_down() {
        let mut m = machine(100, true, "10.0.0.1");
        assert!(m.startup(ms(0)).is_empty());
        assert_eq!(m.state(), State::Backup);
        assert_eq!(m.next_deadline(), Some(Duration::from_micros(3_609_375)));
        assert!(m.on_timer(ms(3600)).is_empty(), "early timer does nothing");
        assert_eq!(
            m.on_timer(ms(3610)),
            vec![
                Action::AddVip,
                Action::SendAdvert { priority: 100 },
                Action::Announce
            ]
        );
        assert_eq!(m.state(), State::Master);
        assert_eq!(m.next_deadline(), Some(ms(4610)));
        assert_eq!(
            m.on_timer(ms(4610)),
            vec![Action::SendAdvert { priority: 100 }]
        );
        assert_eq!(m.next_deadline(), Some(ms(5610)));
    }

    #[test]
    fn owner_goes_master_at_once() {
        let mut m = machine(255, true, "10.0.0.1");
        assert_eq!(
            m.startup(ms(0)),
            vec![
                Action::AddVip,
                Action::SendAdvert { priority: 255 },
                Action::Announce
            ]
        );
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn backup_stays_while_master_advertises() {
        let mut m = machine(100, true, "10.0.0.1");
        m.startup(ms(0));
        for t in (500..20_000).step_by(1000) {
            assert!(m.on_timer(ms(t)).is_empty());
            m.on_advert(ms(t), ip("10.0.0.2"), &adv(150));
        }
        assert_eq!(m.state(), State::Backup);
        assert_eq!(m.master(), Some((ip("10.0.0.2"), 150)));
    }

    #[test]
    fn priority_zero_makes_backup_take_over_after_skew() {
        let mut m = machine(100, true, "10.0.0.1");
        m.startup(ms(0));
        m.on_advert(ms(1000), ip("10.0.0.2"), &adv(150));
        m.on_advert(ms(1500), ip("10.0.0.2"), &adv(0));
        // Skew_Time, plus 150 ms of tie-break for an address ending in 1 (5 ms a step at
        // 1 s adverts); no rival known, so no rank's wait.
        assert_eq!(
            m.next_deadline(),
            Some(ms(1500) + Duration::from_micros(609_375) + ms(150))
        );
        assert!(m.on_timer(ms(2110)).is_empty());
        assert!(m.on_timer(ms(2260)).contains(&Action::AddVip));
    }

    #[test]
    fn equal_backups_do_not_take_over_together_after_a_goodbye() {
        let (mut lo, mut hi) = (
            machine(90, true, "10.0.0.11"),
            machine(90, true, "10.0.0.12"),
        );
        for m in [&mut lo, &mut hi] {
            m.startup(ms(0));
            m.on_advert(ms(1000), ip("10.0.0.10"), &adv(90));
            m.on_advert(ms(1500), ip("10.0.0.10"), &adv(0));
        }
        let (t_lo, t_hi) = (lo.next_deadline().unwrap(), hi.next_deadline().unwrap());
        // Neither knows the other: only the address tie-break separates them.
        assert_eq!(t_lo - t_hi, ms(5), "the higher address goes first");
        assert!(hi.on_timer(t_hi).contains(&Action::AddVip));
        // Its first advert reaches the other before the other's timer runs out.
        lo.on_advert(t_hi + ms(1), ip("10.0.0.12"), &adv(90));
        assert!(lo.on_timer(t_lo).is_empty());
        assert_eq!(lo.state(), State::Backup);
    }

    /// Backups of priority `prio` at `addrs`, each knowing the others and the master
    /// `10.0.0.10` as rivals at `prio`, all hearing that master and then its goodbye at
    /// 1.5 s.
    fn after_goodbye(prio: u8, addrs: &[&str]) -> Vec<Machine> {
        after_last_advert(prio, addrs, Some(0))
    }

    #[test]
    fn equal_backups_rank_by_address_after_a_goodbye() {
        // .12 and .44 get the same address tie-break (12 = 44 mod 32): only the rank
        // separates them, by a whole advert interval.
        let ms_ = after_goodbye(90, &["10.0.0.11", "10.0.0.12", "10.0.0.44"]);
        let leaving = ip("10.0.0.10");
        let ranks: Vec<u32> = ms_.iter().map(|m| m.goodbye_rank(leaving)).collect();
        assert_eq!(ranks, vec![2, 1, 0], "the highest address first");
        let t: Vec<Duration> = ms_.iter().map(|m| m.next_deadline().unwrap()).collect();
        assert_eq!(t[1] - t[2], ms(1000), "one interval a rank");
        assert_eq!(t[0] - t[1], ms(1005), "one interval and the tie-break");
        // Every wait is inside Master_Down, the failover bound.
        for m in &ms_ {
            assert!(m.goodbye_wait(leaving) < m.master_down_interval());
        }
    }

    #[test]
    fn only_the_first_ranked_takes_over_even_when_its_advert_is_late() {
        let mut ms_ = after_goodbye(90, &["10.0.0.12", "10.0.0.44"]);
        let (first, second) = (
            ms_[1].next_deadline().unwrap(),
            ms_[0].next_deadline().unwrap(),
        );
        assert!(ms_[1].on_timer(first).contains(&Action::AddVip));
        // A host that runs late (a loaded or virtualised one): the new master's advert
        // reaches the other 900 ms after it took over, still before the other's timer.
        assert!(ms_[0].on_timer(first + ms(899)).is_empty());
        ms_[0].on_advert(first + ms(900), ip("10.0.0.44"), &adv(90));
        assert!(ms_[0].on_timer(second).is_empty());
        assert_eq!(ms_[0].state(), State::Backup);
        assert_eq!(ms_[0].master(), Some((ip("10.0.0.44"), 90)));
        assert_eq!(ms_[0].transitions(), 1, "never master");
    }

    /// Backups of priority `prio` at `addrs`, each knowing the others and the master
    /// `10.0.0.10` as rivals at `prio`, all hearing that master at `prio` at 1 s and then,
    /// at 1.5 s, at `then` (`None`: its adverts stop).
    fn after_last_advert(prio: u8, addrs: &[&str], then: Option<u8>) -> Vec<Machine> {
        let mut all: Vec<&str> = addrs.to_vec();
        all.push("10.0.0.10");
        addrs
            .iter()
            .map(|a| {
                let mut m = machine(prio, true, a);
                m.set_rivals(all.iter().map(|r| (ip(r), prio)).collect());
                m.startup(ms(0));
                m.on_advert(ms(1000), ip("10.0.0.10"), &adv(prio));
                if let Some(p) = then {
                    m.on_advert(ms(1500), ip("10.0.0.10"), &adv(p));
                }
                m
            })
            .collect()
    }

    /// Both backups' Master_Down runs out at once (they heard the same last advert): the
    /// first-ranked claims then, the second waits an interval more and hears it.
    fn only_one_claims_at_master_down(mut ms_: Vec<Machine>) {
        let t = ms_[0].next_deadline().unwrap();
        assert_eq!(t, ms(1000) + ms_[0].master_down_interval());
        assert_eq!(
            ms_[1].next_deadline(),
            Some(t),
            "equal priorities, one deadline"
        );
        // Both timers run out together (a loaded host runs both late, say).
        let late = t + ms(300);
        assert!(ms_[1].on_timer(late).contains(&Action::AddVip), "rank 0");
        // Rank 1: an interval, and the tie-break of an address ending in 12 (95 ms).
        assert_eq!(ms_[0].rank_wait(), Some(ms(1095)));
        assert!(ms_[0].on_timer(late).is_empty());
        assert_eq!(ms_[0].next_deadline(), Some(late + ms(1095)));
        ms_[0].on_advert(late + ms(900), ip("10.0.0.44"), &adv(90));
        assert!(ms_[0].on_timer(late + ms(1095)).is_empty());
        assert_eq!(ms_[0].state(), State::Backup);
        assert_eq!(ms_[0].master(), Some((ip("10.0.0.44"), 90)));
        assert_eq!(ms_[0].transitions(), 1, "never master");
    }

    #[test]
    fn equal_backups_preempting_a_live_master_claim_one_at_a_time() {
        // The master lives but its priority fell below theirs (a check failed): both
        // backups let Master_Down run out from its last advert at 90.
        let ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], Some(70));
        assert_eq!(ms_[0].silent_master(ms(1600)), None, "alive");
        only_one_claims_at_master_down(ms_);
    }

    #[test]
    fn equal_backups_claim_one_at_a_time_when_the_master_dies() {
        let ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], None);
        only_one_claims_at_master_down(ms_);
    }

    #[test]
    fn a_ranked_backup_claims_after_its_wait_when_nobody_did() {
        let mut ms_ = after_last_advert(90, &["10.0.0.12", "10.0.0.44"], Some(70));
        let t = ms_[0].next_deadline().unwrap();
        assert!(ms_[0].on_timer(t).is_empty());
        // The first-ranked never claims (dead too, or cut off): the wait is taken once.
        assert!(ms_[0].on_timer(t + ms(1095)).contains(&Action::AddVip));
        // A whole Master_Down later, every backup of a new master starts unranked again.
        let mut b = machine(90, true, "10.0.0.12");
        b.set_rivals(ms_[1].rivals.clone());
        b.startup(ms(0));
        assert_eq!(
            b.rank_wait(),
            None,
            "no master heard: startup claims at Master_Down"
        );
        assert!(
            b.on_timer(b.next_deadline().unwrap())
                .contains(&Action::AddVip)
        );
        // And a goodbye's wait already holds the rank: no second wait at its end.
        let mut g = after_goodbye(90, &["10.0.0.12", "10.0.0.44"]);
        let end = g[0].next_deadline().unwrap();
        assert!(g[0].on_timer(end).contains(&Action::AddVip));
    }

    #[test]
    fn goodbye_rank_follows_priority_then_address_and_is_capped() {
        let leaving = ip("10.0.0.10");
        let mut m = machine(100, true, "10.0.0.20");
        let rivals = |list: &[(&str, u8)]| list.iter().map(|(a, p)| (ip(a), *p)).collect();
        // Nobody known: first.
        assert_eq!(m.goodbye_rank(leaving), 0);
        // The leaving router, ourselves and routers that said goodbye do not count; a
        // higher priority does whatever its address, a lower one does not.
        m.set_rivals(rivals(&[
            ("10.0.0.10", 200),
            ("10.0.0.20", 200),
            ("10.0.0.30", 0),
            ("10.0.0.2", 101),
            ("10.0.0.99", 99),
        ]));
        assert_eq!(m.goodbye_rank(leaving), 1);
        // Capped: five ahead of us wait no longer than two.
        m.set_rivals(rivals(&[
            ("10.0.0.21", 100),
            ("10.0.0.22", 100),
            ("10.0.0.23", 100),
            ("10.0.0.24", 150),
            ("10.0.0.25", 150),
        ]));
        assert_eq!(m.goodbye_rank(leaving), MAX_GOODBYE_RANK);
        assert!(m.goodbye_wait(leaving) < m.master_down_interval());
    }

    #[test]
    fn a_backup_whose_checks_fail_goes_after_every_rival() {
        let leaving = ip("10.0.0.10");
        // Whole at 120, at 70 now (a check failing): the others assume it at 120.
        let mut m = Machine::new(
            Params {
                interval_cs: 100,
                preempt: true,
                primary: ip("10.0.0.99"),
                full_priority: 120,
            },
            70,
        );
        m.set_rivals([(ip("10.0.0.11"), 120)].into_iter().collect());
        assert_eq!(m.goodbye_rank(leaving), 2, "after the one rival's rank 1");
        // The rival ranks itself behind us (it assumes us whole, at a higher address): 1.
        let mut r = machine(120, true, "10.0.0.11");
        r.set_rivals([(ip("10.0.0.99"), 120)].into_iter().collect());
        assert_eq!(r.goodbye_rank(leaving), 1);
        // Alone, nobody to go after.
        m.set_rivals(BTreeMap::new());
        assert_eq!(m.goodbye_rank(leaving), 0);
    }

    #[test]
    fn preemption_on_and_off() {
        // Backup with higher priority ignores a lower master and takes over on Master_Down.
        let mut m = machine(200, true, "10.0.0.1");
        m.startup(ms(0));
        let mut t = 0;
        while m.state() == State::Backup && t < 10_000 {
            t += 100;
            if t % 1000 == 0 {
                m.on_advert(ms(t), ip("10.0.0.2"), &adv(100));
            }
            m.on_timer(ms(t));
        }
        assert_eq!(m.state(), State::Master);
        // 3 * 1 s + (56/256) s = 3.22 s after start: the lower adverts did not reset it.
        assert_eq!(t, 3300);

        // Without preemption the lower master keeps it.
        let mut m = machine(200, false, "10.0.0.1");
        m.startup(ms(0));
        for t in (100..20_000).step_by(100) {
            if t % 1000 == 0 {
                m.on_advert(ms(t), ip("10.0.0.2"), &adv(100));
            }
            m.on_timer(ms(t));
        }
        assert_eq!(m.state(), State::Backup);
    }

    #[test]
    fn master_yields_to_higher_and_to_equal_with_higher_address() {
        let mut m = machine(100, true, "10.0.0.5");
        m.startup(ms(0));
        m.on_timer(ms(4000));
        assert_eq!(m.state(), State::Master);
        // Lower priority: we stay master, advertise at once and announce the VIP again
        // (the other one may have just announced it with its own MAC).
        let reassert = vec![Action::SendAdvert { priority: 100 }, Action::Announce];
        assert_eq!(m.on_advert(ms(4100), ip("10.0.0.9"), &adv(50)), reassert);
        // Equal priority, lower address: we win the same way.
        assert_eq!(m.on_advert(ms(4200), ip("10.0.0.4"), &adv(100)), reassert);
        assert_eq!(m.state(), State::Master);
        // Equal priority, higher address: we yield (and hand the VIP over).
        assert_eq!(
            m.on_advert(ms(4300), ip("10.0.0.6"), &adv(100)),
            vec![Action::HandOverVip]
        );
        assert_eq!(m.state(), State::Backup);
        assert_eq!(m.transitions(), 3);
    }

    #[test]
    fn master_answers_priority_zero_at_once() {
        let mut m = machine(100, true, "10.0.0.5");
        m.startup(ms(0));
        m.on_timer(ms(4000));
        assert_eq!(
            m.on_advert(ms(4100), ip("10.0.0.9"), &adv(0)),
            vec![Action::SendAdvert { priority: 100 }]
        );
        assert_eq!(m.next_deadline(), Some(ms(5100)));
    }

    #[test]
    fn own_adverts_are_ignored() {
        let mut m = machine(100, true, "10.0.0.5");
        m.startup(ms(0));
        m.on_timer(ms(4000));
        assert!(m.on_advert(ms(4100), ip("10.0.0.5"), &adv(200)).is_empty());
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn shutdown_sends_priority_zero_and_removes_vip() {
        let mut m = machine(100, true, "10.0.0.5");
        m.startup(ms(0));
        m.on_timer(ms(4000));
        assert_eq!(
            m.shutdown(),
            vec![Action::SendAdvert { priority: 0 }, Action::RemoveVip]
        );
        assert_eq!(m.state(), State::Initialize);
        assert_eq!(m.next_deadline(), None);
        let mut b = machine(100, true, "10.0.0.5");
        b.startup(ms(0));
        assert!(b.shutdown().is_empty());
    }

    #[test]
    fn learns_master_interval_for_master_down() {
        let mut m = machine(100, true, "10.0.0.1");
        m.startup(ms(0));
        let mut a = adv(150);
        a.interval_cs = 10;
        m.on_advert(ms(50), ip("10.0.0.2"), &a);
        // 3 * 100 ms + (156 * 100 ms / 256) = 300 + 60.9375 ms.
        assert_eq!(
            m.next_deadline(),
            Some(ms(50) + Duration::from_micros(360_937))
        );
    }

    #[test]
    fn priority_change_on_master_is_advertised_and_moves_the_vip() {
        let mut a = machine(150, true, "10.0.0.1");
        let mut b = machine(100, true, "10.0.0.2");
        a.startup(ms(0));
        b.startup(ms(0));
        a.on_timer(ms(3500));
        assert_eq!(a.state(), State::Master);
        b.on_advert(ms(3500), ip("10.0.0.1"), &adv(150));
        // a's check fails: 150 - 60 = 90 < 100.
        let out = a.set_priority(ms(3600), effective_priority(150, -60));
        assert_eq!(out, vec![Action::SendAdvert { priority: 90 }]);
        // b ignores the lower adverts, a sends one a second, and b takes over at its
        // Master_Down.
        let deadline = ms(3500) + b.master_down_interval();
        for t in (3600..deadline.as_millis() as u64).step_by(1000) {
            b.on_advert(ms(t), ip("10.0.0.1"), &adv(90));
            assert!(b.on_timer(ms(t)).is_empty());
        }
        assert_eq!(b.next_deadline(), Some(deadline));
        // A preemption of a live master, not a death: no "adverts stopped".
        assert_eq!(b.silent_master(deadline), None);
        assert!(b.on_timer(deadline).contains(&Action::AddVip));
        // a sees b's higher advert, steps down and hands the VIP over.
        assert_eq!(
            a.on_advert(deadline, ip("10.0.0.2"), &adv(100)),
            vec![Action::HandOverVip]
        );
        assert_eq!(a.state(), State::Backup);
        assert_eq!(a.silent_master(deadline), None, "b was just heard");
    }

    #[test]
    fn silent_master_only_when_its_adverts_stop() {
        let mut m = machine(100, true, "10.0.0.1");
        m.startup(ms(0));
        assert_eq!(m.silent_master(ms(100)), None, "no master heard yet");
        for t in (1000..=5000).step_by(1000) {
            m.on_advert(ms(t), ip("10.0.0.2"), &adv(150));
            assert_eq!(m.silent_master(ms(t + 999)), None);
        }
        // Adverts from another, lower router say nothing about the master.
        m.on_advert(ms(7000), ip("10.0.0.3"), &adv(50));
        // The master's last advert at 5 s: silent from 8 s (three intervals), and the
        // takeover at Master_Down (8.61 s) is one after its adverts stopped.
        assert_eq!(m.silent_master(ms(7999)), None);
        assert_eq!(m.silent_master(ms(8000)), Some(ip("10.0.0.2")));
        let deadline = m.next_deadline().unwrap();
        assert_eq!(m.silent_master(deadline), Some(ip("10.0.0.2")));
        assert!(m.on_timer(deadline).contains(&Action::AddVip));
        assert_eq!(m.silent_master(deadline), None, "a master follows nobody");
    }

    #[test]
    fn yield_to_unknown_and_restart_master_down() {
        let mut m = machine(100, true, "10.0.0.5");
        m.startup(ms(0));
        assert!(
            m.yield_to_unknown(ms(10)).is_empty(),
            "a backup has nothing to yield"
        );
        m.restart_master_down(ms(3000));
        assert_eq!(
            m.next_deadline(),
            Some(ms(3000) + m.master_down_interval()),
            "the wait starts again"
        );
        m.on_timer(ms(7000));
        assert_eq!(m.state(), State::Master);
        assert_eq!(m.yield_to_unknown(ms(8000)), vec![Action::HandOverVip]);
        assert_eq!(m.state(), State::Backup);
        assert_eq!(m.master(), None);
        assert_eq!(m.next_deadline(), Some(ms(8000) + m.master_down_interval()));
        // A master does not move its advert timer.
        m.on_timer(ms(20_000));
        m.restart_master_down(ms(20_500));
        assert_eq!(m.next_deadline(), Some(ms(21_000)));
    }

    #[test]
    fn effective_priority_clamps() {
        assert_eq!(effective_priority(40, 50), 90);
        assert_eq!(effective_priority(40, -100), 1);
        assert_eq!(effective_priority(200, 100), 254);
        assert_eq!(effective_priority(255, -100), 255);
    }
}
