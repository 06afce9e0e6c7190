//! Soft state: members that registered, each dropped when it stops renewing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::dns_label::DnsLabel;
use crate::members::member::Member;

/// Members keyed by name with the time of their last registration.
#[derive(Debug)]
pub struct Table {
    entries: HashMap<DnsLabel, (Member, Instant)>,
    expiry: Duration,
}

impl Table {
    /// An empty table whose entries live `expiry` after their last renewal.
    pub fn new(expiry: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            expiry,
        }
    }

    /// Registers or renews `member` at `now`; true when it is new or its record changed.
    pub fn renew(&mut self, member: Member, now: Instant) -> bool {
        let name = member.name.clone();
        match self.entries.insert(name, (member.clone(), now)) {
            Some((old, _)) => old != member,
            None => true,
        }
    }

    /// Records `member` as last heard `age` before `now`, keeping the newer of the two
    /// times and the record heard last; true when it is new or its record changed.
    pub fn renew_aged(&mut self, member: Member, age: Duration, now: Instant) -> bool {
        let seen = now.checked_sub(age).unwrap_or(now);
        if now.saturating_duration_since(seen) > self.expiry {
            // Already expired where it was heard: not news.
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

    /// Removes `name` (a node that said goodbye); true when it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        self.entries.remove(name).is_some()
    }

    /// Drops what was not renewed within the expiry; true when something was dropped.
    pub fn expire(&mut self, now: Instant) -> bool {
        let expiry = self.expiry;
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
        assert!(t.remove("a"));
        assert!(!t.remove("a"));
        assert!(t.list().is_empty());
    }
}
