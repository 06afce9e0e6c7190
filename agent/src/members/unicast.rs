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

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::auth::{Fields, Keys, Op, Signer};
pub use super::registry::{Entry, Goodbye, MEMBERS_PATH, Registration, Registry};
use super::seeds::{self, Seeds};
use super::table::MAX_MEMBERS;
use super::{Counters, own_member, publish};
use crate::context::AgentContext;
use crate::net::http_client::{HttpClient, HttpError, Request, Trust};

/// Where the cluster CA is on a node.
pub const CA_PATH: &str = "/etc/keelson/tls/ca.crt";

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
    exchange_as(tls, None, addr, addr.ip(), method, path, body).await
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
) -> Result<(StatusCode, Bytes), HttpError> {
    let url = format!("https://{addr}{path}");
    let long = Duration::from_secs(3600);
    let client = HttpClient::new()
        .trust(Trust::Roots(tls))
        .timeouts(long, long, long)
        .body_limit(MAX_ANSWER_BYTES);
    let mut req = Request::get(&url).header(http::header::CONTENT_TYPE, "application/json");
    req.method = method;
    req.body = Bytes::from(body);
    req.source = source;
    req.server_name = Some(name);
    let answer = client.send(req).await?;
    Ok((answer.status, answer.body))
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
}

impl RegistrationError {
    /// The registry answered but refused, or answered with something unusable (counted
    /// and logged loudly: it is not the network).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RegistrationError::Refused { .. } | RegistrationError::BadList(_)
        )
    }
}

/// What one registration round brought back, per registry.
type RoundResult = Vec<(SocketAddr, Result<Vec<Entry>, RegistrationError>)>;

/// This node's address of `target`'s family, if it has one.
fn source_for(own: &[IpAddr], target: SocketAddr) -> Option<IpAddr> {
    own.iter()
        .copied()
        .find(|a| a.is_ipv4() == target.is_ipv4())
}

/// Registers with every target at once.
async fn round(
    tls: Arc<rustls::ClientConfig>,
    own: Vec<IpAddr>,
    name: IpAddr,
    targets: Vec<SocketAddr>,
    body: Vec<u8>,
) -> RoundResult {
    let mut set = tokio::task::JoinSet::new();
    for addr in targets {
        let (tls, body) = (tls.clone(), body.clone());
        let source = source_for(&own, addr);
        set.spawn(async move {
            let call = exchange_as(tls, source, addr, name, Method::POST, MEMBERS_PATH, body);
            let res = match tokio::time::timeout(EXCHANGE_TIMEOUT, call).await {
                Ok(Ok((StatusCode::OK, list))) => match parse_answer(&list) {
                    Ok(answer) => {
                        if answer.skipped > 0 {
                            tracing::warn!(
                                %addr,
                                skipped = answer.skipped,
                                "members: entries of a registry's answer skipped (not entries, or over {MAX_MEMBERS})"
                            );
                        }
                        Ok(answer.entries)
                    }
                    Err(e) => Err(RegistrationError::BadList(e)),
                },
                Ok(Ok((status, text))) => Err(RegistrationError::Refused {
                    status,
                    text: String::from_utf8_lossy(&text).trim().to_owned(),
                }),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(RegistrationError::NoAnswer(EXCHANGE_TIMEOUT)),
            };
            (addr, res)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            out.push(r);
        }
    }
    out.sort_by_key(|(a, _)| *a);
    out
}

async fn join_round(h: &mut Option<JoinHandle<RoundResult>>) -> RoundResult {
    match h {
        Some(h) => h.await.unwrap_or_default(),
        None => std::future::pending().await,
    }
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
    let mut seeds = Seeds::new(configured, ctx.cluster.api_vips.clone());
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
    let registration = |now: SystemTime| -> Vec<u8> {
        let auth = signer.as_ref().map(|s| {
            s.sign(
                &Fields {
                    op: Op::Register,
                    cluster: &zone,
                    name: &me.name,
                    role: Some(me.role),
                    addresses: &me.addresses,
                    version: &me.version,
                },
                now,
            )
        });
        serde_json::to_vec(&Registration {
            cluster: zone.clone(),
            member: me.clone(),
            auth,
        })
        .unwrap_or_default()
    };
    let mut changes = registry.subscribe();
    let mut vips = ctx.bus.vips_held.subscribe();
    publish(&ctx, &me, registry.list());
    ctx.bus.mark_ready("members");

    let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: Option<JoinHandle<RoundResult>> = None;
    let mut next_round = Instant::now();
    let mut answered: Vec<SocketAddr> = Vec::new();
    let mut last_errors: BTreeMap<SocketAddr, String> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next_round.into()), if pending.is_none() => {
                let own: Vec<IpAddr> = me.addresses.clone();
                let targets: Vec<SocketAddr> = seeds
                    .targets(&own, &vips.borrow_and_update())
                    .into_iter()
                    .map(|a| SocketAddr::new(a, port))
                    .collect();
                let body = registration(SystemTime::now());
                pending = Some(tokio::spawn(round(tls.clone(), me.addresses.clone(), name, targets, body)));
            }
            results = join_round(&mut pending) => {
                pending = None;
                let now = Instant::now();
                answered.clear();
                let mut status = BTreeMap::new();
                for (addr, res) in results {
                    match res {
                        Ok(entries) => {
                            registry.merge(entries, now);
                            answered.push(addr);
                            last_errors.remove(&addr);
                            status.insert(addr.to_string(), "ok".to_string());
                        }
                        Err(e) => {
                            let text = e.to_string();
                            if last_errors.get(&addr) != Some(&text) {
                                tracing::debug!(%addr, error = %text, "members: registration failed");
                            }
                            if e.is_refusal() {
                                counters.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                tracing::warn!(%addr, "members: registration {text}");
                            }
                            status.insert(addr.to_string(), text.clone());
                            last_errors.insert(addr, text);
                        }
                    }
                }
                *counters.registries.lock().unwrap_or_else(|e| e.into_inner()) = status;
                let alone = registry.list().iter().all(|m| m.name == me.name);
                next_round = Instant::now() + if alone { ALONE_RETRY } else { renew };
            }
            _ = changes.changed() => {
                changes.borrow_and_update();
                let list = registry.list();
                publish(&ctx, &me, list.clone());
                seeds.update(&list, &me.name, SystemTime::now());
                remember(&mut seeds, &state_dir, &zone);
            }
            _ = vips.changed() => {
                // A VIP moved to or away from this node: the holder to reach through it
                // changed. Register now rather than at the next renewal.
                if pending.is_none() {
                    next_round = Instant::now();
                }
            }
            _ = housekeeping.tick() => {
                registry.expire(Instant::now());
            }
        }
    }
    if let Some(p) = pending.take() {
        p.abort();
    }
    // Goodbye, best effort: the registries drop us now rather than at the expiry.
    let path = format!("{MEMBERS_PATH}/{}", me.name);
    let goodbyes = answered.into_iter().map(|addr| {
        let tls = tls.clone();
        let path = path.clone();
        let auth = signer.as_ref().map(|s| {
            s.sign(
                &Fields {
                    op: Op::Delete,
                    cluster: &zone,
                    name: &me.name,
                    role: None,
                    addresses: &[],
                    version: "",
                },
                SystemTime::now(),
            )
        });
        let body = serde_json::to_vec(&Goodbye { auth }).unwrap_or_default();
        let source = source_for(&me.addresses, addr);
        async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                exchange_as(tls, source, addr, name, Method::DELETE, &path, body),
            )
            .await;
        }
    });
    futures::future::join_all(goodbyes).await;
    Ok(())
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

    #[test]
    fn an_answer_that_is_no_list_is_an_error() {
        for bad in [&b"{}"[..], b"", b"[", b"\"x\""] {
            assert!(parse_answer(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_answer(b"[]").unwrap(), Answer::default());
    }
}
