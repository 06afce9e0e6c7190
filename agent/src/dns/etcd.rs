//! The etcd names of the OpenShift 4.1-4.3 era: which master is `etcd-<i>`, and whether the
//! SRV sets etcd's `--discovery-srv` reads may be answered yet (docs/dns.md, "etcd").
//!
//! Pure logic over the member list. The index of a master is the number after the last `-`
//! of its name, as the installer names masters `<infraID>-master-<i>` for `i` in
//! `0..controlPlane.replicas` and as that era's DNS derived it (CoreDNS' mdns plugin took the
//! same suffix): it depends on the name alone, never on the order members joined.

use std::net::IpAddr;

use keelson_cluster::Role;

use crate::dns_label::DnsLabel;
use crate::member::Member;

/// Peer port in `_etcd-server-ssl._tcp` SRV records.
pub const PEER_PORT: u16 = 2380;
/// Client port in `_etcd-client-ssl._tcp` SRV records.
pub const CLIENT_PORT: u16 = 2379;
/// SRV priority and weight, as OpenShift's DNS of the time served them.
pub const SRV_PRIORITY: u16 = 0;
/// See [`SRV_PRIORITY`].
pub const SRV_WEIGHT: u16 = 10;
/// Highest index (four digits): far above any control plane, low enough that a name ending
/// in a long number (a timestamp, a serial) is not mistaken for one.
pub const MAX_INDEX: u16 = 9999;

/// The etcd index of a master named `name`: the decimal number after the last `-` of its
/// first label, 1-4 digits without a leading zero (`0` itself is fine). `None` when the name
/// ends otherwise (`ocp4-x7k2z-master-2` -> 2, `master-0` -> 0, `cp-a`, `master-01` -> none).
pub fn index_of(name: &str) -> Option<u16> {
    let short = name.split('.').next()?;
    let (_, digits) = short.rsplit_once('-')?;
    parse_index(digits.as_bytes())
}

/// 1-4 decimal digits without a leading zero (`0` itself is fine).
fn parse_index(digits: &[u8]) -> Option<u16> {
    let canonical = !digits.is_empty()
        && digits.len() <= 4
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0');
    canonical.then(|| {
        digits
            .iter()
            .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'))
    })
}

/// One `etcd-<i>` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The index `i`.
    pub index: u16,
    /// The DNS label, `etcd-<i>`.
    pub label: String,
    /// The member it names.
    pub member: DnsLabel,
    /// The member's addresses.
    pub addresses: Vec<IpAddr>,
}

/// The etcd names of one member list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdNames {
    /// The names, by index.
    pub targets: Vec<Target>,
    /// The SRV sets are answered: at least `masters` masters have a name.
    pub ready: bool,
    /// Masters needed before the SRV sets are answered.
    pub expected: u32,
    /// Masters whose name has no index (they get no etcd name).
    pub unindexed: Vec<DnsLabel>,
    /// Masters whose index another master (first by name) already has.
    pub duplicates: Vec<DnsLabel>,
}

impl EtcdNames {
    /// The names of the masters in `members`; the SRV sets are ready once `expected` of them
    /// have one.
    pub fn new(members: &[Member], expected: u32) -> Self {
        let mut masters: Vec<&Member> = members.iter().filter(|m| m.role == Role::Master).collect();
        // First by name wins a duplicate index, whatever order the list came in.
        masters.sort_by(|a, b| a.name.cmp(&b.name));
        let mut names = EtcdNames {
            expected,
            ..Self::default()
        };
        for m in masters {
            let Some(index) = index_of(&m.name) else {
                names.unindexed.push(m.name.clone());
                continue;
            };
            if names.targets.iter().any(|t| t.index == index) {
                names.duplicates.push(m.name.clone());
                continue;
            }
            names.targets.push(Target {
                index,
                label: format!("etcd-{index}"),
                member: m.name.clone(),
                addresses: m.addresses.clone(),
            });
        }
        names.targets.sort_by_key(|t| t.index);
        names.ready = names.targets.len() as u64 >= u64::from(expected.max(1));
        names
    }

    /// What `status` shows.
    pub fn status(&self) -> crate::status::model::EtcdNamesStatus {
        crate::status::model::EtcdNamesStatus {
            names: self
                .targets
                .iter()
                .map(|t| (t.label.clone(), t.member.to_string()))
                .collect(),
            srv_ready: self.ready,
            masters: self.expected,
            unindexed: self.unindexed.iter().map(DnsLabel::to_string).collect(),
            duplicates: self.duplicates.iter().map(DnsLabel::to_string).collect(),
        }
    }

    /// The target whose label is `label` (lower case, `etcd-<i>`).
    pub fn target(&self, label: &[u8]) -> Option<&Target> {
        let index = parse_index(label.strip_prefix(b"etcd-")?)?;
        self.targets.iter().find(|t| t.index == index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(name: &str, ip: &str) -> Member {
        Member {
            name: name.parse().unwrap(),
            role: Role::Master,
            addresses: vec![ip.parse().unwrap()],
            version: "1".into(),
        }
    }

    #[test]
    fn index_from_the_installers_names() {
        assert_eq!(index_of("ocp4-x7k2z-master-2"), Some(2));
        assert_eq!(index_of("master-0"), Some(0));
        assert_eq!(index_of("master-10.ocp4.example.com"), Some(10));
        assert_eq!(index_of("cp-9999"), Some(9999));
        for bad in [
            "master",
            "master-",
            "master-01",
            "master-a",
            "master-12345",
            "-",
            "",
            "m-1x",
        ] {
            assert_eq!(index_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn stable_whatever_the_join_order() {
        let a = vec![
            master("master-2", "10.0.0.12"),
            master("master-0", "10.0.0.10"),
            master("master-1", "10.0.0.11"),
        ];
        let mut b = a.clone();
        b.reverse();
        let (na, nb) = (EtcdNames::new(&a, 3), EtcdNames::new(&b, 3));
        assert_eq!(na, nb);
        let labels: Vec<_> = na.targets.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["etcd-0", "etcd-1", "etcd-2"]);
        assert_eq!(na.targets[1].member, "master-1");
        assert!(na.ready);
    }

    #[test]
    fn ready_only_with_every_master() {
        let two = vec![master("m-0", "10.0.0.10"), master("m-1", "10.0.0.11")];
        assert!(!EtcdNames::new(&two, 3).ready);
        // A replacement with a new name (m-3 for a dead m-1) completes the set again.
        let replaced = vec![
            master("m-0", "10.0.0.10"),
            master("m-2", "10.0.0.12"),
            master("m-3", "10.0.0.13"),
        ];
        let n = EtcdNames::new(&replaced, 3);
        assert!(n.ready);
        assert_eq!(n.target(b"etcd-3").unwrap().member, "m-3");
        assert!(n.target(b"etcd-1").is_none());
        assert!(n.target(b"etcd-03").is_none());
        assert!(n.target(b"etcd-").is_none());
    }

    #[test]
    fn workers_unindexed_and_duplicates() {
        let mut w = master("worker-0", "10.0.0.20");
        w.role = Role::Worker;
        let members = vec![
            w,
            master("b-master-1", "10.0.0.12"),
            master("a-master-1", "10.0.0.11"),
            master("control", "10.0.0.13"),
        ];
        let n = EtcdNames::new(&members, 3);
        assert_eq!(n.targets.len(), 1);
        assert_eq!(n.targets[0].member, "a-master-1");
        assert_eq!(n.duplicates, ["b-master-1"]);
        assert_eq!(n.unindexed, ["control"]);
        assert!(!n.ready);
    }
}
