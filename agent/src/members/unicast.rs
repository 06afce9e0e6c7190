//! Unicast members, for networks without multicast: every node registers over HTTPS with
//! the Ignition server port of the API VIP (`POST /keelson/v1/members`, trusting the cluster
//! CA) and gets the live list back. The server side, [`Registry`], is soft state: an entry
//! lives `expiry_secs` after its last renewal, so after the VIP moves the new holder's list
//! is complete again within one renewal interval, and a node that stops renewing goes away.
//!
//! Clients keep what they learned in their own soft state too, so the short gap after a VIP
//! move (a fresh registry) does not drop anyone from the published list.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use keelson_ignition::routes::ExtraRoutes;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::mdns::valid_label;
use super::table::Table;
use super::{Counters, own_member, publish};
use crate::context::{AgentContext, Member};

/// The registration path on the Ignition server.
pub const MEMBERS_PATH: &str = "/keelson/v1/members";
/// Where the cluster CA is on a node.
pub const CA_PATH: &str = "/etc/keelson/tls/ca.crt";

/// What a node sends to register or renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// The cluster zone (`<name>.<baseDomain>`); other clusters are refused.
    pub cluster: String,
    /// The node.
    pub member: Member,
}

/// One entry of the registry's answer: a member and how long ago it last renewed, so
/// clients expire it when the registry does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The member.
    pub member: Member,
    /// Milliseconds since its last renewal.
    pub age_ms: u64,
}

/// The server side: registrations held as soft state. Plugs into the Ignition server as
/// its `/keelson/` routes.
#[derive(Debug)]
pub struct Registry {
    zone: String,
    table: Mutex<Table>,
}

impl Registry {
    /// A registry for cluster `zone` whose entries expire `expiry` after their last renewal.
    pub fn new(zone: &str, expiry: Duration) -> Self {
        Self {
            zone: zone.to_ascii_lowercase(),
            table: Mutex::new(Table::new(expiry)),
        }
    }

    /// The live members.
    pub fn list(&self) -> Vec<Member> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.expire(Instant::now());
        t.list()
    }

    fn json(&self) -> (StatusCode, Bytes) {
        let now = Instant::now();
        let entries: Vec<Entry> = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            t.expire(now);
            t.list_aged(now)
                .into_iter()
                .map(|(member, age)| Entry {
                    member,
                    age_ms: age.as_millis().min(u128::from(u64::MAX)) as u64,
                })
                .collect()
        };
        let body = serde_json::to_vec(&entries).unwrap_or_default();
        (StatusCode::OK, Bytes::from(body))
    }

    fn register(&self, body: &[u8]) -> (StatusCode, Bytes) {
        let bad = |msg: String| (StatusCode::BAD_REQUEST, Bytes::from(msg + "\n"));
        let reg: Registration = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return bad(format!("registration: {e}")),
        };
        if !reg.cluster.eq_ignore_ascii_case(&self.zone) {
            return (
                StatusCode::CONFLICT,
                Bytes::from(format!(
                    "registration: cluster: expected {}, got {}\n",
                    self.zone, reg.cluster
                )),
            );
        }
        if !valid_label(&reg.member.name) {
            return bad(format!(
                "registration: member.name: expected a DNS label, got {:?}",
                reg.member.name
            ));
        }
        if reg.member.addresses.is_empty() || reg.member.addresses.len() > 16 {
            return bad("registration: member.addresses: expected 1 to 16 addresses".into());
        }
        if reg.member.version.len() > 64 {
            return bad("registration: member.version: expected at most 64 bytes".into());
        }
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .renew(reg.member, Instant::now());
        self.json()
    }
}

impl ExtraRoutes for Registry {
    fn handle(
        &self,
        method: &Method,
        path: &str,
        _peer: SocketAddr,
        body: Bytes,
    ) -> Option<(StatusCode, Bytes)> {
        if path == MEMBERS_PATH {
            return Some(match *method {
                Method::GET => self.json(),
                Method::POST => self.register(&body),
                _ => (StatusCode::METHOD_NOT_ALLOWED, Bytes::new()),
            });
        }
        let name = path.strip_prefix(MEMBERS_PATH)?.strip_prefix('/')?;
        Some(match *method {
            // A node that stops says goodbye rather than waiting for the expiry.
            Method::DELETE if valid_label(name) => {
                self.table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(name);
                (StatusCode::NO_CONTENT, Bytes::new())
            }
            Method::DELETE => (
                StatusCode::BAD_REQUEST,
                Bytes::from("member name: expected a DNS label\n"),
            ),
            _ => (StatusCode::METHOD_NOT_ALLOWED, Bytes::new()),
        })
    }
}

/// A TLS client configuration trusting only the CA in `ca_path`.
pub fn client_config(ca_path: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(ca_path)
        .with_context(|| format!("cluster CA {}: expected a PEM file", ca_path.display()))?;
    for cert in certs {
        let cert = cert.with_context(|| format!("cluster CA {}: bad PEM", ca_path.display()))?;
        roots.add(cert).with_context(|| {
            format!("cluster CA {}: not a usable certificate", ca_path.display())
        })?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "cluster CA {}: expected at least one certificate",
        ca_path.display()
    );
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// One HTTPS exchange with `addr` (an IP literal: the certificate must name that IP).
pub async fn exchange(
    tls: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    conn.abort();
    Ok((status, body))
}

/// Runs the unicast client until `stop`, trusting the CA at `ca_path`.
pub async fn run(
    ctx: AgentContext,
    stop: CancellationToken,
    counters: &Counters,
    ca_path: PathBuf,
) -> anyhow::Result<()> {
    let tls = client_config(&ca_path)?;
    let me = own_member(&ctx);
    let settings = &ctx.cluster.members;
    let expiry = Duration::from_secs(u64::from(settings.expiry_secs.max(1)));
    let renew = Duration::from_secs(u64::from(settings.renew_interval_secs.max(1)));
    let port = ctx.cluster.ignition.tls_port;
    let vips: Vec<SocketAddr> = ctx
        .cluster
        .api_vips
        .iter()
        .map(|ip: &IpAddr| SocketAddr::new(*ip, port))
        .collect();
    anyhow::ensure!(
        !vips.is_empty(),
        "cluster.json apiVips: expected an API VIP to register with"
    );
    let body = serde_json::to_vec(&Registration {
        cluster: ctx.cluster.zone(),
        member: me.clone(),
    })?;
    let mut table = Table::new(expiry);
    publish(&ctx, &me, Vec::new());
    ctx.bus.mark_ready("members");
    let mut tick = tokio::time::interval(renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut registered_with = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        for vip in &vips {
            let call = exchange(tls.clone(), *vip, Method::POST, MEMBERS_PATH, body.clone());
            match tokio::time::timeout(renew, call).await {
                Ok(Ok((StatusCode::OK, list))) => match serde_json::from_slice::<Vec<Entry>>(&list)
                {
                    Ok(list) => {
                        let now = Instant::now();
                        for e in list.into_iter().filter(|e| valid_label(&e.member.name)) {
                            table.renew_aged(e.member, Duration::from_millis(e.age_ms), now);
                        }
                        registered_with = Some(*vip);
                        break;
                    }
                    Err(e) => {
                        counters
                            .malformed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(%vip, error = %e, "members: bad list from the registry");
                    }
                },
                Ok(Ok((status, text))) => {
                    tracing::warn!(%vip, %status, body = %String::from_utf8_lossy(&text), "members: registration refused");
                }
                Ok(Err(e)) => tracing::debug!(%vip, error = %e, "members: registration failed"),
                Err(_) => tracing::debug!(%vip, "members: registration timed out"),
            }
        }
        table.expire(Instant::now());
        publish(&ctx, &me, table.list());
    }
    // Goodbye, best effort: the registry drops us now rather than at the expiry.
    if let Some(vip) = registered_with {
        let path = format!("{MEMBERS_PATH}/{}", me.name);
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            exchange(tls, vip, Method::DELETE, &path, Vec::new()),
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_ignition::Role;

    fn reg(cluster: &str, name: &str) -> Bytes {
        Bytes::from(
            serde_json::to_vec(&Registration {
                cluster: cluster.into(),
                member: Member {
                    name: name.into(),
                    role: Role::Master,
                    addresses: vec!["10.0.0.1".parse().unwrap()],
                    version: "1".into(),
                },
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
        let (st, body) = r
            .handle(&Method::POST, MEMBERS_PATH, peer(), reg("C.example", "m0"))
            .unwrap();
        assert_eq!(st, StatusCode::OK);
        let list: Vec<Entry> = serde_json::from_slice(&body).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].member.name, "m0");
        assert!(list[0].age_ms < 1000);
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
                reg("c.example", "bad name"),
            )
            .unwrap();
        assert_eq!(st, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).contains("member.name"));
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

    proptest::proptest! {
        #[test]
        fn any_body_is_answered(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let r = Registry::new("c.example", Duration::from_secs(10));
            let (st, _) = r.handle(&Method::POST, MEMBERS_PATH, peer(), Bytes::from(body)).unwrap();
            proptest::prop_assert!(st == StatusCode::OK || st.is_client_error());
        }
    }
}
