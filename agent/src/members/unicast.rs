//! Unicast members, for networks without multicast (docs/members.md).
//!
//! Every control-plane node serves a [`Registry`] on its Ignition server's TLS port. Every
//! node registers (`POST /keelson/v1/members`, trusting only the cluster CA) with every
//! address of its peer set ([`Seeds`]) — not only with the API VIP, whose holder is what
//! VRRP is still electing — and takes in each answer: the whole cluster as that registry
//! knows it. Every renewal interval, at once when this node loses or gains a VIP, and
//! every second while it knows nobody. On stop it says goodbye to every registry that
//! answered.
//!
//! Every registry presents the one Ignition server certificate of the cluster, whose names
//! are the API VIPs and `api-int`: a registry reached at a node's own address is verified
//! against the first API VIP, which proves it holds the cluster's server key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, StatusCode};
use keelson_cluster::Role;
use tokio_util::sync::CancellationToken;

use super::auth::{Fields, Keys, Op, Signer};
pub use super::registry::{
    Entry, FRESH_HEADER, Goodbye, KEY_HEADER, MEMBERS_PATH, Registration, Registry,
};
use super::seeds::{self, Seeds};
use super::table::MAX_MEMBERS;
use super::{Counters, own_member, publish};
use crate::context::AgentContext;
use crate::member::Member;
use crate::net::http_client::{Connection, HttpClient, HttpError, Request, Trust};

/// Longest wait for one registry's answer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The retry interval while this node knows no other member.
const ALONE_RETRY: Duration = Duration::from_secs(1);

/// A TLS client configuration trusting only the CA in `ca_path`.
pub fn client_config(ca_path: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let pem = std::fs::read(ca_path)
        .with_context(|| format!("cluster CA {}: expected a PEM file", ca_path.display()))?;
    match Trust::roots_from_pem(&[pem]) {
        Ok(Trust::Roots(config)) => Ok(config),
        Ok(_) => anyhow::bail!(
            "cluster CA {}: expected at least one certificate",
            ca_path.display()
        ),
        Err(e) => anyhow::bail!("cluster CA {}: {e}", ca_path.display()),
    }
}

/// The largest answer taken from a registry (the whole cluster's member list: up to
/// [`MAX_MEMBERS`] entries of at most about 1 KiB each); a longer one is refused.
/// `docs/agent.md`, "Limits".
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// A registry's answer as this node takes it in: at most [`MAX_MEMBERS`] entries; elements
/// that are no entry (a name that is no DNS label, a field missing) are skipped and counted,
/// not fatal to the rest. Read element by element, so what is kept is bounded whatever the
/// answer holds (within [`MAX_ANSWER_BYTES`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The entries taken.
    pub entries: Vec<Entry>,
    /// Elements skipped: not entries, or past [`MAX_MEMBERS`].
    pub skipped: usize,
}

/// Parses a registry's answer (a JSON array of entries); see [`Answer`].
pub fn parse_answer(bytes: &[u8]) -> Result<Answer, serde_json::Error> {
    serde_json::from_slice(bytes)
}

impl<'de> serde::Deserialize<'de> for Answer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// One element: an entry, or anything else (skipped).
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Element {
            Entry(Entry),
            Other(serde::de::IgnoredAny),
        }
        struct Elements;
        impl<'de> serde::de::Visitor<'de> for Elements {
            type Value = Answer;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of member entries")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Answer, A::Error> {
                let mut answer = Answer::default();
                while let Some(element) = seq.next_element::<Element>()? {
                    match element {
                        Element::Entry(e) if answer.entries.len() < MAX_MEMBERS => {
                            answer.entries.push(e)
                        }
                        _ => answer.skipped += 1,
                    }
                }
                Ok(answer)
            }
        }
        d.deserialize_seq(Elements)
    }
}

/// One HTTPS exchange with `addr` (an IP literal: the certificate must name that IP).
pub async fn exchange(
    tls: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), HttpError> {
    let answer = exchange_as(tls, None, addr, addr.ip(), method, path, body).await?;
    Ok((answer.status, answer.body))
}

/// One HTTPS exchange with `addr` from `source` (when given), verifying the certificate
/// for `name`. A registry takes a registration only from an address it registers, so a
/// node sends from its own address, whatever the kernel would have chosen.
pub async fn exchange_as(
    tls: Arc<rustls::ClientConfig>,
    source: Option<IpAddr>,
    addr: SocketAddr,
    name: IpAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<crate::net::http_client::Response, HttpError> {
    let url = format!("https://{addr}{path}");
    let req = registry_request(&url, source, name, method, body);
    registry_client(tls).send(req).await
}

/// The client of the registries: the caller bounds the exchange's time as a whole.
fn registry_client(tls: Arc<rustls::ClientConfig>) -> HttpClient {
    let long = Duration::from_secs(3600);
    HttpClient::new()
        .trust(Trust::Roots(tls))
        .timeouts(long, long, long)
        .body_limit(MAX_ANSWER_BYTES)
}

fn registry_request(
    url: &str,
    source: Option<IpAddr>,
    name: IpAddr,
    method: Method,
    body: Vec<u8>,
) -> Request<'_> {
    let mut req = Request::get(url).header(http::header::CONTENT_TYPE, "application/json");
    req.method = method;
    req.body = Bytes::from(body);
    req.source = source;
    req.server_name = Some(name);
    req
}

/// What a node keeps of one registry from one registration to the next: the connection,
/// kept open across renewals (a renewal is then one request, not a TCP and TLS handshake
/// as well), and the tag of the last list the registry answered, so it can answer
/// "unchanged" ([`FRESH_HEADER`]) instead of sending the list again.
#[derive(Debug, Default)]
pub struct Link {
    conn: Option<Connection>,
    /// The `ETag` of the registry's last list, sent as `If-None-Match`; a caller that did
    /// not keep that list must clear it.
    pub tag: Option<http::HeaderValue>,
}

/// A registry's answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// The whole list.
    List(Vec<Entry>),
    /// The list it answered last is unchanged, and every member of it was last heard at
    /// most this long before the answer.
    Unchanged(Duration),
}

/// `list`, the entries of a registry's last whole answer, as an answer "unchanged, heard
/// within `fresh`" states them now: each as old as `fresh`. Never younger than the registry
/// knows them (a relayed record that grew younger kept dead nodes alive, docs/members.md).
pub fn refreshed(list: &[Entry], fresh: Duration) -> Vec<Entry> {
    let age_ms = fresh.as_millis().min(u128::from(u64::MAX)) as u64;
    list.iter()
        .map(|e| Entry {
            member: e.member.clone(),
            age_ms,
        })
        .collect()
}

/// Reads a registry's answer to a registration that sent `If-None-Match` when `asked`:
/// what it says, and the tag of the list it carries.
fn read_answer(
    addr: SocketAddr,
    answer: &crate::net::http_client::Response,
    asked: bool,
) -> Result<(Answered, Option<http::HeaderValue>), RegistrationError> {
    let tag = answer.headers.get(http::header::ETAG).cloned();
    match answer.status {
        StatusCode::OK => Ok((Answered::List(answer_entries(addr, &answer.body)?), tag)),
        StatusCode::NOT_MODIFIED if asked => {
            let fresh = answer
                .headers
                .get(FRESH_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| RegistrationError::Refused {
                    status: answer.status,
                    text: format!("expected {FRESH_HEADER}: <milliseconds> with it"),
                })?;
            Ok((Answered::Unchanged(Duration::from_millis(fresh)), tag))
        }
        status => Err(RegistrationError::Refused {
            status,
            text: String::from_utf8_lossy(&answer.body).trim().to_owned(),
        }),
    }
}

/// Sends `req` on the connection `link` keeps when it has one, else (and once more when
/// the registry closed the kept one just as the request went out: its idle timeout, a
/// restart) on a new one, which `link` then keeps.
async fn send_kept(
    client: &HttpClient,
    link: &mut Link,
    url: &str,
    req: Request<'_>,
) -> Result<crate::net::http_client::Response, HttpError> {
    if let Some(mut conn) = link.conn.take().filter(Connection::is_open) {
        match client.send_on(&mut conn, req.clone(), true).await {
            Ok(answer) => {
                link.conn = conn.is_open().then_some(conn);
                return Ok(answer);
            }
            Err(HttpError::Http { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let mut conn = client.open(url, req.source, req.server_name).await?;
    let answer = client.send_on(&mut conn, req, true).await?;
    link.conn = conn.is_open().then_some(conn);
    Ok(answer)
}

/// Why a registration with one registry brought nothing back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// The registry answered, but not with the list.
    #[error("refused: {status} {text}")]
    Refused {
        /// Its status.
        status: StatusCode,
        /// Its explanation.
        text: String,
    },
    /// The registry's list does not parse.
    #[error("bad list: {0}")]
    BadList(#[source] serde_json::Error),
    /// No answer (connect, TLS, HTTP).
    #[error(transparent)]
    Http(#[from] HttpError),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    /// The registry's node signs with a membership key this node does not hold (a node
    /// left on a retired key, or this node is): its answer is ignored.
    #[error(
        "answer ignored: the registry signs with membership key {0:?}, which this node does \
         not hold (a node on a retired key, or this node is: docs/operations.md)"
    )]
    OtherKey(String),
}

impl RegistrationError {
    /// The registry answered but refused, or answered with something unusable (counted
    /// and logged loudly: it is not the network).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RegistrationError::Refused { .. }
                | RegistrationError::BadList(_)
                | RegistrationError::OtherKey(_)
        )
    }
}

/// One registration: the registry, when it began, what it brought back, and the link to
/// keep for the next one.
#[derive(Debug)]
pub struct Exchange {
    /// The registry.
    pub addr: SocketAddr,
    /// When the exchange began (the ages of the answer count from then).
    pub started: Instant,
    /// The answer.
    pub result: Result<Answered, RegistrationError>,
    /// The connection and tag for the next registration there.
    pub link: Link,
}

/// This node's address of `target`'s family, if it has one.
fn source_for(own: &[IpAddr], target: SocketAddr) -> Option<IpAddr> {
    own.iter()
        .copied()
        .find(|a| a.is_ipv4() == target.is_ipv4())
}

/// The membership key a registry's answer names ([`KEY_HEADER`]), when this node holds
/// keys (`ours`) and not that one.
fn other_key(headers: &http::HeaderMap, ours: Option<&[String]>) -> Option<String> {
    let theirs = headers.get(KEY_HEADER)?.to_str().unwrap_or("?");
    let ours = ours?;
    (!ours.iter().any(|k| k == theirs)).then(|| theirs.chars().take(32).collect())
}

/// Registers with `addr` (verifying its certificate for `name`), from this node's address
/// of its family, sending `body` ([`registration_body`]) on the connection `link` keeps
/// and naming the list it last had from there; `keys`: the IDs this node holds
/// (authenticated clusters). The one registration exchange: the agent's rounds and the
/// scale bench's load generator (`agent/examples/member_load.rs`) both go through it.
pub async fn register_one(
    tls: Arc<rustls::ClientConfig>,
    own: Arc<Vec<IpAddr>>,
    name: IpAddr,
    addr: SocketAddr,
    body: Vec<u8>,
    keys: Option<Arc<Vec<String>>>,
    mut link: Link,
) -> Exchange {
    let started = Instant::now();
    let source = source_for(&own, addr);
    let url = format!("https://{addr}{MEMBERS_PATH}");
    let mut req = registry_request(&url, source, name, Method::POST, body);
    let asked = link.tag.is_some();
    if let Some(tag) = &link.tag {
        req.headers.push((http::header::IF_NONE_MATCH, tag.clone()));
    }
    let client = registry_client(tls);
    let call = send_kept(&client, &mut link, &url, req);
    let result = match tokio::time::timeout(EXCHANGE_TIMEOUT, call).await {
        Ok(Ok(answer)) => match other_key(&answer.headers, keys.as_deref().map(Vec::as_slice)) {
            Some(id) if answer.status.is_success() || answer.status == StatusCode::NOT_MODIFIED => {
                Err(RegistrationError::OtherKey(id))
            }
            _ => read_answer(addr, &answer, asked),
        },
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            // A request half done on it: the connection is of no further use.
            link.conn = None;
            Err(RegistrationError::NoAnswer(EXCHANGE_TIMEOUT))
        }
    };
    let result = match result {
        Ok((answered, tag)) => {
            if let Answered::List(_) = answered {
                link.tag = tag;
            }
            Ok(answered)
        }
        Err(e) => {
            link.tag = None;
            Err(e)
        }
    };
    Exchange {
        addr,
        started,
        result,
        link,
    }
}

/// The entries of registry `addr`'s answer `list`.
fn answer_entries(addr: SocketAddr, list: &[u8]) -> Result<Vec<Entry>, RegistrationError> {
    let answer = parse_answer(list).map_err(RegistrationError::BadList)?;
    if answer.skipped > 0 {
        tracing::warn!(
            %addr,
            skipped = answer.skipped,
            "members: entries of a registry's answer skipped (not entries, or over {MAX_MEMBERS})"
        );
    }
    Ok(answer.entries)
}

/// Runs the unicast client until `stop`, trusting the CA at `ca_path` and remembering the
/// masters under `state_dir`; what it learns also goes into this node's `registry`.
// Over 100 lines on purpose: one `select!` loop whose arms share the round, seed and goodbye state; split, that state would travel through every helper.
pub async fn run(
    ctx: AgentContext,
    registry: Arc<Registry>,
    stop: CancellationToken,
    counters: &Counters,
    ca_path: PathBuf,
    state_dir: PathBuf,
    keys: Option<Arc<Keys>>,
) -> anyhow::Result<()> {
    let tls = client_config(&ca_path)?;
    let key_ids = keys.as_ref().map(|k| Arc::new(k.ids()));
    let signer = keys.map(|k| Signer::new(k, SystemTime::now()));
    let me = own_member(&ctx);
    let zone = ctx.cluster.zone();
    let renew = Duration::from_secs(u64::from(ctx.cluster.members.renew_interval_secs.max(1)));
    let port = ctx.cluster.ignition.tls_port;
    let name = *ctx.cluster.api_vips.first().context(
        "cluster.json apiVips: expected an API VIP (the registries' certificate names it)",
    )?;
    let mut configured: Vec<IpAddr> = Vec::new();
    for inst in &ctx.cluster.vrrp.instances {
        configured.extend(inst.unicast_peers.iter().copied());
    }
    let mut seeds = Seeds::new(configured, ctx.cluster.api_vips.clone())
        .forgetting(ctx.cluster.members.forget_after(), SystemTime::now());
    match seeds::load(&state_dir) {
        Ok(Some(doc)) => match seeds.remember(&doc, &zone, &me.name, SystemTime::now()) {
            Ok(n) => tracing::info!(
                "members: {n} master(s) remembered in {}",
                state_dir.join(seeds::FILE).display()
            ),
            Err(e) => tracing::warn!(
                "members: ignoring {}: {e}",
                state_dir.join(seeds::FILE).display()
            ),
        },
        Ok(None) => {}
        Err(e) => tracing::warn!("members: ignoring what was remembered: {e}"),
    }
    // Signed afresh for every round: a new time and sequence number each time.
    let registration = |now: SystemTime| registration_body(&zone, &me, signer.as_ref(), now);
    let mut changes = registry.subscribe();
    let mut vips = ctx.bus.vips_held.subscribe();
    publish(&ctx, &me, registry.list());
    ctx.bus.mark_ready("members");

    let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each registry has at most one exchange in flight, and a round starts every renewal
    // interval whatever is still in flight: a registry that does not answer (a dead
    // master, until it is forgotten) must not hold back the renewals with the live ones,
    // which would let this node expire there (seen with a 5 s exchange timeout beside a
    // 4 s expiry: the survivors of a dead master flapped).
    let mut exchanges: tokio::task::JoinSet<Exchange> = tokio::task::JoinSet::new();
    let mut in_flight: BTreeMap<tokio::task::Id, SocketAddr> = BTreeMap::new();
    let mut next_round = Instant::now();
    let mut answered: BTreeSet<SocketAddr> = BTreeSet::new();
    let mut status: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let mut last_errors: BTreeMap<SocketAddr, String> = BTreeMap::new();
    // Per registry: the link kept between registrations, and its last whole list (what an
    // "unchanged" answer refers to).
    let mut links: BTreeMap<SocketAddr, Link> = BTreeMap::new();
    let mut lists: BTreeMap<SocketAddr, Vec<Entry>> = BTreeMap::new();
    let own = Arc::new(me.addresses.clone());
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next_round.into()) => {
                let reached: BTreeSet<IpAddr> = answered.iter().map(SocketAddr::ip).collect();
                let targets: BTreeSet<SocketAddr> = seeds
                    .targets(&own, &vips.borrow_and_update(), &reached)
                    .into_iter()
                    .map(|a| SocketAddr::new(a, port))
                    .collect();
                // Registries no longer targeted leave the status (a forgotten master).
                status.retain(|a, _| targets.contains(a));
                answered.retain(|a| targets.contains(a));
                last_errors.retain(|a, _| targets.contains(a));
                links.retain(|a, _| targets.contains(a));
                lists.retain(|a, _| targets.contains(a));
                *counters.registries.lock().unwrap_or_else(|e| e.into_inner()) =
                    status.iter().map(|(a, s)| (a.to_string(), s.clone())).collect();
                let body = registration(SystemTime::now());
                let busy: BTreeSet<SocketAddr> = in_flight.values().copied().collect();
                for addr in targets.into_iter().filter(|a| !busy.contains(a)) {
                    let mut link = links.remove(&addr).unwrap_or_default();
                    if !lists.contains_key(&addr) {
                        link.tag = None;
                    }
                    let task = register_one(tls.clone(), own.clone(), name, addr, body.clone(), key_ids.clone(), link);
                    let id = exchanges.spawn(task).id();
                    in_flight.insert(id, addr);
                }
                let alone = registry.list().iter().all(|m| m.name == me.name);
                next_round = Instant::now() + if alone { ALONE_RETRY } else { renew };
            }
            Some(joined) = exchanges.join_next_with_id(), if !exchanges.is_empty() => {
                let Exchange { addr, started, result: res, link } = match joined {
                    Ok((id, exchange)) => {
                        in_flight.remove(&id);
                        exchange
                    }
                    Err(e) => {
                        in_flight.remove(&e.id());
                        continue;
                    }
                };
                links.insert(addr, link);
                let res = res.map(|answered| match answered {
                    Answered::List(entries) => {
                        lists.insert(addr, entries.clone());
                        entries
                    }
                    Answered::Unchanged(fresh) => {
                        lists.get(&addr).map(|l| refreshed(l, fresh)).unwrap_or_default()
                    }
                });
                if res.is_err() {
                    lists.remove(&addr);
                }
                match res {
                    Ok(entries) => {
                        // The ages count from when the registry answered, somewhere between
                        // the exchange's start and now: counted from its start a relayed
                        // record only grows older. Counted from now, it would grow younger
                        // by the exchange's time at every hop, and a dead node bounced
                        // between two registries would outlive the expiry (seen: back in
                        // the lists seconds after it had left them).
                        registry.merge(entries, started);
                        if me.role == Role::Worker {
                            registry.drop_unlisted(lists.values().map(Vec::as_slice));
                        }
                        answered.insert(addr);
                        last_errors.remove(&addr);
                        status.insert(addr, "ok".to_string());
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if last_errors.get(&addr) != Some(&text) {
                            tracing::debug!(%addr, error = %text, "members: registration failed");
                        }
                        if matches!(e, RegistrationError::OtherKey(_)) {
                            registry.count_drop(super::auth::Reject::UnknownKey);
                        }
                        if e.is_refusal() {
                            counters.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tracing::warn!(%addr, "members: registration {text}");
                        }
                        answered.remove(&addr);
                        status.insert(addr, text.clone());
                        last_errors.insert(addr, text);
                    }
                }
                *counters.registries.lock().unwrap_or_else(|e| e.into_inner()) =
                    status.iter().map(|(a, s)| (a.to_string(), s.clone())).collect();
            }
            _ = changes.changed() => {
                changes.borrow_and_update();
                let list = registry.list();
                publish(&ctx, &me, list.clone());
                log_forgotten(&seeds.update(&list, &me.name, SystemTime::now()));
                remember(&mut seeds, &state_dir, &zone);
            }
            _ = vips.changed() => {
                // A VIP moved to or away from this node: the holder to reach through it
                // changed. Register now rather than at the next renewal.
                next_round = Instant::now();
            }
            _ = housekeeping.tick() => {
                registry.tidy(Instant::now());
                // The live masters are heard now (the list only changes when one comes
                // or goes, so `changes` alone would leave their sighting times behind).
                let now = SystemTime::now();
                let mut forgotten = seeds.update(&registry.list(), &me.name, now);
                forgotten.extend(seeds.forget_quiet(now));
                if !forgotten.is_empty() {
                    log_forgotten(&forgotten);
                    remember(&mut seeds, &state_dir, &zone);
                }
            }
        }
    }
    exchanges.abort_all();
    // Goodbye, best effort: the registries drop us now rather than at the expiry.
    let goodbyes = answered.into_iter().map(|addr| {
        let body = goodbye_body(&zone, &me.name, signer.as_ref(), SystemTime::now());
        let link = links.remove(&addr).unwrap_or_default();
        say_goodbye(tls.clone(), own.clone(), name, addr, &me.name, body, link)
    });
    futures::future::join_all(goodbyes).await;
    Ok(())
}

/// Longest wait for a registry to take a goodbye: a node that stops waits no longer.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(1);

/// Says goodbye for `member` to registry `addr` (`body`: [`goodbye_body`]) on the
/// connection `link` keeps, when it has one: a thousand nodes that stop at once then cost
/// the registries no handshake each. Best effort, within [`GOODBYE_TIMEOUT`]; whether the
/// registry took it.
pub async fn say_goodbye(
    tls: Arc<rustls::ClientConfig>,
    own: Arc<Vec<IpAddr>>,
    name: IpAddr,
    addr: SocketAddr,
    member: &str,
    body: Vec<u8>,
    mut link: Link,
) -> bool {
    let url = format!("https://{addr}{MEMBERS_PATH}/{member}");
    let req = registry_request(&url, source_for(&own, addr), name, Method::DELETE, body);
    let client = registry_client(tls);
    let call = send_kept(&client, &mut link, &url, req);
    matches!(
        tokio::time::timeout(GOODBYE_TIMEOUT, call).await,
        Ok(Ok(answer)) if answer.status.is_success()
    )
}

/// The body of a registration of `me` in cluster `zone`, signed at `now` when `signer` is
/// given (authenticated clusters): a new time and sequence number each call.
pub fn registration_body(
    zone: &str,
    me: &Member,
    signer: Option<&Signer>,
    now: SystemTime,
) -> Vec<u8> {
    let auth = signer.map(|s| {
        s.sign(
            &Fields {
                op: Op::Register,
                cluster: zone,
                name: &me.name,
                role: Some(me.role),
                addresses: &me.addresses,
                version: &me.version,
            },
            now,
        )
    });
    serde_json::to_vec(&Registration {
        cluster: zone.to_owned(),
        member: me.clone(),
        auth,
    })
    .unwrap_or_default()
}

/// The body of node `name`'s goodbye (`DELETE /keelson/v1/members/<name>`), signed at
/// `now` as a deletion when `signer` is given.
pub fn goodbye_body(zone: &str, name: &str, signer: Option<&Signer>, now: SystemTime) -> Vec<u8> {
    let auth = signer.map(|s| {
        s.sign(
            &Fields {
                op: Op::Delete,
                cluster: zone,
                name,
                role: None,
                addresses: &[],
                version: "",
            },
            now,
        )
    });
    serde_json::to_vec(&Goodbye { auth }).unwrap_or_default()
}

/// Says which masters left the peer set and `members.json`, and why.
fn log_forgotten(gone: &[seeds::Forgotten]) {
    for f in gone {
        let addrs: Vec<String> = f.addresses.iter().map(IpAddr::to_string).collect();
        match &f.reason {
            seeds::ForgetReason::Quiet(d) => tracing::info!(
                "members: forgetting master {} ({}): not heard for {} s \
                 (members.forgetAfterSecs); no longer registered with nor remembered",
                f.name,
                addrs.join(", "),
                d.as_secs()
            ),
            seeds::ForgetReason::AddressTaken(by) => tracing::info!(
                "members: forgetting master {} ({}): {by} now has its address; no longer \
                 registered with nor remembered",
                f.name,
                addrs.join(", ")
            ),
        }
    }
}

/// Writes the remembered masters when they changed; a failure is logged, not fatal (the
/// node works without, it only loses the fast cold restart).
fn remember(seeds: &mut Seeds, state_dir: &Path, zone: &str) {
    let now = SystemTime::now();
    if !seeds.needs_write(now) {
        return;
    }
    match seeds::save(state_dir, &seeds.remembered(zone)) {
        Ok(()) => seeds.mark_written(now),
        Err(e) => {
            tracing::warn!(
                "members: cannot remember the masters in {}: {e}",
                state_dir.join(seeds::FILE).display()
            );
            // Do not retry on every change.
            seeds.mark_written(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_under_a_key_this_node_does_not_hold_is_told() {
        let mut h = http::HeaderMap::new();
        let ours = vec![
            "aaaaaaaaaaaaaaaa".to_string(),
            "bbbbbbbbbbbbbbbb".to_string(),
        ];
        assert_eq!(
            other_key(&h, Some(&ours)),
            None,
            "an older registry names none"
        );
        h.insert(
            KEY_HEADER,
            http::HeaderValue::from_static("bbbbbbbbbbbbbbbb"),
        );
        assert_eq!(
            other_key(&h, Some(&ours)),
            None,
            "a key we hold (mid-rotation)"
        );
        assert_eq!(
            other_key(&h, None),
            None,
            "an unauthenticated node believes all"
        );
        h.insert(
            KEY_HEADER,
            http::HeaderValue::from_static("cccccccccccccccc"),
        );
        assert_eq!(
            other_key(&h, Some(&ours)).as_deref(),
            Some("cccccccccccccccc")
        );
    }

    fn entry(name: &str) -> serde_json::Value {
        serde_json::json!({"member": {"name": name, "role": "master",
            "addresses": ["10.0.0.1"], "version": "1"}, "ageMs": 5})
    }

    #[test]
    fn an_element_that_is_no_entry_is_skipped_alone() {
        let list = serde_json::json!([
            entry("m0"),
            entry("not a label"),
            {"member": {"name": "m2"}},
            7,
            entry("xn--bcher-kva")
        ]);
        let answer = parse_answer(list.to_string().as_bytes()).unwrap();
        let names: Vec<&str> = answer
            .entries
            .iter()
            .map(|e| e.member.name.as_str())
            .collect();
        assert_eq!(names, ["m0", "xn--bcher-kva"]);
        assert_eq!(answer.skipped, 3);
        assert_eq!(answer.entries[0].age_ms, 5);
    }

    #[test]
    fn at_most_max_members_entries_are_taken() {
        let list: Vec<serde_json::Value> = (0..MAX_MEMBERS + 10)
            .map(|i| entry(&format!("n{i}")))
            .collect();
        let answer = parse_answer(&serde_json::to_vec(&list).unwrap()).unwrap();
        assert_eq!(answer.entries.len(), MAX_MEMBERS);
        assert_eq!(answer.skipped, 10);
    }

    fn response(
        status: StatusCode,
        headers: &[(&str, &str)],
        body: &str,
    ) -> crate::net::http_client::Response {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        crate::net::http_client::Response {
            status,
            headers: h,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn a_list_is_taken_with_its_tag_and_an_unchanged_answer_with_its_age() {
        let addr: SocketAddr = "10.0.0.5:22623".parse().unwrap();
        let list = serde_json::json!([entry("m0")]).to_string();
        let (answered, tag) = read_answer(
            addr,
            &response(StatusCode::OK, &[("etag", "\"a-1\"")], &list),
            true,
        )
        .unwrap();
        assert!(matches!(&answered, Answered::List(e) if e.len() == 1));
        assert_eq!(tag.unwrap(), "\"a-1\"");
        // An older registry: no tag, the list as before.
        let (_, tag) = read_answer(addr, &response(StatusCode::OK, &[], &list), false).unwrap();
        assert_eq!(tag, None);

        let (answered, _) = read_answer(
            addr,
            &response(StatusCode::NOT_MODIFIED, &[(FRESH_HEADER, "9500")], ""),
            true,
        )
        .unwrap();
        assert_eq!(answered, Answered::Unchanged(Duration::from_millis(9500)));
        let bad = read_answer(addr, &response(StatusCode::NOT_MODIFIED, &[], ""), true);
        assert!(
            matches!(&bad, Err(e) if e.is_refusal() && e.to_string().contains(FRESH_HEADER)),
            "{bad:?}"
        );
        let unasked = read_answer(
            addr,
            &response(StatusCode::NOT_MODIFIED, &[(FRESH_HEADER, "1")], ""),
            false,
        );
        assert!(
            unasked.is_err(),
            "unchanged from what, when no list was named"
        );
    }

    #[test]
    fn an_unchanged_list_is_taken_in_as_old_as_the_registry_says() {
        let list: Vec<Entry> =
            serde_json::from_value(serde_json::json!([entry("m0"), entry("m2")])).unwrap();
        let again = refreshed(&list, Duration::from_millis(12_000));
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|e| e.age_ms == 12_000));
        assert_eq!(again[1].member, list[1].member);
    }

    #[test]
    fn an_answer_that_is_no_list_is_an_error() {
        for bad in [&b"{}"[..], b"", b"[", b"\"x\""] {
            assert!(parse_answer(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_answer(b"[]").unwrap(), Answer::default());
    }
}
