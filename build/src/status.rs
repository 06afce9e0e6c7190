//! `keelson status --cluster out/`: the whole cluster in one table, from the operator's
//! machine (docs/architecture.md, "Security: what a node exposes"): each VIP's holder, and
//! every member with its role, address, agent version, readiness and port security findings.
//!
//! It asks a control-plane node's operator status port ([`keelson_cluster::operator`]) —
//! through the API's floating IP by default, which lands on the API VIP's holder, or at
//! `--endpoint` (a bastion's tunnel) — over TLS: the node must prove the cluster's server
//! certificate, and this tool proves a client certificate it signs for the run with
//! `out/tls/ca.key`. The certificate and its key live in memory only, for one hour; the CA
//! key never leaves the operator's machine.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::operator::{self, ClusterReport};
use keelson_cluster::{ClusterConfig, tls_files};
use serde::Deserialize;

/// `keelson status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// `keelson build`'s output (cluster.json, openstack.json, tls/ca.crt and tls/ca.key).
    #[arg(long, value_name = "DIR")]
    pub cluster: PathBuf,
    /// Where to ask, HOST or HOST:PORT (default: the API's floating IP from openstack.json,
    /// else the API VIP; port 22628).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub endpoint: Option<String>,
    /// Print the gathered documents as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
}

/// A client certificate for the operator, signed by the cluster CA: (certificate, key) DER.
fn client_certificate(ca_cert_pem: &str, ca_key_pem: &str) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    use rcgen::{
        CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::from_pem(ca_key_pem).context("tls/ca.key")?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).context("tls/ca.crt")?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let who = std::env::var("USER").unwrap_or_else(|_| "operator".into());
    params.distinguished_name.push(
        DnType::CommonName,
        format!("{} {who}", operator::CLIENT_CN_PREFIX),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Valid from a little before now (the nodes' clocks may be behind) for an hour.
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(10);
    params.not_after = now + time::Duration::hours(1);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.der().to_vec(), key.serialize_der()))
}

/// The address to ask: `--endpoint`, else the API's floating IP, else the API VIP.
fn endpoint(args: &StatusArgs, cluster: &ClusterConfig) -> anyhow::Result<(String, u16)> {
    let text = match &args.endpoint {
        Some(e) => e.clone(),
        None => {
            let plan = args.cluster.join("openstack.json");
            let fip = std::fs::read(&plan)
                .ok()
                .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
                .and_then(|v| v["apiFloatingIp"].as_str().map(str::to_owned));
            match fip {
                Some(f) => f,
                None => cluster
                    .api_vips
                    .first()
                    .map(IpAddr::to_string)
                    .context("cluster.json apiVips: expected a VIP")?,
            }
        }
    };
    // HOST, HOST:PORT, [V6]:PORT, or a bare IPv6 address.
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok((ip.to_string(), operator::PORT));
    }
    if let Ok(sa) = text.parse::<std::net::SocketAddr>() {
        return Ok((sa.ip().to_string(), sa.port()));
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Ok((
            host.to_owned(),
            port.parse()
                .with_context(|| format!("--endpoint {text}: expected HOST[:PORT]"))?,
        )),
        None => Ok((text, operator::PORT)),
    }
}

/// Asks `path` of the node at `host:port`, over TLS with the operator's certificate,
/// checking the node's certificate against the cluster CA for `api.<zone>`.
async fn fetch(
    host: &str,
    port: u16,
    zone: &str,
    ca_pem: &str,
    client: (Vec<u8>, Vec<u8>),
    path: &str,
) -> anyhow::Result<Vec<u8>> {
    use http_body_util::BodyExt;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.context("tls/ca.crt")?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from(client.0)],
        PrivateKeyDer::try_from(client.1).map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .with_context(|| format!("connecting to {host}:{port}"))?;
    // The server certificate names the API (api.<zone>), whatever address reached it.
    let name = ServerName::try_from(format!("api.{zone}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .with_context(|| format!("TLS with {host}:{port} (the cluster's server certificate)"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, format!("{host}:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let answer = sender
        .send_request(req)
        .await
        .with_context(|| format!("GET {path} from {host}:{port} (refused the certificate?)"))?;
    let status = answer.status();
    let body = answer.into_body().collect().await?.to_bytes().to_vec();
    anyhow::ensure!(
        status.is_success(),
        "GET {path} from {host}:{port}: HTTP {status}: {}",
        String::from_utf8_lossy(&body).trim()
    );
    Ok(body)
}

/// Runs `keelson status`.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let read = |name: &str| {
        let path = args.cluster.join(name);
        std::fs::read_to_string(&path).with_context(|| path.display().to_string())
    };
    let cluster = ClusterConfig::from_json(read("cluster.json")?.as_bytes())
        .with_context(|| format!("{}/cluster.json", args.cluster.display()))?;
    let ca = read(&format!("tls/{}", tls_files::CA_CERT))?;
    let ca_key = read(&format!("tls/{}", tls_files::CA_KEY))?;
    let client = client_certificate(&ca, &ca_key)?;
    let (host, port) = endpoint(&args, &cluster)?;
    let body = tokio::runtime::Runtime::new()?.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(args.timeout),
            fetch(
                &host,
                port,
                &cluster.zone(),
                &ca,
                client,
                operator::CLUSTER_PATH,
            ),
        )
        .await
        .with_context(|| format!("no answer from {host}:{port} within {} s", args.timeout))?
    })?;
    let report: ClusterReport =
        serde_json::from_slice(&body).with_context(|| format!("the answer of {host}:{port}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report, &cluster, &format!("{host}:{port}")));
    }
    Ok(())
}

/// The parts of a node's status document the table shows (the agent's `status --json`;
/// fields this view does not name are ignored, so newer agents stay readable).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeView {
    node: NodeInfo,
    build: BuildView,
    #[serde(default)]
    ready: Vec<String>,
    #[serde(default)]
    vrrp: Vec<VrrpView>,
}

#[derive(Debug, Deserialize)]
struct NodeInfo {
    role: String,
}

#[derive(Debug, Deserialize)]
struct BuildView {
    version: String,
    commit: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VrrpView {
    name: String,
    vip: IpAddr,
    state: String,
    #[serde(default)]
    port_security: Vec<FindingView>,
}

#[derive(Debug, Deserialize)]
struct FindingView {
    problem: String,
    fix: String,
}

/// The services a role runs (docs/architecture.md, "Which services a role runs"): a node is
/// ready when all of them are.
fn role_services(role: &str) -> &'static [&'static str] {
    match role {
        "worker" => &["members", "dns", "vrrp"],
        _ => &["members", "ignition", "dns", "vrrp", "proxy"],
    }
}

/// The table: the VIPs with their holders, then one line per member.
fn table(report: &ClusterReport, cluster: &ClusterConfig, via: &str) -> String {
    let mut o = String::new();
    let views: Vec<(&operator::NodeReport, Option<NodeView>)> = report
        .nodes
        .iter()
        .map(|n| {
            let view = n
                .status
                .as_ref()
                .and_then(|s| serde_json::from_value::<NodeView>(s.clone()).ok());
            (n, view)
        })
        .collect();
    let _ = writeln!(
        o,
        "cluster {}: {} members, answered by {} through {via}",
        cluster.zone(),
        report.nodes.len(),
        report.answered_by
    );
    let _ = writeln!(o, "\n{:<12} {:<26} HOLDER", "VIP", "ADDRESS");
    for inst in &cluster.vrrp.instances {
        let holders: Vec<&str> = views
            .iter()
            .filter(|(_, v)| {
                v.as_ref().is_some_and(|v| {
                    v.vrrp
                        .iter()
                        .any(|i| i.name == inst.name && i.state == "master")
                })
            })
            .map(|(n, _)| n.name.as_str())
            .collect();
        let holder = match holders.as_slice() {
            [] => "none".to_owned(),
            [one] => (*one).to_owned(),
            many => format!("{} (SEVERAL: split brain)", many.join(", ")),
        };
        let _ = writeln!(o, "{:<12} {:<26} {holder}", inst.name, inst.vip.to_string());
    }
    let _ = writeln!(
        o,
        "\n{:<16} {:<10} {:<26} {:<22} {:<10} PORT SECURITY",
        "NODE", "ROLE", "ADDRESS", "AGENT", "READY"
    );
    for (n, view) in &views {
        let address = n
            .address
            .map(|a| a.to_string())
            .unwrap_or_else(|| "-".into());
        let Some(v) = view else {
            let why = n.error.as_deref().unwrap_or("no status document");
            let _ = writeln!(
                o,
                "{:<16} {:<10} {:<26} unreachable: {why}",
                n.name, "?", address
            );
            continue;
        };
        let missing: Vec<&str> = role_services(&v.node.role)
            .iter()
            .copied()
            .filter(|s| !v.ready.iter().any(|r| r == s))
            .collect();
        let ready = if missing.is_empty() {
            "ready".to_owned()
        } else {
            format!("no: {}", missing.join(","))
        };
        let findings: Vec<String> = v
            .vrrp
            .iter()
            .flat_map(|i| {
                i.port_security
                    .iter()
                    .map(move |f| format!("{} {}: {} (fix: {})", i.name, i.vip, f.problem, f.fix))
            })
            .collect();
        let _ = writeln!(
            o,
            "{:<16} {:<10} {:<26} {:<22} {:<10} {}",
            n.name,
            v.node.role,
            address,
            format!("{} ({})", v.build.version, v.build.commit),
            ready,
            if findings.is_empty() {
                "ok".to_owned()
            } else {
                findings.join("; ")
            }
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::install_config::InstallConfig;

    fn cluster() -> ClusterConfig {
        InstallConfig::parse(include_str!("../../examples/install-config.yaml"))
            .unwrap()
            .cluster_config()
    }

    fn node(
        name: &str,
        role: &str,
        api: &str,
        ready: &[&str],
        findings: bool,
    ) -> serde_json::Value {
        serde_json::json!({
            "node": {"name": name, "role": role, "interface": "eth0", "addresses": ["10.0.0.20/16"], "cluster": "ocp4.osd2019.local"},
            "build": {"version": "0.1.0", "commit": "abc123"},
            "ready": ready,
            "futureField": {"a": 1},
            "vrrp": [{"name": "api", "vip": "10.0.0.5", "state": api,
                      "portSecurity": if findings {
                          serde_json::json!([{"problem": "vipNotAllowed", "seconds": 3.0, "fix": "openstack port set ..."}])
                      } else { serde_json::json!([]) }}]
        })
    }

    #[test]
    fn one_table_of_the_whole_cluster() {
        let all = ["members", "ignition", "dns", "vrrp", "proxy"];
        let report = ClusterReport {
            answered_by: "bootstrap".into(),
            nodes: vec![
                operator::NodeReport {
                    name: "bootstrap".into(),
                    address: Some("10.0.0.20".parse().unwrap()),
                    status: Some(node("bootstrap", "bootstrap", "master", &all, false)),
                    error: None,
                },
                operator::NodeReport {
                    name: "master-0".into(),
                    address: Some("10.0.0.21".parse().unwrap()),
                    status: Some(node("master-0", "master", "backup", &all[..3], true)),
                    error: None,
                },
                operator::NodeReport {
                    name: "master-1".into(),
                    address: Some("10.0.0.22".parse().unwrap()),
                    status: None,
                    error: Some("connect timeout".into()),
                },
            ],
        };
        let t = table(&report, &cluster(), "172.24.4.50:22628");
        assert!(t.starts_with("cluster ocp4.osd2019.local: 3 members, answered by bootstrap through 172.24.4.50:22628"), "{t}");
        let line = |start: &str| {
            t.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{start}: {t}"))
        };
        assert!(line("api ").ends_with(" bootstrap"), "{t}");
        assert!(line("ingress ").ends_with(" none"), "{t}");
        let b = line("bootstrap ");
        assert!(
            b.contains("0.1.0 (abc123)") && b.contains(" ready ") && b.ends_with(" ok"),
            "{b}"
        );
        let m = line("master-0 ");
        assert!(m.contains("no: vrrp,proxy"), "{m}");
        assert!(
            m.contains("api 10.0.0.5: vipNotAllowed (fix: openstack port set ...)"),
            "{m}"
        );
        assert!(
            line("master-1 ").contains("unreachable: connect timeout"),
            "{t}"
        );
    }

    #[test]
    fn two_holders_are_called_what_they_are() {
        let all = ["members", "ignition", "dns", "vrrp", "proxy"];
        let report = ClusterReport {
            answered_by: "master-0".into(),
            nodes: ["master-0", "master-1"]
                .iter()
                .map(|n| operator::NodeReport {
                    name: (*n).into(),
                    address: None,
                    status: Some(node(n, "master", "master", &all, false)),
                    error: None,
                })
                .collect(),
        };
        let t = table(&report, &cluster(), "x");
        assert!(
            t.contains("master-0, master-1 (SEVERAL: split brain)"),
            "{t}"
        );
    }

    #[test]
    fn endpoints() {
        let c = cluster();
        let args = |e: Option<&str>| StatusArgs {
            cluster: PathBuf::from("/nonexistent"),
            endpoint: e.map(str::to_owned),
            json: false,
            timeout: 1,
        };
        assert_eq!(
            endpoint(&args(None), &c).unwrap(),
            ("10.0.0.5".into(), 22628)
        );
        assert_eq!(
            endpoint(&args(Some("172.24.4.50")), &c).unwrap(),
            ("172.24.4.50".into(), 22628)
        );
        assert_eq!(
            endpoint(&args(Some("127.0.0.1:9000")), &c).unwrap(),
            ("127.0.0.1".into(), 9000)
        );
        assert_eq!(
            endpoint(&args(Some("bastion.example:22628")), &c).unwrap(),
            ("bastion.example".into(), 22628)
        );
        assert!(endpoint(&args(Some("host:port")), &c).is_err());
    }
}
