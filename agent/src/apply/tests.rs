use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use std::io::Write;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn b64(bytes: &[u8]) -> String {
    format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn sha512(bytes: &[u8]) -> String {
    format!("sha512-{}", hex::encode(Sha512::digest(bytes)))
}

#[tokio::test]
async fn writes_files_directories_keys_and_refuses_units() {
    let root = tempfile::tempdir().unwrap();
    let cluster = br#"{"name":"ocp4"}"#;
    let compressed = gzip(b"big file contents\n");
    let config = serde_json::json!({
        "ignition": {"version": "3.2.0"},
        "storage": {
            "directories": [{"path": "/var/lib/keelson", "mode": 448}],
            "files": [
                {"path": "/etc/keelson/cluster.json", "mode": 420,
                 "contents": {"source": b64(cluster), "verification": {"hash": sha512(cluster)}}},
                {"path": "/etc/keelson/role", "contents": {"source": "data:,master%0A"}},
                {"path": "/etc/big", "mode": 384,
                 "contents": {"source": b64(&compressed), "compression": "gzip",
                              "verification": {"hash": sha512(b"big file contents\n")}}},
            ]
        },
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA k"]}]},
        "systemd": {"units": [{"name": "keelson-agent.service", "enabled": true},
                              {"name": "operator.service", "enabled": true}]}
    });
    let applied = apply_user_data(&serde_json::to_vec(&config).unwrap(), root.path())
        .await
        .unwrap();
    let read = |p: &str| std::fs::read(root.path().join(p)).unwrap();
    assert_eq!(read("etc/keelson/cluster.json"), cluster);
    assert_eq!(read("etc/keelson/role"), b"master\n");
    assert_eq!(read("etc/big"), b"big file contents\n");
    assert_eq!(
        read("home/core/.ssh/authorized_keys.d/ignition"),
        b"ssh-ed25519 AAAA k\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(root.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("etc/big"), 0o600);
    assert_eq!(mode("var/lib/keelson"), 0o700);
    assert_eq!(applied.files_written.len(), 4);
    // The agent's own unit needs nothing here (the agent is PID 1); another unit is refused.
    assert_eq!(applied.refused.len(), 1, "{:?}", applied.refused);
    assert!(
        applied.refused[0].contains("operator.service"),
        "{:?}",
        applied.refused
    );
}

#[tokio::test]
async fn bad_input_is_named() {
    let root = tempfile::tempdir().unwrap();
    let cases = [
        (serde_json::json!({"x": 1}), "ignition.version"),
        (
            serde_json::json!({"ignition": {"version": "1.0.0"}}),
            "ignition.version",
        ),
        (
            serde_json::json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
                {"path": "/etc/../../escape", "contents": {"source": "data:,x"}}]}}),
            "storage.files[0].path",
        ),
        (
            serde_json::json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
                {"path": "/etc/x", "contents": {"source": "data:,x",
                 "verification": {"hash": sha512(b"y")}}}]}}),
            "storage.files[0].contents.verification.hash",
        ),
        (
            serde_json::json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
                {"path": "/etc/x", "contents": {"source": "data:,x", "compression": "xz"}}]}}),
            "compression",
        ),
    ];
    for (config, field) in cases {
        let err = apply_user_data(&serde_json::to_vec(&config).unwrap(), root.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    assert!(apply_user_data(b"not json", root.path()).await.is_err());
    assert!(!root.path().join("escape").exists());
}

/// An HTTPS server with a fresh CA; the first `fail_first` requests get HTTP 500.
async fn https_server(body: Vec<u8>, fail_first: usize) -> (String, String, Arc<AtomicUsize>) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/config/master", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let (status, body) = if n < fail_first {
                    ("500 Internal Server Error", Vec::new())
                } else {
                    ("200 OK", body)
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(&body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (url, ca.pem(), count)
}

#[tokio::test]
async fn pointer_config_is_fetched_with_the_ca_retried_on_500_and_verified() {
    let full = serde_json::to_vec(&serde_json::json!({
        "ignition": {"version": "3.2.0"},
        "storage": {"files": [{"path": "/etc/keelson/role", "contents": {"source": "data:,master"}}]}
    }))
    .unwrap();
    let (url, ca_pem, count) = https_server(full.clone(), 2).await;
    let pointer = serde_json::json!({
        "ignition": {
            "version": "3.2.0",
            "config": {"merge": [{"source": url, "verification": {"hash": sha512(&full)}}]},
            "security": {"tls": {"certificateAuthorities": [{"source": b64(ca_pem.as_bytes())}]}}
        }
    });
    let root = tempfile::tempdir().unwrap();
    let applied = apply_user_data(&serde_json::to_vec(&pointer).unwrap(), root.path())
        .await
        .unwrap();
    assert_eq!(applied.fetched, std::slice::from_ref(&url));
    assert_eq!(count.load(Ordering::SeqCst), 3, "two 500s, then the config");
    assert_eq!(
        std::fs::read(root.path().join("etc/keelson/role")).unwrap(),
        b"master"
    );

    // A 3.1+ CA may come gzip-compressed, saying so.
    let gz_pointer = serde_json::json!({
        "ignition": {
            "version": "3.2.0",
            "config": {"merge": [{"source": url}]},
            "security": {"tls": {"certificateAuthorities": [
                {"source": b64(&gzip(ca_pem.as_bytes())), "compression": "gzip"}]}}
        }
    });
    let root = tempfile::tempdir().unwrap();
    apply_user_data(&serde_json::to_vec(&gz_pointer).unwrap(), root.path())
        .await
        .unwrap();
    assert!(root.path().join("etc/keelson/role").exists());

    // 2.2 pointer (`append`) with a wrong hash: a clear error, nothing written.
    let pointer22 = serde_json::json!({
        "ignition": {
            "version": "2.2.0",
            "config": {"append": [{"source": url, "verification": {"hash": sha512(b"other")}}]},
            "security": {"tls": {"certificateAuthorities": [{"source": b64(ca_pem.as_bytes())}]}}
        }
    });
    let root = tempfile::tempdir().unwrap();
    let err = apply_user_data(&serde_json::to_vec(&pointer22).unwrap(), root.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ignition.config.append[0].verification.hash"),
        "{err}"
    );

    // Without the CA the server is not trusted.
    let untrusted = serde_json::json!({
        "ignition": {"version": "3.2.0", "config": {"merge": [{"source": url}]},
                     "security": {"tls": {"certificateAuthorities": [
                         {"source": b64(https_server(vec![], 0).await.1.as_bytes())}]}}}
    });
    let err = apply_user_data_with(
        &serde_json::to_vec(&untrusted).unwrap(),
        root.path(),
        &ApplyOptions {
            fetch_timeout: Some(Duration::from_secs(2)),
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("TLS"), "{err}");
}

#[tokio::test]
async fn remote_files_are_fetched_once_and_reused_when_the_hash_matches() {
    let binary = b"\x7fELF a service binary".repeat(100);
    let (url, ca_pem, count) = https_server(binary.clone(), 0).await;
    let url = url.replace("/config/master", "/assets/svc");
    let config = |hash: String| {
        serde_json::to_vec(&serde_json::json!({
            "ignition": {"version": "3.2.0",
                "security": {"tls": {"certificateAuthorities": [{"source": b64(ca_pem.as_bytes())}]}}},
            "storage": {"files": [{"path": "/usr/local/bin/svc", "mode": 493,
                "contents": {"source": url, "verification": {"hash": hash}}}]}
        }))
        .unwrap()
    };
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("usr/local/bin/svc");
    apply_user_data(&config(sha512(&binary)), root.path())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), binary);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // A second boot: the file is there with the right hash, so nothing is downloaded.
    apply_user_data(&config(sha512(&binary)), root.path())
        .await
        .unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1, "reused, not fetched again");
    // A stale local copy does not count: it is fetched and then fails verification.
    std::fs::write(&target, b"stale").unwrap();
    let err = apply_user_data_with(
        &config(sha512(b"what the server does not have")),
        root.path(),
        &ApplyOptions {
            fetch_timeout: Some(Duration::from_secs(5)),
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert!(
        err.contains("storage.files[0].contents.verification.hash"),
        "{err}"
    );
}

/// The URL of a server whose answer to any request is an endless body.
async fn endless_server() -> String {
    format!(
        "http://{}/big",
        keelson_testkit::http::endless_http_server().await
    )
}

#[tokio::test]
async fn a_gzip_bomb_and_an_endless_download_are_refused_and_the_rest_applied() {
    let root = tempfile::tempdir().unwrap();
    // 65 MiB of zeros is about 65 KiB of gzip: a bomb a user_data can carry.
    let bomb = gzip(&vec![0u8; MAX_FILE_BYTES + (1 << 20)]);
    assert!(bomb.len() < 100 << 10);
    let config = serde_json::json!({
        "ignition": {"version": "3.2.0"},
        "storage": {"files": [
            {"path": "/etc/bomb", "contents": {"source": b64(&bomb), "compression": "gzip"}},
            {"path": "/etc/endless", "contents": {"source": endless_server().await}},
            {"path": "/etc/keelson/role", "contents": {"source": "data:,master%0A"}},
        ]}
    });
    let applied = apply_user_data(&serde_json::to_vec(&config).unwrap(), root.path())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(root.path().join("etc/keelson/role")).unwrap(),
        b"master\n",
        "the rest of the config is applied"
    );
    assert!(!root.path().join("etc/bomb").exists());
    assert!(!root.path().join("etc/endless").exists());
    let limit = MAX_FILE_BYTES.to_string();
    assert_eq!(applied.refused.len(), 2, "{:?}", applied.refused);
    assert!(
        applied.refused[0].contains("storage.files[0].contents")
            && applied.refused[0].contains(&limit)
            && applied.refused[0].contains("once decompressed"),
        "{:?}",
        applied.refused
    );
    assert!(
        applied.refused[1].contains("storage.files[1].contents.source")
            && applied.refused[1].contains(&limit),
        "{:?}",
        applied.refused
    );
}

#[tokio::test]
async fn an_oversized_config_is_refused_naming_the_limit() {
    let root = tempfile::tempdir().unwrap();
    let huge = vec![b' '; MAX_CONFIG_BYTES + 1];
    let err = apply_user_data(&huge, root.path()).await.unwrap_err();
    assert!(
        err.to_string().contains(&MAX_CONFIG_BYTES.to_string()),
        "{err}"
    );
    // A pointer to an endless config: refused, not retried forever.
    let config = serde_json::json!({
        "ignition": {"version": "3.2.0", "config": {"merge": [{"source": endless_server().await}]}}
    });
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        apply_user_data(&serde_json::to_vec(&config).unwrap(), root.path()),
    )
    .await
    .expect("refused at once, not retried")
    .unwrap_err();
    assert!(
        err.to_string().contains(&MAX_CONFIG_BYTES.to_string()),
        "{err}"
    );
}

/// A plain HTTP server that, as Glance does for `/v2/images/<id>/file`, answers `body` only
/// to a request carrying `X-Auth-Token: <token>`, and 401 to any other.
async fn token_server(body: Vec<u8>, token: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v2/images/0c6f/file",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = tcp.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let sent = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("x-auth-token")
                        .then(|| value.trim())
                });
                let (status, body) = if sent == Some(token) {
                    ("200 OK", body)
                } else {
                    ("401 Unauthorized", Vec::new())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(&body).await;
            });
        }
    });
    url
}

/// The hosted bootstrap (docs/openstack.md): the pointer `keelson pointer` writes is followed
/// with its `httpHeaders`, and the hosted copy verified against its sha512.
#[tokio::test]
async fn a_hosted_config_is_fetched_with_its_headers() {
    use keelson_cluster::render::hosted::{HostedSource, pointer_to};
    let full = serde_json::to_vec(&serde_json::json!({
        "ignition": {"version": "3.2.0"},
        "storage": {"files": [{"path": "/etc/keelson/role", "contents": {"source": "data:,bootstrap"}}]}
    }))
    .unwrap();
    let url = token_server(full.clone(), "gAAAAB-token").await;
    let source = |token: &str| HostedSource {
        url: url.clone(),
        headers: vec![("X-Auth-Token".into(), token.into())],
        cas: vec![],
    };
    let root = tempfile::tempdir().unwrap();
    let pointer = pointer_to(&full, &source("gAAAAB-token")).unwrap();
    let applied = apply_user_data(&pointer, root.path()).await.unwrap();
    assert_eq!(applied.fetched, std::slice::from_ref(&url));
    assert_eq!(
        std::fs::read(root.path().join("etc/keelson/role")).unwrap(),
        b"bootstrap"
    );
    // Another token: Glance's 401, for good (a 4xx is not retried), nothing written.
    let root = tempfile::tempdir().unwrap();
    let err = apply_user_data(&pointer_to(&full, &source("expired")).unwrap(), root.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("401"), "{err}");
    assert!(!root.path().join("etc/keelson/role").exists());
    // A header value no HTTP request can carry is named.
    let bad = serde_json::json!({"ignition": {"version": "3.2.0", "config": {"merge": [
        {"source": url, "httpHeaders": [{"name": "X-Auth-Token", "value": "a\nb"}]}]}}});
    let err = apply_user_data(&serde_json::to_vec(&bad).unwrap(), root.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ignition.config.merge[0].httpHeaders[0]"),
        "{err}"
    );
}
