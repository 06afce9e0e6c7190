//! The HTTP metadata source against a server on 169.254.169.254 — inside a network namespace
//! the test creates, so nothing leaves the host — read with `keelson-agent metadata`, and the
//! command's errors for a config drive without `openstack/latest` and an unreachable service.

use std::process::Command;

use keelson_testkit::cmd::output_ok;
use keelson_testkit::http::HttpServer;
use keelson_testkit::netns::{bind_tcp_in, if_index_in};
use keelson_testkit::{Netns, require, require_root};

const BIN: &str = env!("CARGO_BIN_EXE_keelson-agent");

/// `keelson-agent metadata --source http` in namespace `ns`.
fn metadata_in(ns: &Netns) -> Command {
    let mut cmd = ns.exec(BIN);
    cmd.args(["metadata", "--source", "http"]);
    cmd
}

#[test]
fn metadata_service_on_the_link_local_address() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("kmd");
    ns.ip(&["addr", "add", "169.254.169.254/32", "dev", "lo"]);
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/openstack-metadata"
    );
    let read = |f: &str| std::fs::read_to_string(format!("{fixtures}/{f}")).unwrap();
    let (meta, network) = (
        read("openstack-config-drive_openstack_meta_data.json"),
        read("ibmcloud-classic_network_data.json"),
    );
    let _server = HttpServer::start(
        bind_tcp_in(ns.name(), ([169, 254, 169, 254], 80).into()),
        [
            ("/openstack/latest/meta_data.json", meta),
            ("/openstack/latest/network_data.json", network),
            (
                "/openstack/latest/user_data",
                r#"{"ignition":{"version":"3.2.0"}}"#.into(),
            ),
        ],
    );
    let out = output_ok(metadata_in(&ns).args(["--timeout", "20"]));
    let md: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(md["source"], "http://169.254.169.254");
    assert_eq!(md["meta_data"]["name"], "abai-fcos-afterburn-test");
    assert_eq!(
        md["network_data"]["networks"][0]["ip_address"],
        "10.135.202.146"
    );
    assert_eq!(md["user_data"], r#"{"ignition":{"version":"3.2.0"}}"#);

    // The same namespace without a server on another port: unreachable, named, bounded.
    let out = metadata_in(&ns)
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
    if !require_root() {
        return;
    }
    let (srv, cli) = (Netns::new("kmd6s"), Netns::new("kmd6c"));
    srv.veth("mdsrv", &cli, "eth0");
    srv.ip(&["addr", "add", "fe80::a9fe:a9fe/64", "dev", "mdsrv", "nodad"]);
    let scope = if_index_in(srv.name(), "mdsrv");
    let at = std::net::SocketAddrV6::new("fe80::a9fe:a9fe".parse().unwrap(), 80, 0, scope);
    let _server = HttpServer::start(
        bind_tcp_in(srv.name(), at.into()),
        [(
            "/openstack/latest/meta_data.json",
            r#"{"uuid":"u-6","name":"master-6"}"#,
        )],
    );
    // The client's own link-local address needs DAD to finish before it can connect: the
    // command retries until then.
    let out = output_ok(metadata_in(&cli).args([
        "--url",
        "http://[fe80::a9fe:a9fe%eth0]",
        "--timeout",
        "20",
    ]));
    let md: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(md["source"], "http://[fe80::a9fe:a9fe%eth0]");
    assert_eq!(md["meta_data"]["name"], "master-6");
    assert!(md["network_data"].is_null(), "404: no network_data");
}

#[test]
fn config_drive_without_openstack_latest_is_named() {
    if !require("xorriso") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("cd.iso");
    std::fs::create_dir_all(dir.path().join("tree/ec2/latest")).unwrap();
    std::fs::write(dir.path().join("tree/ec2/latest/meta-data.json"), "{}").unwrap();
    keelson_testkit::config_drive::iso(&dir.path().join("tree"), &iso, &["-R", "-J"]);
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
