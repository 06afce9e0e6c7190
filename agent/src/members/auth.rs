//! Authenticated member records (docs/members.md, "Authenticated membership").
//!
//! Every record a node sends about itself (a unicast registration, its renewal and its
//! deletion; an mDNS announcement and its goodbye) carries a [`Proof`]: the ID of the key
//! that signed it, a time, a sequence number, and an HMAC-SHA256 under the cluster
//! membership key over all of them, what the record does ([`Op`]) and the record's fields
//! ([`canonical`]). A receiver drops and counts ([`Reject`]) a record with no proof, a
//! wrong MAC (or a key it does not hold), a time more than the window
//! ([`DEFAULT_WINDOW`], `members.maxClockSkewSecs`) away from its own clock, or a sequence
//! number not above the last one it accepted from that node (a replay) — unless the record
//! is one of the last few it accepted ([`RECENT`]), arriving again: a node reaches one
//! registry both through the API VIP and at its address with the same signed body; an mDNS
//! announcement is heard on IPv4 and on IPv6, whose sockets do not keep each other's order.
//! That is a [`Fresh::Duplicate`], harmless, and it renews nothing, so replaying the last
//! records of a node that died does not keep it alive. The sequence numbers of a node start
//! at its clock in milliseconds when it starts and grow by one per record, so they keep
//! growing across restarts.
//!
//! The HMAC is ring's (already linked for TLS), compared in constant time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keelson_cluster::Role;
use ring::hmac;
use serde::{Deserialize, Serialize};

/// How far a record's time may be from the receiver's clock unless `cluster.json` says
/// otherwise (`members.maxClockSkewSecs`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(120);

/// How many of the records last accepted from a node count as duplicates when they arrive
/// again (rather than as replays).
pub const RECENT: usize = 4;

/// Nodes whose last records a verifier keeps before it forgets those no longer within the
/// window (a cluster's every node, with room to spare).
pub const TRACKED: usize = super::table::MAX_MEMBERS;

/// How often at most a node warns about records dropped as stale (a clock problem).
const STALE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// What a record proves about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Proof {
    /// The signing key's ID (`members.keyId`).
    pub key_id: String,
    /// When it was signed, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The signer's sequence number.
    pub seq: u64,
    /// HMAC-SHA256 over [`canonical`], hex.
    pub mac: String,
}

/// What a record does. Signed, so no record can be turned into another kind (a captured
/// announcement into a goodbye, an mDNS announcement into a unicast registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A unicast registration or renewal.
    Register,
    /// A unicast goodbye.
    Delete,
    /// An mDNS announcement (TXT record with a TTL).
    Announce,
    /// An mDNS goodbye (the TXT record with TTL 0).
    Goodbye,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Register => "register",
            Op::Delete => "delete",
            Op::Announce => "announce",
            Op::Goodbye => "goodbye",
        }
    }
}

/// The fields a proof covers.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    /// What the record does.
    pub op: Op,
    /// The cluster zone.
    pub cluster: &'a str,
    /// The node.
    pub name: &'a str,
    /// Its role (none for a deletion).
    pub role: Option<Role>,
    /// Its addresses (none for a deletion).
    pub addresses: &'a [IpAddr],
    /// Its agent version (empty for a deletion).
    pub version: &'a str,
}

/// The bytes the MAC covers: one field per line, addresses sorted, so sender and receiver
/// agree whatever order the JSON carried them in. Names are DNS labels and versions are
/// checked for control characters, so no field can forge a line of another.
pub fn canonical(f: &Fields<'_>, time_ms: u64, seq: u64) -> Vec<u8> {
    let mut addrs: Vec<String> = f.addresses.iter().map(|a| a.to_string()).collect();
    addrs.sort();
    format!(
        "keelson-member-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{time_ms}\n{seq}\n",
        f.op.as_str(),
        f.cluster.to_ascii_lowercase(),
        f.name.to_ascii_lowercase(),
        f.role.map(Role::as_str).unwrap_or(""),
        addrs.join(","),
        f.version,
    )
    .into_bytes()
}

/// Why a record was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// No proof where one is required.
    NoMac,
    /// A MAC that does not verify with the key it names.
    BadMac,
    /// Signed with a key ID this node does not hold: a node still on a retired key, or
    /// one already on a key this node has not been given yet (a rotation done out of
    /// order, docs/operations.md).
    UnknownKey,
    /// A time too far from ours.
    Stale,
    /// A sequence number not above the last one accepted from that node, and not one of
    /// the records accepted last.
    Replay,
    /// A registration that did not come from an address it registers.
    AddressMismatch,
}

impl Reject {
    /// Every reason, in counter order.
    pub const ALL: [Reject; 6] = [
        Reject::NoMac,
        Reject::BadMac,
        Reject::UnknownKey,
        Reject::Stale,
        Reject::Replay,
        Reject::AddressMismatch,
    ];

    /// The counter name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::NoMac => "noMac",
            Reject::BadMac => "badMac",
            Reject::UnknownKey => "unknownKey",
            Reject::Stale => "stale",
            Reject::Replay => "replay",
            Reject::AddressMismatch => "addressMismatch",
        }
    }
}

/// Errors loading the keys.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The signing key file could not be read.
    #[error("membership key {path}: {source} (cluster.json members.keyId names key {key_id})")]
    Read {
        /// The file.
        path: String,
        /// The key cluster.json names.
        key_id: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A key file is not a key.
    #[error("membership key {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        #[source]
        source: keelson_cluster::membership::KeyError,
    },
    /// The signing key is not the one cluster.json names.
    #[error(
        "membership key {path}: its ID is {got}, cluster.json members.keyId expects {expected}"
    )]
    WrongKey {
        /// The file.
        path: String,
        /// What cluster.json says.
        expected: String,
        /// What the file is.
        got: String,
    },
}

/// The membership keys of a node: one signs, every one verifies.
#[derive(Debug)]
pub struct Keys {
    signing_id: String,
    by_id: Vec<(String, hmac::Key)>,
}

impl Keys {
    /// Keys from raw bytes, the first signing (tests, and [`Keys::load`]).
    pub fn from_raw(keys: &[Vec<u8>]) -> Self {
        let by_id: Vec<(String, hmac::Key)> = keys
            .iter()
            .map(|k| {
                (
                    keelson_cluster::membership::key_id(k),
                    hmac::Key::new(hmac::HMAC_SHA256, k),
                )
            })
            .collect();
        Self {
            signing_id: by_id.first().map(|(id, _)| id.clone()).unwrap_or_default(),
            by_id,
        }
    }

    /// The keys in `tls_dir` (`membership.key` signs; `membership.previous.key` and
    /// `membership.next.key`, when present, verify too), checked against `key_id`.
    pub fn load(tls_dir: &Path, key_id: &str) -> Result<Self, AuthError> {
        let mut raw = Vec::new();
        for (i, name) in keelson_cluster::tls_files::MEMBERSHIP_KEYS
            .iter()
            .enumerate()
        {
            let path = tls_dir.join(name);
            let shown = path.display().to_string();
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if i > 0 && e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(AuthError::Read {
                        path: shown,
                        key_id: key_id.to_string(),
                        source,
                    });
                }
            };
            let key = keelson_cluster::membership::parse_key(&text).map_err(|source| {
                AuthError::Parse {
                    path: shown.clone(),
                    source,
                }
            })?;
            if i == 0 {
                let got = keelson_cluster::membership::key_id(&key);
                if got != key_id {
                    return Err(AuthError::WrongKey {
                        path: shown,
                        expected: key_id.to_string(),
                        got,
                    });
                }
            }
            raw.push(key);
        }
        Ok(Self::from_raw(&raw))
    }

    /// The signing key's ID.
    pub fn signing_id(&self) -> &str {
        &self.signing_id
    }

    /// The IDs of every key this node verifies with, the signing one first.
    pub fn ids(&self) -> Vec<String> {
        self.by_id.iter().map(|(id, _)| id.clone()).collect()
    }

    /// A proof for `fields` at `time_ms` with `seq` (with no key at all, one that never
    /// verifies).
    pub fn sign(&self, fields: &Fields<'_>, time_ms: u64, seq: u64) -> Proof {
        let mac = self
            .by_id
            .first()
            .map(|(_, key)| hex::encode(hmac::sign(key, &canonical(fields, time_ms, seq)).as_ref()))
            .unwrap_or_default();
        Proof {
            key_id: self.signing_id.clone(),
            time_ms,
            seq,
            mac,
        }
    }

    /// Checks `proof`'s key and MAC for `fields`.
    fn check_mac(&self, fields: &Fields<'_>, proof: &Proof) -> Result<(), Reject> {
        let key = self
            .by_id
            .iter()
            .find(|(id, _)| *id == proof.key_id)
            .map(|(_, k)| k)
            .ok_or(Reject::UnknownKey)?;
        let tag = hex::decode(&proof.mac).map_err(|_| Reject::BadMac)?;
        hmac::verify(key, &canonical(fields, proof.time_ms, proof.seq), &tag)
            .map_err(|_| Reject::BadMac)
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
}

/// Signs this node's records: the keys and a sequence number that only grows.
#[derive(Debug)]
pub struct Signer {
    keys: std::sync::Arc<Keys>,
    seq: AtomicU64,
}

impl Signer {
    /// A signer whose sequence numbers start at `now` in milliseconds.
    pub fn new(keys: std::sync::Arc<Keys>, now: SystemTime) -> Self {
        Self {
            keys,
            seq: AtomicU64::new(unix_ms(now)),
        }
    }

    /// A proof for `fields`, signed at `now`.
    pub fn sign(&self, fields: &Fields<'_>, now: SystemTime) -> Proof {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        self.keys.sign(fields, unix_ms(now), seq)
    }
}

/// Drops counted by reason.
#[derive(Debug, Default)]
pub struct Drops([AtomicU64; 6]);

impl Drops {
    /// Counts one drop.
    pub fn count(&self, r: Reject) {
        let i = Reject::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters by reason (`noMac`, ...).
    pub fn counts(&self) -> std::collections::BTreeMap<String, u64> {
        Reject::ALL
            .iter()
            .enumerate()
            .map(|(i, r)| (r.as_str().to_string(), self.0[i].load(Ordering::Relaxed)))
            .collect()
    }

    /// One counter.
    pub fn get(&self, r: Reject) -> u64 {
        let i = Reject::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.0[i].load(Ordering::Relaxed)
    }
}

/// Whether a warning last given at `*last` is due again at `now` (at most once every
/// [`STALE_WARNING_EVERY`]); if so, records `now`.
fn due(last: &Mutex<Option<SystemTime>>, now: SystemTime) -> bool {
    let mut warned = last.lock().unwrap_or_else(|e| e.into_inner());
    let due = match *warned {
        Some(t) => now
            .duration_since(t)
            .map_or(true, |d| d >= STALE_WARNING_EVERY),
        None => true,
    };
    if due {
        *warned = Some(now);
    }
    due
}

/// What [`Verifier::check`] made of a record that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fresh {
    /// Newer than anything accepted from that node (or not authenticated at all): believe it.
    New,
    /// One of the records accepted last ([`RECENT`]), once more: harmless, renews nothing.
    Duplicate,
}

/// Whether a record about `addresses` may come from `source`: it must be one of them
/// (IPv4-mapped IPv6 counts as the IPv4 address).
pub fn source_matches(source: IpAddr, addresses: &[IpAddr]) -> bool {
    addresses.contains(&source.to_canonical())
}

/// One node's records accepted last: (sequence number, MAC, time), newest last.
type Accepted = std::collections::VecDeque<(u64, String, u64)>;

/// What a receiver keeps: the keys (none: records are not authenticated), the window, the
/// last sequence number accepted per node, and the drop counters.
#[derive(Debug)]
pub struct Verifier {
    keys: Option<std::sync::Arc<Keys>>,
    window: Duration,
    /// Per node: the records accepted last (sequence number, MAC and time), newest last.
    /// Nodes whose newest record is older than the window are forgotten once more than
    /// [`TRACKED`] are kept: any record of theirs is stale by then.
    last: Mutex<HashMap<String, Accepted>>,
    /// When a stale record was last logged as a warning.
    stale_warned: Mutex<Option<SystemTime>>,
    /// When a record signed with a key this node does not hold was last logged.
    unknown_key_warned: Mutex<Option<SystemTime>>,
    /// Drops by reason.
    pub drops: Drops,
}

impl Default for Verifier {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Verifier {
    /// A verifier with `keys` (`None`: everything passes unauthenticated) and the default
    /// window.
    pub fn new(keys: Option<std::sync::Arc<Keys>>) -> Self {
        Self {
            keys,
            window: DEFAULT_WINDOW,
            last: Mutex::new(HashMap::new()),
            stale_warned: Mutex::new(None),
            unknown_key_warned: Mutex::new(None),
            drops: Drops::default(),
        }
    }

    /// The same, accepting record times at most `window` away from the receiver's clock.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Whether records are authenticated.
    pub fn enabled(&self) -> bool {
        self.keys.is_some()
    }

    /// The ID of the key this node signs with (none: not authenticated).
    pub fn signing_id(&self) -> Option<&str> {
        self.keys.as_ref().map(|k| k.signing_id())
    }

    /// Checks a record at `now` without recording it, in this order: a proof is there,
    /// its MAC verifies (nothing else matters without), it came from the node it is about
    /// (`from_its_node`: a record heard from anywhere else is relayed or replayed, whatever
    /// its time), its time is within the window, its sequence number is new. Without keys
    /// every record passes (clusters built before the key: today's behaviour).
    pub fn check(
        &self,
        fields: &Fields<'_>,
        proof: Option<&Proof>,
        from_its_node: bool,
        now: SystemTime,
    ) -> Result<Fresh, Reject> {
        let Some(keys) = &self.keys else {
            return Ok(Fresh::New);
        };
        let proof = proof.ok_or(Reject::NoMac)?;
        if let Err(r) = keys.check_mac(fields, proof) {
            if r == Reject::UnknownKey {
                self.warn_unknown_key(fields.name, &proof.key_id, keys, now);
            }
            return Err(r);
        }
        if !from_its_node {
            return Err(Reject::AddressMismatch);
        }
        let now_ms = unix_ms(now);
        let skew = now_ms.abs_diff(proof.time_ms);
        if u128::from(skew) > self.window.as_millis() {
            self.warn_stale(fields.name, now_ms, proof.time_ms, now);
            return Err(Reject::Stale);
        }
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Some(recent) = last.get(&fields.name.to_ascii_lowercase()) else {
            return Ok(Fresh::New);
        };
        if recent
            .iter()
            .any(|(seq, mac, _)| *seq == proof.seq && *mac == proof.mac)
        {
            return Ok(Fresh::Duplicate);
        }
        match recent.back() {
            Some((newest, _, _)) if proof.seq <= *newest => Err(Reject::Replay),
            _ => Ok(Fresh::New),
        }
    }

    /// A node on a key this node does not hold is cut off from the cluster: the one
    /// failure of a key rotation an operator must see (at most once a minute, as a
    /// forger can send any key ID).
    fn warn_unknown_key(&self, name: &str, key_id: &str, keys: &Keys, now: SystemTime) {
        if !due(&self.unknown_key_warned, now) {
            return;
        }
        // Only the record's claims: a key ID is no secret, but keep a forger's bytes short.
        let shown: String = key_id.chars().take(32).collect();
        tracing::warn!(
            "members: dropped a record of {name} signed with membership key {shown:?}, which \
             this node does not hold (it verifies with {}): that node is on a retired key, or \
             on a new one this node has not been given yet; it is not a member until both \
             share a key (docs/operations.md, \"Rotating the membership key\")",
            keys.ids().join(", ")
        );
    }

    /// A record with a good MAC but a time far from ours is a replay or a clock problem;
    /// the second breaks membership silently, so it is said (at most once a minute).
    fn warn_stale(&self, name: &str, now_ms: u64, time_ms: u64, now: SystemTime) {
        if due(&self.stale_warned, now) {
            let (dir, by) = if time_ms > now_ms {
                ("ahead of", time_ms - now_ms)
            } else {
                ("behind", now_ms - time_ms)
            };
            tracing::warn!(
                "members: dropped a record of {name} signed {:.1} s {dir} this node's clock \
                 (at most {} s allowed, members.maxClockSkewSecs): a replay, or clocks that \
                 disagree (check NTP on both nodes)",
                by as f64 / 1000.0,
                self.window.as_secs()
            );
        }
    }

    /// Records that `proof` of node `name` was accepted.
    pub fn accept(&self, name: &str, proof: Option<&Proof>) {
        let Some(p) = proof else {
            return;
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let key = name.to_ascii_lowercase();
        if !last.contains_key(&key) && last.len() >= TRACKED {
            // A record signed before now - window is refused as stale whatever its sequence
            // number: what was kept about nodes last heard before that guards nothing.
            let horizon = unix_ms(SystemTime::now())
                .saturating_sub(self.window.as_millis().min(u128::from(u64::MAX)) as u64);
            last.retain(|_, r| r.back().is_some_and(|(_, _, t)| *t >= horizon));
        }
        let recent = last.entry(key).or_default();
        if recent.back().is_some_and(|(newest, _, _)| p.seq <= *newest) {
            return;
        }
        recent.push_back((p.seq, p.mac.clone(), p.time_ms));
        while recent.len() > RECENT {
            recent.pop_front();
        }
    }

    /// Counts a dropped record of `name` heard from `from` (logged at debug level: a
    /// forger must not be able to flood the log).
    pub fn refuse(&self, r: Reject, name: &str, from: std::net::SocketAddr) {
        self.drops.count(r);
        tracing::debug!(%from, member = name, reason = r.as_str(), "members: record dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> std::sync::Arc<Keys> {
        std::sync::Arc::new(Keys::from_raw(&[vec![b; 32]]))
    }

    fn fields(addrs: &[IpAddr]) -> Fields<'_> {
        Fields {
            op: Op::Register,
            cluster: "c.example",
            name: "master-0",
            role: Some(Role::Master),
            addresses: addrs,
            version: "0.1.0",
        }
    }

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn signed_records_verify_and_each_forgery_is_dropped_by_reason() {
        let addrs: Vec<IpAddr> = vec!["10.0.0.11".parse().unwrap()];
        let signer = Signer::new(keys(1), t(0));
        let v = Verifier::new(Some(keys(1)));
        let p1 = signer.sign(&fields(&addrs), t(0));
        assert_eq!(
            v.check(&fields(&addrs), Some(&p1), true, t(1)),
            Ok(Fresh::New)
        );
        v.accept("master-0", Some(&p1));
        // The same record again: a duplicate (renews nothing).
        assert_eq!(
            v.check(&fields(&addrs), Some(&p1), true, t(1)),
            Ok(Fresh::Duplicate)
        );
        let p2 = signer.sign(&fields(&addrs), t(2));
        assert!(p2.seq > p1.seq);
        assert_eq!(
            v.check(&fields(&addrs), Some(&p2), true, t(2)),
            Ok(Fresh::New)
        );
        v.accept("master-0", Some(&p2));
        // An older one still among the last accepted: a duplicate too.
        assert_eq!(
            v.check(&fields(&addrs), Some(&p1), true, t(2)),
            Ok(Fresh::Duplicate)
        );
        // One never accepted, older than the newest: a replay; the same sequence number
        // with another MAC too.
        let skipped = signer.sign(&fields(&addrs), t(2));
        for _ in 0..RECENT {
            let p = signer.sign(&fields(&addrs), t(2));
            assert_eq!(
                v.check(&fields(&addrs), Some(&p), true, t(2)),
                Ok(Fresh::New)
            );
            v.accept("master-0", Some(&p));
        }
        assert_eq!(
            v.check(&fields(&addrs), Some(&skipped), true, t(2)),
            Err(Reject::Replay)
        );
        // p1 and p2 are no longer among the last accepted.
        assert_eq!(
            v.check(&fields(&addrs), Some(&p1), true, t(2)),
            Err(Reject::Replay)
        );
        let mut other_addrs = fields(&addrs);
        other_addrs.version = "0.2.0";
        let same_seq = Keys::sign(&keys(1), &other_addrs, p2.time_ms, p2.seq);
        assert_eq!(
            v.check(&other_addrs, Some(&same_seq), true, t(2)),
            Err(Reject::Replay)
        );
        let p3 = signer.sign(&fields(&addrs), t(2));
        // No proof; another key; a changed field; a tampered MAC; another op.
        assert_eq!(
            v.check(&fields(&addrs), None, true, t(2)),
            Err(Reject::NoMac)
        );
        let mut goodbye = fields(&addrs);
        goodbye.op = Op::Delete;
        assert_eq!(
            v.check(&goodbye, Some(&p3), true, t(2)),
            Err(Reject::BadMac)
        );
        let other = Signer::new(keys(2), t(0)).sign(&fields(&addrs), t(2));
        assert_eq!(
            v.check(&fields(&addrs), Some(&other), true, t(2)),
            Err(Reject::UnknownKey),
            "a key this node does not hold (a retired one) is told from a bad MAC"
        );
        let mut claimed = other.clone();
        claimed.key_id = keys(1).signing_id().to_owned();
        assert_eq!(
            v.check(&fields(&addrs), Some(&claimed), true, t(2)),
            Err(Reject::BadMac),
            "another key's MAC under our key's ID"
        );
        let moved: Vec<IpAddr> = vec!["10.0.0.66".parse().unwrap()];
        assert_eq!(
            v.check(&fields(&moved), Some(&p3), true, t(2)),
            Err(Reject::BadMac)
        );
        let mut bad = p3.clone();
        bad.mac
            .replace_range(0..2, if &bad.mac[0..2] == "00" { "11" } else { "00" });
        assert_eq!(
            v.check(&fields(&addrs), Some(&bad), true, t(2)),
            Err(Reject::BadMac)
        );
        let mut later = p3.clone();
        later.seq += 100;
        assert_eq!(
            v.check(&fields(&addrs), Some(&later), true, t(2)),
            Err(Reject::BadMac),
            "seq is signed"
        );
        // Too old, too new; a narrower window.
        assert_eq!(
            v.check(&fields(&addrs), Some(&p3), true, t(2 + 121)),
            Err(Reject::Stale)
        );
        assert_eq!(
            v.check(&fields(&addrs), Some(&p3), true, t(2 + 119)),
            Ok(Fresh::New)
        );
        let future = signer.sign(&fields(&addrs), t(500));
        assert_eq!(
            v.check(&fields(&addrs), Some(&future), true, t(2)),
            Err(Reject::Stale)
        );
        let narrow = Verifier::new(Some(keys(1))).with_window(Duration::from_secs(5));
        assert_eq!(
            narrow.check(&fields(&addrs), Some(&p3), true, t(8)),
            Err(Reject::Stale)
        );
        // Signed, but heard from elsewhere.
        assert_eq!(
            v.check(&fields(&addrs), Some(&p3), false, t(2)),
            Err(Reject::AddressMismatch)
        );
        // Without keys everything passes.
        assert_eq!(
            Verifier::new(None).check(&fields(&addrs), None, true, t(0)),
            Ok(Fresh::New)
        );
        v.drops.count(Reject::Replay);
        assert_eq!(v.drops.get(Reject::Replay), 1);
        assert_eq!(v.drops.counts()["replay"], 1);
    }

    #[test]
    fn canonical_sorts_addresses_and_separates_ops() {
        let a: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap()];
        let b: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(canonical(&fields(&a), 1, 2), canonical(&fields(&b), 1, 2));
        let ops = [Op::Register, Op::Delete, Op::Announce, Op::Goodbye];
        for x in ops {
            for y in ops {
                let (mut f, mut g) = (fields(&a), fields(&a));
                f.op = x;
                g.op = y;
                assert_eq!(canonical(&f, 1, 2) == canonical(&g, 1, 2), x == y);
            }
        }
    }

    #[test]
    fn source_must_be_a_registered_address() {
        let addrs: Vec<IpAddr> = vec!["10.0.0.11".parse().unwrap(), "fd00::11".parse().unwrap()];
        assert!(source_matches("10.0.0.11".parse().unwrap(), &addrs));
        assert!(source_matches("::ffff:10.0.0.11".parse().unwrap(), &addrs));
        assert!(source_matches("fd00::11".parse().unwrap(), &addrs));
        assert!(!source_matches("10.0.0.12".parse().unwrap(), &addrs));
        assert!(!source_matches("0.0.0.0".parse().unwrap(), &addrs));
    }

    #[test]
    fn a_rotation_key_verifies_but_does_not_sign() {
        let both = std::sync::Arc::new(Keys::from_raw(&[vec![1; 32], vec![2; 32]]));
        let addrs: Vec<IpAddr> = vec!["10.0.0.11".parse().unwrap()];
        let old = Signer::new(keys(2), t(0)).sign(&fields(&addrs), t(0));
        let v = Verifier::new(Some(both.clone()));
        assert_eq!(
            v.check(&fields(&addrs), Some(&old), true, t(0)),
            Ok(Fresh::New)
        );
        assert_eq!(
            both.signing_id(),
            keelson_cluster::membership::key_id(&[1; 32])
        );
        assert_eq!(both.ids().len(), 2);
        // Retired: key 2 removed; a node still signing with it is refused as such.
        let retired = Verifier::new(Some(keys(1)));
        let late = Signer::new(keys(2), t(0)).sign(&fields(&addrs), t(1));
        assert_eq!(
            retired.check(&fields(&addrs), Some(&late), true, t(1)),
            Err(Reject::UnknownKey)
        );
    }

    #[test]
    fn load_checks_the_id_cluster_json_names() {
        let dir = tempfile::tempdir().unwrap();
        let text = keelson_cluster::membership::generate().unwrap();
        std::fs::write(dir.path().join("membership.key"), &text).unwrap();
        let id = keelson_cluster::membership::key_id(
            &keelson_cluster::membership::parse_key(&text).unwrap(),
        );
        assert_eq!(Keys::load(dir.path(), &id).unwrap().signing_id(), id);
        let e = Keys::load(dir.path(), "0000000000000000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expects 0000000000000000"), "{e}");
        let e = Keys::load(&dir.path().join("none"), &id)
            .unwrap_err()
            .to_string();
        assert!(e.contains("membership key") && e.contains(&id), "{e}");
        std::fs::write(dir.path().join("membership.next.key"), "short").unwrap();
        let e = Keys::load(dir.path(), &id).unwrap_err().to_string();
        assert!(e.contains("membership.next.key"), "{e}");
    }
}
