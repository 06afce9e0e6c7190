//! PID 1's first steps as a cloud provides them (`init/cloud.rs`, docs/agent.md "Appliance
//! boot"), run against a "cloud" namespace on the other end of the node's NIC: a config
//! drive that is there or not, a real DHCP server (dnsmasq) handing out the ephemeral lease
//! with Neutron's classless route to the metadata service, the metadata service on
//! `169.254.169.254` or only on `fe80::a9fe:a9fe` on the link. Nothing leaves the
//! namespaces; the config drive is an image file (the host's block devices are not looked
//! at).

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use keelson_agent::init::cloud::{self, CloudSources};
use keelson_agent::metadata::ConfigDriveSource;
use keelson_agent::net::Netlink;
use keelson_testkit::dhcp::DhcpServer;
use keelson_testkit::http::HttpServer;
use keelson_testkit::netns::{bind_tcp_in, if_index_in};
use keelson_testkit::{Netns, require, require_root};
use tokio_util::sync::CancellationToken;

/// The node's NIC, as Nova's network_data.json names it.
const MAC: &str = "52:54:00:31:00:01";
/// The cloud's end of the link.
const GATEWAY: &str = "10.31.0.1";
/// What dnsmasq hands out (the ephemeral lease).
const LEASES: &str = "10.31.0.50,10.31.0.59,255.255.255.0,10m";
/// The static address network_data.json gives the node.
const STATIC: &str = "10.31.0.20/24";

const META_DATA: &str = r#"{"uuid":"0a3e5a8e-31aa-4c31-8f31-31deadbeef31","name":"master-0",
    "hostname":"master-0.novalocal","meta":{"keelson-role":"master"}}"#;

/// network_data.json: the NIC (by MAC) with the static address, as Nova writes it for a
/// subnet without DHCP.
fn network_data_static() -> String {
    serde_json::json!({
        "links": [{"id": "tap31", "type": "phy", "ethernet_mac_address": MAC, "mtu": 1450}],
        "networks": [{"id": "n0", "type": "ipv4", "link": "tap31", "ip_address": "10.31.0.20",
                      "netmask": "255.255.255.0", "routes": []}],
        "services": [{"type": "dns", "address": "10.31.0.53"}]
    })
    .to_string()
}

/// The node's namespace and the cloud's, joined by a veth: `eth0` (the node's only NIC,
/// left down for PID 1 to bring up) and `tap0` (10.31.0.1/24).
fn link() -> (Netns, Netns) {
    let (node, cloud) = (Netns::new("kcn"), Netns::new("kcc"));
    cloud.nic("tap0", &node, "eth0", MAC);
    cloud.ip(&["addr", "add", &format!("{GATEWAY}/24"), "dev", "tap0"]);
    cloud.ip(&["link", "set", "tap0", "up"]);
    (node, cloud)
}

/// A cloud that attached no config drive (its image never appears), looked for 0.5 s.
fn without_a_config_drive() -> CloudSources {
    CloudSources {
        config_drive: ConfigDriveSource {
            device: Some("/nonexistent/keelson-test/config-drive.iso".into()),
        },
        config_drive_wait: Duration::from_millis(500),
        ..CloudSources::default()
    }
}

/// What PID 1 ended with.
struct Booted {
    source: String,
    node_name: Option<String>,
    interface: Option<String>,
    addresses: Vec<IpNet>,
    dns: Vec<IpAddr>,
    dhcp_kept: Vec<String>,
}

/// Runs `cloud::metadata_and_network` in `node` with `sources`, up to 60 s.
fn boot(node: &Netns, sources: CloudSources) -> Booted {
    node.block_on(move || async move {
        let netlink = Netlink::connect().unwrap();
        netlink.loopback_up().await.unwrap();
        let stop = CancellationToken::new();
        let found = tokio::time::timeout(
            Duration::from_secs(60),
            cloud::metadata_and_network(&netlink, &sources, &stop),
        )
        .await
        .expect("metadata and network within 60 s")
        .expect("no error")
        .expect("not stopped");
        let (md, network) = found;
        let booted = Booted {
            source: md.source.clone(),
            node_name: md.node_name().map(String::from),
            interface: network.configured.interface.clone(),
            addresses: network.configured.addresses.clone(),
            dns: network.dns.borrow().clone(),
            dhcp_kept: network
                .dhcp
                .iter()
                .map(|c| c.interface().to_owned())
                .collect(),
        };
        for client in network.dhcp {
            client.stop(false).await;
        }
        booted
    })
    .join()
    .unwrap()
}

/// The node's IPv4 addresses on eth0 (`a.b.c.d/n`).
fn v4_addresses(node: &Netns) -> Vec<String> {
    let out = node.ip(&["-j", "-4", "addr", "show", "dev", "eth0"]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    doc[0]["addr_info"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| format!("{}/{}", i["local"].as_str().unwrap(), i["prefixlen"]))
                .collect()
        })
        .unwrap_or_default()
}

fn can_run() -> bool {
    require_root() && require("dnsmasq")
}

/// A config drive that is there wins: its metadata, its static network, and no DHCP at all
/// (the cloud's DHCP server hears nothing).
#[test]
fn a_config_drive_wins_and_no_dhcp_is_asked() {
    if !can_run() || !require("xorriso") {
        return;
    }
    let (node, cloud) = link();
    let dhcp = DhcpServer::start(cloud.name(), "tap0", LEASES, &[]);
    let dir = tempfile::tempdir().unwrap();
    let network = network_data_static();
    let drive = keelson_testkit::config_drive::iso_of(
        dir.path(),
        &[
            ("openstack/latest/meta_data.json", META_DATA.as_bytes()),
            ("openstack/latest/network_data.json", network.as_bytes()),
        ],
    );
    let booted = boot(
        &node,
        CloudSources {
            config_drive: ConfigDriveSource {
                device: Some(drive.clone()),
            },
            ..CloudSources::default()
        },
    );
    assert_eq!(booted.source, format!("config-drive:{}", drive.display()));
    assert_eq!(booted.node_name.as_deref(), Some("master-0"));
    assert_eq!(booted.interface.as_deref(), Some("eth0"));
    assert_eq!(booted.addresses, [STATIC.parse::<IpNet>().unwrap()]);
    assert_eq!(booted.dns, ["10.31.0.53".parse::<IpAddr>().unwrap()]);
    assert!(booted.dhcp_kept.is_empty());
    assert_eq!(v4_addresses(&node), [STATIC]);
    let log = dhcp.log();
    assert!(!log.contains("DHCPDISCOVER"), "DHCP was asked:\n{log}");
}

/// No config drive: an ephemeral DHCPv4 lease on the NIC (with the classless route to
/// 169.254.169.254), the metadata service over IPv4, then network_data.json's static
/// address replaces the lease, whose address and routes are removed.
#[test]
fn without_a_config_drive_the_lease_reaches_the_metadata_service_and_is_retired() {
    if !can_run() {
        return;
    }
    let (node, cloud) = link();
    cloud.ip(&["addr", "add", "169.254.169.254/32", "dev", "lo"]);
    let network = network_data_static();
    let service = HttpServer::start(
        bind_tcp_in(cloud.name(), ([169, 254, 169, 254], 80).into()),
        [
            ("/openstack/latest/meta_data.json", META_DATA.to_owned()),
            ("/openstack/latest/network_data.json", network),
        ],
    );
    let route =
        format!("option:classless-static-route,169.254.169.254/32,{GATEWAY},0.0.0.0/0,{GATEWAY}");
    let dhcp = DhcpServer::start(cloud.name(), "tap0", LEASES, &[&route]);
    let booted = boot(&node, without_a_config_drive());
    assert_eq!(booted.source, "http://169.254.169.254");
    assert_eq!(booted.node_name.as_deref(), Some("master-0"));
    assert!(
        service
            .requests()
            .contains(&"/openstack/latest/meta_data.json".to_owned()),
        "{:?}",
        service.requests()
    );
    // The lease was taken...
    let log = dhcp.log();
    assert!(log.contains("DHCPACK"), "{log}");
    assert!(dhcp.leases().contains(MAC), "{}", dhcp.leases());
    // ...and retired: the static address alone, the lease's routes gone.
    assert_eq!(booted.addresses, [STATIC.parse::<IpNet>().unwrap()]);
    assert!(booted.dhcp_kept.is_empty());
    assert_eq!(v4_addresses(&node), [STATIC]);
    let routes = node.ip(&["-4", "route"]);
    assert!(!routes.contains("169.254.169.254"), "{routes}");
    assert!(!routes.contains("default"), "{routes}");
}

/// No config drive, a lease but no metadata service on IPv4 (nothing at 169.254.169.254):
/// PID 1 finds it over IPv6 at `fe80::a9fe:a9fe` on its NIC's link. Without
/// network_data.json the NIC keeps DHCP, the client still running.
#[test]
fn with_ipv4_metadata_unreachable_the_ipv6_link_local_service_answers() {
    if !can_run() {
        return;
    }
    let (node, cloud) = link();
    cloud.ip(&["addr", "add", "fe80::a9fe:a9fe/64", "dev", "tap0", "nodad"]);
    let scope = if_index_in(cloud.name(), "tap0");
    let at = std::net::SocketAddrV6::new("fe80::a9fe:a9fe".parse().unwrap(), 80, 0, scope);
    let service = HttpServer::start(
        bind_tcp_in(cloud.name(), at.into()),
        [("/openstack/latest/meta_data.json", META_DATA)],
    );
    let dhcp = DhcpServer::start(
        cloud.name(),
        "tap0",
        LEASES,
        &[&format!("option:router,{GATEWAY}")],
    );
    let booted = boot(&node, without_a_config_drive());
    assert_eq!(booted.source, "http://[fe80::a9fe:a9fe%eth0]");
    assert_eq!(booted.node_name.as_deref(), Some("master-0"));
    assert!(
        service
            .requests()
            .contains(&"/openstack/latest/meta_data.json".to_owned())
    );
    // IPv4 was there (a lease), the metadata service on it was not.
    assert!(dhcp.log().contains("DHCPACK"), "{}", dhcp.log());
    assert_eq!(booted.dhcp_kept, ["eth0"]);
    let [lease] = booted.addresses.as_slice() else {
        panic!("one address, the lease's: {:?}", booted.addresses);
    };
    assert!(lease.to_string().starts_with("10.31.0.5"), "{lease}");
    assert_eq!(v4_addresses(&node), [lease.to_string()]);
}
