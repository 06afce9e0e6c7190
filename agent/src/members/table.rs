//! Soft state: members that registered, each dropped when it stops renewing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::dns_label::DnsLabel;
use crate::member::Member;

/// The most members a table holds (a registry's own, and what it merges from others): a
/// cluster's every node, as many as `keelson build` accepts in an install-config; a
/// registry that tried to make this node hold more (a bug, or a compromised server key) is
/// held to it. `docs/agent.md`, "Limits".
pub const MAX_MEMBERS: usize = keelson_cluster::MAX_NODES as usize;

/// Members keyed by name with the time of their last registration.
#[derive(Debug)]
pub struct Table {
    entries: HashMap<DnsLabel, (Member, Instant)>,
    /// Members that said goodbye, with when: until the expiry has passed, another
    /// registry's list may still carry one (it took the goodbye later, or never), and taking
    /// that back would keep the node listed until it expires everywhere. At most
    /// [`MAX_MEMBERS`]; past that a goodbye only removes.
    departed: HashMap<DnsLabel, Instant>,
    expiry: Duration,
}

impl Table {
    /// An empty table whose entries live `expiry` after their last renewal.
    pub fn new(expiry: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            departed: HashMap::new(),
            expiry,
        }
    }

    /// Whether `name` may be taken in: it is there already, or there is room
    /// ([`MAX_MEMBERS`]).
    pub fn has_room_for(&self, name: &str) -> bool {
        self.entries.contains_key(name) || self.entries.len() < MAX_MEMBERS
    }

    /// How long an entry lives after its last renewal.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// Whether it holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// How many members other than `except` list `address` among theirs.
    pub fn count_listing(&self, address: IpAddr, except: &str) -> usize {
        self.entries
            .iter()
            .filter(|(name, (m, _))| name.as_str() != except && m.addresses.contains(&address))
            .count()
    }

    /// How many members it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Registers or renews `member` at `now`; true when it is new or its record changed. A
    /// new member when the table is full is not taken (false).
    pub fn renew(&mut self, member: Member, now: Instant) -> bool {
        if !self.has_room_for(&member.name) {
            return false;
        }
        // Heard from the node itself: back, whatever it said before.
        self.departed.remove(&member.name);
        let name = member.name.clone();
        match self.entries.insert(name, (member.clone(), now)) {
            Some((old, _)) => old != member,
            None => true,
        }
    }

    /// Records `member` as last heard `age` before `now`, keeping the newer of the two
    /// times and the record heard last; true when it is new or its record changed. A new
    /// member when the table is full is not taken (false), nor a record heard before the
    /// member said goodbye here.
    pub fn renew_aged(&mut self, member: Member, age: Duration, now: Instant) -> bool {
        let seen = now.checked_sub(age).unwrap_or(now);
        if now.saturating_duration_since(seen) > self.expiry || !self.has_room_for(&member.name) {
            // Already expired where it was heard, or no room: not news.
            return false;
        }
        if self
            .departed
            .get(&member.name)
            .is_some_and(|at| seen <= *at)
        {
            return false;
        }
        match self.entries.get_mut(&member.name) {
            Some((_, t)) if *t >= seen => false,
            Some((m, t)) => {
                let changed = *m != member;
                *m = member;
                *t = seen;
                changed
            }
            None => {
                self.entries.insert(member.name.clone(), (member, seen));
                true
            }
        }
    }

    /// The live members with the time since their last renewal, sorted by name.
    pub fn list_aged(&self, now: Instant) -> Vec<(Member, Duration)> {
        let mut out: Vec<(Member, Duration)> = self
            .entries
            .values()
            .map(|(m, t)| (m.clone(), now.saturating_duration_since(*t)))
            .collect();
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }

    /// The time since the member heard longest ago was last heard (`None`: no member).
    pub fn oldest_age(&self, now: Instant) -> Option<Duration> {
        self.entries
            .values()
            .map(|(_, t)| now.saturating_duration_since(*t))
            .max()
    }

    /// Removes `name`, a node that said goodbye at `now`; true when it was there. Records
    /// heard before `now` are not taken back in ([`Table::renew_aged`]) until the expiry has
    /// passed; the node's own registration is.
    pub fn remove(&mut self, name: &str, now: Instant) -> bool {
        let Some((member, _)) = self.entries.remove(name) else {
            return false;
        };
        if self.departed.len() < MAX_MEMBERS {
            self.departed.insert(member.name, now);
        }
        true
    }

    /// Drops every member `keep` does not name; true when one was dropped.
    pub fn retain_named(&mut self, keep: &std::collections::HashSet<&str>) -> bool {
        let before = self.entries.len();
        self.entries.retain(|name, _| keep.contains(name.as_str()));
        self.entries.len() != before
    }

    /// How many goodbyes are remembered (see [`Table::remove`]).
    pub fn departed(&self) -> usize {
        self.departed.len()
    }

    /// Drops what was not renewed within the expiry, and goodbyes older than it; true when
    /// a member was dropped.
    pub fn expire(&mut self, now: Instant) -> bool {
        let expiry = self.expiry;
        self.departed
            .retain(|_, at| now.saturating_duration_since(*at) <= expiry);
        let before = self.entries.len();
        self.entries
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) <= expiry);
        self.entries.len() != before
    }

    /// The live members, sorted by name.
    pub fn list(&self) -> Vec<Member> {
        let mut out: Vec<Member> = self.entries.values().map(|(m, _)| m.clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::Role;

    fn m(name: &str) -> Member {
        Member {
            name: name.parse().unwrap(),
            role: Role::Worker,
            addresses: vec!["10.0.0.1".parse().unwrap()],
            version: "1".into(),
        }
    }

    /// A full table renews what it holds and takes nothing new, however it is offered.
    #[test]
    fn a_full_table_takes_no_new_member() {
        let t0 = Instant::now();
        let mut t = Table::new(Duration::from_secs(10));
        for i in 0..MAX_MEMBERS {
            assert!(t.renew(m(&format!("n{i}")), t0));
        }
        assert_eq!(t.len(), MAX_MEMBERS);
        assert!(!t.has_room_for("new"));
        assert!(!t.renew(m("new"), t0));
        assert!(!t.renew_aged(m("new"), Duration::ZERO, t0));
        assert_eq!(t.len(), MAX_MEMBERS);
        // Those it holds still renew (a changed record is news).
        let mut moved = m("n7");
        moved.addresses = vec!["10.0.0.7".parse().unwrap()];
        assert!(t.renew(moved, t0 + Duration::from_secs(1)));
        assert!(t.has_room_for("n7"));
    }

    #[test]
    fn renew_expire_remove() {
        let t0 = Instant::now();
        let mut t = Table::new(Duration::from_secs(10));
        assert!(t.renew(m("b"), t0));
        assert!(t.renew(m("a"), t0 + Duration::from_secs(5)));
        assert!(
            !t.renew(m("a"), t0 + Duration::from_secs(5)),
            "a renewal is not news"
        );
        assert_eq!(
            t.list().iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        t.expire(t0 + Duration::from_secs(11));
        assert_eq!(t.list().len(), 1);
        assert!(t.renew_aged(m("c"), Duration::from_secs(9), t0 + Duration::from_secs(11)));
        assert!(
            !t.renew_aged(
                m("c"),
                Duration::from_secs(10),
                t0 + Duration::from_secs(11)
            ),
            "an older sighting is not news"
        );
        assert!(
            !t.renew_aged(
                m("d"),
                Duration::from_secs(30),
                t0 + Duration::from_secs(11)
            ),
            "expired where it was heard"
        );
        assert!(t.expire(t0 + Duration::from_secs(13)));
        assert_eq!(
            t.list().len(),
            1,
            "c was heard 9 s before 11 s: expired at 12 s"
        );
        let aged = t.list_aged(t0 + Duration::from_secs(6));
        assert_eq!(aged[0].1, Duration::from_secs(1));
        assert!(t.remove("a", t0 + Duration::from_secs(6)));
        assert!(!t.remove("a", t0 + Duration::from_secs(6)));
        assert!(t.list().is_empty());
    }

    /// A goodbye holds: another registry's older record of the node does not bring it
    /// back (the registries would pass it between them until it expired everywhere), its
    /// own registration does, and the goodbye is forgotten after the expiry.
    #[test]
    fn a_goodbye_is_not_undone_by_a_relayed_record() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Table::new(s(10));
        assert!(t.renew(m("a"), t0));
        assert!(t.remove("a", t0 + s(2)));
        assert!(
            !t.renew_aged(m("a"), s(1), t0 + s(3)),
            "heard at 2 s, when it said goodbye"
        );
        assert!(t.list().is_empty());
        assert!(
            t.renew_aged(m("a"), s(0), t0 + s(3)),
            "heard after its goodbye: it came back"
        );
        assert!(t.remove("a", t0 + s(4)));
        assert!(t.renew(m("a"), t0 + s(5)), "its own registration");
        assert_eq!(t.departed(), 0);
        assert!(t.remove("a", t0 + s(6)));
        assert_eq!(t.departed(), 1);
        t.expire(t0 + s(17));
        assert_eq!(t.departed(), 0, "forgotten after the expiry");
    }
}
