//! The unicast members registry: what this node knows about the cluster's members, served
//! to the others as the Ignition server's `/keelson/v1/members` routes.
//!
//! One table holds both the nodes that registered here and those learned from other
//! registries' answers (each with the time it was last heard, wherever that was), so any
//! control-plane node answers a registration with everything it knows: a node that reaches
//! one registry learns the whole cluster. Ages travel with the entries and the newest
//! sighting wins, so a node that stopped renewing expires everywhere `expiry` after it was
//! last heard anywhere, however often the others gossip about it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use keelson_cluster::routes::{ExtraAnswer, ExtraRoutes};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::auth::{Fields, Fresh, Op, Proof, Reject, Verifier, source_matches};
use super::limits::{MEMBERS_PER_ADDRESS, SourceLimiter};
use super::table::{MAX_MEMBERS, Table};
use crate::dns_label::DnsLabel;
use crate::member::Member;
use crate::node::NodeIdentity;
use keelson_cluster::ClusterConfig;

/// The registration path on the Ignition server.
pub const MEMBERS_PATH: &str = "/keelson/v1/members";

/// The header of every registry answer naming the membership key its node signs with (an
/// authenticated cluster only). A client that does not hold that key ignores the answer:
/// the records in an answer carry no proof of their own, so without it a node left on a
/// retired key would still list itself, through its own registry, on every node that
/// registers with it (docs/operations.md). Older registries send none; their answers are
/// believed as before.
pub const KEY_HEADER: &str = "keelson-membership-key";

/// The header of a registry's `304 Not Modified` answer to a registration that named the
/// list it holds (`If-None-Match` with the `ETag` of an earlier answer): every member of
/// that list is still listed and was last heard at most this many milliseconds before the
/// answer. The client takes its copy of the list in again with that age, so a renewal
/// costs neither side the list while nothing changed. Older registries ignore
/// `If-None-Match` and always answer with the list; older clients never send it.
pub const FRESH_HEADER: &str = "keelson-members-fresh-ms";

/// What a node sends to register or renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// The cluster zone (`<name>.<baseDomain>`); other clusters are refused.
    pub cluster: String,
    /// The node.
    pub member: Member,
    /// Its proof (authenticated clusters: `cluster.json` `members.keyId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Proof>,
}

/// What a node sends with its goodbye (`DELETE /keelson/v1/members/<node>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Goodbye {
    /// Its proof (authenticated clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Proof>,
}

/// One entry of the registry's answer: a member and how long ago it was last heard, so
/// clients expire it when the registry does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The member.
    pub member: Member,
    /// Milliseconds since it was last heard.
    pub age_ms: u64,
}

/// Why a registry refused a registration before believing it (counted,
/// `keelson_members_registry_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// A new member while the registry holds [`MAX_MEMBERS`] (503).
    Full,
    /// A new member from an address [`MEMBERS_PER_ADDRESS`] live members already list (409).
    Address,
    /// More registrations from one address than [`super::limits`] allows (429).
    Rate,
}

impl Refusal {
    /// Every reason, in counter order.
    pub const ALL: [Refusal; 3] = [Refusal::Full, Refusal::Address, Refusal::Rate];

    /// The counter label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::Address => "address",
            Refusal::Rate => "rate",
        }
    }
}

/// What a registry counts (status `discovery.registry`, `/metrics`).
#[derive(Debug, Default)]
struct Counts {
    registrations: AtomicU64,
    refused: [AtomicU64; 3],
    merge_skipped: AtomicU64,
    answers: AtomicU64,
    answer_bytes: AtomicU64,
    unchanged: AtomicU64,
}

/// The last answer built, served again while nothing changed for [`Registry::cache_for`].
#[derive(Debug)]
struct CachedAnswer {
    /// The change counter ([`Registry::subscribe`]) it was built at.
    generation: u64,
    built: Instant,
    body: Bytes,
}

/// The longest a registry serves the same answer: every registration is answered with the
/// whole list (N entries for N members, N registrations per renewal interval), so building
/// it once per window rather than per request takes the serialisation out of the renewal
/// cost. Ages in a reused answer are stated this much older than they were when it was
/// built: a record only ever looks older than it is, never younger (a relayed record that
/// grew younger at each hop kept a dead node alive, docs/members.md "Wire format").
const ANSWER_CACHE_FOR: Duration = Duration::from_millis(250);

/// The registry of one node.
#[derive(Debug)]
pub struct Registry {
    zone: String,
    own: Option<Member>,
    table: Mutex<Table>,
    changed: watch::Sender<u64>,
    /// `None` until the members service loaded the keys (registrations wait: 503).
    verifier: RwLock<Option<Arc<Verifier>>>,
    limiter: Mutex<SourceLimiter>,
    counts: Counts,
    cache: Mutex<Option<CachedAnswer>>,
    /// How long one answer is served again (shorter for short expiries).
    cache_for: Duration,
    /// When a refusal was last logged as a warning.
    refusal_warned: Mutex<Option<Instant>>,
    /// Drawn when the registry is made: in its answers' tags, so a tag from before a
    /// restart (whose change counter began again at 0) never matches.
    instance: u64,
    /// The oldest a member may have been heard for the registry to answer "unchanged"
    /// ([`FRESH_HEADER`]); an older one (a node that stopped) gets the list until it expires.
    fresh_within: Duration,
}

impl Registry {
    /// A registry for cluster `zone` whose entries expire `expiry` after they were last
    /// heard.
    pub fn new(zone: &str, expiry: Duration) -> Self {
        Self {
            zone: zone.to_ascii_lowercase(),
            own: None,
            table: Mutex::new(Table::new(expiry)),
            changed: watch::Sender::new(0),
            verifier: RwLock::new(Some(Arc::new(Verifier::new(None)))),
            // `keelson build`'s renewal interval until `with_renewal` says otherwise.
            limiter: Mutex::new(SourceLimiter::new(Duration::from_secs(10))),
            counts: Counts::default(),
            cache: Mutex::new(None),
            cache_for: ANSWER_CACHE_FOR.min(expiry / 20),
            refusal_warned: Mutex::new(None),
            instance: rand::random(),
            fresh_within: fresh_within(Duration::from_secs(10), expiry),
        }
    }

    /// Limits each address's registrations for members that renew every `renew`
    /// ([`super::limits`]).
    pub fn with_renewal(mut self, renew: Duration) -> Self {
        *self.limiter.lock().unwrap_or_else(|e| e.into_inner()) = SourceLimiter::new(renew);
        let expiry = self.table().expiry();
        self.fresh_within = fresh_within(renew, expiry);
        self
    }

    /// The registry of `node` in `cluster`: entries expire after `members.expiryS`, the
    /// node lists itself, and registrations wait for the membership keys when the cluster
    /// names one. Built once by the run loop, it outlives restarts of `members` (which fills
    /// it) and `ignition_server` (which serves it).
    pub fn for_node(cluster: &ClusterConfig, node: &NodeIdentity) -> Self {
        let expiry = Duration::from_secs(u64::from(cluster.members.expiry_secs.max(1)));
        let renew = Duration::from_secs(u64::from(cluster.members.renew_interval_secs.max(1)));
        let registry = Self::new(&cluster.zone(), expiry)
            .with_own(Member::of(node))
            .with_renewal(renew);
        if cluster.members.key_id.is_some() {
            registry.awaiting_keys()
        } else {
            registry
        }
    }

    /// Holds registrations back (503) until [`Registry::set_verifier`]: for a cluster
    /// whose records are authenticated, before the key is loaded.
    pub fn awaiting_keys(self) -> Self {
        *self.verifier.write().unwrap_or_else(|e| e.into_inner()) = None;
        self
    }

    /// Checks registrations and goodbyes with `v` from now on.
    pub fn set_verifier(&self, v: Arc<Verifier>) {
        *self.verifier.write().unwrap_or_else(|e| e.into_inner()) = Some(v);
    }

    fn verifier(&self) -> Option<Arc<Verifier>> {
        self.verifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts a record (or a registry's answer) dropped by this node's client side.
    pub fn count_drop(&self, r: Reject) {
        if let Some(v) = self.verifier() {
            v.drops.count(r);
        }
    }

    /// Whether records are authenticated, and the drops by reason (for `status`).
    pub fn auth_status(&self) -> Option<crate::status::model::MembersAuth> {
        self.verifier().map(|v| crate::status::model::MembersAuth {
            authenticated: v.enabled(),
            drops: v.drops.counts(),
        })
    }

    /// What this registry holds, took and refused (for `status`).
    pub fn registry_status(&self) -> crate::status::model::RegistryStatus {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::status::model::RegistryStatus {
            entries: self.table().len() as u64,
            limit: MAX_MEMBERS as u64,
            registrations: g(&self.counts.registrations),
            refused: Refusal::ALL
                .iter()
                .enumerate()
                .map(|(i, r)| (r.as_str().to_string(), g(&self.counts.refused[i])))
                .collect(),
            merge_skipped: g(&self.counts.merge_skipped),
            answers: g(&self.counts.answers),
            answer_bytes: g(&self.counts.answer_bytes),
            unchanged: g(&self.counts.unchanged),
            sources: self.limiter.lock().unwrap_or_else(|e| e.into_inner()).len() as u64,
        }
    }

    /// Registrations received (every `POST`, refused or not).
    pub fn registrations(&self) -> u64 {
        self.counts.registrations.load(Ordering::Relaxed)
    }

    fn count_refusal(&self, r: Refusal, peer: SocketAddr, name: &str) {
        let i = Refusal::ALL.iter().position(|x| *x == r).unwrap_or(0);
        let n = self.counts.refused[i].fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(%peer, member = name, reason = r.as_str(), "members: registration refused");
        // Said, but at most once a minute: a flood must not flood the log.
        let now = Instant::now();
        let mut last = self
            .refusal_warned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(60)) {
            *last = Some(now);
            tracing::warn!(
                "members: refused a registration of {name} from {} ({}; {n} so far for that \
                 reason, counted in keelson_members_registry_refused_total; docs/members.md, \
                 \"Bounds\")",
                peer.ip(),
                match r {
                    Refusal::Full => "the registry is full",
                    Refusal::Address => "too many members at that address",
                    Refusal::Rate => "too many registrations from that address",
                },
            );
        }
    }

    /// Lists `own` (the node serving this registry) in every answer, always fresh: a node
    /// that registers through the API VIP learns the holder's own address this way.
    pub fn with_own(mut self, own: Member) -> Self {
        self.own = Some(own);
        self
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self, changed: bool) {
        if changed {
            self.changed.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// A receiver that sees a change whenever a member appears, changes or goes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The live members (this node first if it is listed), sorted by name.
    pub fn list(&self) -> Vec<Member> {
        let mut out: Vec<Member> = self.own.iter().cloned().collect();
        out.extend(self.table().list());
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The live members with their ages at `now`, this node at age 0.
    pub fn entries(&self, now: Instant) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .own
            .iter()
            .map(|m| Entry {
                member: m.clone(),
                age_ms: 0,
            })
            .collect();
        out.extend(
            self.table()
                .list_aged(now)
                .into_iter()
                .map(|(member, age)| Entry {
                    member,
                    age_ms: age.as_millis().min(u128::from(u64::MAX)) as u64,
                }),
        );
        out
    }

    fn own_name(&self) -> Option<&str> {
        self.own.as_ref().map(|m| m.name.as_str())
    }

    /// Takes in another registry's answer, heard at `now`. Entries naming this node, or
    /// not shaped as a registration must be, are skipped, and so are new ones once the table
    /// holds [`MAX_MEMBERS`]. Returns how many were taken.
    pub fn merge(&self, entries: Vec<Entry>, now: Instant) -> usize {
        let mut taken = 0;
        let mut changed = false;
        {
            let mut t = self.table();
            for e in entries {
                // Another registry's answer is believed (it proved the cluster's server key),
                // but held to the same shape as a registration here.
                if Some(e.member.name.as_str()) == self.own_name()
                    || check_member(&e.member).is_err()
                {
                    continue;
                }
                if !t.has_room_for(&e.member.name) {
                    self.counts.merge_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                taken += 1;
                changed |= t.renew_aged(e.member, Duration::from_millis(e.age_ms), now);
            }
        }
        self.notify(changed);
        taken
    }

    /// Drops what was not heard within the expiry.
    pub fn expire(&self, now: Instant) {
        let changed = self.table().expire(now);
        self.notify(changed);
    }

    /// Housekeeping (every second): drops what expired and forgets the addresses that have
    /// been quiet long enough ([`SourceLimiter::forget_quiet`]).
    pub fn tidy(&self, now: Instant) {
        self.expire(now);
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_quiet(now);
    }

    fn answer(&self) -> (StatusCode, Bytes) {
        let (_, body) = self.answer_body(Instant::now());
        self.count_answer(&body);
        (StatusCode::OK, body)
    }

    fn count_answer(&self, body: &Bytes) {
        self.counts.answers.fetch_add(1, Ordering::Relaxed);
        self.counts
            .answer_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
    }

    /// The `ETag` of the list at change counter `generation`.
    fn tag(&self, generation: u64) -> http::HeaderValue {
        http::HeaderValue::from_str(&format!("\"{:016x}-{generation}\"", self.instance))
            .unwrap_or_else(|_| http::HeaderValue::from_static("\"\""))
    }

    /// The answer to a registration at `now` whose `If-None-Match` was `held`: `304` with
    /// [`FRESH_HEADER`] when `held` is the tag of the list as it is now and every member was
    /// heard within [`Registry::fresh_within`]; else the list with its `ETag`.
    pub fn conditional_answer(
        &self,
        held: Option<&http::HeaderValue>,
        now: Instant,
    ) -> ExtraAnswer {
        if let Some(held) = held {
            self.expire(now);
            let generation = *self.changed.borrow();
            let oldest = self.table().oldest_age(now).unwrap_or_default();
            if *held == self.tag(generation) && oldest <= self.fresh_within {
                self.counts.answers.fetch_add(1, Ordering::Relaxed);
                self.counts.unchanged.fetch_add(1, Ordering::Relaxed);
                let ms = oldest.as_millis().min(u128::from(u64::MAX)) as u64;
                return ExtraAnswer {
                    status: StatusCode::NOT_MODIFIED,
                    body: Bytes::new(),
                    headers: vec![
                        (http::header::ETAG, held.clone()),
                        (
                            http::HeaderName::from_static(FRESH_HEADER),
                            http::HeaderValue::from(ms),
                        ),
                    ],
                };
            }
        }
        let (generation, body) = self.answer_body(now);
        self.count_answer(&body);
        ExtraAnswer {
            status: StatusCode::OK,
            body,
            headers: vec![(http::header::ETAG, self.tag(generation))],
        }
    }

    /// The list as served at `now` and the change counter it was built at: the one built
    /// last while nothing changed since and it is younger than [`ANSWER_CACHE_FOR`], else a
    /// new one.
    fn answer_body(&self, now: Instant) -> (u64, Bytes) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let generation = *self.changed.borrow();
        if let Some(c) = cache.as_ref()
            && c.generation == generation
            && now.saturating_duration_since(c.built) < self.cache_for
        {
            return (c.generation, c.body.clone());
        }
        self.expire(now);
        let generation = *self.changed.borrow();
        let mut entries = self.entries(now);
        // Served for up to `cache_for` more: stated as old as they will be by then. This
        // node's own entry is live whenever it answers.
        let older = self.cache_for.as_millis() as u64;
        for e in entries.iter_mut() {
            if Some(e.member.name.as_str()) != self.own_name() {
                e.age_ms = e.age_ms.saturating_add(older);
            }
        }
        let body = Bytes::from(serde_json::to_vec(&entries).unwrap_or_default());
        *cache = Some(CachedAnswer {
            generation,
            built: now,
            body: body.clone(),
        });
        (generation, body)
    }

    /// Takes in a registration (`body` from `peer`), or says why not.
    fn take(&self, body: &[u8], peer: SocketAddr) -> Result<(), (StatusCode, Bytes)> {
        self.counts.registrations.fetch_add(1, Ordering::Relaxed);
        // Before anything else: a flood from one address costs it no parsing, no MAC.
        if !self
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(peer.ip(), Instant::now())
        {
            self.count_refusal(Refusal::Rate, peer, "?");
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                Bytes::from(format!(
                    "registration: too many registrations from {}\n",
                    peer.ip().to_canonical()
                )),
            ));
        }
        let bad = |msg: String| (StatusCode::BAD_REQUEST, Bytes::from(msg + "\n"));
        let reg: Registration = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return Err(bad(format!("registration: {e}"))),
        };
        if !reg.cluster.eq_ignore_ascii_case(&self.zone) {
            return Err((
                StatusCode::CONFLICT,
                Bytes::from(format!(
                    "registration: cluster: expected {}, got {}\n",
                    self.zone, reg.cluster
                )),
            ));
        }
        if let Err(e) = check_member(&reg.member) {
            return Err(bad(format!("registration: {e}")));
        }
        if Some(reg.member.name.as_str()) == self.own_name() {
            return Err((
                StatusCode::CONFLICT,
                Bytes::from(format!(
                    "registration: member.name: {} is the node serving this registry\n",
                    reg.member.name
                )),
            ));
        }
        let Some(verifier) = self.verifier() else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                Bytes::from_static(b"registration: the membership key is not loaded yet\n"),
            ));
        };
        let fields = Fields {
            op: Op::Register,
            cluster: &reg.cluster,
            name: &reg.member.name,
            role: Some(reg.member.role),
            addresses: &reg.member.addresses,
            version: &reg.member.version,
        };
        // Only from an address it registers: nobody registers a node but the node itself.
        let from_it = source_matches(peer.ip(), &reg.member.addresses);
        let fresh = match verifier.check(&fields, reg.auth.as_ref(), from_it, SystemTime::now()) {
            Ok(f) => f,
            Err(r) => return Err(refuse(&verifier, r, &reg.member.name, peer)),
        };
        // The record accepted last, once more (the node reached this registry both through
        // the API VIP and at its address): answered, but it renews nothing, so a replay of
        // a dead node's last registration does not keep it alive.
        if fresh == Fresh::New {
            let mut table = self.table();
            if !table.has_room_for(&reg.member.name) {
                drop(table);
                self.count_refusal(Refusal::Full, peer, &reg.member.name);
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    Bytes::from(format!(
                        "registration: the registry is full ({MAX_MEMBERS} members)\n"
                    )),
                ));
            }
            let source = peer.ip().to_canonical();
            if !table.contains(&reg.member.name)
                && table.count_listing(source, &reg.member.name) >= MEMBERS_PER_ADDRESS
            {
                drop(table);
                self.count_refusal(Refusal::Address, peer, &reg.member.name);
                return Err((
                    StatusCode::CONFLICT,
                    Bytes::from(format!(
                        "registration: {MEMBERS_PER_ADDRESS} live members already list \
                         address {source}\n"
                    )),
                ));
            }
            verifier.accept(&reg.member.name, reg.auth.as_ref());
            let changed = table.renew(reg.member, Instant::now());
            drop(table);
            self.notify(changed);
        }
        Ok(())
    }

    fn goodbye(&self, name: &str, body: &[u8], peer: SocketAddr) -> (StatusCode, Bytes) {
        let bye: Goodbye = if body.is_empty() {
            Goodbye::default()
        } else {
            match serde_json::from_slice(body) {
                Ok(b) => b,
                Err(e) => {
                    return (
                        StatusCode::BAD_REQUEST,
                        Bytes::from(format!("goodbye: {e}\n")),
                    );
                }
            }
        };
        let Some(verifier) = self.verifier() else {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Bytes::from_static(b"goodbye: the membership key is not loaded yet\n"),
            );
        };
        let Some(known) = self
            .table()
            .list()
            .into_iter()
            .find(|m| m.name.eq_ignore_ascii_case(name))
        else {
            return (StatusCode::NO_CONTENT, Bytes::new());
        };
        let fields = Fields {
            op: Op::Delete,
            cluster: &self.zone,
            name,
            role: None,
            addresses: &[],
            version: "",
        };
        // Only from the node's own address: nobody says goodbye for another.
        let from_it = source_matches(peer.ip(), &known.addresses);
        if let Err(r) = verifier.check(&fields, bye.auth.as_ref(), from_it, SystemTime::now()) {
            return refuse(&verifier, r, name, peer);
        }
        verifier.accept(name, bye.auth.as_ref());
        let changed = self.table().remove(&known.name, Instant::now());
        self.notify(changed);
        (StatusCode::NO_CONTENT, Bytes::new())
    }
}

/// Counts and answers a dropped record.
fn refuse(v: &Verifier, r: Reject, name: &str, peer: SocketAddr) -> (StatusCode, Bytes) {
    v.refuse(r, name, peer);
    let status = match r {
        Reject::AddressMismatch => StatusCode::FORBIDDEN,
        _ => StatusCode::UNAUTHORIZED,
    };
    (
        status,
        Bytes::from(format!("member {name}: dropped: {}\n", r.as_str())),
    )
}

impl ExtraRoutes for Registry {
    fn headers(&self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        self.verifier()
            .and_then(|v| v.signing_id().map(str::to_owned))
            .and_then(|id| http::HeaderValue::from_str(&id).ok())
            .map(|id| vec![(http::HeaderName::from_static(KEY_HEADER), id)])
            .unwrap_or_default()
    }

    fn handle_request(
        &self,
        method: &Method,
        path: &str,
        peer: SocketAddr,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Option<ExtraAnswer> {
        if path == MEMBERS_PATH && *method == Method::POST {
            let held = headers.get(http::header::IF_NONE_MATCH);
            return Some(match self.take(&body, peer) {
                Ok(()) => self.conditional_answer(held, Instant::now()),
                Err((status, body)) => ExtraAnswer {
                    status,
                    body,
                    headers: Vec::new(),
                },
            });
        }
        self.handle(method, path, peer, body)
            .map(|(status, body)| ExtraAnswer {
                status,
                body,
                headers: Vec::new(),
            })
    }

    fn handle(
        &self,
        method: &Method,
        path: &str,
        peer: SocketAddr,
        body: Bytes,
    ) -> Option<(StatusCode, Bytes)> {
        if path == MEMBERS_PATH {
            return Some(match *method {
                Method::GET => self.answer(),
                Method::POST => match self.take(&body, peer) {
                    Ok(()) => self.answer(),
                    Err(refused) => refused,
                },
                _ => (StatusCode::METHOD_NOT_ALLOWED, Bytes::new()),
            });
        }
        let name = path.strip_prefix(MEMBERS_PATH)?.strip_prefix('/')?;
        Some(match *method {
            // A node that stops says goodbye rather than waiting for the expiry.
            Method::DELETE if DnsLabel::is_valid(name) => self.goodbye(name, &body, peer),
            Method::DELETE => (
                StatusCode::BAD_REQUEST,
                Bytes::from("member name: expected a DNS label\n"),
            ),
            _ => (StatusCode::METHOD_NOT_ALLOWED, Bytes::new()),
        })
    }
}

/// How long since a member was heard the registry still answers "unchanged": one and a
/// half renewal intervals (a live member renews every interval, so its age stays under
/// this), and at most half the expiry (so the age a client takes in with a `304` leaves it
/// time to hear the member again before it expires there).
fn fresh_within(renew: Duration, expiry: Duration) -> Duration {
    (renew + renew / 2).min(expiry / 2)
}

/// A member that this registry will not list; says which field and what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemberShapeError {
    /// No address, or more than 16.
    #[error("member.addresses: expected 1 to 16 addresses")]
    Addresses,
    /// A version longer than 64 bytes or with control characters.
    #[error("member.version: expected at most 64 bytes, no control characters")]
    Version,
}

/// What every member this registry lists must look like, however it was heard: 1 to 16
/// addresses, a version of at most 64 bytes without control characters (its name is a
/// [`DnsLabel`], checked when it was read).
fn check_member(m: &Member) -> Result<(), MemberShapeError> {
    if m.addresses.is_empty() || m.addresses.len() > 16 {
        return Err(MemberShapeError::Addresses);
    }
    if m.version.len() > 64 || m.version.chars().any(char::is_control) {
        return Err(MemberShapeError::Version);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::Role;

    fn member(name: &str, addr: &str) -> Member {
        Member {
            name: name.parse().unwrap(),
            role: Role::Master,
            addresses: vec![addr.parse().unwrap()],
            version: "1".into(),
        }
    }

    fn reg(cluster: &str, name: &str) -> Bytes {
        Bytes::from(
            serde_json::to_vec(&Registration {
                cluster: cluster.into(),
                member: member(name, "10.0.0.1"),
                auth: None,
            })
            .unwrap(),
        )
    }

    fn peer() -> SocketAddr {
        "10.0.0.1:40000".parse().unwrap()
    }

    #[test]
    fn register_list_delete() {
        let r = Registry::new("c.example", Duration::from_secs(10));
        let mut rx = r.subscribe();
        let (st, body) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), reg("C.example", "m0"))
            .unwrap();
        assert_eq!(st, StatusCode::OK);
        assert!(rx.has_changed().unwrap(), "a new member is a change");
        rx.borrow_and_update();
        let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].member.name, "m0");
        assert!(list[0].age_ms < 1000);
        r.handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m0"))
            .unwrap();
        assert!(!rx.has_changed().unwrap(), "a renewal is not");
        let (st, _) = r
            .handle(
                &Method::DELETE,
                &format!("{MEMBERS_PATH}/m0"),
                peer(),
                Bytes::new(),
            )
            .unwrap();
        assert_eq!(st, StatusCode::NO_CONTENT);
        assert!(r.list().is_empty());
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn own_node_is_always_listed_fresh_and_cannot_be_registered() {
        let r =
            Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
        let (st, body) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m0"))
            .unwrap();
        assert_eq!(st, StatusCode::OK);
        let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            list.iter()
                .map(|e| e.member.name.as_str())
                .collect::<Vec<_>>(),
            ["m1", "m0"]
        );
        assert_eq!(list[0].age_ms, 0);
        assert_eq!(
            list[0].member.addresses,
            vec!["10.0.0.11".parse::<std::net::IpAddr>().unwrap()]
        );
        let (st, body) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", "m1"))
            .unwrap();
        assert_eq!(st, StatusCode::CONFLICT);
        assert!(String::from_utf8_lossy(&body).contains("serving this registry"));
    }

    #[test]
    fn merged_answers_are_held_to_the_registration_checks() {
        // Found by the members_registry fuzz target: a 118-byte version came in through
        // another registry's answer and was listed.
        let r =
            Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
        let crash = include_bytes!("testdata/fuzz-merge-long-version.json");
        let entries: Vec<Entry> = serde_json::from_slice(crash).unwrap();
        let mut no_address = member("m3", "10.0.0.13");
        no_address.addresses.clear();
        let mut control = member("m4", "10.0.0.14");
        control.version = "1\n2".into();
        let mut all = entries;
        all.extend([no_address, control].map(|member| Entry { member, age_ms: 0 }));
        all.push(Entry {
            member: member("m2", "10.0.0.12"),
            age_ms: 0,
        });
        assert_eq!(r.merge(all, Instant::now()), 1);
        let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
        assert_eq!(names, ["m1", "m2"]);
    }

    #[test]
    fn merged_answers_keep_the_newest_sighting_and_expire_on_time() {
        let r =
            Registry::new("c.example", Duration::from_secs(10)).with_own(member("m1", "10.0.0.11"));
        let t0 = Instant::now();
        let heard = |name: &str, age_ms| Entry {
            member: member(name, "10.0.0.12"),
            age_ms,
        };
        // Our own name is skipped (a name that is no DNS label is no `Entry`: the answer's
        // reader drops it, `unicast::parse_answer`).
        let taken = r.merge(vec![heard("m2", 4000), heard("m1", 0)], t0);
        assert_eq!(taken, 1);
        // Gossip about an older sighting does not make it younger.
        r.merge(vec![heard("m2", 9000)], t0);
        r.expire(t0 + Duration::from_secs(6));
        assert_eq!(
            r.list().len(),
            2,
            "heard 4 s before t0: live until t0 + 6 s"
        );
        r.expire(t0 + Duration::from_millis(6100));
        assert_eq!(
            r.list().iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
            ["m1"]
        );
    }

    /// A-labels (`xn--...`, the ASCII form OpenShift node names may take) register and are
    /// listed like any node name.
    #[test]
    fn a_label_names_register() {
        let r = Registry::new("c.example", Duration::from_secs(10));
        for name in ["xn--cwl6ngym1", "xn--bcher-kva"] {
            let (st, body) = r
                .handle(&Method::POST, MEMBERS_PATH, peer(), reg("c.example", name))
                .unwrap();
            assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        }
        let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
        assert_eq!(names, ["xn--bcher-kva", "xn--cwl6ngym1"]);
    }

    #[test]
    fn refuses_bad_input() {
        let r = Registry::new("c.example", Duration::from_secs(10));
        let (st, body) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                peer(),
                reg("other.example", "m0"),
            )
            .unwrap();
        assert_eq!(st, StatusCode::CONFLICT);
        assert!(String::from_utf8_lossy(&body).contains("cluster: expected c.example"));
        let (st, body) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                peer(),
                Bytes::from_static(
                    br#"{"cluster":"c.example","member":{"name":"bad name","role":"master",
                        "addresses":["10.0.0.1"],"version":"1"}}"#,
                ),
            )
            .unwrap();
        assert_eq!(st, StatusCode::BAD_REQUEST);
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("node name \"bad name\": expected a DNS label"),
            "{text}"
        );
        let (st, body) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                peer(),
                Bytes::from_static(b"{\"cluster\":1}"),
            )
            .unwrap();
        assert_eq!(st, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).contains("registration"));
        let (st, _) = r
            .handle(&Method::PUT, MEMBERS_PATH, peer(), Bytes::new())
            .unwrap();
        assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
        assert!(
            r.handle(&Method::GET, "/keelson/v1/other", peer(), Bytes::new())
                .is_none()
        );
        assert!(r.list().is_empty());
    }

    #[test]
    fn authenticated_registry_drops_forgeries_by_reason() {
        use crate::members::auth::{Keys, Signer};
        let keys = Arc::new(Keys::from_raw(&[vec![7; 32]]));
        let r = Registry::new("c.example", Duration::from_secs(10)).awaiting_keys();
        let body = |auth| {
            Bytes::from(
                serde_json::to_vec(&Registration {
                    cluster: "c.example".into(),
                    member: member("m0", "10.0.0.1"),
                    auth,
                })
                .unwrap(),
            )
        };
        let (st, _) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), body(None))
            .unwrap();
        assert_eq!(
            st,
            StatusCode::SERVICE_UNAVAILABLE,
            "before the key is loaded"
        );
        assert!(r.headers().is_empty(), "no key yet, no key header");
        r.set_verifier(Arc::new(Verifier::new(Some(keys.clone()))));
        // Every answer names the key this registry's node signs with.
        assert_eq!(
            r.headers(),
            [(
                http::HeaderName::from_static(KEY_HEADER),
                http::HeaderValue::from_str(keys.signing_id()).unwrap()
            )]
        );
        assert!(
            Registry::new("c.example", Duration::from_secs(10))
                .headers()
                .is_empty(),
            "an unauthenticated registry names none"
        );
        let signer = Signer::new(keys, SystemTime::now());
        let m = member("m0", "10.0.0.1");
        let fields = Fields {
            op: Op::Register,
            cluster: "c.example",
            name: "m0",
            role: Some(m.role),
            addresses: &m.addresses,
            version: &m.version,
        };
        let genuine = signer.sign(&fields, SystemTime::now());
        let post = |b: Bytes, from: &str| {
            r.handle(&Method::POST, MEMBERS_PATH, from.parse().unwrap(), b)
                .unwrap()
                .0
        };
        assert_eq!(post(body(None), "10.0.0.1:1"), StatusCode::UNAUTHORIZED);
        let mut forged = genuine.clone();
        forged.mac = "00".repeat(32);
        assert_eq!(
            post(body(Some(forged)), "10.0.0.1:1"),
            StatusCode::UNAUTHORIZED
        );
        // Genuine, but sent from another address.
        assert_eq!(
            post(body(Some(genuine.clone())), "10.0.0.66:1"),
            StatusCode::FORBIDDEN
        );
        assert!(r.list().is_empty());
        assert_eq!(
            post(body(Some(genuine.clone())), "10.0.0.1:1"),
            StatusCode::OK
        );
        // IPv4 arriving on a dual-stack socket counts as itself.
        for _ in 0..crate::members::auth::RECENT {
            let again = signer.sign(&fields, SystemTime::now());
            assert_eq!(
                post(body(Some(again)), "[::ffff:10.0.0.1]:1"),
                StatusCode::OK
            );
        }
        // The first, no longer among the last few accepted: a replay.
        assert_eq!(
            post(body(Some(genuine)), "10.0.0.1:1"),
            StatusCode::UNAUTHORIZED,
            "replay"
        );
        // A goodbye without a proof does not remove it; a signed one from it does.
        let (st, _) = r
            .handle(
                &Method::DELETE,
                &format!("{MEMBERS_PATH}/m0"),
                peer(),
                Bytes::new(),
            )
            .unwrap();
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        assert_eq!(r.list().len(), 1);
        let bye = signer.sign(
            &Fields {
                op: Op::Delete,
                cluster: "c.example",
                name: "m0",
                role: None,
                addresses: &[],
                version: "",
            },
            SystemTime::now(),
        );
        let (st, _) = r
            .handle(
                &Method::DELETE,
                &format!("{MEMBERS_PATH}/m0"),
                peer(),
                Bytes::from(serde_json::to_vec(&Goodbye { auth: Some(bye) }).unwrap()),
            )
            .unwrap();
        assert_eq!(st, StatusCode::NO_CONTENT);
        assert!(r.list().is_empty());
        let auth = r.auth_status().unwrap();
        assert!(auth.authenticated);
        assert_eq!(
            serde_json::to_value(&auth.drops).unwrap(),
            serde_json::json!({"noMac": 2, "badMac": 1, "unknownKey": 0, "stale": 0, "replay": 1, "addressMismatch": 1})
        );
    }

    #[test]
    fn a_duplicate_registration_is_answered_but_renews_nothing() {
        use crate::members::auth::{Keys, Signer};
        let keys = Arc::new(Keys::from_raw(&[vec![7; 32]]));
        let r = Registry::new("c.example", Duration::from_secs(10));
        r.set_verifier(Arc::new(Verifier::new(Some(keys.clone()))));
        let m = member("m0", "10.0.0.1");
        let signer = Signer::new(keys, SystemTime::now());
        let auth = signer.sign(
            &Fields {
                op: Op::Register,
                cluster: "c.example",
                name: "m0",
                role: Some(m.role),
                addresses: &m.addresses,
                version: &m.version,
            },
            SystemTime::now(),
        );
        let body = Bytes::from(
            serde_json::to_vec(&Registration {
                cluster: "c.example".into(),
                member: m,
                auth: Some(auth),
            })
            .unwrap(),
        );
        let post = || {
            r.handle(&Method::POST, MEMBERS_PATH, peer(), body.clone())
                .unwrap()
                .0
        };
        assert_eq!(post(), StatusCode::OK);
        std::thread::sleep(Duration::from_millis(300));
        // Through the API VIP as well as directly: answered again...
        assert_eq!(post(), StatusCode::OK);
        // ...but last heard at the first, so a replay cannot keep a dead node alive.
        let age = r.entries(Instant::now())[0].age_ms;
        assert!(age >= 300, "renewed by a duplicate: age {age} ms");
    }

    fn reg_at(name: &str, addr: &str) -> Bytes {
        Bytes::from(
            serde_json::to_vec(&Registration {
                cluster: "c.example".into(),
                member: member(name, addr),
                auth: None,
            })
            .unwrap(),
        )
    }

    fn refused(r: &Registry, reason: &str) -> u64 {
        r.registry_status().refused[reason]
    }

    /// A flood of new names from one address: two are believed (a node and its
    /// replacement), the rest refused and counted, then the address is held to its rate;
    /// other addresses and the members already listed are untouched.
    #[test]
    fn a_member_flood_from_one_address_is_refused_and_counted() {
        let r = Registry::new("c.example", Duration::from_secs(35))
            .with_renewal(Duration::from_secs(10));
        let from: SocketAddr = "10.0.0.66:40000".parse().unwrap();
        let post = |name: &str, addr: &str, peer: SocketAddr| {
            r.handle(&Method::POST, MEMBERS_PATH, peer, reg_at(name, addr))
                .unwrap()
                .0
        };
        assert_eq!(
            post("good", "10.0.0.7", "10.0.0.7:1".parse().unwrap()),
            StatusCode::OK
        );
        let codes: Vec<StatusCode> = (0..100)
            .map(|i| post(&format!("fake-{i}"), "10.0.0.66", from))
            .collect();
        let ok = codes.iter().filter(|c| **c == StatusCode::OK).count();
        assert_eq!(ok, MEMBERS_PER_ADDRESS, "{codes:?}");
        let by_address = codes.iter().filter(|c| **c == StatusCode::CONFLICT).count() as u64;
        let by_rate = codes
            .iter()
            .filter(|c| **c == StatusCode::TOO_MANY_REQUESTS)
            .count() as u64;
        assert_eq!(
            by_address,
            u64::from(super::super::limits::BURST) - MEMBERS_PER_ADDRESS as u64
        );
        assert_eq!(by_address + by_rate, 100 - MEMBERS_PER_ADDRESS as u64);
        assert_eq!(refused(&r, "address"), by_address);
        assert_eq!(refused(&r, "rate"), by_rate);
        assert_eq!(refused(&r, "full"), 0);
        // Those believed renew as any member does; the rate limit refused them at once too
        // (it comes first), so a flooder cannot keep many names alive either.
        let names: Vec<String> = r.list().into_iter().map(|m| m.name.to_string()).collect();
        assert_eq!(names, ["fake-0", "fake-1", "good"]);
        // Another address is not held back.
        assert_eq!(
            post("other", "10.0.0.8", "10.0.0.8:1".parse().unwrap()),
            StatusCode::OK
        );
        let st = r.registry_status();
        assert_eq!(st.registrations, 102);
        assert_eq!(st.entries, 4);
        assert_eq!(st.sources, 3);
    }

    /// Records beyond the bound: a full registry refuses a new member (503, counted),
    /// still renews those it holds, and skips (and counts) new entries of another
    /// registry's answer.
    #[test]
    fn records_beyond_the_bound_are_refused_and_counted() {
        let r = Registry::new("c.example", Duration::from_secs(35));
        let now = Instant::now();
        let entries: Vec<Entry> = (0..MAX_MEMBERS + 10)
            .map(|i| Entry {
                member: member(
                    &format!("n{i}"),
                    &std::net::Ipv4Addr::from(0x0a01_0000 + i as u32).to_string(),
                ),
                age_ms: 0,
            })
            .collect();
        assert_eq!(r.merge(entries, now), MAX_MEMBERS);
        let st = r.registry_status();
        assert_eq!((st.entries, st.merge_skipped), (MAX_MEMBERS as u64, 10));
        let (st, body) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                "10.9.0.1:1".parse().unwrap(),
                reg_at("late", "10.9.0.1"),
            )
            .unwrap();
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert!(String::from_utf8_lossy(&body).contains("full"));
        assert_eq!(refused(&r, "full"), 1);
        // One it holds renews.
        let (st, _) = r
            .handle(
                &Method::POST,
                MEMBERS_PATH,
                "10.1.0.5:1".parse().unwrap(),
                reg_at("n5", "10.1.0.5"),
            )
            .unwrap();
        assert_eq!(st, StatusCode::OK);
        assert_eq!(r.list().len(), MAX_MEMBERS);
    }

    /// A reused answer states every entry at least as old as it is when served, and a
    /// change (a new member) is in the very next answer.
    #[test]
    fn a_reused_answer_never_makes_a_member_younger() {
        let r =
            Registry::new("c.example", Duration::from_secs(35)).with_own(member("m1", "10.0.0.11"));
        let post = |name: &str, addr: &str| {
            let (st, body) = r
                .handle(
                    &Method::POST,
                    MEMBERS_PATH,
                    format!("{addr}:1").parse().unwrap(),
                    reg_at(name, addr),
                )
                .unwrap();
            assert_eq!(st, StatusCode::OK);
            let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
            list
        };
        let first = post("a", "10.0.0.1");
        let registered = Instant::now();
        assert_eq!(first.len(), 2);
        std::thread::sleep(Duration::from_millis(60));
        let get = || -> Vec<Entry> {
            let (_, body) = r
                .handle(&Method::GET, MEMBERS_PATH, peer(), Bytes::new())
                .unwrap();
            serde_json::from_slice(&body).unwrap()
        };
        for _ in 0..3 {
            let list = get();
            let a = list.iter().find(|e| e.member.name == "a").unwrap();
            let true_age = registered.elapsed().as_millis() as u64;
            assert!(
                a.age_ms >= true_age.saturating_sub(1),
                "a stated {} ms old, is {true_age}",
                a.age_ms
            );
            let own = list.iter().find(|e| e.member.name == "m1").unwrap();
            assert_eq!(
                own.age_ms, 0,
                "the registry's own node is live when it answers"
            );
            std::thread::sleep(Duration::from_millis(40));
        }
        // A new member is not held back by a reused answer.
        let second = post("b", "10.0.0.2");
        assert_eq!(second.len(), 3);
        assert_eq!(get().len(), 3);
        let st = r.registry_status();
        assert_eq!(st.answers, 6);
        assert!(st.answer_bytes > 0);
    }

    /// Registers `name` at 10.0.0.<n> naming the list tagged `held`, as a current client.
    fn post_holding(r: &Registry, name: &str, held: Option<&http::HeaderValue>) -> ExtraAnswer {
        let mut headers = http::HeaderMap::new();
        if let Some(h) = held {
            headers.insert(http::header::IF_NONE_MATCH, h.clone());
        }
        r.handle_request(
            &Method::POST,
            MEMBERS_PATH,
            peer(),
            &headers,
            reg("c.example", name),
        )
        .unwrap()
    }

    fn header<'a>(a: &'a ExtraAnswer, name: &str) -> Option<&'a http::HeaderValue> {
        a.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    #[test]
    fn a_renewal_naming_the_current_list_is_answered_unchanged() {
        let r = Registry::new("c.example", Duration::from_secs(35))
            .with_own(member("m1", "10.0.0.11"))
            .with_renewal(Duration::from_secs(10));
        let first = post_holding(&r, "m0", None);
        assert_eq!(first.status, StatusCode::OK);
        let tag = header(&first, "etag").expect("a list is tagged").clone();
        let list: Vec<Entry> = serde_json::from_slice(&first.body).unwrap();
        assert_eq!(list.len(), 2);

        let again = post_holding(&r, "m0", Some(&tag));
        assert_eq!(again.status, StatusCode::NOT_MODIFIED);
        assert!(again.body.is_empty(), "no list with an unchanged answer");
        let fresh: u64 = header(&again, FRESH_HEADER)
            .expect("says how fresh")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(fresh < 1000, "m0 renewed just now, stated {fresh} ms");
        let st = r.registry_status();
        assert_eq!(st.answers, 2);
        assert_eq!(
            st.answer_bytes,
            first.body.len() as u64,
            "the 304 sent no list"
        );

        // A tag that is not the current one (another registry's, or a client's own
        // garbage) gets the list.
        let other = http::HeaderValue::from_static("\"0-0\"");
        assert_eq!(post_holding(&r, "m0", Some(&other)).status, StatusCode::OK);
    }

    #[test]
    fn a_change_of_the_list_makes_the_held_tag_stale() {
        let r = Registry::new("c.example", Duration::from_secs(35));
        let tag = header(&post_holding(&r, "m0", None), "etag")
            .unwrap()
            .clone();
        // A new member: the list changed.
        let joined = post_holding(&r, "m2", Some(&tag));
        assert_eq!(joined.status, StatusCode::OK, "a new member is news");
        let tag2 = header(&joined, "etag").unwrap().clone();
        assert_ne!(tag, tag2);
        let list: Vec<Entry> = serde_json::from_slice(&joined.body).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            post_holding(&r, "m0", Some(&tag2)).status,
            StatusCode::NOT_MODIFIED
        );
        // A goodbye: the list changed again.
        let (st, _) = r
            .handle(
                &Method::DELETE,
                &format!("{MEMBERS_PATH}/m2"),
                peer(),
                Bytes::new(),
            )
            .unwrap();
        assert_eq!(st, StatusCode::NO_CONTENT);
        let after = post_holding(&r, "m0", Some(&tag2));
        assert_eq!(after.status, StatusCode::OK, "a goodbye is news");
        let list: Vec<Entry> = serde_json::from_slice(&after.body).unwrap();
        assert_eq!(list.len(), 1);
        // An expiry: the list changed.
        let tag3 = header(&after, "etag").unwrap().clone();
        let r2 = Registry::new("c.example", Duration::from_millis(400));
        let t = header(&post_holding(&r2, "m0", None), "etag")
            .unwrap()
            .clone();
        let t0 = Instant::now();
        r2.merge(
            vec![Entry {
                member: member("m3", "10.0.0.3"),
                age_ms: 0,
            }],
            t0,
        );
        let t = header(&r2.conditional_answer(Some(&t), t0), "etag")
            .unwrap()
            .clone();
        let later = t0 + Duration::from_millis(300);
        r2.merge(
            vec![Entry {
                member: member("m0", "10.0.0.1"),
                age_ms: 0,
            }],
            later,
        );
        let expired = r2.conditional_answer(Some(&t), later + Duration::from_millis(200));
        assert_eq!(expired.status, StatusCode::OK, "m3 expired: news");
        let list: Vec<Entry> = serde_json::from_slice(&expired.body).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].member.name, "m0");
        assert_ne!(tag3, t, "tags of two registries differ");
    }

    #[test]
    fn a_member_not_heard_lately_keeps_the_list_coming() {
        let r = Registry::new("c.example", Duration::from_secs(35))
            .with_renewal(Duration::from_secs(10));
        let now = Instant::now();
        // m3 was last heard 16 s ago (past one and a half renewal intervals: it stopped).
        r.merge(
            vec![Entry {
                member: member("m3", "10.0.0.3"),
                age_ms: 16_000,
            }],
            now,
        );
        let tag = header(&post_holding(&r, "m0", None), "etag")
            .unwrap()
            .clone();
        let again = post_holding(&r, "m0", Some(&tag));
        assert_eq!(
            again.status,
            StatusCode::OK,
            "an unchanged answer would state m3 heard more lately than it was"
        );
        let list: Vec<Entry> = serde_json::from_slice(&again.body).unwrap();
        let m3 = list.iter().find(|e| e.member.name == "m3").unwrap();
        assert!(m3.age_ms >= 16_000, "its age as it is: {}", m3.age_ms);
    }

    #[test]
    fn a_restarted_registry_does_not_take_its_former_tag() {
        let a = Registry::new("c.example", Duration::from_secs(35));
        let tag = header(&post_holding(&a, "m0", None), "etag")
            .unwrap()
            .clone();
        // The same list, the same change counter, another process.
        let b = Registry::new("c.example", Duration::from_secs(35));
        let again = post_holding(&b, "m0", Some(&tag));
        assert_eq!(again.status, StatusCode::OK);
        assert_ne!(header(&again, "etag"), Some(&tag));
    }

    #[test]
    fn the_unchanged_window_stays_within_the_expiry() {
        let s = Duration::from_secs;
        assert_eq!(fresh_within(s(10), s(35)), s(15));
        assert_eq!(fresh_within(s(10), s(20)), s(10), "half the expiry at most");
        assert_eq!(
            fresh_within(Duration::from_millis(500), s(4)),
            Duration::from_millis(750)
        );
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn any_body_is_answered(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let r = Registry::new("c.example", Duration::from_secs(10));
            let (st, _) = r.handle(&Method::POST, MEMBERS_PATH, peer(), Bytes::from(body)).unwrap();
            proptest::prop_assert!(st == StatusCode::OK || st.is_client_error());
        }
    }
}
