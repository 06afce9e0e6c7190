//! `keelson status` as an operator runs it, against the agent's own operator status port and
//! metrics port (the library's servers, on loopback addresses): the port answers the
//! operator's certificate, which `keelson status` signs with `out/tls/ca.key`, and refuses a
//! client without one, with a node's own (server) certificate, or with a certificate of
//! another CA; the answering node gathers each member's `/status` from its metrics port and
//! names the member that does not answer. The OpenStack run does the same through a floating
//! IP (docs/openstack.md).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use keelson_agent::context::{AgentContext, NodePaths};
use keelson_agent::member::Member;
use keelson_agent::node::NodeIdentity;
use keelson_cluster::operator::ClusterReport;
use keelson_cluster::{ClusterConfig, Role};
use tokio_util::sync::CancellationToken;

const KEELSON: &str = env!("CARGO_BIN_EXE_keelson");

/// `keelson build` of the example into `dir` (a stand-in agent binary: nothing runs it).
fn build(dir: &Path) {
    let agent = dir.join("agent");
    // The smallest static x86_64 ELF `keelson build` accepts as the agent.
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    elf.extend(2u16.to_le_bytes());
    elf.extend(0x3eu16.to_le_bytes());
    elf.extend(1u32.to_le_bytes());
    elf.extend((0x40_0000u64 + 120).to_le_bytes());
    elf.extend(64u64.to_le_bytes());
    elf.extend(0u64.to_le_bytes());
    elf.extend(0u32.to_le_bytes());
    for half in [64u16, 56, 1, 64, 0, 0] {
        elf.extend(half.to_le_bytes());
    }
    elf.extend(1u32.to_le_bytes());
    elf.extend(5u32.to_le_bytes());
    for word in [0u64, 0x40_0000, 0x40_0000, 129, 129, 0x1000] {
        elf.extend(word.to_le_bytes());
    }
    elf.extend_from_slice(&[0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]);
    std::fs::write(&agent, elf).unwrap();
    let out = Command::new(KEELSON)
        .args(["build", "--quiet", "--no-image", "--config"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/install-config.yaml"
        ))
        .arg("--out")
        .arg(dir.join("out"))
        .arg("--agent")
        .arg(&agent)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn node(name: &str, role: Role, address: &str) -> NodeIdentity {
    NodeIdentity {
        name: name.parse().unwrap(),
        role,
        interface: "lo".into(),
        addresses: vec![format!("{address}/8").parse().unwrap()],
    }
}

fn member(n: &NodeIdentity) -> Member {
    Member::of(n)
}

/// A rustls client config trusting the cluster CA, with `client` as its certificate.
fn client_config(ca_pem: &[u8], client: Option<(Vec<u8>, Vec<u8>)>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(cert)],
                PrivateKeyDer::try_from(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// Whether a GET of /v1/node with `config` gets an answer (TLS 1.3 tells a refused client
/// certificate only at the first read).
async fn answered(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("api.ocp4.osd2019.local").unwrap();
    let Ok(mut tls) = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
    else {
        return false;
    };
    let _ = tls
        .write_all(b"GET /v1/node HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    answer.starts_with(b"HTTP/1.1 200")
}

/// A client certificate and key (DER), made for client authentication, signed by `issuer`.
fn client_cert(issuer: &rcgen::Issuer<'_, rcgen::KeyPair>) -> (Vec<u8>, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.der().to_vec(), key.serialize_der())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_sees_the_cluster_and_nobody_else_does() {
    let work = tempfile::tempdir().unwrap();
    build(work.path());
    let out = work.path().join("out");
    let tls = out.join("tls");
    let mut cluster =
        ClusterConfig::from_json(&std::fs::read(out.join("cluster.json")).unwrap()).unwrap();
    // Every member on loopback: 127.0.0.1 answers the operator; master-0's metrics port
    // (at 127.0.0.77) gives its /status; worker-0 (127.0.0.78) answers nothing.
    let metrics = std::net::TcpListener::bind("127.0.0.77:0").unwrap();
    cluster.metrics.port = metrics.local_addr().unwrap().port();
    cluster.machine_networks = vec!["127.0.0.0/8".parse().unwrap()];
    let paths = NodePaths {
        tls_dir: tls.clone(),
        state_dir: work.path().join("state"),
    };
    let bootstrap = node("bootstrap", Role::Bootstrap, "127.0.0.1");
    let master = node("master-0", Role::Master, "127.0.0.77");
    let worker = node("worker-0", Role::Worker, "127.0.0.78");
    let members = Arc::new(vec![member(&bootstrap), member(&master), member(&worker)]);
    let ctx = AgentContext::new(cluster.clone(), bootstrap).with_paths(paths.clone());
    ctx.bus.members.send_replace(members.clone());
    let master_ctx = AgentContext::new(cluster.clone(), master).with_paths(paths);
    master_ctx.bus.members.send_replace(members);
    let stop = CancellationToken::new();
    let started = Instant::now();
    metrics.set_nonblocking(true).unwrap();
    tokio::spawn(keelson_agent::metrics::serve_on(
        tokio::net::TcpListener::from_std(metrics).unwrap(),
        keelson_cluster::server::AccessList::new(vec![], true),
        move || master_ctx.status(started),
        stop.clone(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(keelson_agent::operator::serve_on(
        listener,
        keelson_agent::operator::tls_config(&tls).unwrap(),
        ctx,
        started,
        stop.clone(),
    ));

    // The operator's tool, as it is run.
    let status = |json: bool| {
        let out = out.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(KEELSON);
            cmd.args(["status", "--cluster"])
                .arg(&out)
                .args(["--endpoint", &addr.to_string()]);
            if json {
                cmd.arg("--json");
            }
            cmd.output().unwrap()
        })
    };
    let table = status(false).await.unwrap();
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with(&format!(
            "cluster ocp4.osd2019.local: 3 members, answered by bootstrap through {addr}"
        )),
        "{text}"
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}: {text}"))
            .to_owned()
    };
    assert!(line("bootstrap").contains("bootstrap  127.0.0.1"), "{text}");
    assert!(line("master-0").contains("master     127.0.0.77"), "{text}");
    // Nothing runs on these stand-ins: not ready, and the missing services named.
    assert!(
        line("master-0").contains("no: members,ignition,dns,vrrp,proxy"),
        "{text}"
    );
    assert!(line("worker-0").contains("unreachable"), "{text}");
    let json = status(true).await.unwrap();
    let report: ClusterReport = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<&str> = report.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["bootstrap", "master-0", "worker-0"]);
    assert_eq!(
        report.nodes[1].status.as_ref().unwrap()["node"]["role"],
        "master"
    );
    assert_eq!(
        report.nodes[2].address,
        Some("127.0.0.78".parse::<IpAddr>().unwrap())
    );
    assert!(report.nodes[2].error.is_some());

    // Nobody else: no certificate, a node's own server certificate, another CA's client
    // certificate. The operator's (signed by ca.key) is answered.
    let ca_pem = std::fs::read(tls.join("ca.crt")).unwrap();
    let ca_key = std::fs::read_to_string(tls.join("ca.key")).unwrap();
    let ca = rcgen::Issuer::from_ca_cert_pem(
        &String::from_utf8_lossy(&ca_pem),
        rcgen::KeyPair::from_pem(&ca_key).unwrap(),
    )
    .unwrap();
    assert!(answered(addr, client_config(&ca_pem, Some(client_cert(&ca)))).await);
    assert!(
        !answered(addr, client_config(&ca_pem, None)).await,
        "no certificate"
    );
    let server = {
        use rustls::pki_types::pem::PemObject;
        let cert = rustls::pki_types::CertificateDer::from_pem_file(tls.join("server.crt"))
            .unwrap()
            .to_vec();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(tls.join("server.key"))
            .unwrap()
            .secret_der()
            .to_vec();
        (cert, key)
    };
    assert!(
        !answered(addr, client_config(&ca_pem, Some(server))).await,
        "a node's server certificate is not a client's"
    );
    let other = {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap()
    };
    assert!(
        !answered(addr, client_config(&ca_pem, Some(client_cert(&other)))).await,
        "another CA's client certificate"
    );
    stop.cancel();
}
