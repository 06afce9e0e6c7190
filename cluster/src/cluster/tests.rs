use super::*;

#[test]
fn fletcher8_matches_hand_computation() {
    // "ab": sum1 = 97 % 15 = 7, sum2 = 7; then sum1 = (7+98)%15 = 0, sum2 = 7.
    assert_eq!(fletcher8("ab"), 0x70);
    assert_eq!(fletcher8(""), 0);
}

fn example() -> ClusterConfig {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/install-config.yaml"
    ))
    .unwrap();
    crate::install_config::InstallConfig::parse(&text)
        .unwrap()
        .cluster_config()
}

#[test]
fn merge_patch_changes_only_what_it_names() {
    let base = example();
    let patch = serde_json::json!({
        "api": {"frontendPort": 7443},
        "dns": {"upstreams": ["192.0.2.53:53"]},
        "sshAuthorizedKeys": null
    });
    let patched = base.with_merge_patch(&patch).unwrap();
    assert_eq!(patched.api.frontend_port, 7443);
    assert_eq!(
        patched.dns.upstreams,
        vec!["192.0.2.53:53".parse().unwrap()]
    );
    assert!(patched.ssh_authorized_keys.is_empty());
    assert_eq!(patched.vrrp, base.vrrp);
    assert_eq!(patched.api.backend_port, base.api.backend_port);
}

#[test]
fn vrrp_level_fields_set_every_instance_and_are_not_written() {
    let base = example();
    assert!(base.vrrp.instances.len() >= 2, "api and ingress");
    let patch = serde_json::json!({"vrrp": {"transport": "multicast", "handbackSecs": 30}});
    let patched = base.with_merge_patch(&patch).unwrap();
    for inst in &patched.vrrp.instances {
        assert_eq!(inst.transport, VrrpTransport::Multicast, "{}", inst.name);
        assert_eq!(inst.handback_secs, 30, "{}", inst.name);
    }
    // Everything else of the instances is the build's.
    let mut undone = patched.clone();
    for (inst, orig) in undone.vrrp.instances.iter_mut().zip(&base.vrrp.instances) {
        inst.transport = orig.transport;
        inst.handback_secs = orig.handback_secs;
    }
    assert_eq!(undone.vrrp, base.vrrp);
    // Written, each instance names its value; the shorthand is gone.
    let written = serde_json::to_value(&patched).unwrap();
    assert!(
        written["vrrp"].get("handbackSecs").is_none(),
        "{}",
        written["vrrp"]
    );
    assert!(
        written["vrrp"].get("transport").is_none(),
        "{}",
        written["vrrp"]
    );
    assert_eq!(written["vrrp"]["instances"][0]["handbackSecs"], 30);
    // It replaces an instance's own value, 0 (off) too.
    let off = patched
        .with_merge_patch(&serde_json::json!({"vrrp": {"handbackSecs": 0}}))
        .unwrap();
    assert!(off.vrrp.instances.iter().all(|i| i.handback_secs == 0));
    // And is checked like any field.
    let e = base
        .with_merge_patch(&serde_json::json!({"vrrp": {"handbackSec": 30}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("handbackSec"), "{e}");
    let e = base
        .with_merge_patch(&serde_json::json!({"vrrp": {"transport": "broadcast"}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("broadcast"), "{e}");
}

#[test]
fn merge_patch_errors_name_the_field() {
    let base = example();
    let e = base
        .with_merge_patch(&serde_json::json!({"api": {"frontendPrt": 1}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("frontendPrt"), "{e}");
    let e = base
        .with_merge_patch(&serde_json::json!({"version": 2}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("version: expected 1, got 2"), "{e}");
    let e = base
        .with_merge_patch(&serde_json::json!([1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("merge patch"), "{e}");
}

#[test]
fn membership_settings_are_checked_and_optional() {
    let base = example();
    assert_eq!(
        base.members.key_id, None,
        "install-config alone names no key"
    );
    assert_eq!(
        base.members.max_clock_skew(),
        std::time::Duration::from_secs(120)
    );
    // Absent fields stay absent in the JSON (clusters built before them read the same).
    let json = String::from_utf8(base.to_json()).unwrap();
    assert!(!json.contains("keyId") && !json.contains("maxClockSkewSecs"));
    let ok = base
        .with_merge_patch(
            &serde_json::json!({"members": {"keyId": "0123456789abcdef", "maxClockSkewSecs": 30}}),
        )
        .unwrap();
    assert_eq!(ok.members.key_id.as_deref(), Some("0123456789abcdef"));
    assert_eq!(
        ok.members.max_clock_skew(),
        std::time::Duration::from_secs(30)
    );
    let e = base
        .with_merge_patch(&serde_json::json!({"members": {"keyId": "not-a-key-id"}}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("members.keyId") && e.contains("16 lowercase hex"),
        "{e}"
    );
    let e = base
        .with_merge_patch(&serde_json::json!({"members": {"maxClockSkewSecs": 0}}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("members.maxClockSkewSecs") && e.contains("1 to 3600"),
        "{e}"
    );
    assert!(!json.contains("forgetAfterSecs"));
    assert_eq!(
        base.members.forget_after(),
        std::time::Duration::from_secs(86_400)
    );
    let short = base
        .with_merge_patch(&serde_json::json!({"members": {"forgetAfterSecs": 600}}))
        .unwrap();
    assert_eq!(
        short.members.forget_after(),
        std::time::Duration::from_secs(600)
    );
    let e = base
        .with_merge_patch(
            &serde_json::json!({"members": {"expirySecs": 35, "forgetAfterSecs": 10}}),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("members.forgetAfterSecs") && e.contains("at least members.expirySecs"),
        "{e}"
    );
}

#[test]
fn etcd_names_default_by_spec_when_absent() {
    let mut c = example();
    assert_eq!(
        c.dns.etcd,
        Some(EtcdRecords {
            enabled: false,
            masters: 3
        }),
        "the install-config's default spec is 3.x"
    );
    // A cluster.json written before the field: the payload's era decides.
    c.dns.etcd = None;
    assert!(!c.to_json().windows(4).any(|w| w == b"etcd"));
    assert!(!c.etcd_records().enabled);
    c.ignition.spec = "2.2.0".into();
    assert_eq!(
        c.etcd_records(),
        EtcdRecords {
            enabled: true,
            masters: EtcdRecords::DEFAULT_MASTERS
        }
    );
    let e = c
        .with_merge_patch(&serde_json::json!({"dns": {"etcd": {"enabled": true}}}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("masters"),
        "a new etcd object names its size: {e}"
    );
    let e = c
        .with_merge_patch(&serde_json::json!({"dns": {"etcd": {"enabled": true, "masters": 0}}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("dns.etcd.masters: expected 1 to 1000"), "{e}");
}

#[test]
fn health_check_fields_are_camel_case() {
    let k: HealthCheckKind = serde_json::from_str(
        r#"{"type":"http","url":"https://127.0.0.1:6443/readyz","expectStatus":200}"#,
    )
    .unwrap();
    assert_eq!(
        k,
        HealthCheckKind::Http {
            url: "https://127.0.0.1:6443/readyz".into(),
            expect_status: 200
        }
    );
    let k: HealthCheckKind = serde_json::from_str(r#"{"type":"proxyHealthyBackend"}"#).unwrap();
    assert_eq!(k, HealthCheckKind::ProxyHealthyBackend);
    let k: HealthCheckKind = serde_json::from_str(r#"{"type":"localApiserver"}"#).unwrap();
    assert_eq!(k, HealthCheckKind::LocalApiserver);
}

#[test]
fn check_timeout_defaults_to_the_clamped_interval() {
    let c = |interval_ms, timeout_ms| HealthCheckConfig {
        name: "c".into(),
        check: HealthCheckKind::LocalApiserver,
        interval_ms,
        rise: 1,
        fall: 1,
        weight: 0,
        timeout_ms,
    };
    let s = std::time::Duration::from_secs;
    assert_eq!(c(1000, None).timeout(), s(1));
    assert_eq!(c(100, None).timeout(), s(1));
    assert_eq!(c(2000, None).timeout(), s(2));
    assert_eq!(c(60_000, None).timeout(), s(5));
    assert_eq!(c(2000, Some(10_000)).timeout(), s(10));
    assert_eq!(c(5000, Some(300)).timeout().as_millis(), 300);
}

#[test]
fn check_timeout_is_bounded() {
    let with = |t: u32| {
        let mut c = crate::install_config::InstallConfig::parse(include_str!(
            "../../../examples/install-config.yaml"
        ))
        .unwrap()
        .cluster_config();
        let check = c.vrrp.instances[0]
            .checks
            .iter_mut()
            .find(|c| c.check == HealthCheckKind::LocalApiserver)
            .expect("keelson build writes a local-apiserver check");
        check.timeout_ms = Some(t);
        c.check()
    };
    for bad in [0, 99, 60_001] {
        let e = with(bad).unwrap_err().to_string();
        assert!(
            e.contains("checks[local-apiserver].timeoutMs") && e.contains("100 to 60000"),
            "{bad}: {e}"
        );
    }
    with(100).unwrap();
    with(60_000).unwrap();
}

#[test]
fn vrids_are_checked_per_family_and_named() {
    let base = example();
    let (api, _) = default_vrids(&base.name);
    // The ingress instance on the API's VRID: an error naming it and the other.
    let mut same = base.clone();
    same.vrrp.instances[1].vrid = api;
    let e = same.check().unwrap_err().to_string();
    assert!(
        e.contains("vrrp.instances[1].vrid") && e.contains("api's") && e.contains(&api.to_string()),
        "{e}"
    );
    // Another family may share it (IPv4 and IPv6 routers are apart).
    let mut v6 = base.clone();
    let mut inst = v6.vrrp.instances[0].clone();
    inst.name = "api-v6".into();
    inst.vip = "fd00::5".parse().unwrap();
    v6.vrrp.instances.push(inst);
    v6.check().unwrap();
    // A second-family VIP follows its role's instance; never itself, nor a follower.
    let n = v6.vrrp.instances.len() - 1;
    for (bad, ok) in [("api", true), ("api-v6", false), ("nope", false)] {
        let mut c = v6.clone();
        c.vrrp.instances[n].follows = Some(bad.into());
        match c.check() {
            Ok(()) => assert!(ok, "{bad}"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    !ok && e.contains(&format!("vrrp.instances[{n}].follows")),
                    "{e}"
                );
            }
        }
    }
    let mut chain = v6.clone();
    chain.vrrp.instances[n].follows = Some("api".into());
    chain.vrrp.instances[0].follows = Some("api-v6".into());
    assert!(chain.check().is_err());
    // Announced by BGP: both or neither.
    let mut follows = v6.clone();
    follows.vrrp.instances[n].follows = Some("api".into());
    let bgp = |vips: serde_json::Value| {
        follows.with_merge_patch(&serde_json::json!({"bgp": {
            "vips": vips, "localAsn": 64512,
            "peers": [{"address": "10.0.0.1", "asn": 65001}]
        }}))
    };
    bgp(serde_json::json!(["api", "api-v6"])).unwrap();
    let e = bgp(serde_json::json!(["api"])).unwrap_err().to_string();
    assert!(e.contains(&format!("vrrp.instances[{n}].follows")), "{e}");
    // Out of range, read from JSON: named as a VRID, not as a Rust type.
    for bad in [0, 256, -1] {
        let mut doc = serde_json::to_value(&base).unwrap();
        doc["vrrp"]["instances"][0]["vrid"] = bad.into();
        let e = ClusterConfig::from_json(&serde_json::to_vec(&doc).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("vrid: expected 1..=255"), "{bad}: {e}");
    }
}

#[test]
fn node_address_hint_and_interface_are_checked() {
    let base = example();
    let json = String::from_utf8(base.to_json()).unwrap();
    assert!(!json.contains("nodeAddress") && !json.contains("loadBalancer"));
    let ok = base
        .with_merge_patch(
            &serde_json::json!({"nodeAddress": {"hint": "10.0.0.1", "interface": "br-ex"}}),
        )
        .unwrap();
    assert_eq!(
        ok.node_address.hint,
        Some(AddressHint::Address("10.0.0.1".parse().unwrap()))
    );
    let net = base
        .with_merge_patch(&serde_json::json!({"nodeAddress": {"hint": "10.0.1.7/24"}}))
        .unwrap();
    assert_eq!(net.node_address.hint.unwrap().to_string(), "10.0.1.0/24");
    let e = base
        .with_merge_patch(&serde_json::json!({"nodeAddress": {"hint": "192.168.9.1"}}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nodeAddress.hint") && e.contains("inside the machine networks"),
        "{e}"
    );
    let e = base
        .with_merge_patch(&serde_json::json!({"nodeAddress": {"hint": "br-ex"}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("an IP address or a CIDR"), "{e}");
    for bad in ["", "a/b", "way-too-long-name0", "eth0:1"] {
        let e = base
            .with_merge_patch(&serde_json::json!({"nodeAddress": {"interface": bad}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodeAddress.interface"), "{bad}: {e}");
    }
    // The hint's rules, as the agent applies them.
    let on_link: IpNet = "10.0.3.9/24".parse().unwrap();
    assert!(AddressHint::Address("10.0.3.1".parse().unwrap()).matches(&on_link));
    assert!(!AddressHint::Address("10.0.4.1".parse().unwrap()).matches(&on_link));
    assert!(AddressHint::Network("10.0.0.0/16".parse().unwrap()).matches(&on_link));
    assert!(!AddressHint::Network("10.1.0.0/16".parse().unwrap()).matches(&on_link));
}

#[test]
fn vrids_differ() {
    for name in ["ocp4", "a", "cluster", "x-y"] {
        let (api, ingress) = default_vrids(name);
        assert_ne!(api, ingress, "{name}");
        assert_ne!(api, 0);
        assert_ne!(ingress, 0);
    }
}
