//! Where a node registers in unicast mode: a peer set that does not depend on the API VIP
//! being elected (docs/members.md, "The peer set"). Pure apart from [`load`] and [`save`].
//!
//! - `unicastPeers` of the VRRP instances in `cluster.json` (addresses the operator knows);
//! - the API VIPs, while another node holds them (during install that is the bootstrap the
//!   node fetched its config from), and only until a registry at a node's own address
//!   answers: the VIP leads to one of those registries, so once they answer, registering
//!   through it too only doubles the holder's connections and work;
//! - every control-plane member learned from any registry (a master is kept after it
//!   expires, so both sides of a healed partition find each other again; a bootstrap is
//!   forgotten once it is gone, as it leaves for good at the pivot);
//! - the masters remembered in `<state dir>/members.json` from an earlier run, for a cold
//!   restart of every master (entries unheard for [`RETENTION`] are dropped).
//!
//! A master is forgotten (it leaves the peer set and `members.json`) when it has not been
//! heard for `members.forgetAfterSecs`, counted from its last sighting or from this
//! agent's start, whichever is later, or at once when another member now announces one of
//! its addresses (a replacement reusing it). That is how a master deleted for good stops
//! being registered with; the live lists (DNS, proxy, VRRP) drop it at `expirySecs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keelson_cluster::Role;
use serde::{Deserialize, Serialize};

use crate::dns_label::DnsLabel;
use crate::member::Member;

/// The file under the state directory.
pub const FILE: &str = "members.json";

/// How long a remembered master stays a seed without being heard again.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often the file is rewritten when nothing but the sighting times changed.
pub const REFRESH: Duration = Duration::from_secs(3600);

/// `members.json`: the masters this node knew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Remembered {
    /// The cluster zone they belong to.
    pub cluster: String,
    /// The masters.
    pub members: Vec<RememberedMember>,
}

/// One remembered master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RememberedMember {
    /// Node name.
    pub name: DnsLabel,
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// When it was last heard (seconds since the Unix epoch).
    pub last_seen_unix: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Learned {
    role: Role,
    addresses: Vec<IpAddr>,
    last_seen: SystemTime,
}

/// The peer set of one node.
#[derive(Debug, Clone)]
pub struct Seeds {
    configured: Vec<IpAddr>,
    vips: Vec<IpAddr>,
    learned: BTreeMap<DnsLabel, Learned>,
    written: Option<(BTreeMap<DnsLabel, Vec<IpAddr>>, SystemTime)>,
    /// A quiet master is forgotten this long after max(last sighting, `started`).
    forget_after: Duration,
    /// When this agent started.
    started: SystemTime,
}

/// A master [`Seeds`] forgot, and why (for the log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    /// Its name.
    pub name: DnsLabel,
    /// The addresses it had.
    pub addresses: Vec<IpAddr>,
    /// Why: not heard for `forgetAfterSecs`, or its address taken by another member.
    pub reason: ForgetReason,
}

/// Why a master was forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForgetReason {
    /// Not heard for this long (since its last sighting or the agent's start).
    Quiet(Duration),
    /// Another member (named) announces one of its addresses.
    AddressTaken(DnsLabel),
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Seeds {
    /// Seeds from the configuration: static peers and the API VIPs (masters forgotten
    /// after [`RETENTION`] until [`Seeds::forgetting`] says otherwise).
    pub fn new(configured: Vec<IpAddr>, vips: Vec<IpAddr>) -> Self {
        Self {
            configured,
            vips,
            learned: BTreeMap::new(),
            written: None,
            forget_after: RETENTION,
            started: UNIX_EPOCH,
        }
    }

    /// The same, forgetting a quiet master `after` it was last heard or after `started`
    /// (this agent's start), whichever is later (`members.forgetAfterSecs`).
    pub fn forgetting(mut self, after: Duration, started: SystemTime) -> Self {
        self.forget_after = after;
        self.started = started;
        self
    }

    /// Forgets, at `now`, the masters not heard for the forget time; returns them. A live
    /// master is heard at every [`Seeds::update`]: call it with the live list first.
    pub fn forget_quiet(&mut self, now: SystemTime) -> Vec<Forgotten> {
        let (after, started) = (self.forget_after, self.started);
        let mut gone = Vec::new();
        self.learned.retain(|name, l| {
            let quiet = now
                .duration_since(l.last_seen.max(started))
                .unwrap_or_default();
            let keep = quiet <= after;
            if !keep {
                gone.push(Forgotten {
                    name: name.clone(),
                    addresses: l.addresses.clone(),
                    reason: ForgetReason::Quiet(quiet),
                });
            }
            keep
        });
        gone
    }

    /// Takes in the live member list at `now` (this node, `own_name`, excluded); returns
    /// the quiet masters forgotten because a live member now has one of their addresses.
    pub fn update(&mut self, live: &[Member], own_name: &str, now: SystemTime) -> Vec<Forgotten> {
        let mut gone = Vec::new();
        // An address now announced by another live member no longer reaches a quiet
        // master: its replacement (or any new node) took it.
        let quiet: Vec<DnsLabel> = self
            .learned
            .keys()
            .filter(|n| !live.iter().any(|m| m.name == **n))
            .cloned()
            .collect();
        for name in quiet {
            let Some(l) = self.learned.get(&name) else {
                continue;
            };
            let taker = live
                .iter()
                .find(|m| m.name != name && m.addresses.iter().any(|a| l.addresses.contains(a)));
            if let Some(taker) = taker {
                gone.push(Forgotten {
                    name: name.clone(),
                    addresses: l.addresses.clone(),
                    reason: ForgetReason::AddressTaken(taker.name.clone()),
                });
                self.learned.remove(&name);
            }
        }
        let mut live_names = BTreeSet::new();
        for m in live {
            if m.name == own_name || m.role == Role::Worker || m.addresses.is_empty() {
                continue;
            }
            live_names.insert(m.name.clone());
            self.learned.insert(
                m.name.clone(),
                Learned {
                    role: m.role,
                    addresses: m.addresses.clone(),
                    last_seen: now,
                },
            );
        }
        self.learned
            .retain(|name, l| l.role != Role::Bootstrap || live_names.contains(name));
        gone
    }

    /// Where to register now: configured peers, the learned control-plane nodes (their
    /// addresses of the first VIP's family, or all when they have none of it), and the API
    /// VIPs this node does not hold while no registry outside the VIPs is among `answered`
    /// (the registries that answered this node's last registration); never this node's own
    /// addresses.
    pub fn targets(
        &self,
        own: &[IpAddr],
        held: &BTreeSet<IpAddr>,
        answered: &BTreeSet<IpAddr>,
    ) -> Vec<IpAddr> {
        let v6 = self.vips.first().map(IpAddr::is_ipv6);
        let mut out: Vec<IpAddr> = self.configured.clone();
        if !answered.iter().any(|a| !self.vips.contains(a)) {
            out.extend(self.vips.iter().filter(|v| !held.contains(v)));
        }
        for l in self.learned.values() {
            let same: Vec<IpAddr> = l
                .addresses
                .iter()
                .copied()
                .filter(|a| Some(a.is_ipv6()) == v6)
                .collect();
            if same.is_empty() {
                out.extend(l.addresses.iter().copied());
            } else {
                out.extend(same);
            }
        }
        out.retain(|a| !own.contains(a) && !a.is_unspecified());
        out.sort();
        out.dedup();
        out
    }

    fn masters(&self) -> BTreeMap<DnsLabel, Vec<IpAddr>> {
        self.learned
            .iter()
            .filter(|(_, l)| l.role == Role::Master)
            .map(|(n, l)| (n.clone(), l.addresses.clone()))
            .collect()
    }

    /// Whether the remembered masters differ from what was last written, or the file is
    /// older than [`REFRESH`] (sighting times move on).
    pub fn needs_write(&self, now: SystemTime) -> bool {
        let masters = self.masters();
        match &self.written {
            None => !masters.is_empty(),
            Some((set, at)) => {
                *set != masters
                    || (!masters.is_empty()
                        && now.duration_since(*at).unwrap_or_default() >= REFRESH)
            }
        }
    }

    /// The document to write at `now` (the masters only: they serve registries for good).
    pub fn remembered(&self, zone: &str) -> Remembered {
        Remembered {
            cluster: zone.to_string(),
            members: self
                .learned
                .iter()
                .filter(|(_, l)| l.role == Role::Master)
                .map(|(name, l)| RememberedMember {
                    name: name.clone(),
                    addresses: l.addresses.clone(),
                    last_seen_unix: unix(l.last_seen),
                })
                .collect(),
        }
    }

    /// Records that [`Seeds::remembered`] was written at `now`.
    pub fn mark_written(&mut self, now: SystemTime) {
        self.written = Some((self.masters(), now));
    }

    /// Takes in a remembered document at `now`: masters of this `zone` heard within
    /// [`RETENTION`]. Returns how many were taken, or why none.
    pub fn remember(
        &mut self,
        doc: &Remembered,
        zone: &str,
        own_name: &str,
        now: SystemTime,
    ) -> Result<usize, SeedsError> {
        if !doc.cluster.eq_ignore_ascii_case(zone) {
            return Err(SeedsError::OtherCluster {
                expected: zone.to_owned(),
                got: doc.cluster.clone(),
            });
        }
        let mut taken = 0;
        for m in &doc.members {
            let seen = UNIX_EPOCH + Duration::from_secs(m.last_seen_unix);
            if m.name == own_name
                || m.addresses.is_empty()
                || now.duration_since(seen).unwrap_or_default() > RETENTION
            {
                continue;
            }
            self.learned.entry(m.name.clone()).or_insert(Learned {
                role: Role::Master,
                addresses: m.addresses.clone(),
                last_seen: seen,
            });
            taken += 1;
        }
        self.mark_written(now);
        Ok(taken)
    }
}

/// Why the remembered masters cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedsError {
    /// The file is another cluster's.
    #[error("cluster: expected {expected}, got {got}")]
    OtherCluster {
        /// This cluster's zone.
        expected: String,
        /// The file's.
        got: String,
    },
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a remembered-members document (the message names the field).
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The JSON error.
        source: serde_json::Error,
    },
}

/// Reads `dir/members.json`; `Ok(None)` when there is none.
pub fn load(dir: &Path) -> Result<Option<Remembered>, SeedsError> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| SeedsError::Parse {
                path: path.display().to_string(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SeedsError::Read {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Writes `dir/members.json` atomically (a temporary file renamed over it), the directory
/// created 0700 when missing.
pub fn save(dir: &Path, doc: &Remembered) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let mut bytes = serde_json::to_vec_pretty(doc).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn m(name: &str, role: Role, addrs: &[&str]) -> Member {
        Member {
            name: name.parse().unwrap(),
            role,
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            version: "1".into(),
        }
    }

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn targets_skip_own_addresses_and_held_vips() {
        let mut s = Seeds::new(vec![ip("10.0.0.99")], vec![ip("10.0.0.5")]);
        let own = [ip("10.0.0.11")];
        assert_eq!(
            s.targets(&own, &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.5"), ip("10.0.0.99")]
        );
        let held: BTreeSet<IpAddr> = [ip("10.0.0.5")].into();
        assert_eq!(s.targets(&own, &held, &BTreeSet::new()), [ip("10.0.0.99")]);
        s.update(
            &[
                m("master-0", Role::Master, &["10.0.0.11"]),
                m("master-1", Role::Master, &["fd00::12", "10.0.0.12"]),
                m("bootstrap", Role::Bootstrap, &["10.0.0.10"]),
                m("worker-0", Role::Worker, &["10.0.0.21"]),
            ],
            "master-0",
            t(0),
        );
        assert_eq!(
            s.targets(&own, &held, &BTreeSet::new()),
            [ip("10.0.0.10"), ip("10.0.0.12"), ip("10.0.0.99")],
            "control plane only, the VIP's family"
        );
    }

    #[test]
    fn the_vip_is_a_target_only_until_a_registry_at_a_node_address_answers() {
        let mut s = Seeds::new(vec![], vec![ip("10.0.0.5")]);
        let none = BTreeSet::new();
        assert_eq!(s.targets(&[], &none, &none), [ip("10.0.0.5")]);
        // Only the VIP answered (the holder, not yet learned): it stays.
        let vip_only: BTreeSet<IpAddr> = [ip("10.0.0.5")].into();
        s.update(&[m("master-1", Role::Master, &["10.0.0.12"])], "w", t(0));
        assert_eq!(
            s.targets(&[], &none, &vip_only),
            [ip("10.0.0.5"), ip("10.0.0.12")]
        );
        // A master answered at its own address: the VIP only led there.
        let master: BTreeSet<IpAddr> = [ip("10.0.0.12"), ip("10.0.0.5")].into();
        assert_eq!(s.targets(&[], &none, &master), [ip("10.0.0.12")]);
        // Every master stopped answering: back through the VIP, to whoever holds it now.
        assert_eq!(
            s.targets(&[], &none, &none),
            [ip("10.0.0.5"), ip("10.0.0.12")]
        );
    }

    #[test]
    fn masters_are_kept_after_they_go_quiet_bootstraps_are_not() {
        let mut s = Seeds::new(vec![], vec![ip("10.0.0.5")]);
        s.update(
            &[
                m("bootstrap", Role::Bootstrap, &["10.0.0.10"]),
                m("master-1", Role::Master, &["10.0.0.12"]),
            ],
            "master-0",
            t(0),
        );
        s.update(&[], "master-0", t(100));
        assert_eq!(
            s.targets(&[], &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.5"), ip("10.0.0.12")],
            "a partition must not make the other side unknown"
        );
    }

    #[test]
    fn a_quiet_master_is_forgotten_after_the_forget_time() {
        let day = Duration::from_secs(86_400);
        let mut s = Seeds::new(vec![], vec![ip("10.0.0.5")]).forgetting(day, t(0));
        s.update(
            &[
                m("master-1", Role::Master, &["10.0.0.12"]),
                m("master-2", Role::Master, &["10.0.0.13"]),
            ],
            "master-0",
            t(0),
        );
        // master-2 dies: master-1 keeps renewing.
        s.update(
            &[m("master-1", Role::Master, &["10.0.0.12"])],
            "master-0",
            t(86_000),
        );
        assert!(
            s.forget_quiet(t(86_400)).is_empty(),
            "not quiet long enough"
        );
        // master-1 is still live a day later: heard at every update, never forgotten.
        s.update(
            &[m("master-1", Role::Master, &["10.0.0.12"])],
            "master-0",
            t(86_401),
        );
        let gone = s.forget_quiet(t(86_401));
        assert_eq!(
            gone,
            [Forgotten {
                name: "master-2".parse().unwrap(),
                addresses: vec![ip("10.0.0.13")],
                reason: ForgetReason::Quiet(Duration::from_secs(86_401)),
            }]
        );
        assert_eq!(
            s.targets(&[], &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.5"), ip("10.0.0.12")]
        );
        assert!(s.needs_write(t(86_401)), "members.json must lose it too");
        assert_eq!(s.remembered("c.example").members.len(), 1);
    }

    #[test]
    fn remembered_masters_get_the_forget_time_after_a_long_shutdown() {
        let doc = Remembered {
            cluster: "c.example".into(),
            members: vec![RememberedMember {
                name: "master-1".parse().unwrap(),
                addresses: vec![ip("10.0.0.12")],
                last_seen_unix: unix(t(0)),
            }],
        };
        // Started 3 days after the file was written, forgetting after 1 day.
        let start = t(3 * 86_400);
        let mut s = Seeds::new(vec![], vec![]).forgetting(Duration::from_secs(86_400), start);
        s.remember(&doc, "c.example", "master-0", start).unwrap();
        assert!(s.forget_quiet(start + Duration::from_secs(60)).is_empty());
        assert_eq!(
            s.targets(&[], &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.12")]
        );
        assert_eq!(s.forget_quiet(start + Duration::from_secs(86_401)).len(), 1);
        assert!(
            s.targets(&[], &BTreeSet::new(), &BTreeSet::new())
                .is_empty()
        );
    }

    #[test]
    fn a_replacement_taking_the_address_makes_the_old_master_forgotten() {
        let mut s = Seeds::new(vec![], vec![]);
        s.update(
            &[m("master-2", Role::Master, &["10.0.0.13"])],
            "master-0",
            t(0),
        );
        // master-2 is gone; master-3 boots on its address.
        let gone = s.update(
            &[m("master-3", Role::Master, &["10.0.0.13"])],
            "master-0",
            t(10),
        );
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].name.as_str(), "master-2");
        assert_eq!(
            gone[0].reason,
            ForgetReason::AddressTaken("master-3".parse().unwrap())
        );
        let doc = s.remembered("c.example");
        assert_eq!(doc.members.len(), 1);
        assert_eq!(doc.members[0].name.as_str(), "master-3");
        // A master that moved to a new address under its own name just moves.
        let gone = s.update(
            &[m("master-3", Role::Master, &["10.0.0.14"])],
            "master-0",
            t(20),
        );
        assert!(gone.is_empty());
        assert_eq!(
            s.targets(&[], &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.14")]
        );
    }

    #[test]
    fn remembered_round_trip_and_retention() {
        let mut s = Seeds::new(vec![], vec![ip("10.0.0.5")]);
        assert!(!s.needs_write(t(0)), "nothing to remember yet");
        s.update(
            &[
                m("master-1", Role::Master, &["10.0.0.12"]),
                m("bootstrap", Role::Bootstrap, &["10.0.0.10"]),
            ],
            "master-0",
            t(0),
        );
        assert!(s.needs_write(t(0)));
        let doc = s.remembered("c.example");
        assert_eq!(doc.members.len(), 1, "masters only");
        s.mark_written(t(0));
        assert!(!s.needs_write(t(10)));
        assert!(s.needs_write(t(3600)), "refreshed hourly");
        let text = serde_json::to_string(&doc).unwrap();
        assert!(text.contains("\"lastSeenUnix\":1700000000"), "{text}");

        let mut fresh = Seeds::new(vec![], vec![ip("10.0.0.5")]);
        assert_eq!(
            fresh
                .remember(&doc, "C.example", "master-0", t(60))
                .unwrap(),
            1
        );
        assert_eq!(
            fresh.targets(&[], &BTreeSet::new(), &BTreeSet::new()),
            [ip("10.0.0.5"), ip("10.0.0.12")]
        );
        assert!(!fresh.needs_write(t(61)), "what was read needs no write");
        let mut late = Seeds::new(vec![], vec![]);
        assert_eq!(
            late.remember(&doc, "c.example", "master-0", t(RETENTION.as_secs() + 1))
                .unwrap(),
            0
        );
        let err = late
            .remember(&doc, "other.example", "master-0", t(0))
            .unwrap_err();
        assert!(
            err.to_string().contains("cluster: expected other.example"),
            "{err}"
        );
        assert_eq!(
            Seeds::new(vec![], vec![])
                .remember(&doc, "c.example", "master-1", t(0))
                .unwrap(),
            0,
            "ourselves"
        );
    }

    #[test]
    fn load_and_save() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(load(&state).unwrap(), None);
        let doc = Remembered {
            cluster: "c.example".into(),
            members: vec![RememberedMember {
                name: "master-1".parse().unwrap(),
                addresses: vec![ip("10.0.0.12")],
                last_seen_unix: 5,
            }],
        };
        save(&state, &doc).unwrap();
        assert_eq!(load(&state).unwrap(), Some(doc));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::write(state.join(FILE), b"{\"cluster\": 1}").unwrap();
        let err = load(&state).unwrap_err();
        assert!(matches!(err, SeedsError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("members.json"), "{err}");
    }
}
