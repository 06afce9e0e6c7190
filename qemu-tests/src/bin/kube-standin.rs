//! `kube-standin`: plays kube-apiserver on the QEMU cluster's masters (docs/qemu-cluster.md), and with
//! `--plain` the ingress router's readiness endpoint on the workers.
//!
//! A tiny HTTPS server with a self-signed certificate (plain HTTP with `--plain`):
//! `GET /readyz`, `/healthz` and `/healthz/ready` answer `ok`, `GET /version` answers JSON
//! naming the node, so the harness can see which node answered through a VIP. Shipped in the
//! test image and started by the agent's supervisor as an operator service (`cluster.json`
//! `services`). Blocking, a thread per connection: it serves a test, not a cluster.
//!
//! `--slow-readyz-if FILE`: while FILE exists, `/readyz` answers after 1, 2, 3 s in turn —
//! an overloaded apiserver that is slow but alive (`bench/vip_soak.sh`).
//!
//! `--control` (the router): `GET /router/stop` makes `/healthz/ready` answer 503, as a
//! router that stops does before it exits, and `GET /router/start` 200 again; `--stopped`
//! starts it that way. The harness starts and stops routers with it on nodes it has no shell
//! on (the appliance). A test fixture: anyone on the segment may ask.
//!
//! `--mcs DIR`: plays OpenShift's machine-config-server instead (the QEMU cluster beside
//! openshift-install, docs/qemu-cluster.md): HTTPS with `DIR/tls.crt` and `DIR/tls.key` (a
//! certificate for `api-int.<cluster>.<baseDomain>` from OpenShift's root CA, as the real
//! one has), `GET /config/<pool>` answering `DIR/<pool>.ign`, `/healthz`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let mut listen = "0.0.0.0:6443".to_owned();
    let mut name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mut plain = false;
    let mut slow_if: Option<std::path::PathBuf> = None;
    let mut control = false;
    let mut stopped = false;
    let mut mcs: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().context("--listen needs ADDR:PORT")?,
            "--name" => name = args.next().context("--name needs a node name")?,
            "--plain" => plain = true,
            "--control" => control = true,
            "--stopped" => stopped = true,
            "--slow-readyz-if" => {
                slow_if = Some(args.next().context("--slow-readyz-if needs a file")?.into())
            }
            "--mcs" => mcs = Some(args.next().context("--mcs needs a directory")?.into()),
            other => anyhow::bail!(
                "unknown argument {other:?} (expected --listen, --name, --plain, --slow-readyz-if, --control, --stopped, --mcs)"
            ),
        }
    }
    if let Ok(env_name) = std::env::var("KEELSON_NODE_NAME") {
        name = env_name;
    }
    let (certs, key) = match &mcs {
        Some(dir) => mcs_identity(dir)?,
        None => {
            let cert =
                rcgen::generate_simple_self_signed(vec![name.clone(), "kube-standin".into()])?;
            (
                vec![cert.cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
            )
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    let config = Arc::new(config);
    let mcs = Arc::new(mcs);
    let slow = Arc::new(Slow {
        file: slow_if,
        turn: std::sync::atomic::AtomicUsize::new(0),
        control,
        stopped: std::sync::atomic::AtomicBool::new(stopped),
    });
    let listener = TcpListener::bind(&listen).with_context(|| format!("binding {listen}"))?;
    let scheme = if plain { "http" } else { "https" };
    eprintln!("kube-standin: serving {scheme}://{listen} as {name}");
    for stream in listener.incoming() {
        let Ok(mut tcp) = stream else { continue };
        let config = config.clone();
        let name = name.clone();
        let slow = slow.clone();
        let mcs = mcs.clone();
        std::thread::spawn(move || -> Result<()> {
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            let mcs = mcs.as_deref();
            if plain {
                return serve(&mut tcp, &name, &slow, mcs, |_| {});
            }
            let mut conn = rustls::ServerConnection::new(config)?;
            let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
            serve(&mut tls, &name, &slow, mcs, |tls| {
                tls.conn.send_close_notify()
            })
        });
    }
    Ok(())
}

/// The machine-config-server's certificate chain and key, from `DIR/tls.crt` and
/// `DIR/tls.key` (PEM).
fn mcs_identity(
    dir: &std::path::Path,
) -> Result<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    use rustls::pki_types::pem::PemObject;
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(&cert)
        .with_context(|| cert.display().to_string())?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| cert.display().to_string())?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key)
        .with_context(|| key.display().to_string())?;
    Ok((certs, key))
}

/// `--slow-readyz-if`: the file, and whose turn of the 1/2/3 s delays is next; `--control`:
/// whether the router is stopped.
struct Slow {
    file: Option<std::path::PathBuf>,
    turn: std::sync::atomic::AtomicUsize,
    control: bool,
    stopped: std::sync::atomic::AtomicBool,
}

impl Slow {
    /// How long `/readyz` waits now.
    fn delay(&self) -> std::time::Duration {
        match &self.file {
            Some(f) if f.exists() => {
                let t = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::time::Duration::from_secs(1 + (t % 3) as u64)
            }
            _ => std::time::Duration::ZERO,
        }
    }
}

/// Answers requests on one connection until the client closes or asks to;
/// `close_notify` ends the transport's session before the last flush.
fn serve<S: Read + Write>(
    stream: &mut S,
    name: &str,
    slow: &Slow,
    mcs: Option<&std::path::Path>,
    close_notify: impl Fn(&mut S),
) -> Result<()> {
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut close = false;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
                break;
            }
            if header.to_ascii_lowercase().starts_with("connection: close") {
                close = true;
            }
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("/");
        if path == "/readyz" {
            std::thread::sleep(slow.delay());
        }
        use std::sync::atomic::Ordering::Relaxed;
        // Pools are plain names (`master`, `worker`): nothing else is looked up.
        let config = |pool: &str| {
            mcs.filter(|_| !pool.is_empty() && pool.chars().all(|c| c.is_ascii_lowercase()))
                .and_then(|dir| std::fs::read(dir.join(format!("{pool}.ign"))).ok())
        };
        let text = |s: &str| s.as_bytes().to_vec();
        let (status, kind, body) = match path {
            "/router/stop" | "/router/start" if slow.control => {
                slow.stopped.store(path == "/router/stop", Relaxed);
                eprintln!("kube-standin: {path}");
                ("200 OK", "text/plain", text("ok"))
            }
            "/healthz/ready" if slow.stopped.load(Relaxed) => {
                ("503 Service Unavailable", "text/plain", text("stopped"))
            }
            "/readyz" | "/healthz" | "/livez" | "/healthz/ready" => {
                ("200 OK", "text/plain", text("ok"))
            }
            "/version" => (
                "200 OK",
                "text/plain",
                text(&format!(
                    r#"{{"gitVersion":"v0.0.0-keelson-standin","node":"{name}"}}"#
                )),
            ),
            p if p.starts_with("/config/") => match config(&p["/config/".len()..]) {
                Some(bytes) => ("200 OK", "application/json", bytes),
                None => ("404 Not Found", "text/plain", text("not found")),
            },
            _ => ("404 Not Found", "text/plain", text("not found")),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nX-Node: {name}\r\n{}\r\n",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        reader.get_mut().write_all(head.as_bytes())?;
        reader.get_mut().write_all(&body)?;
        reader.get_mut().flush()?;
        if close {
            close_notify(reader.get_mut());
            let _ = reader.get_mut().flush();
            return Ok(());
        }
    }
}
