//! Node networking against the real kernel and a real DHCP server, in network namespaces the
//! test creates: static configuration from network_data.json over netlink, and the DHCPv4
//! client against dnsmasq (lease, renew, release on stop).

use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use keelson_agent::metadata::NetworkData;
use keelson_agent::metadata::network_plan::plan;
use keelson_agent::net::{Netlink, dhcp};
use keelson_testkit::dhcp::DhcpServer;
use keelson_testkit::{Netns, require, require_root, wait_for};

#[test]
fn static_network_data_is_applied_over_netlink() {
    if !require_root() {
        return;
    }
    let (a, b) = (Netns::new("kinsa"), Netns::new("kinsb"));
    a.ip(&[
        "link",
        "add",
        "eth7",
        "type",
        "veth",
        "peer",
        "name",
        "peer7",
        "netns",
        b.name(),
    ]);
    a.ip(&["link", "set", "eth7", "address", "52:54:00:77:00:01"]);
    let data: NetworkData = serde_json::from_value(serde_json::json!({
        "links": [{"id": "tap1", "type": "phy", "ethernet_mac_address": "52:54:00:77:00:01", "mtu": 1400}],
        "networks": [{"id": "n0", "type": "ipv4", "link": "tap1", "ip_address": "10.76.0.11",
                      "netmask": "255.255.255.0",
                      "routes": [{"network": "10.99.0.0", "netmask": "255.255.0.0", "gateway": "10.76.0.1"}]}],
        "services": [{"type": "dns", "address": "10.76.0.53"}]
    }))
    .unwrap();
    let configured = a
        .block_on(move || async move {
            let netlink = Netlink::connect().unwrap();
            netlink.loopback_up().await.unwrap();
            let links = netlink.links().await.unwrap();
            let p = plan(Some(&data), &links).unwrap();
            let first = netlink.apply(&p).await.unwrap();
            // Applying twice is harmless (a restarted agent does exactly that).
            netlink.apply(&p).await.unwrap();
            first
        })
        .join()
        .unwrap();
    assert_eq!(configured.interface.as_deref(), Some("eth7"));
    assert_eq!(configured.dns, ["10.76.0.53".parse::<IpAddr>().unwrap()]);
    let addr = a.ip(&["-4", "addr", "show", "dev", "eth7"]);
    assert!(addr.contains("inet 10.76.0.11/24"), "{addr}");
    assert!(addr.contains("mtu 1400") || a.ip(&["link", "show", "eth7"]).contains("mtu 1400"));
    let routes = a.ip(&["-4", "route"]);
    assert!(
        routes.contains("10.99.0.0/16 via 10.76.0.1 dev eth7"),
        "{routes}"
    );
    assert!(a.ip(&["link", "show", "lo"]).contains("UP"));
}

/// The agent's DHCPv4 client on `eth0` of `ns` (brought up first), until `stop`.
fn dhcp_client(
    ns: &Netns,
    hostname: Option<&str>,
    t1: Option<Duration>,
    dns_tx: tokio::sync::watch::Sender<Vec<IpAddr>>,
    stop: &tokio_util::sync::CancellationToken,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let (hostname, stop) = (hostname.map(str::to_owned), stop.clone());
    ns.block_on(move || async move {
        let netlink = Netlink::connect().unwrap();
        let links = netlink.links().await.unwrap();
        let eth0 = links.into_iter().find(|l| l.name == "eth0").unwrap();
        netlink.set_up(eth0.index, None).await.unwrap();
        dhcp::run(netlink, eth0, hostname, t1, dns_tx, stop).await
    })
}

#[test]
fn dhcp_lease_renew_and_release_against_dnsmasq() {
    if !require_root() || !require("dnsmasq") {
        return;
    }
    let (srv, cli) = (Netns::new("kinds"), Netns::new("kindc"));
    srv.veth("dsrv", &cli, "eth0");
    srv.ip(&["addr", "add", "10.77.0.1/24", "dev", "dsrv"]);
    let dnsmasq = DhcpServer::start(
        srv.name(),
        "dsrv",
        "10.77.0.50,10.77.0.60,255.255.255.0,2m",
        &["option:router,10.77.0.1", "option:dns-server,10.77.0.53"],
    );

    let stop = tokio_util::sync::CancellationToken::new();
    let (dns_tx, dns_rx) = tokio::sync::watch::channel(Vec::new());
    let client = dhcp_client(
        &cli,
        Some("dhcp-test"),
        Some(Duration::from_secs(2)),
        dns_tx,
        &stop,
    );
    let addr = || cli.ip(&["-4", "addr", "show", "dev", "eth0"]);
    let took = wait_for("a lease", Duration::from_secs(20), || {
        addr().contains("inet 10.77.0.")
    });
    eprintln!("dhcp lease after {took:?}");
    let routes = cli.ip(&["-4", "route"]);
    assert!(
        routes.contains("default via 10.77.0.1 dev eth0"),
        "{routes}"
    );
    assert_eq!(*dns_rx.borrow(), ["10.77.0.53".parse::<IpAddr>().unwrap()]);
    assert!(dnsmasq.leases().contains("dhcp-test"));
    // T1 overridden to 2 s: the client renews (a second DHCPREQUEST/DHCPACK pair).
    wait_for("a renewal", Duration::from_secs(15), || {
        dnsmasq.log().matches("DHCPACK").count() >= 2
    });
    stop.cancel();
    client.join().unwrap().unwrap();
    wait_for("the release", Duration::from_secs(10), || {
        dnsmasq.log().contains("DHCPRELEASE")
    });
    assert!(
        !addr().contains("inet 10.77.0."),
        "address removed on release"
    );
    wait_for("dnsmasq to drop the lease", Duration::from_secs(10), || {
        !dnsmasq.leases().contains("dhcp-test")
    });
}

/// The DHCP client's interface is deleted under it (netlink calls fail, sends fail
/// with ENODEV) and comes back later with the same MAC: the client looks for it by MAC and
/// gets a lease again, instead of ending and leaving the node without an address.
#[test]
fn dhcp_recovers_when_its_interface_is_deleted_and_comes_back() {
    if !require_root() || !require("dnsmasq") {
        return;
    }
    let (srv, cli) = (Netns::new("kinrs"), Netns::new("kinrc"));
    const MAC: &str = "52:54:00:78:00:01";
    srv.ip(&["link", "add", "br0", "type", "bridge"]);
    srv.ip(&["addr", "add", "10.78.0.1/24", "dev", "br0"]);
    srv.ip(&["link", "set", "br0", "up"]);
    // eth0 left down: the client brings it up, the first time and after it comes back.
    let plug = || {
        srv.nic("p0", &cli, "eth0", MAC);
        srv.ip(&["link", "set", "p0", "master", "br0", "up"]);
    };
    plug();
    let _dnsmasq = DhcpServer::start(
        srv.name(),
        "br0",
        "10.78.0.50,10.78.0.60,255.255.255.0,2m",
        &[],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let (dns_tx, _dns_rx) = tokio::sync::watch::channel(Vec::new());
    let client = dhcp_client(&cli, None, None, dns_tx, &stop);
    // Not `Netns::ip`: the interface is missing for a while, and that is no failure.
    let addr = || {
        Command::new("ip")
            .args(["-n", cli.name(), "-4", "addr", "show", "dev", "eth0"])
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    wait_for("the first lease", Duration::from_secs(20), || {
        addr().contains("inet 10.78.0.")
    });
    // The interface goes away (a driver reset, a hot-unplug): netlink and sends fail.
    cli.ip(&["link", "del", "eth0"]);
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
