//! Several decision cores on a simulated segment, event by event: adverts and ARP frames
//! travel with each link's loss and delay, a node's kernel answers ARP for a VIP it holds
//! even while its agent is stalled (what a probe relies on), a stalled agent reads what
//! queued up when it runs again, and a dead node answers nothing. The holders are traced,
//! and the properties of docs/vrrp.md ("Fast failover without flapping") are checked on
//! random runs: the seed is printed, and fixed under CI.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::*;

/// Which frames a link rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Vrrp,
    Arp,
}

/// What happens to a frame from one node to another.
#[derive(Debug, Clone, Copy)]
struct Link {
    /// Dropped (a partition, a cut direction).
    cut: bool,
    /// Chance of loss.
    loss: f64,
    /// Delay, drawn uniformly from this range (microseconds).
    delay_us: (u64, u64),
}

const CLEAN: Link = Link {
    cut: false,
    loss: 0.0,
    delay_us: (100, 300),
};

/// `tc netem delay 50ms 50ms loss 10%` on every node's link (bench/vip_soak.sh's netem).
const NETEM: Link = Link {
    cut: false,
    loss: 0.1,
    delay_us: (0, 100_000),
};

#[derive(Debug, Clone)]
enum Frame {
    Advert { src: usize, advert: Advert },
    Arp(ArpFrame),
    ArpRequest { from: usize },
}

struct Node {
    core: Router,
    holds: bool,
    /// The node runs (its kernel answers ARP); false once killed.
    alive: bool,
    /// Its agent is stalled until then.
    frozen_until: Option<Duration>,
    /// What arrived while stalled, with arrival times.
    backlog: Vec<(Duration, Frame)>,
    notes: Vec<(Duration, Note)>,
}

/// Xorshift64*: the simulation's only randomness, from the case's seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo + 1)
        }
    }
}

type Rule = Box<dyn Fn(Duration, usize, usize, Kind) -> Link>;

struct Sim {
    now: Duration,
    nodes: Vec<Node>,
    events: BinaryHeap<Reverse<(Duration, u64)>>,
    frames: BTreeMap<u64, (usize, Frame)>,
    seq: u64,
    rng: Rng,
    rule: Rule,
    /// Live holders after every change: (when, who).
    trace: Vec<(Duration, Vec<usize>)>,
}

impl Sim {
    /// `n` masters at 120 advertising every `interval_ms` over `transport` (unicast ones
    /// know each other as members), started at 0.
    fn new(n: usize, interval_ms: u32, transport: VrrpTransport, seed: u64, rule: Rule) -> Sim {
        let members: Vec<Member> = (0..n).map(member).collect();
        let mut sim = Sim {
            now: Duration::ZERO,
            nodes: (0..n)
                .map(|i| Node {
                    core: router(i, interval_ms, transport),
                    holds: false,
                    alive: true,
                    frozen_until: None,
                    backlog: Vec::new(),
                    notes: Vec::new(),
                })
                .collect(),
            events: BinaryHeap::new(),
            frames: BTreeMap::new(),
            seq: 0,
            rng: Rng(seed | 1),
            rule,
            trace: vec![(Duration::ZERO, vec![])],
        };
        for i in 0..n {
            let mut effects = sim.nodes[i].core.start(Duration::ZERO);
            effects.extend(sim.nodes[i].core.set_members(Duration::ZERO, &members));
            sim.carry_out(i, effects);
        }
        sim
    }

    fn send(&mut self, from: usize, to: usize, kind: Kind, frame: Frame) {
        let link = (self.rule)(self.now, from, to, kind);
        if link.cut || self.rng.unit() < link.loss {
            return;
        }
        let at = self.now + Duration::from_micros(self.rng.range(link.delay_us));
        self.seq += 1;
        self.events.push(Reverse((at, self.seq)));
        self.frames.insert(self.seq, (to, frame));
    }

    fn carry_out(&mut self, i: usize, effects: Vec<Effect>) {
        let n = self.nodes.len();
        for e in effects {
            match e {
                Effect::SendAdvert { priority } => {
                    let advert = adv(priority, self.nodes[i].core.spec().interval_cs() * 10);
                    let to: Vec<usize> = if self.nodes[i].core.spec().unicast() {
                        self.nodes[i]
                            .core
                            .destinations(self.now)
                            .iter()
                            .filter_map(|a| (0..n).find(|&j| addr(j) == *a))
                            .collect()
                    } else {
                        (0..n).filter(|&j| j != i).collect()
                    };
                    for j in to {
                        let f = Frame::Advert {
                            src: i,
                            advert: advert.clone(),
                        };
                        self.send(i, j, Kind::Vrrp, f);
                    }
                }
                Effect::AddVip => self.nodes[i].holds = true,
                Effect::RemoveVip { .. } => self.nodes[i].holds = false,
                Effect::Announce => {
                    let garp = ArpFrame {
                        op: 1,
                        sender_mac: mac(i),
                        sender_ip: VIP.into(),
                        target_ip: VIP.into(),
                    };
                    for j in (0..n).filter(|&j| j != i) {
                        self.send(i, j, Kind::Arp, Frame::Arp(garp));
                    }
                }
                Effect::Probe => {
                    for j in (0..n).filter(|&j| j != i) {
                        self.send(i, j, Kind::Arp, Frame::ArpRequest { from: i });
                    }
                }
                Effect::Note(note) => self.nodes[i].notes.push((self.now, note)),
                Effect::PeerDown(_) | Effect::HandBack { .. } | Effect::PortRound(_) => {}
            }
        }
        self.record();
    }

    fn record(&mut self) {
        let holders: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].alive && self.nodes[i].holds)
            .collect();
        if self.trace.last().map(|(_, h)| h) != Some(&holders) {
            self.trace.push((self.now, holders));
        }
    }

    /// A frame reaches node `to`'s kernel; its agent reads it now or after its stall.
    fn deliver(&mut self, to: usize, frame: Frame) {
        if !self.nodes[to].alive {
            return;
        }
        if let Frame::ArpRequest { from } = frame {
            // The kernel answers for an address on its interface, agent or no agent.
            if self.nodes[to].holds {
                let reply = ArpFrame {
                    op: 2,
                    sender_mac: mac(to),
                    sender_ip: VIP.into(),
                    target_ip: match addr(from) {
                        IpAddr::V4(a) => a,
                        IpAddr::V6(_) => unreachable!(),
                    },
                };
                self.send(to, from, Kind::Arp, Frame::Arp(reply));
            }
            return;
        }
        if self.nodes[to].frozen_until.is_some() {
            self.nodes[to].backlog.push((self.now, frame));
        } else {
            self.read(to, self.now, frame);
        }
    }

    fn read(&mut self, i: usize, at: Duration, frame: Frame) {
        let effects = match frame {
            Frame::Advert { src, advert } => self.nodes[i].core.on_advert(at, addr(src), &advert),
            Frame::Arp(arp) => self.nodes[i].core.on_arp(at, &arp),
            Frame::ArpRequest { .. } => Vec::new(),
        };
        self.carry_out(i, effects);
    }

    fn wake_of(&self, i: usize) -> Option<Duration> {
        let n = &self.nodes[i];
        if !n.alive {
            return None;
        }
        match n.frozen_until {
            Some(t) => Some(t),
            None => n.core.next_wakeup(),
        }
    }

    /// Runs until `until`.
    fn run_until(&mut self, until: Duration) {
        let mut spins = 0u32;
        loop {
            let frame_at = self.events.peek().map(|Reverse((t, _))| *t);
            let (node_at, node) = (0..self.nodes.len())
                .filter_map(|i| self.wake_of(i).map(|t| (t, i)))
                .min()
                .map_or((None, 0), |(t, i)| (Some(t), i));
            let next = match (frame_at, node_at) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => break,
                },
            };
            if next > until {
                break;
            }
            spins = if next <= self.now { spins + 1 } else { 0 };
            assert!(spins < 10_000, "the cores spin at {:?}", self.now);
            self.now = next.max(self.now);
            if frame_at == Some(next) {
                let Reverse((_, seq)) = self.events.pop().unwrap();
                let (to, frame) = self.frames.remove(&seq).unwrap();
                self.deliver(to, frame);
                continue;
            }
            let i = node;
            if self.nodes[i].frozen_until.is_some_and(|t| t <= self.now) {
                self.nodes[i].frozen_until = None;
                // Read what queued first, each at its arrival (the runner's read_queued).
                for (at, f) in std::mem::take(&mut self.nodes[i].backlog) {
                    self.read(i, at, f);
                }
                continue;
            }
            let now = self.now;
            let effects = self.nodes[i].core.on_timer(now);
            self.carry_out(i, effects);
        }
        self.now = until;
    }

    /// The live holders now.
    fn holders(&self) -> Vec<usize> {
        self.trace.last().unwrap().1.clone()
    }

    /// Stalls node `i`'s agent for `d` from now (its kernel runs on).
    fn freeze(&mut self, i: usize, d: Duration) {
        self.nodes[i].frozen_until = Some(self.now + d);
    }

    /// Node `i` dies (no goodbye, nothing answers).
    fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
        self.record();
    }

    /// Changes of the sole holder from `since` on (a node taking over from another).
    fn moves_since(&self, since: Duration) -> usize {
        let sole: Vec<usize> = self
            .trace
            .iter()
            .filter(|(t, _)| *t >= since)
            .filter(|(_, h)| h.len() == 1)
            .map(|(_, h)| h[0])
            .collect();
        let mut last = self.sole_at(since);
        let mut moves = 0;
        for h in sole {
            if last.is_some_and(|l| l != h) {
                moves += 1;
            }
            last = Some(h);
        }
        moves
    }

    fn sole_at(&self, t: Duration) -> Option<usize> {
        self.trace
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .and_then(|(_, h)| (h.len() == 1).then(|| h[0]))
    }

    /// The longest stretch from `since` on with two or more live holders, and with none.
    fn longest(&self, since: Duration, until: Duration) -> (Duration, Duration) {
        let (mut dual, mut none) = (Duration::ZERO, Duration::ZERO);
        let points: Vec<&(Duration, Vec<usize>)> = self.trace.iter().collect();
        for (k, (t, h)) in points.iter().map(|p| (p.0, &p.1)).enumerate() {
            let end = points.get(k + 1).map_or(until, |p| p.0).min(until);
            let start = t.max(since);
            if end <= start {
                continue;
            }
            if h.len() >= 2 {
                dual = dual.max(end - start);
            } else if h.is_empty() {
                none = none.max(end - start);
            }
        }
        (dual, none)
    }

    /// When the first live node other than `dead` held the VIP alone from `since` on.
    fn sole_live_since(&self, since: Duration) -> Option<Duration> {
        self.trace
            .iter()
            .find(|(t, h)| *t >= since && h.len() == 1)
            .map(|(t, _)| *t)
    }

    fn notes_of(&self, i: usize) -> String {
        self.nodes[i]
            .notes
            .iter()
            .map(|(t, n)| format!("{t:?} {n:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn everywhere(link: Link) -> Rule {
    Box::new(move |_, _, _, _| link)
}

/// The steady holder of a fresh segment, after start-up.
fn settled(sim: &mut Sim) -> usize {
    sim.run_until(Duration::from_secs(5));
    let h = sim.holders();
    assert_eq!(h.len(), 1, "holders after start-up: {h:?}");
    h[0]
}

/// The bound a silent holder's death is taken over in, at 100 ms adverts and priority 120
/// (docs/vrrp.md): its death confirmed at Master_Down (353 ms after the last advert, so at
/// most that after the death) and the network's delay.
const TAKEOVER_BOUND: Duration = Duration::from_millis(360);

#[test]
fn a_dead_holder_is_replaced_within_the_bound_and_once() {
    for transport in [VrrpTransport::Multicast, VrrpTransport::Unicast] {
        for offset in [0u64, 33, 66, 99] {
            let mut sim = Sim::new(3, 100, transport, 7, everywhere(CLEAN));
            let h = settled(&mut sim);
            sim.run_until(Duration::from_secs(5) + ms(offset));
            let killed = sim.now;
            sim.kill(h);
            sim.run_until(killed + Duration::from_secs(5));
            let back = sim.sole_live_since(killed).expect("nobody took over") - killed;
            assert!(
                back <= TAKEOVER_BOUND,
                "{transport:?} +{offset} ms: taken over after {back:?}"
            );
            assert_eq!(
                sim.moves_since(killed),
                0,
                "one takeover, no moves after it"
            );
            let (dual, _) = sim.longest(killed, sim.now);
            assert_eq!(dual, Duration::ZERO);
        }
    }
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::with_cases(6))]

    /// The soaks of bench/vip_soak.sh, simulated: 10 % loss and 0-100 ms of delay on every
    /// link, and the holder's agent stalled 300 ms every 10 s (its kernel runs on): in
    /// 300 s the VIP never moves and never has two holders.
    #[test]
    fn nothing_dead_nothing_moves(seed in proptest::prelude::any::<u64>(), unicast in proptest::prelude::any::<bool>()) {
        let transport = if unicast { VrrpTransport::Unicast } else { VrrpTransport::Multicast };
        let mut sim = Sim::new(3, 100, transport, seed, everywhere(NETEM));
        let h = settled(&mut sim);
        let start = sim.now;
        let mut t = start;
        while t < start + Duration::from_secs(300) {
            t += Duration::from_secs(10);
            sim.run_until(t);
            let holder = sim.holders();
            proptest::prop_assert_eq!(&holder, &vec![h], "moved by {:?}", t);
            sim.freeze(h, ms(300));
        }
        sim.run_until(t + Duration::from_secs(1));
        proptest::prop_assert_eq!(sim.moves_since(start), 0, "{}", sim.notes_of((h + 1) % 3));
        let (dual, none) = sim.longest(start, sim.now);
        proptest::prop_assert_eq!(dual, Duration::ZERO);
        proptest::prop_assert_eq!(none, Duration::ZERO);
        // Not because Master_Down never ran out: the backups held their claims.
        let held: u64 = (0..3)
            .filter(|&i| i != h)
            .map(|i| sim.nodes[i].core.snapshot(sim.now).counters.claims_held)
            .sum();
        proptest::prop_assert!(held > 0, "no silence long enough to test anything");
    }

    /// Whatever the loss and delay (up to the soak's), a dead holder is replaced by one
    /// live holder, and within a second.
    #[test]
    fn a_death_is_never_missed(seed in proptest::prelude::any::<u64>(), offset_ms in 0u64..100, unicast in proptest::prelude::any::<bool>()) {
        let transport = if unicast { VrrpTransport::Unicast } else { VrrpTransport::Multicast };
        let mut sim = Sim::new(3, 100, transport, seed, everywhere(NETEM));
        let h = settled(&mut sim);
        sim.run_until(sim.now + ms(offset_ms));
        let killed = sim.now;
        sim.kill(h);
        sim.run_until(killed + Duration::from_secs(10));
        let back = sim.sole_live_since(killed).map(|t| t - killed);
        proptest::prop_assert!(back.is_some_and(|b| b <= Duration::from_secs(1)), "back after {:?}", back);
        proptest::prop_assert_eq!(sim.holders().len(), 1);
    }

    /// A holder cut off from the others for 2 s: they take over (it cannot be told from a
    /// death), and once the cut heals, one holder remains within a second.
    #[test]
    fn a_healed_partition_ends_with_one_holder(seed in proptest::prelude::any::<u64>(), cut_ms in 1000u64..3000) {
        let cut = std::rc::Rc::new(std::cell::Cell::new(None::<usize>));
        let c = cut.clone();
        let rule: Rule = Box::new(move |_, from, to, _| match c.get() {
            Some(k) if (from == k) != (to == k) => Link { cut: true, ..CLEAN },
            _ => CLEAN,
        });
        let mut sim = Sim::new(3, 100, VrrpTransport::Unicast, seed, rule);
        let h = settled(&mut sim);
        cut.set(Some(h));
        let t0 = sim.now;
        sim.run_until(t0 + ms(cut_ms));
        let during = sim.holders();
        proptest::prop_assert_eq!(during.len(), 2, "the cut-off holder and one other");
        cut.set(None);
        let healed = sim.now;
        sim.run_until(healed + Duration::from_secs(1));
        proptest::prop_assert_eq!(sim.holders().len(), 1, "{:?}", sim.trace);
        let (dual, _) = sim.longest(healed, sim.now);
        proptest::prop_assert!(dual <= ms(500), "two holders {:?} after healing", dual);
        sim.run_until(healed + Duration::from_secs(10));
        proptest::prop_assert_eq!(sim.moves_since(healed + Duration::from_secs(1)), 0);
    }
}

/// Adverts from the holder to one backup lost (protocol 112 dropped one way, ARP passing):
/// the backup's Master_Down runs out again and again, its probe is answered every time,
/// and it never claims.
#[test]
fn adverts_lost_one_way_move_nothing() {
    let lost = std::rc::Rc::new(std::cell::Cell::new(None::<(usize, usize)>));
    let l = lost.clone();
    let rule: Rule = Box::new(move |_, from, to, kind| {
        if kind == Kind::Vrrp && l.get() == Some((from, to)) {
            Link { cut: true, ..CLEAN }
        } else {
            CLEAN
        }
    });
    let mut sim = Sim::new(3, 100, VrrpTransport::Unicast, 3, rule);
    let h = settled(&mut sim);
    let b = (h + 1) % 3;
    lost.set(Some((h, b)));
    let t0 = sim.now;
    sim.run_until(t0 + Duration::from_secs(20));
    assert_eq!(sim.holders(), vec![h]);
    assert_eq!(sim.moves_since(t0), 0);
    assert_eq!(sim.longest(t0, sim.now).0, Duration::ZERO);
    let c = &sim.nodes[b].core.snapshot(sim.now).counters;
    assert_eq!(c.claims_held, 1, "{}", sim.notes_of(b));
    // And back the other way: nothing to hold, a backup does not advertise.
    lost.set(Some((b, h)));
    sim.run_until(sim.now + Duration::from_secs(5));
    assert_eq!(sim.holders(), vec![h]);
}

/// Everything from the holder to one backup lost (adverts and ARP): the backup confirms a
/// death that did not happen and claims; the holder hears it, finds that it cannot hear
/// the holder, and gives way. Two holders for no longer than the confirmation window, and
/// then no more moves.
#[test]
fn everything_lost_one_way_leaves_two_holders_briefly_and_once() {
    for k in 0..3 {
        let lost = std::rc::Rc::new(std::cell::Cell::new(None::<(usize, usize)>));
        let l = lost.clone();
        let rule: Rule = Box::new(move |_, from, to, _| {
            if l.get() == Some((from, to)) {
                Link { cut: true, ..CLEAN }
            } else {
                CLEAN
            }
        });
        let mut sim = Sim::new(3, 100, VrrpTransport::Unicast, 11 + k, rule);
        let h = settled(&mut sim);
        let b = (h + 1 + k as usize % 2) % 3;
        lost.set(Some((h, b)));
        let t0 = sim.now;
        sim.run_until(t0 + Duration::from_secs(20));
        let (dual, _) = sim.longest(t0, sim.now);
        let window = sim.nodes[b]
            .core
            .timing()
            .confirmed_after(sim.nodes[b].core.machine().master_down_interval());
        assert!(
            dual > Duration::ZERO && dual <= window,
            "two holders for {dual:?} (window {window:?}): {:?}\n{}\n{}",
            sim.trace,
            sim.notes_of(h),
            sim.notes_of(b)
        );
        assert_eq!(sim.holders(), vec![b], "the one that cannot hear keeps it");
        assert_eq!(sim.moves_since(t0 + Duration::from_secs(2)), 0);
        assert_eq!(sim.nodes[h].core.snapshot(sim.now).counters.deaf_yields, 1);
    }
}
