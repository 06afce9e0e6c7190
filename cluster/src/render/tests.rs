use super::*;
use crate::install_config::InstallConfig;

fn cluster() -> ClusterConfig {
    InstallConfig::parse(include_str!("../../../examples/install-config.yaml"))
        .unwrap()
        .cluster_config()
}

fn assets(agent_url: Option<&str>) -> NodeAssets {
    NodeAssets {
        ca_pem: "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n".into(),
        server_cert_pem: "-----BEGIN CERTIFICATE-----\nMIIBserver\n-----END CERTIFICATE-----\n"
            .into(),
        server_key_pem: "-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n".into(),
        agent_sha512: "ab".repeat(64),
        agent_url: agent_url.map(str::to_owned),
        agent_inline: None,
        membership_keys: [(
            "membership.key".to_string(),
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n".to_string(),
        )]
        .into(),
        operator: Default::default(),
    }
}

fn schema(spec: SpecVersion) -> jsonschema::Validator {
    let name = format!(
        "{}/../testdata/ignition-schemas/v{}.ignition.json",
        env!("CARGO_MANIFEST_DIR"),
        &spec.as_str()[..3].replace('.', "_")
    );
    let text = std::fs::read_to_string(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

/// The example cluster with an operator service whose binary is a build asset.
fn cluster_with_service() -> ClusterConfig {
    let mut c = cluster();
    c.services.push(crate::cluster::ServiceSpec {
        name: "kube-apiserver".into(),
        path: "/usr/local/bin/kube-standin".into(),
        args: vec!["--listen".into(), "0.0.0.0:6443".into()],
        env: Default::default(),
        restart: Default::default(),
        roles: vec![Role::Bootstrap, Role::Master],
        asset: Some(crate::cluster::ServiceAsset {
            name: "kube-standin".into(),
            sha512: "cd".repeat(64),
        }),
    });
    c.check().unwrap();
    c
}

fn every_config() -> Vec<(String, SpecVersion, Vec<u8>)> {
    let c = cluster_with_service();
    let mut out = Vec::new();
    for spec in SpecVersion::ALL {
        for role in [Role::Bootstrap, Role::Master, Role::Worker] {
            for url in [None, Some("https://objects.example/keelson-agent")] {
                out.push((
                    format!("{spec} full {role} url={url:?}"),
                    spec,
                    render_full(&c, role, spec, &assets(url)).unwrap(),
                ));
            }
            if role != Role::Bootstrap {
                out.push((
                    format!("{spec} pointer {role}"),
                    spec,
                    render_pointer(&c, role, spec, &assets(None).ca_pem).unwrap(),
                ));
            }
        }
    }
    out
}

#[test]
fn every_config_passes_its_schema() {
    for (what, spec, bytes) in every_config() {
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(doc["ignition"]["version"], spec.as_str(), "{what}");
        let validator = schema(spec);
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{what}: {errors:?}");
    }
}

#[test]
fn ignition_validate_accepts_3_0_to_3_3() {
    if !keelson_testkit::require("ignition-validate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (i, (what, spec, bytes)) in every_config().into_iter().enumerate() {
        if !matches!(
            spec,
            SpecVersion::V3_0 | SpecVersion::V3_1 | SpecVersion::V3_2 | SpecVersion::V3_3
        ) {
            continue;
        }
        let path = dir.path().join(format!("{i}.ign"));
        std::fs::write(&path, &bytes).unwrap();
        let out = std::process::Command::new("ignition-validate")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn full_configs_carry_what_each_role_needs() {
    let c = cluster();
    let paths = |bytes: &[u8]| -> Vec<String> {
        let doc: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        doc["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_owned())
            .collect()
    };
    let master = render_full(&c, Role::Master, SpecVersion::V3_2, &assets(None)).unwrap();
    let m = paths(&master);
    for p in [
        paths::CLUSTER_JSON,
        paths::ROLE,
        paths::CA,
        paths::SERVER_KEY,
        unit::AGENT_PATH,
    ] {
        assert!(m.contains(&p.to_owned()), "master lacks {p}");
    }
    let doc: serde_json::Value = serde_json::from_slice(&master).unwrap();
    let agent = doc["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == unit::AGENT_PATH)
        .unwrap();
    assert_eq!(
        agent["contents"]["source"],
        "https://10.0.0.5:22623/assets/keelson-agent"
    );
    assert_eq!(
        agent["contents"]["verification"]["hash"],
        format!("sha512-{}", "ab".repeat(64))
    );
    assert_eq!(doc["systemd"]["units"][0]["name"], unit::AGENT_UNIT_NAME);
    assert_eq!(doc["systemd"]["units"][0]["enabled"], true);
    assert_eq!(doc["passwd"]["users"][0]["name"], "core");

    let worker = paths(&render_full(&c, Role::Worker, SpecVersion::V3_2, &assets(None)).unwrap());
    assert!(
        !worker.contains(&paths::SERVER_KEY.to_owned()),
        "workers never hold the server key"
    );

    // Appliance bootstrap: no agent file or unit; RHCOS bootstrap: from --agent-url.
    let appliance = render_full(&c, Role::Bootstrap, SpecVersion::V3_2, &assets(None)).unwrap();
    assert!(!paths(&appliance).contains(&unit::AGENT_PATH.to_owned()));
    let rhcos = render_full(
        &c,
        Role::Bootstrap,
        SpecVersion::V3_2,
        &assets(Some("https://o.example/a")),
    )
    .unwrap();
    assert!(String::from_utf8_lossy(&rhcos).contains("https://o.example/a"));

    // The role file decodes to the role.
    let doc: serde_json::Value = serde_json::from_slice(&master).unwrap();
    let role = doc["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == paths::ROLE)
        .unwrap();
    assert_eq!(role["contents"]["source"], "data:,master%0A");
}

#[test]
fn service_assets_go_to_the_roles_that_run_them_but_not_the_bootstrap() {
    let c = cluster_with_service();
    let standin = |role: Role| -> Option<serde_json::Value> {
        let bytes = render_full(&c, role, SpecVersion::V3_2, &assets(None)).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        doc["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/usr/local/bin/kube-standin")
            .cloned()
    };
    let m = standin(Role::Master).expect("masters get the service's executable");
    assert_eq!(
        m["contents"]["source"],
        "https://10.0.0.5:22623/assets/kube-standin"
    );
    assert_eq!(
        m["contents"]["verification"]["hash"],
        format!("sha512-{}", "cd".repeat(64))
    );
    assert_eq!(m["mode"], 0o755);
    assert!(standin(Role::Worker).is_none(), "not a worker service");
    assert!(
        standin(Role::Bootstrap).is_none(),
        "the bootstrap cannot fetch from itself"
    );
    // A second service running the same executable: fetched once (Ignition refuses a path
    // twice).
    let mut two = c.clone();
    let mut router = two.services[0].clone();
    router.name = "router".into();
    two.services.push(router);
    let bytes = render_full(&two, Role::Master, SpecVersion::V3_2, &assets(None)).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let copies = doc["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"] == "/usr/local/bin/kube-standin")
        .count();
    assert_eq!(copies, 1);
}

/// After the pivot the masters serve the workers' assets too: a worker-only service's
/// executable goes into a master's assets directory (not onto its PATH), once per asset.
#[test]
fn masters_keep_the_workers_assets_to_serve_them() {
    let mut c = cluster_with_service();
    c.services[0].roles = vec![Role::Bootstrap];
    for name in ["router", "router-metrics"] {
        c.services.push(crate::cluster::ServiceSpec {
            name: name.into(),
            path: format!("/usr/local/bin/{name}"),
            args: vec![],
            env: Default::default(),
            restart: Default::default(),
            roles: vec![Role::Worker],
            asset: Some(crate::cluster::ServiceAsset {
                name: "kube-standin".into(),
                sha512: "cd".repeat(64),
            }),
        });
    }
    c.check().unwrap();
    let files = |role: Role| -> Vec<serde_json::Value> {
        let bytes = render_full(&c, role, SpecVersion::V3_2, &assets(None)).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        doc["storage"]["files"].as_array().unwrap().clone()
    };
    let master = files(Role::Master);
    let kept: Vec<_> = master
        .iter()
        .filter(|f| f["path"] == "/etc/keelson/assets/kube-standin")
        .collect();
    assert_eq!(kept.len(), 1, "once, though two services use it");
    assert_eq!(
        kept[0]["contents"]["source"],
        "https://10.0.0.5:22623/assets/kube-standin"
    );
    assert_eq!(kept[0]["mode"], 0o644, "served, not run");
    assert!(!master.iter().any(|f| f["path"] == "/usr/local/bin/router"));
    let worker = files(Role::Worker);
    assert!(worker.iter().any(|f| f["path"] == "/usr/local/bin/router"));
    assert!(
        !worker
            .iter()
            .any(|f| f["path"] == "/etc/keelson/assets/kube-standin")
    );
    // A master that runs the asset's service has it already: nothing more.
    let both = cluster_with_service();
    let bytes = render_full(&both, Role::Master, SpecVersion::V3_2, &assets(None)).unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("/etc/keelson/assets/"));
}

#[test]
fn pointer_and_22_specifics() {
    let c = cluster();
    let ca = assets(None).ca_pem;
    let p = render_pointer(&c, Role::Worker, SpecVersion::V3_2, &ca).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(
        doc["ignition"]["config"]["merge"][0]["source"],
        "https://10.0.0.5:22623/config/worker"
    );
    assert!(
        doc["ignition"]["security"]["tls"]["certificateAuthorities"][0]["source"]
            .as_str()
            .unwrap()
            .starts_with("data:")
    );
    check_user_data("worker.ign", &p).unwrap();

    let p22 = render_pointer(&c, Role::Master, SpecVersion::V2_2, &ca).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&p22).unwrap();
    assert_eq!(
        doc["ignition"]["config"]["append"][0]["source"],
        "https://10.0.0.5:22623/config/master"
    );
    assert!(doc["ignition"]["config"].get("merge").is_none());
    let full22 = render_full(&c, Role::Master, SpecVersion::V2_2, &assets(None)).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&full22).unwrap();
    assert!(
        doc["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["filesystem"] == "root")
    );

    let err = check_user_data("bootstrap.ign", &vec![b'x'; USER_DATA_MAX + 1])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bootstrap.ign") && err.contains("65535"),
        "{err}"
    );
}

#[test]
fn same_inputs_same_bytes() {
    let c = cluster();
    for spec in SpecVersion::ALL {
        let a = render_full(&c, Role::Master, spec, &assets(None)).unwrap();
        let b = render_full(&c.clone(), Role::Master, spec, &assets(None)).unwrap();
        assert_eq!(a, b, "{spec}");
    }
}

#[test]
fn data_urls_pick_the_shortest_form() {
    let (url, comp) = data_url(b"master\n");
    assert_eq!((url.as_str(), comp), ("data:,master%0A", None));
    let big = vec![b'a'; 10_000];
    let (url, comp) = data_url(&big);
    assert_eq!(comp, Some("gzip"));
    assert!(url.len() < 200, "{}", url.len());
}

/// The bytes of a `data:` URL as this renderer writes them (no decompression).
fn decode_data_url(url: &str) -> Vec<u8> {
    let rest = url.strip_prefix("data:").unwrap();
    let (meta, payload) = rest.split_once(',').unwrap();
    if meta.ends_with(";base64") {
        return base64::engine::general_purpose::STANDARD
            .decode(payload)
            .unwrap();
    }
    let mut out = Vec::new();
    let bytes = payload.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(
                u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap(), 16).unwrap(),
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn certificate_authorities_are_never_compressed() {
    // A PEM that gzip shrinks a lot: were CAs compressed, this one would be. 2.2 and 3.0
    // have no `compression` for CAs, and a gzip body without it is garbage to Ignition.
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        "MIIB".repeat(150)
    );
    assert_eq!(data_url(pem.as_bytes()).1, Some("gzip"));
    let c = cluster();
    for spec in SpecVersion::ALL {
        for role in [Role::Master, Role::Worker] {
            let mut full_assets = assets(None);
            full_assets.ca_pem = pem.clone();
            for bytes in [
                render_pointer(&c, role, spec, &pem).unwrap(),
                render_full(&c, role, spec, &full_assets).unwrap(),
            ] {
                let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let ca = &doc["ignition"]["security"]["tls"]["certificateAuthorities"][0];
                assert!(
                    ca.get("compression").is_none_or(|v| v.is_null()),
                    "{spec} {role}: {ca}"
                );
                let source = ca["source"].as_str().unwrap();
                assert_eq!(decode_data_url(source), pem.as_bytes(), "{spec} {role}");
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(keelson_testkit::proptest::config())]
    #[test]
    fn data_url_round_trips(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000)) {
        let (url, compression) = data_url(&data);
        let decoded = decode_data_url(&url);
        let plain = if compression == Some("gzip") {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&decoded[..]), &mut out).unwrap();
            out
        } else {
            decoded
        };
        proptest::prop_assert_eq!(plain, data);
    }
}

#[test]
fn every_config_reads_back_as_the_typed_config_it_was_written_from() {
    // Both directions of the 2.2 translation, and every 3.x spec's own types: what `read`
    // makes of a written config is the typed config it came from (2.2 has no `overwrite`).
    let c = cluster_with_service();
    for spec in SpecVersion::ALL {
        for role in [Role::Bootstrap, Role::Master, Role::Worker] {
            let model = full_model(&c, role, &assets(Some("https://objects.example/a")));
            let read = read(&write(&model, spec).unwrap()).unwrap();
            let mut expected = v3_config(&model, spec);
            if spec == SpecVersion::V2_2 {
                for f in expected
                    .storage
                    .iter_mut()
                    .flat_map(|s| s.files.iter_mut().flatten())
                {
                    f.overwrite = None;
                }
            }
            assert_eq!(read.config, expected, "{spec} {role}");
            assert_eq!(read.v2, spec == SpecVersion::V2_2);
        }
    }
}

#[test]
fn reading_names_the_field_that_is_wrong() {
    let err = |text: &str| read(text.as_bytes()).unwrap_err().to_string();
    assert!(
        err(r#"{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/a"},{"path":"/b","mode":"rw"}]}}"#)
            .starts_with("storage.files[1].mode: invalid type"),
    );
    assert!(
        err(r#"{"ignition":{"version":"2.2.0"},"storage":{"files":[{"filesystem":"root"}]}}"#)
            .starts_with("storage.files[0]: missing field `path`"),
    );
    assert_eq!(err(r#"{"ignition":{}}"#), "expected ignition.version");
    assert!(err(r#"{"ignition":{"version":"1.0.0"}}"#).starts_with("ignition.version: expected"));
    assert!(err("[").starts_with("expected Ignition JSON"));
    let v2 = read(
        br#"{"ignition":{"version":"2.2.0"},"storage":{"disks":[{"device":"/dev/vda"}],
            "files":[{"filesystem":"root","path":"/a","append":true,"contents":{"source":"data:,x"}}]}}"#,
    )
    .unwrap();
    assert_eq!(v2.layout_v2, ["disks"]);
    let file = &v2.config.storage.unwrap().files.unwrap()[0];
    assert!(file.contents.is_none() && file.append.as_ref().unwrap().len() == 1);
}
