use super::*;
use crate::cluster::{ClusterConfig, Role};

const EXAMPLE: &str = include_str!("../../../examples/install-config.yaml");
const EXAMPLE_42: &str = include_str!("../../../examples/install-config-4.2.yaml");

#[test]
fn current_example() {
    let ic = InstallConfig::parse(EXAMPLE).unwrap();
    assert_eq!(
        (ic.name.as_str(), ic.base_domain.as_str()),
        ("ocp4", "osd2019.local")
    );
    assert_eq!((ic.masters, ic.workers), (3, 2));
    assert_eq!(
        ic.machine_networks,
        ["10.0.0.0/16".parse::<IpNet>().unwrap()]
    );
    assert_eq!(ic.api_vips, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
    assert_eq!(ic.ingress_vips, ["10.0.0.7".parse::<IpAddr>().unwrap()]);
    assert_eq!(ic.ssh_keys.len(), 1);
    let cluster = ic.cluster_config();
    cluster.check().unwrap();
    let (api, ingress) = default_vrids("ocp4");
    assert_eq!(cluster.instance("api").unwrap().vrid, api);
    assert_eq!(cluster.instance("ingress").unwrap().vrid, ingress);
    assert_eq!(
        cluster.instance("api").unwrap().priorities.bootstrap,
        Some(70)
    );
    assert_eq!(cluster.zone(), "ocp4.osd2019.local");
}

/// The API instance's priorities with every check passing except those named.
fn api_priority(cluster: &ClusterConfig, role: Role, failing: &[&str]) -> i32 {
    let api = cluster.instance("api").unwrap();
    let base = i32::from(api.priorities.for_role(role).unwrap());
    let weights: i32 = api
        .checks
        .iter()
        .filter(|c| !failing.contains(&c.name.as_str()))
        .map(|c| c.weight)
        .sum();
    base + weights
}

#[test]
fn a_dead_local_apiserver_moves_the_vip_between_masters_only() {
    let cluster = InstallConfig::parse(EXAMPLE).unwrap().cluster_config();
    let check = cluster
        .instance("api")
        .unwrap()
        .checks
        .iter()
        .find(|c| c.name == "local-apiserver")
        .expect("the local-apiserver check");
    assert_eq!(check.check, HealthCheckKind::LocalApiserver);
    // Slow is not dead: a 1-3 s /readyz passes; a dead one fails within 2 probes (4 s).
    assert_eq!(check.timeout().as_secs(), 10);
    assert_eq!((check.interval_ms, check.fall), (2000, 2));
    let master = api_priority(&cluster, Role::Master, &[]);
    let master_dead_api = api_priority(&cluster, Role::Master, &["local-apiserver"]);
    let bootstrap_dead_api = api_priority(&cluster, Role::Bootstrap, &["local-apiserver"]);
    assert_eq!(master, 120);
    assert!(
        master_dead_api < master,
        "a healthy master takes the VIP over"
    );
    assert!(
        bootstrap_dead_api > master,
        "the bootstrap keeps the VIP (it serves Ignition) whatever its apiserver does"
    );
    // A master whose proxy has no backend loses to one whose apiserver alone is dead.
    assert!(api_priority(&cluster, Role::Master, &["api-proxy"]) < master_dead_api);
}

#[test]
fn the_42_era_form() {
    let ic = InstallConfig::parse(EXAMPLE_42).unwrap();
    assert_eq!(ic.name, "ocp4");
    assert_eq!(ic.api_vips, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
    assert_eq!(ic.ingress_vips, ["10.0.0.7".parse::<IpAddr>().unwrap()]);
    assert_eq!(ic.machine_networks[0].to_string(), "10.0.0.0/16");
    assert!(ic.api_floating_ip.is_some(), "lbFloatingIP kept");
    assert!(
        ic.notes.iter().any(|n| n.contains("computeFlavor")),
        "{:?}",
        ic.notes
    );
}

fn err(yaml: &str) -> String {
    InstallConfig::parse(yaml).unwrap_err().to_string()
}

fn with(from: &str, to: &str) -> String {
    assert!(EXAMPLE.contains(from), "{from}");
    EXAMPLE.replacen(from, to, 1)
}

#[test]
fn bad_input_names_field_and_expectation() {
    assert_eq!(
        err(&with("replicas: 3", "replicas: three")),
        "controlPlane.replicas: expected an integer from 1 to 4096, got \"three\""
    );
    assert_eq!(
        err(&with("replicas: 3", "replicas: 0")),
        "controlPlane.replicas: expected an integer from 1 to 4096, got 0"
    );
    // A pool bigger than a cluster can be names the bound; pools that together are too
    // many name their sum.
    assert_eq!(
        err(&with("replicas: 3", "replicas: 5000")),
        "controlPlane.replicas: expected an integer from 1 to 4096, got 5000"
    );
    let many = EXAMPLE.replace("replicas: 2", "replicas: 2100");
    assert!(
        many.contains("replicas: 2100"),
        "the example has a compute pool of 2"
    );
    let two_pools = many.replace("compute:\n", "compute:\n- name: infra\n  replicas: 2100\n");
    assert_eq!(
        err(&two_pools),
        "compute[].replicas: 3 masters and 4200 workers are 4203 nodes; a keelson cluster holds at most 4096 (every members registry keeps that many records; docs/scale.md)"
    );
    // 4,096 nodes in all is accepted.
    let most = EXAMPLE.replace("replicas: 2", "replicas: 4093");
    assert_eq!(InstallConfig::parse(&most).unwrap().workers, 4093);
    assert!(err(&with("    - 10.0.0.5", "    - 192.168.1.5")).starts_with(
        "platform.openstack.apiVIPs[0]: expected an address inside the machine network (10.0.0.0/16), got 192.168.1.5"
    ));
    assert_eq!(
        err(&with("    - 10.0.0.7", "    - 10.0.0.5")),
        "platform.openstack.ingressVIPs: expected a VIP different from the API VIP, got 10.0.0.5"
    );
    assert!(
        err(&with("    - 10.0.0.5", "    - not-an-ip"))
            .starts_with("platform.openstack.apiVIPs[0]: expected an IP address")
    );
    assert!(
        err(&with("  - cidr: 10.0.0.0/16", "  - cidr: 10.0.0/99"))
            .starts_with("networking.machineNetwork[0].cidr")
    );
    assert!(
        err(&with("baseDomain: osd2019.local", ""))
            .starts_with("baseDomain: expected a non-empty string")
    );
    assert!(
        err(&with("  name: ocp4", "  name: OCP_4"))
            .starts_with("metadata.name: expected a DNS label")
    );
    assert!(
        err(&with("    apiVIPs:\n    - 10.0.0.5\n", ""))
            .starts_with("platform.openstack.apiVIPs: expected a list with the VIP")
    );
    assert_eq!(
        err(&with("    - 10.0.0.5\n", "    - 10.0.0.5\n    - fd00::x\n")),
        "platform.openstack.apiVIPs[1]: expected an IP address, got \"fd00::x\""
    );
    assert!(
        err(&with("compute:", "compute: three\nx:")).starts_with("compute: invalid type"),
        "{}",
        err(&with("compute:", "compute: three\nx:"))
    );
    assert_eq!(
        err(&with("sshKey:", "sshKey: [1]\ny:")),
        "sshKey: expected an SSH public key string, got a list"
    );
    assert!(err("a: [").starts_with("not valid YAML"));
    assert!(err("- 1\n- 2\n").starts_with("(top level): expected a mapping"));
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::config())]
    #[test]
    fn never_panics(text in "[a-zA-Z0-9:\\-\\[\\]{}., \\n]{0,300}") {
        let _ = InstallConfig::parse(&text);
    }

    #[test]
    fn mutated_example_never_panics(at in 0usize..1500, byte in proptest::prelude::any::<u8>()) {
        let mut bytes = EXAMPLE.as_bytes().to_vec();
        if at < bytes.len() {
            bytes[at] = byte;
        }
        if let Ok(text) = String::from_utf8(bytes) {
            let _ = InstallConfig::parse(&text);
        }
    }
}

#[test]
fn hand_backs_are_on_where_a_node_may_forward_a_clients_frames() {
    // OpenStack: off (Neutron's port security drops frames from a client's address sent
    // by another port), and omitted from cluster.json.
    let ic = InstallConfig::parse(EXAMPLE).unwrap();
    assert_eq!(ic.platform, "openstack");
    let cluster = ic.cluster_config();
    assert!(cluster.vrrp.instances.iter().all(|i| i.handback_secs == 0));
    let json = serde_json::to_string(&cluster).unwrap();
    assert!(!json.contains("handbackSecs"), "{json}");
    // Bare metal and `none`: 30 s on every instance.
    for platform in ["baremetal", "none"] {
        let ic =
            InstallConfig::parse(&with("  openstack:\n", &format!("  {platform}:\n"))).unwrap();
        assert_eq!(ic.platform, platform);
        let cluster = ic.cluster_config();
        assert!(
            cluster.vrrp.instances.iter().all(|i| i.handback_secs == 30),
            "{platform}"
        );
        let back =
            ClusterConfig::from_json(serde_json::to_string(&cluster).unwrap().as_bytes()).unwrap();
        assert_eq!(back.instance("api").unwrap().handback_secs, 30);
    }
}

#[test]
fn user_managed_load_balancer_leaves_the_vips_to_it() {
    let plain = InstallConfig::parse(EXAMPLE).unwrap();
    assert_eq!(plain.load_balancer, LoadBalancerType::Keelson);
    assert!(!plain.cluster_config().load_balancer.user_managed());
    let managed = InstallConfig::parse(&with(
        "    cloud: openstack",
        "    cloud: openstack\n    loadBalancer:\n      type: UserManaged",
    ))
    .unwrap();
    assert!(managed.notes.iter().all(|n| !n.contains("loadBalancer")));
    let cluster = managed.cluster_config();
    cluster.check().unwrap();
    assert!(cluster.load_balancer.user_managed());
    assert!(
        cluster.vrrp.instances.is_empty(),
        "no VRRP for VIPs it owns"
    );
    // DNS still names the VIPs.
    assert_eq!(cluster.api_vips, plain.api_vips);
    let json = String::from_utf8(cluster.to_json()).unwrap();
    assert!(json.contains("\"type\": \"userManaged\""), "{json}");
    // OpenShift's default spelled out is keelson's default.
    let default = InstallConfig::parse(&with(
        "    cloud: openstack",
        "    cloud: openstack\n    loadBalancer:\n      type: OpenShiftManagedDefault",
    ))
    .unwrap();
    assert_eq!(default.cluster_config(), plain.cluster_config());
    assert_eq!(
        err(&with(
            "    cloud: openstack",
            "    cloud: openstack\n    loadBalancer:\n      type: External"
        )),
        "platform.openstack.loadBalancer.type: expected OpenShiftManagedDefault or UserManaged, got \"External\""
    );
}

#[test]
fn floating_ips_of_both_eras() {
    let ic = InstallConfig::parse(EXAMPLE_42).unwrap();
    assert_eq!(ic.api_floating_ip, Some("172.24.4.100".parse().unwrap()));
    assert_eq!(ic.external_network.as_deref(), Some("public"));
    assert_eq!(ic.ingress_floating_ip, None);
    let current = with(
        "    cloud: openstack\n",
        "    cloud: openstack\n    externalNetwork: public\n    apiFloatingIP: 172.24.4.50\n    ingressFloatingIP: 172.24.4.51\n",
    );
    let ic = InstallConfig::parse(&current).unwrap();
    assert_eq!(ic.api_floating_ip, Some("172.24.4.50".parse().unwrap()));
    assert_eq!(ic.ingress_floating_ip, Some("172.24.4.51".parse().unwrap()));
    assert!(
        !ic.notes
            .iter()
            .any(|n| n.contains("FloatingIP") || n.contains("externalNetwork")),
        "{:?}",
        ic.notes
    );
    // None of them: no router, no floating IP (the cluster stays on its own network).
    let ic = InstallConfig::parse(EXAMPLE).unwrap();
    assert_eq!(
        (
            ic.api_floating_ip,
            ic.ingress_floating_ip,
            ic.external_network
        ),
        (None, None, None)
    );
}

#[test]
fn ingress_is_every_router_node_and_only_those() {
    let cluster = InstallConfig::parse(EXAMPLE).unwrap().cluster_config();
    let ingress = cluster.instance("ingress").unwrap();
    assert_eq!(ingress.priorities.master, Some(20), "masters take part too");
    assert_eq!(ingress.priorities.worker, Some(20));
    assert_eq!(ingress.priorities.bootstrap, None);
    assert!(ingress.checks.is_empty());
    assert_eq!(ingress.required_checks.len(), 1);
    assert!(matches!(
        &ingress.required_checks[0].check,
        HealthCheckKind::Http { url, .. } if url == "http://127.0.0.1:1936/healthz/ready"
    ));
}

#[test]
fn bad_floating_ips_name_the_field() {
    let fips = |lines: &str| {
        with(
            "    cloud: openstack\n",
            &format!("    cloud: openstack\n{lines}"),
        )
    };
    assert_eq!(
        err(&fips("    apiFloatingIP: 172.24.4.50\n")),
        "platform.openstack.externalNetwork: expected the external network's name, where apiFloatingIP 172.24.4.50 lives (floating IPs need a router to it), got nothing"
    );
    assert_eq!(
        err(&fips(
            "    externalNetwork: public\n    ingressFloatingIP: 10.0.3.4\n"
        )),
        "platform.openstack.ingressFloatingIP: expected an address on the external network, outside the machine network 10.0.0.0/16, got 10.0.3.4"
    );
    assert_eq!(
        err(&fips(
            "    externalNetwork: public\n    apiFloatingIP: 2001:db8::5\n"
        )),
        "platform.openstack.apiFloatingIP: expected an IPv4 address (Neutron's floating IPs are IPv4), got 2001:db8::5"
    );
    assert_eq!(
        err(&fips(
            "    externalNetwork: public\n    apiFloatingIP: 172.24.4.50\n    ingressFloatingIP: 172.24.4.50\n"
        )),
        "platform.openstack.ingressFloatingIP: expected a floating IP other than apiFloatingIP, got 172.24.4.50"
    );
    assert_eq!(
        err(&fips(
            "    externalNetwork: public\n    apiFloatingIP: 172.24.4.50\n    lbFloatingIP: 172.24.4.60\n"
        )),
        "platform.openstack.lbFloatingIP: expected the same address as apiFloatingIP (172.24.4.50), or only one of the two, got 172.24.4.60"
    );
    assert!(
        err(&fips(
            "    externalNetwork: public\n    apiFloatingIP: nope\n"
        ))
        .starts_with("platform.openstack.apiFloatingIP: expected an IP address")
    );
}

#[test]
fn a_dual_stack_roles_second_vip_follows_its_first() {
    let yaml = EXAMPLE
        .replacen(
            "  - cidr: 10.0.0.0/16\n",
            "  - cidr: 10.0.0.0/16\n  - cidr: fd00::/64\n",
            1,
        )
        .replacen("    - 10.0.0.5\n", "    - 10.0.0.5\n    - fd00::5\n", 1)
        .replacen("    - 10.0.0.7\n", "    - 10.0.0.7\n    - fd00::7\n", 1);
    let cluster = InstallConfig::parse(&yaml).unwrap().cluster_config();
    cluster.check().unwrap();
    for (role, v6) in [("api", "fd00::5"), ("ingress", "fd00::7")] {
        let first = cluster.instance(role).unwrap();
        assert_eq!(first.follows, None, "{role}");
        let second = cluster.instance(&format!("{role}-v6")).unwrap();
        assert_eq!(second.vip, v6.parse::<IpAddr>().unwrap());
        assert_eq!(second.follows.as_deref(), Some(role));
    }
    // Written and read back as such.
    let again = ClusterConfig::from_json(&cluster.to_json()).unwrap();
    assert_eq!(again, cluster);
}
