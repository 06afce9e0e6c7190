//! The agent's Ignition service on loopback: TLS from files, ports from cluster.json,
//! bootstrap mode from the node's role, and the bus.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::node::NodeIdentity;
use keelson_cluster::{ClusterConfig, SpecVersion};

/// How long a test waits for the service's ready mark: the start-up (certificates read,
/// two listeners bound) of a debug build on a loaded 2-core machine. The tests judge what
/// is served, not how fast the service starts; 5 s failed once in a `make test` whose
/// unit tests took 116 s instead of 6 (load average 21).
const READY_LIMIT: Duration = Duration::from_secs(60);

const CLUSTER_JSON: &str = r#"{
  "version": 1, "name": "ocp4", "baseDomain": "osd2019.local",
  "machineNetworks": ["10.0.0.0/16"], "apiVips": ["10.0.0.5"], "ingressVips": ["10.0.0.7"],
  "vrrp": {"instances": []},
  "api": {"frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
          "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 2,
          "connectTimeoutMs": 1000, "idleTimeoutSecs": 3600, "maxConnections": 1000},
  "dns": {"port": 53, "ttl": 30, "manageResolvConf": false},
  "ignition": {"tlsPort": 0, "plainPort": 0, "allowedNetworks": [], "spec": "3.2.0"},
  "members": {"transport": "mdns", "renewIntervalSecs": 10, "expirySecs": 30}
}"#;

struct Fake;
impl ConfigSource for Fake {
    fn config(
        &self,
        pool: Role,
        spec: SpecVersion,
    ) -> Result<Bytes, keelson_cluster::server::SourceError> {
        Ok(Bytes::from(format!(
            "{{\"pool\":\"{pool}\",\"spec\":\"{spec}\"}}"
        )))
    }
}

fn write_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "agent test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

fn ctx(role: &str) -> AgentContext {
    let cluster = ClusterConfig::from_json(CLUSTER_JSON.as_bytes()).unwrap();
    let node = NodeIdentity::from_json(
        format!(r#"{{"name":"n0","role":"{role}","interface":"lo","addresses":["127.0.0.1/8"]}}"#)
            .as_bytes(),
        "node.json",
    )
    .unwrap();
    AgentContext::new(cluster, node)
}

fn paths(dir: &Path) -> Paths {
    Paths {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        assets_dir: dir.join("assets"),
        self_asset: None,
    }
}

/// curl on the host: the status and the body.
fn curl(args: &[&str]) -> (String, Vec<u8>) {
    let reply = keelson_testkit::http::curl(args);
    (reply.status.to_string(), reply.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_node_serves_master_and_sets_the_bus() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    std::fs::create_dir(dir.path().join("assets")).unwrap();
    std::fs::write(dir.path().join("assets/keelson-agent"), b"agent bytes").unwrap();
    let ctx = ctx("bootstrap");
    let bus = ctx.bus.clone();
    let mut ready = bus.ready.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        IgnitionService::new(Fake)
            .with_paths(paths(dir.path()))
            .with_listen_ip("127.0.0.1".parse().unwrap())
            .run(ctx, stop.clone()),
    );
    tokio::time::timeout(READY_LIMIT, ready.wait_for(|r| r.contains("ignition")))
        .await
        .expect("ready within READY_LIMIT")
        .unwrap();
    assert!(*bus.ignition_running.borrow());
    let status = bus.views.ignition.read().expect("ignition view");
    assert!(status.bootstrap);
    assert_eq!(
        status.allowed_networks,
        vec!["10.0.0.0/16".parse().unwrap()]
    );
    let (tls, plain) = (status.tls.unwrap(), status.plain.unwrap());
    assert_ne!(tls.port(), 0);
    let ca = dir.path().join("ca.crt").display().to_string();
    let results = tokio::task::spawn_blocking(move || {
        let resolve = format!("localhost:{}:127.0.0.1", tls.port());
        let url = |p: &str| format!("https://localhost:{}{p}", tls.port());
        let accept = "Accept: application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1";
        [
            curl(&[
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                "-H",
                accept,
                &url("/config/master"),
            ]),
            curl(&[
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                "-H",
                accept,
                &url("/config/worker"),
            ]),
            curl(&[&format!("http://{plain}/assets/keelson-agent")]),
        ]
    })
    .await
    .unwrap();
    assert_eq!(
        results[0],
        (
            "200".into(),
            br#"{"pool":"master","spec":"3.4.0"}"#.to_vec()
        )
    );
    assert_eq!(results[1].0, "500");
    assert_eq!(results[2], ("200".into(), b"agent bytes".to_vec()));
    // Every answer is counted, with the spec served (the metrics read these).
    let counted: Vec<(String, String, String, u16, u64)> = bus
        .views
        .ignition
        .read()
        .unwrap()
        .requests
        .into_iter()
        .map(|r| (r.route, r.pool, r.spec, r.status, r.count))
        .collect();
    let c = |route: &str, pool: &str, spec: &str, status| {
        (route.into(), pool.into(), spec.into(), status, 1)
    };
    assert_eq!(
        counted,
        vec![
            c("asset", "", "", 200),
            c("config", "master", "3.4.0", 200),
            c("config", "worker", "", 500),
        ]
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops within 5 s")
        .unwrap()
        .unwrap();
    assert!(!*bus.ignition_running.borrow());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_serves_worker_and_its_own_binary() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    let ctx = ctx("master");
    let bus = ctx.bus.clone();
    let stop = CancellationToken::new();
    let mut p = paths(dir.path());
    p.self_asset = Some(AGENT_ASSET.into());
    let task = tokio::spawn(
        IgnitionService::new(Fake)
            .with_paths(p)
            .with_listen_ip("127.0.0.1".parse().unwrap())
            .run(ctx, stop.clone()),
    );
    let mut ready = bus.ready.subscribe();
    tokio::time::timeout(READY_LIMIT, ready.wait_for(|r| r.contains("ignition")))
        .await
        .expect("ready within READY_LIMIT")
        .unwrap();
    let plain = bus.views.ignition.read().unwrap().plain.unwrap();
    let (worker, exe_len) = tokio::task::spawn_blocking(move || {
        let w = curl(&[&format!("http://{plain}/config/worker")]);
        // The asset is this very test binary: compare sizes via HEAD, not 100 MB of bytes.
        let head =
            keelson_testkit::http::curl(&["-I", &format!("http://{plain}/assets/{AGENT_ASSET}")]);
        (w, head.headers.to_ascii_lowercase())
    })
    .await
    .unwrap();
    assert_eq!(
        worker,
        (
            "200".into(),
            br#"{"pool":"worker","spec":"2.2.0"}"#.to_vec()
        )
    );
    let exe = std::fs::metadata(std::env::current_exe().unwrap())
        .unwrap()
        .len();
    assert!(
        exe_len.contains(&format!("content-length: {exe}\r\n")),
        "{exe_len}"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn missing_tls_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx("master");
    let bus = ctx.bus.clone();
    let err = IgnitionService::new(Fake)
        .with_paths(paths(dir.path()))
        .with_listen_ip("127.0.0.1".parse().unwrap())
        .run(ctx, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("server.crt"), "{err:#}");
    assert!(!*bus.ignition_running.borrow());
    assert!(!bus.ready.borrow().contains("ignition"));
}
