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
use tokio::sync::watch;

use super::auth::{Fields, Fresh, Op, Reject, Verifier, source_matches};
use super::limits::{MEMBERS_PER_ADDRESS, SourceLimiter};
use super::table::{MAX_MEMBERS, Table};
use crate::dns_label::DnsLabel;
use crate::member::Member;
use crate::node::NodeIdentity;
use keelson_cluster::ClusterConfig;

mod wire;
use wire::check_member;
pub use wire::{
    Entry, FRESH_HEADER, Goodbye, KEY_HEADER, MEMBERS_PATH, MemberShapeError, Registration,
};

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

    /// Keeps only the members some list of `lists` names (the last whole list of each
    /// registry that answered): on a node that serves no registry, whose table is only
    /// what registries listed, a node that said goodbye or expired on every registry
    /// leaves with their next answers rather than at this node's own expiry.
    pub fn drop_unlisted<'a>(&self, lists: impl IntoIterator<Item = &'a [Entry]>) {
        let listed: std::collections::HashSet<&str> = lists
            .into_iter()
            .flatten()
            .map(|e| e.member.name.as_str())
            .collect();
        let changed = self.table().retain_named(&listed);
        self.notify(changed);
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

#[cfg(test)]
mod tests;
