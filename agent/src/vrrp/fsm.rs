//! The VRRP state machine of RFC 5798 §6.4 (which RFC 3768 §6.4 matches apart from units),
//! pure: time is a [`Duration`] since any fixed origin that the caller passes in, and the
//! machine answers with [`Action`]s for the I/O layer. No sockets, no clocks, no netlink.
//!
//! - here: the states, the RFC's timers (Skew_Time, Master_Down_Interval, the advert
//!   timer) and transitions, preemption, the owner, the goodbye (priority 0), giving way;
//! - `rank`: keelson's goodbye and Master_Down ranks, which stagger equal backups so that
//!   one claims at a time ([`Machine::goodbye_rank`], [`Machine::rank_wait`]);
//! - `tests`: both, at exact times.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::codec::Advert;

mod rank;

pub use rank::{MAX_GOODBYE_RANK, RANK_STEP_MIN};

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
mod tests;
