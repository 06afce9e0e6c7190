//! The Ignition config server over real sockets: HTTPS with a test CA (rcgen) and plain
//! HTTP on 127.0.0.1, driven by curl, the way an operator or a probe would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use keelson_cluster::routes::ExtraRoutes;
use keelson_cluster::server::{
    Assets, BoundServer, ConfigSource, IgnitionServer, ServerOptions, SourceError, tls_config,
};
use keelson_cluster::{Role, SpecVersion};
use keelson_testkit::http::Reply;
use tokio_util::sync::CancellationToken;

/// Renders a small deterministic JSON per (pool, spec), counts renderings and records the
/// spec each one was negotiated to.
#[derive(Default)]
struct Fake {
    calls: Arc<AtomicUsize>,
    specs: Arc<std::sync::Mutex<Vec<SpecVersion>>>,
}

fn fake_config(pool: Role, spec: SpecVersion) -> Vec<u8> {
    format!("{{\"ignition\":{{\"version\":\"{spec}\"}},\"pool\":\"{pool}\"}}").into_bytes()
}

impl ConfigSource for Fake {
    fn config(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.specs.lock().unwrap().push(spec);
        Ok(fake_config(pool, spec).into())
    }
}

/// A CA and a server certificate for `localhost` / 127.0.0.1, in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "keelson test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        Self {
            dir,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }
}

struct Running {
    tls: SocketAddr,
    plain: SocketAddr,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
    pki: Pki,
    calls: Arc<AtomicUsize>,
    specs: Arc<std::sync::Mutex<Vec<SpecVersion>>>,
    _assets_dir: tempfile::TempDir,
}

async fn start(edit: impl FnOnce(&mut ServerOptions, &Path)) -> Running {
    let pki = Pki::new();
    let assets_dir = tempfile::tempdir().unwrap();
    let mut opts = ServerOptions {
        tls_listen: Some("127.0.0.1:0".parse().unwrap()),
        plain_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServerOptions::default()
    };
    edit(&mut opts, assets_dir.path());
    let assets = Assets::from_dir(assets_dir.path()).unwrap();
    let fake = Fake::default();
    let calls = fake.calls.clone();
    let specs = fake.specs.clone();
    let tls = tls_config(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes(), "test").unwrap();
    let server = IgnitionServer::new(fake, assets, opts)
        .with_tls(tls)
        .with_extra_routes(Arc::new(Echo));
    let bound: BoundServer = server.bind().await.unwrap();
    let (tls, plain) = (bound.tls_addr().unwrap(), bound.plain_addr().unwrap());
    let stop = CancellationToken::new();
    let done = tokio::spawn({
        let stop = stop.clone();
        async move { bound.serve(stop).await.unwrap() }
    });
    Running {
        tls,
        plain,
        stop,
        done,
        pki,
        calls,
        specs,
        _assets_dir: assets_dir,
    }
}

/// `/keelson/echo` answers 201 with what it got, and the header `x-echo: yes`; other
/// `/keelson/` paths are not its.
struct Echo;
impl ExtraRoutes for Echo {
    fn handle(
        &self,
        method: &http::Method,
        path: &str,
        peer: SocketAddr,
        body: Bytes,
    ) -> Option<(http::StatusCode, Bytes)> {
        (path == "/keelson/echo").then(|| {
            let out = format!(
                "{{\"method\":\"{method}\",\"peer\":\"{}\",\"len\":{}}}",
                peer.ip(),
                body.len()
            );
            (http::StatusCode::CREATED, Bytes::from(out))
        })
    }

    fn headers(&self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        vec![(
            http::HeaderName::from_static("x-echo"),
            http::HeaderValue::from_static("yes"),
        )]
    }
}

/// curl on the host (in a blocking thread), which must get an HTTP answer.
async fn curl(args: Vec<String>) -> Reply {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = keelson_testkit::http::curl(&args);
        assert_eq!(reply.exit, Some(0), "curl {args:?}: {}", reply.error);
        reply
    })
    .await
    .unwrap()
}

impl Running {
    fn https(&self, path: &str) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.pki.ca_path().display().to_string(),
            "--resolve".into(),
            format!("localhost:{}:127.0.0.1", self.tls.port()),
            format!("https://localhost:{}{path}", self.tls.port()),
        ]
    }

    fn http(&self, path: &str) -> Vec<String> {
        vec![format!("http://{}{path}", self.plain)]
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.done)
            .await
            .expect("server stops within 5 s")
            .unwrap();
    }
}

fn with(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    v.append(&mut args);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_matrix_end_to_end_over_tls_and_plain() {
    let s = start(|_, _| {}).await;
    let ign = "application/vnd.coreos.ignition+json";
    let cases: Vec<(Option<String>, SpecVersion)> = vec![
        (None, SpecVersion::V2_2),
        (Some("*/*".into()), SpecVersion::V2_2),
        (
            Some(format!("{ign};version=3.0.0, */*;q=0.1")),
            SpecVersion::V3_0,
        ),
        (
            Some(format!("{ign};version=3.1.0, */*;q=0.1")),
            SpecVersion::V3_1,
        ),
        (
            Some(format!("{ign};version=3.2.0, */*;q=0.1")),
            SpecVersion::V3_2,
        ),
        (
            Some(format!("{ign};version=3.3.0, */*;q=0.1")),
            SpecVersion::V3_3,
        ),
        (
            Some(format!("{ign};version=3.4.0, */*;q=0.1")),
            SpecVersion::V3_4,
        ),
        (
            Some(format!("{ign};version=3.5.0, */*;q=0.1")),
            SpecVersion::V3_5,
        ),
        (
            Some(format!("{ign};version=3.6.0, */*;q=0.1")),
            SpecVersion::NEWEST,
        ),
        (
            Some(format!(
                "{ign}; version=2.2.0, {ign}; version=1; q=0.5, */*; q=0.1"
            )),
            SpecVersion::V2_2,
        ),
    ];
    for (pool, role) in [("master", Role::Master), ("worker", Role::Worker)] {
        for (accept, spec) in &cases {
            for tls in [true, false] {
                let path = format!("/config/{pool}");
                let args = if tls { s.https(&path) } else { s.http(&path) };
                let args = match accept {
                    Some(a) => with(args, &["-H", &format!("Accept: {a}")]),
                    // curl sends `Accept: */*` unless told not to.
                    None => with(args, &["-H", "Accept:"]),
                };
                let r = curl(args).await;
                assert_eq!(r.status, 200, "{pool} {accept:?} tls={tls}");
                assert_eq!(
                    r.body,
                    fake_config(role, *spec),
                    "{pool} {accept:?} tls={tls}"
                );
                assert_eq!(
                    r.header("content-type").as_deref(),
                    Some("application/json")
                );
                assert_eq!(r.header("content-length"), Some(r.body.len().to_string()));
            }
        }
    }
    // Rendered once per (pool, spec): 7 specs per pool, then served from the cache.
    assert_eq!(s.calls.load(Ordering::SeqCst), 2 * 7);
    let bad = curl(with(
        s.https("/config/master"),
        &["-H", &format!("Accept: {ign};version=4.0.0, */*;q=0.1")],
    ))
    .await;
    assert_eq!(bad.status, 400);
    assert!(String::from_utf8_lossy(&bad.body).contains("4.0.0"));
    let old = curl(with(
        s.http("/config/worker"),
        &["-H", &format!("Accept: {ign}; version=2.1.0, */*; q=0.1")],
    ))
    .await;
    assert_eq!(old.status, 400);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_codes() {
    let s = start(|_, _| {}).await;
    for (path, status) in [
        ("/healthz", 200),
        ("/config/master", 200),
        ("/config/infra", 404),
        ("/config/bootstrap", 404),
        ("/config/", 404),
        ("/config/master/", 404),
        ("/config/../x", 404),
        ("/config/../config/master", 404),
        ("/config/./master", 404),
        ("/config%2Fmaster", 404),
        ("/config/master%2F..%2Fworker", 404),
        ("//config/master", 404),
        ("/config//master", 404),
        ("/assets/../tls/server.key", 404),
        ("/assets/nope", 404),
        ("/", 404),
        ("/nothing", 404),
        ("/keelson/unknown", 404),
    ] {
        for args in [s.http(path), s.https(path)] {
            let r = curl(args).await;
            assert_eq!(r.status, status, "GET {path}");
        }
    }
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let r = curl(with(s.http("/config/master"), &["-X", method])).await;
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD"));
    }
    // Query strings do not change the route.
    assert_eq!(curl(s.http("/config/master?x=1")).await.status, 200);
    // Extra routes get every method, the body, and the peer.
    let r = curl(with(
        s.http("/keelson/echo"),
        &["-X", "POST", "--data-binary", "hello"],
    ))
    .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body, br#"{"method":"POST","peer":"127.0.0.1","len":5}"#);
    // With the handler's own headers (the registry names its membership key so).
    assert_eq!(r.header("x-echo").as_deref(), Some("yes"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_has_length_and_no_body() {
    let s = start(|_, _| {}).await;
    let accept = "Accept: application/vnd.coreos.ignition+json;version=3.2.0";
    for args in [s.http("/config/master"), s.https("/config/worker")] {
        let get = curl(with(args.clone(), &["-H", accept])).await;
        let head = curl(with(args, &["-I", "-H", accept])).await;
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("content-length"),
            Some(get.body.len().to_string())
        );
        assert_eq!(
            head.header("content-type").as_deref(),
            Some("application/json")
        );
    }
    // Over a raw socket: exactly the header block, nothing after it.
    let plain = s.plain;
    let raw = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(plain).unwrap();
        c.write_all(b"HEAD /config/master HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let len = fake_config(Role::Master, SpecVersion::V2_2).len();
    assert!(
        text.to_ascii_lowercase()
            .contains(&format!("content-length: {len}\r\n")),
        "{text}"
    );
    assert!(
        text.ends_with("\r\n\r\n"),
        "body after HEAD headers: {text:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_accept_lines_count_as_one_list() {
    let s = start(|_, _| {}).await;
    let plain = s.plain;
    let raw = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(plain).unwrap();
        c.write_all(
            b"GET /config/worker HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\
              Accept: application/vnd.coreos.ignition+json;version=3.3.0\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body = String::from_utf8(fake_config(Role::Worker, SpecVersion::V3_3)).unwrap();
    assert!(text.ends_with(&body), "{text}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_mode_answers_500_for_worker() {
    let s = start(|o, _| o.bootstrap = true).await;
    assert_eq!(curl(s.https("/config/worker")).await.status, 500);
    assert_eq!(curl(s.http("/config/worker")).await.status, 500);
    let m = curl(s.https("/config/master")).await;
    assert_eq!(m.status, 200);
    assert_eq!(m.body, fake_config(Role::Master, SpecVersion::V2_2));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outside_the_allowed_networks_get_403() {
    let s = start(|o, _| {
        o.allowed_networks = vec!["10.0.0.0/8".parse().unwrap()];
        o.allow_loopback = false;
    })
    .await;
    for path in [
        "/config/master",
        "/config/worker",
        "/assets/keelson-agent",
        "/keelson/echo",
        "/nothing",
    ] {
        assert_eq!(curl(s.http(path)).await.status, 403, "{path}");
        assert_eq!(curl(s.https(path)).await.status, 403, "{path}");
    }
    // Probes still see it alive.
    assert_eq!(curl(s.http("/healthz")).await.status, 200);
    assert_eq!(
        s.calls.load(Ordering::SeqCst),
        0,
        "nothing rendered for a refused client"
    );
    s.stop().await;
    // Loopback allowed (the default), same networks otherwise: 200.
    let s = start(|o, _| o.allowed_networks = vec!["10.0.0.0/8".parse().unwrap()]).await;
    assert_eq!(curl(s.http("/config/master")).await.status, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_are_served_byte_exact() {
    // 3 MiB of non-repeating bytes (an xorshift stream), like an agent binary.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let blob: Vec<u8> = (0..3 * 1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let b2 = blob.clone();
    let s = start(move |_, dir| {
        std::fs::write(dir.join("keelson-agent"), &b2).unwrap();
        std::fs::write(dir.join(".secret"), b"no").unwrap();
    })
    .await;
    for args in [
        s.http("/assets/keelson-agent"),
        s.https("/assets/keelson-agent"),
    ] {
        let r = curl(args).await;
        assert_eq!(r.status, 200);
        assert!(
            r.body == blob,
            "asset differs ({} bytes vs {})",
            r.body.len(),
            blob.len()
        );
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/octet-stream")
        );
        assert_eq!(r.header("content-length"), Some(blob.len().to_string()));
    }
    let h = curl(with(s.http("/assets/keelson-agent"), &["-I"])).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some(blob.len().to_string()));
    assert_eq!(curl(s.http("/assets/.secret")).await.status, 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_real() {
    let s = start(|_, _| {}).await;
    let port = s.tls.port();
    // A client that does not trust the test CA refuses the server (curl exit 60).
    let untrusted = tokio::task::spawn_blocking(move || {
        keelson_testkit::http::curl(&[
            "--cacert",
            "/dev/null",
            "--capath",
            "/nonexistent",
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
            &format!("https://localhost:{port}/healthz"),
        ])
    })
    .await
    .unwrap();
    assert!(
        matches!(untrusted.exit, Some(60) | Some(77)),
        "{untrusted:?}"
    );
    // Plain HTTP to the TLS port is not answered as HTTP.
    let plain = tokio::task::spawn_blocking(move || {
        keelson_testkit::http::curl(&[
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/healthz"),
        ])
    })
    .await
    .unwrap();
    assert_ne!(plain.exit, Some(0), "{plain:?}");
    s.stop().await;
}

#[test]
fn bad_tls_material_is_a_clear_error() {
    let pki = Pki::new();
    let e = tls_config(b"not pem", pki.key_pem.as_bytes(), "server.crt").unwrap_err();
    assert!(
        e.to_string().contains("server.crt") && e.to_string().contains("CERTIFICATE"),
        "{e}"
    );
    let e = tls_config(pki.cert_pem.as_bytes(), b"", "server.key").unwrap_err();
    assert!(e.to_string().contains("private key"), "{e}");
    // A key that is not the certificate's.
    let other = rcgen::KeyPair::generate().unwrap().serialize_pem();
    assert!(tls_config(pki.cert_pem.as_bytes(), other.as_bytes(), "x").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop() {
    let s = start(|_, _| {}).await;
    let plain = s.plain;
    // An idle keep-alive connection and one in the middle of sending a request.
    let (idle, mut busy) = tokio::task::spawn_blocking(move || {
        let mut idle = TcpStream::connect(plain).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        let n = idle.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let mut busy = TcpStream::connect(plain).unwrap();
        busy.write_all(b"GET /config/master HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        (idle, busy)
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The request in flight still gets its answer, then the connection closes.
    let reply = tokio::task::spawn_blocking(move || {
        busy.write_all(b"\r\n").unwrap();
        busy.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let _ = busy.read_to_end(&mut out);
        out
    })
    .await
    .unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    tokio::time::timeout(Duration::from_secs(5), s.done)
        .await
        .expect("serve returns after stop")
        .unwrap();
    // The idle connection was closed, and nobody listens any more.
    let mut idle = idle;
    idle.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(idle.read(&mut buf).unwrap_or(0), 0);
    assert!(TcpStream::connect(plain).is_err());
}

/// The Ignition program of Debian's `ignition` package (2.14, what the RHCOS stand-in's
/// initramfs runs), where setup.sh installs it.
const IGNITION_BIN: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

/// The exact header Ignition 2.14 sends (its `internal/resource/url.go`).
const IGNITION_2_14_ACCEPT: &str = "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1";

/// The real Ignition 2.14 fetches a pointer config's merge from our server, over TLS with
/// the pointer's CA as a data URL (what `master.ign` is): its stage `fetch` succeeds and the
/// server negotiated spec 3.3.0 from its Accept header. Then the header itself, as sent on
/// the wire, is the one the negotiation tests name.
#[tokio::test]
async fn ignition_binary_fetches_a_pointer_merge_and_gets_3_3() {
    if !keelson_testkit::require_file(IGNITION_BIN, "Ignition 2.14") {
        return;
    }
    let r = start(|_, _| {}).await;
    let work = tempfile::tempdir().unwrap();
    let ca = std::fs::read(r.pki.ca_path()).unwrap();
    let pointer = serde_json::json!({
        "ignition": {
            "version": "3.3.0",
            "config": {"merge": [{"source": format!("https://127.0.0.1:{}/config/master", r.tls.port())}]},
            "security": {"tls": {"certificateAuthorities": [
                {"source": keelson_cluster::render::plain_data_url(&ca)}
            ]}}
        }
    });
    let config = work.path().join("config.ign");
    std::fs::write(&config, serde_json::to_vec(&pointer).unwrap()).unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let cache = work.path().join("cache.json");
    let out = {
        let (root, cache, config, state, neednet) = (
            root.clone(),
            cache.clone(),
            config.clone(),
            work.path().join("state"),
            work.path().join("neednet"),
        );
        tokio::task::spawn_blocking(move || {
            Command::new("timeout")
                .arg("60")
                .arg(IGNITION_BIN)
                .args(["-platform", "file", "-stage", "fetch", "-log-to-stdout"])
                .arg("-root")
                .arg(&root)
                .arg("-config-cache")
                .arg(&cache)
                .arg("-state-file")
                .arg(&state)
                .arg("-neednet")
                .arg(&neednet)
                .env("IGNITION_CONFIG_FILE", &config)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "ignition failed:\n{log}");
    assert!(
        log.contains(&format!(
            "fetched referenced config at https://127.0.0.1:{}/config/master",
            r.tls.port()
        )),
        "{log}"
    );
    assert_eq!(
        r.specs.lock().unwrap().as_slice(),
        [SpecVersion::V3_3],
        "{log}"
    );
    // The config Ignition goes on with (its own internal spec, translated up) is cached.
    let merged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    assert!(merged["ignition"]["version"].is_string(), "{merged}");
    r.stop.cancel();
    r.done.await.unwrap();

    // The header on the wire: a listener that records one request and answers a config.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let recorder = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed mid-request");
            request.extend_from_slice(&buf[..n]);
        }
        let body = br#"{"ignition":{"version":"3.3.0"}}"#;
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        conn.write_all(body).unwrap();
        String::from_utf8_lossy(&request).into_owned()
    });
    let plain = serde_json::json!({"ignition": {"version": "3.3.0", "config": {"merge": [
        {"source": format!("http://127.0.0.1:{port}/config/master")}
    ]}}});
    std::fs::write(&config, serde_json::to_vec(&plain).unwrap()).unwrap();
    let _ = std::fs::remove_file(&cache);
    let status = Command::new("timeout")
        .arg("60")
        .arg(IGNITION_BIN)
        .args(["-platform", "file", "-stage", "fetch", "-log-to-stdout"])
        .arg("-root")
        .arg(&root)
        .arg("-config-cache")
        .arg(&cache)
        .arg("-state-file")
        .arg(work.path().join("state2"))
        .arg("-neednet")
        .arg(work.path().join("neednet2"))
        .env("IGNITION_CONFIG_FILE", &config)
        .output()
        .unwrap();
    let request = recorder.join().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    let accept = request
        .lines()
        .find_map(|l| l.strip_prefix("Accept: "))
        .unwrap_or_else(|| panic!("no Accept header in {request:?}"));
    assert_eq!(accept, IGNITION_2_14_ACCEPT);
    assert_eq!(
        keelson_cluster::negotiate::negotiate(Some(accept.as_bytes())).unwrap(),
        SpecVersion::V3_3
    );
}
