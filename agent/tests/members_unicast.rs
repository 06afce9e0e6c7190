//! Unicast members end to end on loopback: three `keelson-agent members` processes register
//! over HTTPS (cluster CA) with an in-test Ignition-like server whose `/keelson/` routes are
//! the agent's `Registry`. They converge; after the "VIP moves" (server replaced by a fresh
//! one on the same address) the list is rebuilt within one renewal interval; a killed node
//! expires; a stopped one says goodbye.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keelson_agent::members::unicast::Registry;
use keelson_ignition::routes::ExtraRoutes;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");
const RENEW: u64 = 1;
const EXPIRY: u64 = 4;

struct Tls {
    server: Arc<rustls::ServerConfig>,
    ca_pem: String,
}

/// A cluster CA and a server certificate for 127.0.0.1 signed by it.
fn tls() -> Tls {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![CertificateDer::from(leaf.der().to_vec())], key)
    .unwrap();
    Tls {
        server: Arc::new(server),
        ca_pem: ca.pem(),
    }
}

/// Serves `registry` as the Ignition server's `/keelson/` routes over TLS; dropping the
/// returned handle (abort) closes the listener and every connection.
async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, registry: Arc<Registry>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let registry = registry.clone();
        conns.spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move {
                    let method = req.method().clone();
                    let path = req.uri().path().to_string();
                    let body = req.into_body().collect().await?.to_bytes();
                    let (status, body) = registry
                        .handle(&method, &path, peer, body)
                        .unwrap_or((http::StatusCode::NOT_FOUND, Bytes::new()));
                    Ok::<_, hyper::Error>(
                        hyper::Response::builder()
                            .status(status)
                            .body(Full::new(body))
                            .unwrap(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
        while conns.try_join_next().is_some() {}
    }
}

struct Agent {
    child: Child,
    latest: Arc<Mutex<Vec<String>>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    fn names(&self) -> Vec<String> {
        self.latest.lock().unwrap().clone()
    }
}

fn start_agent(dir: &Path, cluster: &Path, ca: &Path, name: &str, addr: &str) -> Agent {
    let node = dir.join(format!("{name}.json"));
    std::fs::write(
        &node,
        serde_json::json!({"name": name, "role": "master", "interface": "lo", "addresses": [addr]})
            .to_string(),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keelson-agent"))
        .arg("members")
        .arg("--cluster")
        .arg(cluster)
        .arg("--node")
        .arg(&node)
        .arg("--ca")
        .arg(ca)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let latest = Arc::new(Mutex::new(Vec::new()));
    let l2 = latest.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(list) = serde_json::from_str::<Vec<serde_json::Value>>(&line) {
                *l2.lock().unwrap() = list
                    .iter()
                    .map(|m| m["name"].as_str().unwrap_or("").to_string())
                    .collect();
            }
        }
    });
    Agent { child, latest }
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if cond() {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

fn names(registry: &Registry) -> Vec<String> {
    registry.list().into_iter().map(|m| m.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_converge_survive_vip_move_and_expire() {
    let tls = tls();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &tls.ca_pem).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let mut v: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    v["apiVips"] = serde_json::json!(["127.0.0.1"]);
    v["ignition"]["tlsPort"] = addr.port().into();
    v["members"] = serde_json::json!({"transport": "unicast", "renewIntervalSecs": RENEW, "expirySecs": EXPIRY});
    let cluster = dir.path().join("cluster.json");
    std::fs::write(&cluster, v.to_string()).unwrap();

    let zone = "ocp4.example.com";
    let reg_a = Arc::new(Registry::new(zone, Duration::from_secs(EXPIRY)));
    let server_a = tokio::spawn(serve(listener, tls.server.clone(), reg_a.clone()));

    let all = ["master-0", "master-1", "master-2"]
        .map(String::from)
        .to_vec();
    let mut agents: Vec<Agent> = all
        .iter()
        .enumerate()
        .map(|(i, n)| {
            start_agent(
                dir.path(),
                &cluster,
                &ca,
                n,
                &format!("127.0.0.{}/8", 10 + i),
            )
        })
        .collect();
    let took = wait_for("convergence", Duration::from_secs(10), || {
        names(&reg_a) == all && agents.iter().all(|a| a.names() == all)
    })
    .await;
    eprintln!("converged in {took:?}");

    // The VIP moves: the old holder's server goes away, a fresh one answers on the address.
    server_a.abort();
    let _ = server_a.await;
    let reg_b = Arc::new(Registry::new(zone, Duration::from_secs(EXPIRY)));
    let listener = TcpListener::bind(addr).await.unwrap();
    let server_b = tokio::spawn(serve(listener, tls.server.clone(), reg_b.clone()));
    let rebuilt = wait_for("rebuild after the VIP move", Duration::from_secs(5), || {
        names(&reg_b) == all
    })
    .await;
    eprintln!("rebuilt in {rebuilt:?} (renewal interval {RENEW}s)");
    assert!(
        rebuilt <= Duration::from_millis(RENEW * 1000 + 700),
        "rebuild took {rebuilt:?}"
    );
    for a in &agents {
        assert_eq!(a.names(), all, "no member lost across the move");
    }

    // SIGKILL master-2: no goodbye; it expires from the registry and from the others.
    drop(agents.pop());
    let t = Instant::now();
    let two = all[..2].to_vec();
    wait_for(
        "expiry of master-2",
        Duration::from_secs(EXPIRY + RENEW + 2),
        || names(&reg_b) == two && agents.iter().all(|a| a.names() == two),
    )
    .await;
    let gone = t.elapsed();
    eprintln!("killed node expired after {gone:?} (expiry {EXPIRY}s)");
    assert!(
        gone >= Duration::from_secs(EXPIRY - 1),
        "expired too early: {gone:?}"
    );

    // SIGTERM master-1: it deregisters at once.
    let stopped = agents.pop().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stopped.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t = Instant::now();
    wait_for("goodbye of master-1", Duration::from_secs(2), || {
        names(&reg_b) == ["master-0"]
    })
    .await;
    eprintln!("stopped node deregistered after {:?}", t.elapsed());
    drop(stopped);
    server_b.abort();
}

#[tokio::test]
async fn untrusted_server_is_refused() {
    // The agent's client refuses a server whose certificate the cluster CA did not sign.
    let good = tls();
    let other = tls();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &good.ca_pem).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reg = Arc::new(Registry::new("ocp4.example.com", Duration::from_secs(5)));
    let server = tokio::spawn(serve(listener, other.server.clone(), reg));
    let client = keelson_agent::members::unicast::client_config(&ca).unwrap();
    let err = keelson_agent::members::unicast::exchange(
        client,
        addr,
        http::Method::GET,
        "/keelson/v1/members",
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, keelson_agent::net::http_client::HttpError::Tls { .. }),
        "{err:#}"
    );
    // A missing CA file is a clear error.
    let err =
        keelson_agent::members::unicast::client_config(&dir.path().join("none.crt")).unwrap_err();
    assert!(format!("{err:#}").contains("cluster CA"), "{err:#}");
    server.abort();
}
