//! Node networking against the real kernel and a real DHCP server, in network namespaces the
//! test creates: static configuration from network_data.json over netlink, and the DHCPv4
//! client against dnsmasq (lease, renew, release on stop).

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keelson_agent::metadata::NetworkData;
use keelson_agent::net::{Netlink, dhcp, plan};

mod netns_common;
use netns_common::{Namespaces, in_netns, root_or_skip, runtime, sh};

#[test]
fn static_network_data_is_applied_over_netlink() {
    if !root_or_skip() {
        return;
    }
    let id = std::process::id() % 10_000;
    let (a, b) = (format!("kins{id}a"), format!("kins{id}b"));
    let _ns = Namespaces::new(&[&a, &b]);
    sh(&[
        "ip", "-n", &a, "link", "add", "eth7", "type", "veth", "peer", "name", "peer7", "netns", &b,
    ]);
    sh(&[
        "ip",
        "-n",
        &a,
        "link",
        "set",
        "eth7",
        "address",
        "52:54:00:77:00:01",
    ]);
    let data: NetworkData = serde_json::from_value(serde_json::json!({
        "links": [{"id": "tap1", "type": "phy", "ethernet_mac_address": "52:54:00:77:00:01", "mtu": 1400}],
        "networks": [{"id": "n0", "type": "ipv4", "link": "tap1", "ip_address": "10.76.0.11",
                      "netmask": "255.255.255.0",
                      "routes": [{"network": "10.99.0.0", "netmask": "255.255.0.0", "gateway": "10.76.0.1"}]}],
        "services": [{"type": "dns", "address": "10.76.0.53"}]
    }))
    .unwrap();
    let configured = in_netns(&a, move || {
        runtime().block_on(async move {
            let netlink = Netlink::connect().unwrap();
            netlink.loopback_up().await.unwrap();
            let links = netlink.links().await.unwrap();
            let p = plan(Some(&data), &links).unwrap();
            let first = netlink.apply(&p).await.unwrap();
            // Applying twice is harmless (a restarted agent does exactly that).
            netlink.apply(&p).await.unwrap();
            first
        })
    })
    .join()
    .unwrap();
    assert_eq!(configured.interface.as_deref(), Some("eth7"));
    assert_eq!(configured.dns, ["10.76.0.53".parse::<IpAddr>().unwrap()]);
    let addr = sh(&["ip", "-n", &a, "-4", "addr", "show", "dev", "eth7"]);
    assert!(addr.contains("inet 10.76.0.11/24"), "{addr}");
    assert!(
        addr.contains("mtu 1400")
            || sh(&["ip", "-n", &a, "link", "show", "eth7"]).contains("mtu 1400")
    );
    let routes = sh(&["ip", "-n", &a, "-4", "route"]);
    assert!(
        routes.contains("10.99.0.0/16 via 10.76.0.1 dev eth7"),
        "{routes}"
    );
    assert!(sh(&["ip", "-n", &a, "link", "show", "lo"]).contains("UP"));
}

struct Dnsmasq(Child);

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

#[test]
fn dhcp_lease_renew_and_release_against_dnsmasq() {
    if !root_or_skip() {
        return;
    }
    if !Path::new("/usr/sbin/dnsmasq").exists() {
        assert!(std::env::var("CI").is_err(), "CI installs dnsmasq-base");
        eprintln!("skipping: no dnsmasq");
        return;
    }
    let id = std::process::id() % 10_000;
    let (srv, cli) = (format!("kind{id}s"), format!("kind{id}c"));
    let _ns = Namespaces::new(&[&srv, &cli]);
    sh(&[
        "ip", "-n", &srv, "link", "add", "dsrv", "type", "veth", "peer", "name", "eth0", "netns",
        &cli,
    ]);
    sh(&[
        "ip",
        "-n",
        &srv,
        "addr",
        "add",
        "10.77.0.1/24",
        "dev",
        "dsrv",
    ]);
    sh(&["ip", "-n", &srv, "link", "set", "dsrv", "up"]);
    let dir = tempfile::tempdir().unwrap();
    let leases = dir.path().join("leases");
    let log = dir.path().join("log");
    let _dnsmasq = Dnsmasq(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &srv,
                "/usr/sbin/dnsmasq",
                "--no-daemon",
                "--conf-file=/dev/null",
            ])
            .args([
                "--interface=dsrv",
                "--bind-interfaces",
                "--port=0",
                "--log-dhcp",
            ])
            .args(["--dhcp-range=10.77.0.50,10.77.0.60,255.255.255.0,2m"])
            .args([
                "--dhcp-option=option:router,10.77.0.1",
                "--dhcp-option=option:dns-server,10.77.0.53",
            ])
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--log-facility={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("dnsmasq to start", Duration::from_secs(10), || {
        log_text().contains("DHCP, IP range")
    });

    let stop = tokio_util::sync::CancellationToken::new();
    let (dns_tx, dns_rx) = tokio::sync::watch::channel(Vec::new());
    let client = {
        let stop = stop.clone();
        in_netns(&cli, move || {
            runtime().block_on(async move {
                let netlink = Netlink::connect().unwrap();
                let links = netlink.links().await.unwrap();
                let eth0 = links.into_iter().find(|l| l.name == "eth0").unwrap();
                netlink.set_up(eth0.index, None).await.unwrap();
                dhcp::run(
                    netlink,
                    eth0,
                    Some("dhcp-test".into()),
                    Some(Duration::from_secs(2)),
                    dns_tx,
                    stop,
                )
                .await
            })
        })
    };
    let addr = || sh(&["ip", "-n", &cli, "-4", "addr", "show", "dev", "eth0"]);
    let took = wait_for("a lease", Duration::from_secs(20), || {
        addr().contains("inet 10.77.0.")
    });
    eprintln!("dhcp lease after {took:?}");
    let routes = sh(&["ip", "-n", &cli, "-4", "route"]);
    assert!(
        routes.contains("default via 10.77.0.1 dev eth0"),
        "{routes}"
    );
    assert_eq!(*dns_rx.borrow(), ["10.77.0.53".parse::<IpAddr>().unwrap()]);
    assert!(
        std::fs::read_to_string(&leases)
            .unwrap()
            .contains("dhcp-test")
    );
    // T1 overridden to 2 s: the client renews (a second DHCPREQUEST/DHCPACK pair).
    wait_for("a renewal", Duration::from_secs(15), || {
        log_text().matches("DHCPACK").count() >= 2
    });
    stop.cancel();
    client.join().unwrap().unwrap();
    wait_for("the release", Duration::from_secs(10), || {
        log_text().contains("DHCPRELEASE")
    });
    assert!(
        !addr().contains("inet 10.77.0."),
        "address removed on release"
    );
    wait_for("dnsmasq to drop the lease", Duration::from_secs(10), || {
        !std::fs::read_to_string(&leases)
            .unwrap_or_default()
            .contains("dhcp-test")
    });
}

/// Issue 19: the DHCP client's interface is deleted under it (netlink calls fail, sends fail
/// with ENODEV) and comes back later with the same MAC: the client looks for it by MAC and
/// gets a lease again, instead of ending and leaving the node without an address.
#[test]
fn dhcp_recovers_when_its_interface_is_deleted_and_comes_back() {
    if !root_or_skip() {
        return;
    }
    let id = std::process::id() % 10_000;
    let (srv, cli) = (format!("kinr{id}s"), format!("kinr{id}c"));
    let _ns = Namespaces::new(&[&srv, &cli]);
    const MAC: &str = "52:54:00:78:00:01";
    sh(&["ip", "-n", &srv, "link", "add", "br0", "type", "bridge"]);
    sh(&[
        "ip",
        "-n",
        &srv,
        "addr",
        "add",
        "10.78.0.1/24",
        "dev",
        "br0",
    ]);
    sh(&["ip", "-n", &srv, "link", "set", "br0", "up"]);
    let plug = || {
        sh(&[
            "ip", "-n", &srv, "link", "add", "p0", "type", "veth", "peer", "name", "eth0", "netns",
            &cli,
        ]);
        sh(&["ip", "-n", &cli, "link", "set", "eth0", "address", MAC]);
        sh(&["ip", "-n", &srv, "link", "set", "p0", "master", "br0", "up"]);
    };
    plug();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let _dnsmasq = Dnsmasq(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &srv,
                "dnsmasq",
                "--no-daemon",
                "--conf-file=/dev/null",
            ])
            .args([
                "--interface=br0",
                "--bind-interfaces",
                "--port=0",
                "--log-dhcp",
            ])
            .args(["--dhcp-range=10.78.0.50,10.78.0.60,255.255.255.0,2m"])
            .arg(format!(
                "--dhcp-leasefile={}",
                dir.path().join("leases").display()
            ))
            .arg(format!("--log-facility={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("dnsmasq to start", Duration::from_secs(10), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("DHCP, IP range")
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let client = {
        let stop = stop.clone();
        in_netns(&cli, move || {
            runtime().block_on(async move {
                let netlink = Netlink::connect().unwrap();
                let links = netlink.links().await.unwrap();
                let eth0 = links.into_iter().find(|l| l.name == "eth0").unwrap();
                netlink.set_up(eth0.index, None).await.unwrap();
                let (dns_tx, _) = tokio::sync::watch::channel(Vec::new());
                dhcp::run(netlink, eth0, None, None, dns_tx, stop).await
            })
        })
    };
    let addr = || {
        Command::new("ip")
            .args(["-n", &cli, "-4", "addr", "show", "dev", "eth0"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    wait_for("the first lease", Duration::from_secs(20), || {
        addr().contains("inet 10.78.0.")
    });
    // The interface goes away (a driver reset, a hot-unplug): netlink and sends fail.
    sh(&["ip", "-n", &cli, "link", "del", "eth0"]);
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !client.is_finished(),
        "the client kept running without its interface"
    );
    plug();
    let took = wait_for(
        "a lease on the interface that came back",
        Duration::from_secs(30),
        || addr().contains("inet 10.78.0."),
    );
    eprintln!("lease again {took:?} after the interface came back");
    stop.cancel();
    client.join().unwrap().unwrap();
}
