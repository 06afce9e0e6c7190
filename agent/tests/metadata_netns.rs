//! The HTTP metadata source against a server on 169.254.169.254 — inside a network namespace
//! the test creates, so nothing leaves the host — read with `keelson-agent metadata`, and the
//! command's errors for a config drive without `openstack/latest` and an unreachable service.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_keelson-agent");

mod netns_common;
use netns_common::root_or_skip;

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tiny HTTP server in the namespace serving `routes` (path -> body), 404 otherwise.
fn serve_in(ns: &str, routes: Vec<(&'static str, String)>) {
    serve_on(ns, None, routes)
}

/// [`serve_in`] on 169.254.169.254:80, or on `[fe80::a9fe:a9fe%<link>]:80` with a link.
fn serve_on(ns: &str, link_local_on: Option<&str>, routes: Vec<(&'static str, String)>) {
    let path = format!("/run/netns/{ns}");
    let link = link_local_on.map(str::to_owned);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let listener = match link {
            None => TcpListener::bind("169.254.169.254:80").unwrap(),
            Some(link) => {
                let index = nix::net::if_::if_nametoindex(link.as_str()).unwrap();
                let addr =
                    std::net::SocketAddrV6::new("fe80::a9fe:a9fe".parse().unwrap(), 80, 0, index);
                TcpListener::bind(addr).unwrap()
            }
        };
        tx.send(()).unwrap();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 2048];
            let n = conn.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let wanted = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let (status, body) = routes
                .iter()
                .find(|(p, _)| *p == wanted)
                .map(|(_, b)| ("200 OK", b.clone()))
                .unwrap_or(("404 Not Found", String::new()));
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    rx.recv().unwrap();
}

#[test]
fn metadata_service_on_the_link_local_address() {
    if !root_or_skip() {
        return;
    }
    let ns = Netns(format!("kmd{}", std::process::id() % 100_000));
    let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    ip(&[
        "-n",
        &ns.0,
        "addr",
        "add",
        "169.254.169.254/32",
        "dev",
        "lo",
    ]);
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/openstack-metadata"
    );
    let read = |f: &str| std::fs::read_to_string(format!("{fixtures}/{f}")).unwrap();
    serve_in(
        &ns.0,
        vec![
            (
                "/openstack/latest/meta_data.json",
                read("openstack-config-drive_openstack_meta_data.json"),
            ),
            (
                "/openstack/latest/network_data.json",
                read("ibmcloud-classic_network_data.json"),
            ),
            (
                "/openstack/latest/user_data",
                r#"{"ignition":{"version":"3.2.0"}}"#.to_owned(),
            ),
        ],
    );
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            BIN,
            "metadata",
            "--source",
            "http",
            "--timeout",
            "20",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(md["source"], "http://169.254.169.254");
    assert_eq!(md["meta_data"]["name"], "abai-fcos-afterburn-test");
    assert_eq!(
        md["network_data"]["networks"][0]["ip_address"],
        "10.135.202.146"
    );
    assert_eq!(md["user_data"], r#"{"ignition":{"version":"3.2.0"}}"#);

    // The same namespace without a server on another port: unreachable, named, bounded.
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, BIN, "metadata", "--source", "http"])
        .args(["--url", "http://169.254.169.254:8775", "--timeout", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("169.254.169.254:8775"), "{err}");
}

/// Nova's metadata service over IPv6 (`fe80::a9fe:a9fe` on the instance's link), for
/// networks without IPv4: the agent reaches it with the NIC as the address's zone.
#[test]
fn metadata_service_on_the_ipv6_link_local_address() {
    if !root_or_skip() {
        return;
    }
    let id = std::process::id() % 100_000;
    let (srv, cli) = (Netns(format!("kmd6s{id}")), Netns(format!("kmd6c{id}")));
    for ns in [&srv.0, &cli.0] {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        ip(&["netns", "add", ns]);
    }
    ip(&[
        "-n", &srv.0, "link", "add", "mdsrv", "type", "veth", "peer", "name", "eth0", "netns",
        &cli.0,
    ]);
    ip(&[
        "-n",
        &srv.0,
        "addr",
        "add",
        "fe80::a9fe:a9fe/64",
        "dev",
        "mdsrv",
        "nodad",
    ]);
    ip(&["-n", &srv.0, "link", "set", "mdsrv", "up"]);
    ip(&["-n", &cli.0, "link", "set", "eth0", "up"]);
    serve_on(
        &srv.0,
        Some("mdsrv"),
        vec![(
            "/openstack/latest/meta_data.json",
            r#"{"uuid":"u-6","name":"master-6"}"#.to_owned(),
        )],
    );
    // The client's own link-local address needs DAD to finish before it can connect: the
    // command retries until then.
    let out = Command::new("ip")
        .args(["netns", "exec", &cli.0, BIN, "metadata", "--source", "http"])
        .args(["--url", "http://[fe80::a9fe:a9fe%eth0]", "--timeout", "20"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(md["source"], "http://[fe80::a9fe:a9fe%eth0]");
    assert_eq!(md["meta_data"]["name"], "master-6");
    assert!(md["network_data"].is_null(), "404: no network_data");
}

#[test]
fn config_drive_without_openstack_latest_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tree/ec2/latest")).unwrap();
    std::fs::write(dir.path().join("tree/ec2/latest/meta-data.json"), "{}").unwrap();
    let iso = dir.path().join("cd.iso");
    let made = Command::new("xorriso")
        .args([
            "-as", "mkisofs", "-quiet", "-R", "-J", "-V", "config-2", "-o",
        ])
        .arg(&iso)
        .arg(dir.path().join("tree"))
        .status();
    if !made.is_ok_and(|s| s.success()) {
        assert!(std::env::var("CI").is_err(), "CI installs xorriso");
        return;
    }
    let out = Command::new(BIN)
        .args([
            "metadata",
            "--source",
            "config-drive",
            "--timeout",
            "1",
            "--device",
        ])
        .arg(&iso)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("openstack/latest/meta_data.json") && err.contains("cd.iso"),
        "{err}"
    );
}
