//! `keelson build`, `render`, `validate`, `vrids` as an operator runs them.

use std::path::Path;
use std::process::{Command, Output};

// Topics long enough for a file of their own, beside this one (a test crate's root looks
// for its modules next to it, hence the paths).
#[path = "build/openshift_install.rs"]
mod openshift_install;
#[path = "build/operator_configs.rs"]
mod operator_configs;

const KEELSON: &str = env!("CARGO_BIN_EXE_keelson");
const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/install-config.yaml"
);
const EXAMPLE_42: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/install-config-4.2.yaml"
);

fn keelson(args: &[&str]) -> Output {
    Command::new(KEELSON)
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A stand-in for the agent that passes `keelson`'s static-executable check: the smallest
/// static x86_64 ELF (one PT_LOAD segment whose code is `exit(0)`), so the tests do not need
/// the real agent's 12 MB built first.
fn tiny_static_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    let code: &[u8] = &[0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]; // mov eax,60; xor edi,edi; syscall
    let size = (64 + 56 + code.len()) as u64;
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(0x3eu16.to_le_bytes()); // EM_X86_64
    elf.extend(1u32.to_le_bytes());
    elf.extend((BASE + 120).to_le_bytes()); // entry: the code after the headers
    elf.extend(64u64.to_le_bytes()); // program headers right after this header
    elf.extend(0u64.to_le_bytes()); // no section headers
    elf.extend(0u32.to_le_bytes());
    for half in [64u16, 56, 1, 64, 0, 0] {
        elf.extend(half.to_le_bytes());
    }
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // R+X
    for word in [0, BASE, BASE, size, size, 0x1000] {
        elf.extend(word.to_le_bytes());
    }
    elf.extend_from_slice(code);
    elf
}

fn fake_agent(dir: &Path) -> String {
    let path = dir.join("keelson-agent");
    std::fs::write(&path, tiny_static_elf()).unwrap();
    path.display().to_string()
}

/// Whether the appliance kernel `make setup` unpacks is there; without it (and without
/// `CI`) the builds run with `--no-image`.
fn with_kernel() -> bool {
    keelson_testkit::need::need(
        keelson_image::kernel::KernelSource::locate(None, None).is_ok(),
        "the appliance kernel in .cache/kernel (make setup); building with --no-image",
    )
}

#[test]
fn two_builds_with_the_same_tls_give_the_same_sha256sums() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    let image = with_kernel();
    let build = |out: &Path| {
        let mut args = vec![
            "build", "--config", EXAMPLE, "--agent", &agent, "--quiet", "--out",
        ];
        let out = out.display().to_string();
        args.push(&out);
        if !image {
            args.push("--no-image");
        }
        ok(&keelson(&args));
    };
    build(&a);
    // Same tls/ in a fresh directory.
    std::fs::create_dir_all(b.join("tls")).unwrap();
    for f in [
        "ca.crt",
        "ca.key",
        "server.crt",
        "server.key",
        "membership.key",
    ] {
        std::fs::copy(a.join("tls").join(f), b.join("tls").join(f)).unwrap();
    }
    build(&b);
    let sums_a = std::fs::read_to_string(a.join("SHA256SUMS")).unwrap();
    assert_eq!(
        sums_a,
        std::fs::read_to_string(b.join("SHA256SUMS")).unwrap()
    );
    // A rebuild into the same --out reuses tls/, the membership key included.
    let key_a = std::fs::read_to_string(a.join("tls/membership.key")).unwrap();
    build(&a);
    assert_eq!(
        sums_a,
        std::fs::read_to_string(a.join("SHA256SUMS")).unwrap()
    );
    assert_eq!(
        key_a,
        std::fs::read_to_string(a.join("tls/membership.key")).unwrap()
    );
    // The membership key: kept beside the CA key (0600, not a deliverable), named by
    // cluster.json, handed to every node in the full configs only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(a.join("tls/membership.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!sums_a.contains("membership.key"));
    let key = keelson_cluster::membership::parse_key(&key_a).unwrap();
    let cluster_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("cluster.json")).unwrap()).unwrap();
    assert_eq!(
        cluster_json["members"]["keyId"],
        keelson_cluster::membership::key_id(&key)
    );
    let key_file = |config: &serde_json::Value| -> Option<String> {
        config["storage"]["files"]
            .as_array()?
            .iter()
            .find(|f| f["path"] == "/etc/keelson/tls/membership.key")
            .map(|f| f["contents"]["source"].as_str().unwrap_or("").to_string())
    };
    let boot: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("bootstrap.ign")).unwrap()).unwrap();
    assert!(key_file(&boot).is_some(), "bootstrap.ign carries the key");
    for pointer in ["master.ign", "worker.ign"] {
        let text = std::fs::read_to_string(a.join(pointer)).unwrap();
        assert!(
            !text.contains("membership.key"),
            "{pointer} is a pointer config: no secrets"
        );
    }
    for name in [
        "bootstrap.ign",
        "master.ign",
        "worker.ign",
        "cluster.json",
        "tls/ca.crt",
    ] {
        assert!(
            sums_a.contains(&format!("  {name}\n")),
            "{name} in SHA256SUMS"
        );
    }
    if image {
        assert!(sums_a.contains("  keelson.qcow2\n"));
    }
    // The Heat template (docs/openstack.md): every node with its port carrying both VIPs
    // and its Ignition config as user_data (the bootstrap's unless given a hosted pointer),
    // and least privilege in the security group: VRRP and the router's stats from the
    // machine network, ingress from its source parameter.
    assert!(sums_a.contains("  openstack.yaml\n") && sums_a.contains("  openstack.json\n"));
    let heat: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(a.join("openstack.yaml")).unwrap())
            .unwrap();
    let res = &heat["resources"];
    for (node, ign) in [
        ("bootstrap", "bootstrap.ign"),
        ("master_0", "master.ign"),
        ("master_2", "master.ign"),
        ("worker_1", "worker.ign"),
    ] {
        assert_eq!(res[node]["type"], "OS::Nova::Server", "{node}");
        let user_data = &res[node]["properties"]["user_data"];
        let file = if node == "bootstrap" {
            &user_data["if"][2]["get_file"]
        } else {
            &user_data["get_file"]
        };
        assert_eq!(file, ign, "{node}");
        assert_eq!(
            res[format!("{node}_port")]["properties"]["allowed_address_pairs"],
            serde_json::json!([{"ip_address": "10.0.0.5"}, {"ip_address": "10.0.0.7"}])
        );
    }
    assert!(res["master_3"].is_null() && res["worker_2"].is_null());
    let rules: Vec<&serde_json::Value> = res
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["type"] == "OS::Neutron::SecurityGroupRule")
        .map(|r| &r["properties"])
        .collect();
    let from = |r: &serde_json::Value| r["remote_ip_prefix"].clone();
    assert!(
        rules
            .iter()
            .any(|r| r["protocol"] == "112" && from(r) == "10.0.0.0/16")
    );
    for port in [80, 443] {
        assert!(
            rules.iter().any(|r| r["port_range_min"] == port
                && from(r) == serde_json::json!({"get_param": "ingress_source"})),
            "no rule for tcp {port}: {rules:?}"
        );
    }
    assert!(
        rules
            .iter()
            .any(|r| r["port_range_min"] == 1936 && from(r) == "10.0.0.0/16"),
        "no machine-network rule for tcp 1936: {rules:?}"
    );
    assert!(
        !rules.iter().any(|r| r["remote_ip_prefix"].is_null()),
        "no rule is open to anywhere by itself: {rules:?}"
    );
    assert!(
        !sums_a.contains("ca.key"),
        "the CA key is not a deliverable"
    );
    // `sha256sum -c` agrees.
    let check = Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(&a)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // No staging leftovers.
    assert!(std::fs::read_dir(&a).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".keelson")
    }));

    // The master pointer config points at the VIP with the CA from tls/.
    let master: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("master.ign")).unwrap()).unwrap();
    assert_eq!(
        master["ignition"]["config"]["merge"][0]["source"],
        "https://10.0.0.5:22623/config/master"
    );

    // `keelson render` prints what the Ignition server over this directory serves.
    let dir = a.display().to_string();
    let rendered = ok(&keelson(&[
        "render", "--config", EXAMPLE, "--role", "master", "--dir", &dir, "--agent", &agent,
    ]));
    let cluster =
        keelson_cluster::ClusterConfig::from_json(&std::fs::read(a.join("cluster.json")).unwrap())
            .unwrap();
    let source = keelson_cluster::server::RenderSource::from_files(
        cluster,
        &a.join("tls"),
        &a.join("assets/keelson-agent"),
    )
    .unwrap();
    use keelson_cluster::server::ConfigSource;
    let served = source
        .config(
            keelson_cluster::Role::Master,
            keelson_cluster::SpecVersion::V3_2,
        )
        .unwrap();
    assert_eq!(rendered.trim_end().as_bytes(), &served[..]);
    // Masters and workers get the key from the Ignition server.
    for role in [keelson_cluster::Role::Master, keelson_cluster::Role::Worker] {
        let full: serde_json::Value = serde_json::from_slice(
            &source
                .config(role, keelson_cluster::SpecVersion::V3_2)
                .unwrap(),
        )
        .unwrap();
        assert!(key_file(&full).is_some(), "{role:?} config carries the key");
    }
}

#[test]
fn the_42_era_config_builds_spec_2_2() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let out = work.path().join("out").display().to_string();
    ok(&keelson(&[
        "build",
        "--config",
        EXAMPLE_42,
        "--out",
        &out,
        "--agent",
        &agent,
        "--spec",
        "2.2.0",
        "--no-image",
        "--quiet",
    ]));
    let boot: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("out/bootstrap.ign")).unwrap())
            .unwrap();
    assert_eq!(boot["ignition"]["version"], "2.2.0");
    let worker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("out/worker.ign")).unwrap())
            .unwrap();
    assert_eq!(
        worker["ignition"]["config"]["append"][0]["source"],
        "https://10.0.0.5:22623/config/worker"
    );
    // The 4.2-era payload: its etcd finds its peers by SRV, so the DNS serves the names.
    let cluster: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("out/cluster.json")).unwrap())
            .unwrap();
    assert_eq!(
        cluster["dns"]["etcd"],
        serde_json::json!({"enabled": true, "masters": 3})
    );
}

#[test]
fn etcd_names_follow_the_spec_unless_patched() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let build = |name: &str, extra: &[&str]| -> serde_json::Value {
        let out = work.path().join(name).display().to_string();
        let mut args = vec![
            "build",
            "--config",
            EXAMPLE,
            "--out",
            &out,
            "--agent",
            &agent,
            "--no-image",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        ok(&keelson(&args));
        serde_json::from_slice(&std::fs::read(work.path().join(name).join("cluster.json")).unwrap())
            .unwrap()
    };
    let default = build("default", &[]);
    assert_eq!(
        default["dns"]["etcd"],
        serde_json::json!({"enabled": false, "masters": 3}),
        "spec 3.x: off"
    );
    let patch = work.path().join("etcd.json");
    std::fs::write(&patch, r#"{"dns": {"etcd": {"enabled": true}}}"#).unwrap();
    let patch = patch.display().to_string();
    let on = build("on", &["--cluster-patch", &patch]);
    assert_eq!(
        on["dns"]["etcd"]["enabled"], true,
        "configurable either way"
    );
    std::fs::write(
        work.path().join("bad.json"),
        r#"{"dns": {"etcd": {"masters": 0}}}"#,
    )
    .unwrap();
    let out = work.path().join("bad-out").display().to_string();
    let bad = work.path().join("bad.json").display().to_string();
    let res = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out,
        "--agent",
        &agent,
        "--no-image",
        "--cluster-patch",
        &bad,
    ]);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("dns.etcd.masters"), "{err}");
}

#[test]
fn bad_input_exits_2_names_the_field_and_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let cases = [
        (
            text.replace("replicas: 3", "replicas: three"),
            "controlPlane.replicas: expected an integer from 1 to 4096, got \"three\"",
        ),
        (
            text.replace("    - 10.0.0.7", "    - 10.0.0.5"),
            "platform.openstack.ingressVIPs: expected a VIP different from the API VIP",
        ),
        (
            text.replace("    - 10.0.0.5", "    - 10.9.0.5"),
            "platform.openstack.apiVIPs[0]: expected an address inside the machine network",
        ),
        ("metadata: [".to_owned(), "not valid YAML"),
    ];
    for (i, (yaml, message)) in cases.iter().enumerate() {
        let config = work.path().join(format!("bad{i}.yaml"));
        std::fs::write(&config, yaml).unwrap();
        let config = config.display().to_string();
        let out_dir = work.path().join(format!("out{i}"));
        let out = out_dir.display().to_string();
        for args in [
            vec!["validate", "--config", &config],
            vec![
                "build",
                "--config",
                &config,
                "--out",
                &out,
                "--agent",
                &agent,
                "--no-image",
            ],
        ] {
            let result = keelson(&args);
            assert_eq!(result.status.code(), Some(2), "{args:?}");
            let err = String::from_utf8_lossy(&result.stderr);
            assert!(
                err.contains(message) && err.contains(&config),
                "{args:?}: {err}"
            );
        }
        assert!(
            !out_dir.exists() || std::fs::read_dir(&out_dir).unwrap().next().is_none(),
            "nothing written"
        );
    }
    let spec = keelson(&[
        "build", "--config", EXAMPLE, "--out", "/tmp/x", "--spec", "9.9.9",
    ]);
    assert_eq!(spec.status.code(), Some(2));
    // A missing agent: a clear error and nothing half-written.
    let out = work.path().join("noagent");
    let result = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out.display().to_string(),
        "--agent",
        "/nonexistent/agent",
        "--no-image",
    ]);
    assert_eq!(result.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&result.stderr).contains("/nonexistent/agent"));
}

#[test]
fn a_dynamically_linked_agent_is_refused_and_the_static_one_named() {
    let work = tempfile::tempdir().unwrap();
    // What a plain `cargo build` leaves beside `keelson`: an executable with an interpreter.
    let dynamic = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    for command in ["build", "image"] {
        let out = work.path().join(command);
        let out_s = out.display().to_string();
        let mut args = vec![command, "--out", &out_s, "--agent", dynamic];
        if command == "build" {
            args.extend(["--config", EXAMPLE, "--no-image"]);
        }
        let result = keelson(&args);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains(dynamic)
                && stderr.contains("dynamically linked")
                && stderr.contains("make agent"),
            "{command}: the error names the file, why and the fix: {stderr}"
        );
        assert!(!out.join("bootstrap.ign").exists() && !out.join("keelson.qcow2").exists());
    }
    // The static one is accepted, and `keelson build` says which agent it used.
    let agent = fake_agent(work.path());
    let out = work.path().join("ok");
    let result = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out.display().to_string(),
        "--agent",
        &agent,
        "--no-image",
    ]);
    ok(&result);
    let stderr = String::from_utf8_lossy(&result.stderr);
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(tiny_static_elf()))
    };
    assert!(
        stderr.contains(&format!(
            "agent: {agent} ({} bytes, sha256 {sha})",
            tiny_static_elf().len()
        )),
        "{stderr}"
    );
}

#[test]
fn vrids_and_validate_print_what_they_derived() {
    let out = ok(&keelson(&["vrids", "--config", EXAMPLE]));
    let (api, ingress) = keelson_cluster::cluster::default_vrids("ocp4");
    assert!(out.contains(&format!("api         vrid {api:>3}")), "{out}");
    assert!(
        out.contains(&format!("ingress     vrid {ingress:>3}")),
        "{out}"
    );
    let out = ok(&keelson(&["validate", "--config", EXAMPLE_42]));
    assert!(
        out.contains("ocp4.osd2019.local") && out.contains("valid"),
        "{out}"
    );
}

#[test]
fn cluster_patch_reaches_cluster_json_and_the_rendered_configs() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let patch = work.path().join("patch.json");
    std::fs::write(
        &patch,
        r#"{"api": {"frontendPort": 7443}, "dns": {"upstreams": ["192.0.2.53:53"]}}"#,
    )
    .unwrap();
    let patch = patch.display().to_string();
    let out = work.path().join("out").display().to_string();
    ok(&keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out,
        "--agent",
        &agent,
        "--no-image",
        "--quiet",
        "--spec",
        "3.1.0",
        "--cluster-patch",
        &patch,
    ]));
    let written = std::fs::read(work.path().join("out/cluster.json")).unwrap();
    let cluster = keelson_cluster::ClusterConfig::from_json(&written).unwrap();
    assert_eq!(cluster.api.frontend_port, 7443);
    assert_eq!(cluster.dns.upstreams.len(), 1);
    assert_eq!(cluster.ignition.spec, "3.1.0");
    // `render` with the same patch carries the same cluster.json as the build's.
    let rendered = ok(&keelson(&[
        "render",
        "--config",
        EXAMPLE,
        "--role",
        "bootstrap",
        "--spec",
        "3.1.0",
        "--dir",
        &out,
        "--agent",
        &agent,
        "--cluster-patch",
        &patch,
    ]));
    let bootstrap = std::fs::read_to_string(work.path().join("out/bootstrap.ign")).unwrap();
    assert_eq!(rendered.trim_end(), bootstrap.trim_end());

    // A misspelt field in the patch: exit 2, the field named, nothing written.
    let bad = work.path().join("bad.json");
    std::fs::write(&bad, r#"{"api": {"frontendPrt": 7443}}"#).unwrap();
    let out2 = work.path().join("out2");
    let result = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out2.display().to_string(),
        "--agent",
        &agent,
        "--no-image",
        "--cluster-patch",
        &bad.display().to_string(),
    ]);
    assert_eq!(result.status.code(), Some(2));
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(
        err.contains("frontendPrt") && err.contains("bad.json"),
        "{err}"
    );
    assert!(!out2.exists() || std::fs::read_dir(&out2).unwrap().next().is_none());
}

#[test]
fn build_says_which_bootstrap_its_config_is_for() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let run = |out: &str, url: Option<&str>| {
        let mut args = vec![
            "build",
            "--config",
            EXAMPLE,
            "--out",
            out,
            "--agent",
            &agent,
            "--no-image",
        ];
        if let Some(url) = url {
            args.extend(["--agent-url", url]);
        }
        let result = keelson(&args);
        ok(&result);
        String::from_utf8_lossy(&result.stderr).into_owned()
    };
    let appliance = run(&work.path().join("a").display().to_string(), None);
    assert!(
        appliance.contains("warning: bootstrap.ign is for the keelson appliance image"),
        "{appliance}"
    );
    assert!(
        appliance.contains("pass --agent-url URL"),
        "the warning says what to pass: {appliance}"
    );
    // A warning is not progress: --quiet keeps it.
    let quiet_out = work.path().join("q").display().to_string();
    let quiet = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &quiet_out,
        "--agent",
        &agent,
        "--no-image",
        "--quiet",
    ]);
    ok(&quiet);
    assert!(
        String::from_utf8_lossy(&quiet.stderr).contains("--agent-url"),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    let rhcos = run(
        &work.path().join("b").display().to_string(),
        Some("https://objects.example/keelson-agent"),
    );
    assert!(
        rhcos.contains("fetches the agent from https://objects.example/keelson-agent"),
        "{rhcos}"
    );
    assert!(!rhcos.contains("warning"), "{rhcos}");
}

#[test]
fn a_bgp_patch_is_validated_and_reaches_cluster_json() {
    let work = tempfile::tempdir().unwrap();
    let patch = work.path().join("bgp.json");
    let good = r#"{"bgp": {"vips": ["api"], "localAsn": 64512,
                  "peers": [{"address": "10.0.0.1", "asn": 65001}]}}"#;
    std::fs::write(&patch, good).unwrap();
    let p = patch.display().to_string();
    let out = ok(&keelson(&[
        "validate",
        "--config",
        EXAMPLE,
        "--cluster-patch",
        &p,
    ]));
    assert!(
        out.contains("bgp: api announced by BGP (AS64512, 1 peers)"),
        "{out}"
    );
    // A wrong field is named, with what was expected.
    std::fs::write(&patch, good.replace("\"api\"]", "\"apii\"]")).unwrap();
    let result = keelson(&["validate", "--config", EXAMPLE, "--cluster-patch", &p]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(
        err.contains("bgp.vips[0]: expected the name of a vrrp.instances[] entry"),
        "{err}"
    );
    std::fs::write(&patch, good.replace("localAsn", "localASN")).unwrap();
    let err = String::from_utf8_lossy(
        &keelson(&["validate", "--config", EXAMPLE, "--cluster-patch", &p]).stderr,
    )
    .into_owned();
    assert!(err.contains("unknown field `localASN`"), "{err}");
    // build writes it, with the defaults filled in.
    std::fs::write(&patch, good).unwrap();
    let agent = fake_agent(work.path());
    let out = work.path().join("out").display().to_string();
    ok(&keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        &out,
        "--agent",
        &agent,
        "--no-image",
        "--quiet",
        "--cluster-patch",
        &p,
    ]));
    let cluster = keelson_cluster::ClusterConfig::from_json(
        &std::fs::read(work.path().join("out/cluster.json")).unwrap(),
    )
    .unwrap();
    let bgp = cluster.bgp.unwrap();
    assert_eq!(
        (bgp.table, bgp.bfd.interval_ms, bgp.bfd.multiplier),
        (198, 300, 3)
    );
}

const OPENSHIFT_414: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../testdata/openshift-install/4.14"
);
const OPENSHIFT_42: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../testdata/openshift-install/4.2"
);

/// The example install-config as OpenShift's UPI writes it: `platform: none`, no VIPs.
fn platform_none(dir: &Path) -> String {
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let at = text.find("platform:").unwrap();
    let end = text[at..].find("pullSecret").unwrap() + at;
    let path = dir.join("install-config.yaml");
    std::fs::write(
        &path,
        format!("{}platform:\n  none: {{}}\n{}", &text[..at], &text[end..]),
    )
    .unwrap();
    path.display().to_string()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `keelson vrids --scan`: keepalived (a real neighbour's virtual router: VRRPv3 multicast,
/// VRID 51 as a cluster named `lab` derives it, 100 ms adverts) on a segment, and the scan
/// from another node of it lists VRID 51 with keepalived's address and VIP, marked as the
/// scanning cluster's (an install-config named `ocp8`, which gets 51 and 146 too), and 146 as
/// not heard. Needs root and keepalived.
#[test]
fn vrids_scan_lists_the_virtual_routers_on_a_segment() {
    use keelson_testkit::{Segment, require, require_root};
    if !require_root() || !require("keepalived") {
        return;
    }
    let seg = Segment::ipv4_only("kvs", 2, 0);
    let dir = tempfile::tempdir().unwrap();
    let conf = "global_defs {\n    router_id kvs-ka\n}\n\
        vrrp_instance lab_api {\n    state BACKUP\n    interface eth0\n    version 3\n    \
        virtual_router_id 51\n    priority 100\n    advert_int 0.1\n    \
        virtual_ipaddress {\n        10.0.0.5/32 dev eth0\n    }\n}\n";
    let mut ka = keelson_testkit::agent::start_keepalived(&seg, dir.path(), 1, conf);
    let config = dir.path().join("install-config.yaml");
    std::fs::write(
        &config,
        std::fs::read_to_string(EXAMPLE)
            .unwrap()
            .replace("name: ocp4", "name: ocp8"),
    )
    .unwrap();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &seg.nodes[0],
            KEELSON,
            "vrids",
            "--scan",
            "eth0",
        ])
        .args(["--seconds", "1.5", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    ka.term();
    let text = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("eth0: 1 virtual router(s) heard")
            && text.contains("vrid  51 IPv4 v3 every 100 ms: vips 10.0.0.5; routers 10.0.0.11")
            && text.contains("<- this cluster's VRID: taken")
            && text.contains("this cluster's VRIDs not heard: 146"),
        "{text}"
    );
    // ocp8's derived VRIDs are lab's: the warning says so and what to do.
    assert!(
        stderr.contains("\"lab\" (51, 146)") && stderr.contains("--vrid api=N"),
        "{stderr}"
    );
    // Bad input is named.
    let e = keelson(&["vrids", "--scan", "no-such-if0", "--seconds", "1"]);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("--scan no-such-if0: no such interface"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let e = keelson(&["vrids", "--config", EXAMPLE, "--vrid", "api=256"]);
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("api: expected a VRID 1..=255, got \"256\""),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let e = keelson(&[
        "vrids",
        "--config",
        EXAMPLE,
        "--vrid",
        "api=9",
        "--vrid",
        "ingress=9",
    ]);
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("vrrp.instances[1].vrid"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
}

/// A bootstrap config too large for user_data (Nova's 65,535 bytes of base64) is written
/// all the same, with a note, and boots from a pointer to a hosted copy: `keelson pointer`
/// writes it, and the Heat template takes it as a parameter instead of the file.
#[test]
fn a_bootstrap_over_the_limit_is_written_and_boots_from_a_pointer() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    // 700 SSH keys of ~100 bytes: the bootstrap carries them twice (cluster.json, passwd).
    let keys: String = (0..700)
        .map(|i| format!("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:043} operator{i}@example\n"))
        .collect();
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let start = text.find("sshKey:").unwrap();
    let config = work.path().join("install-config.yaml");
    let indented: String = keys.lines().map(|k| format!("  {k}\n")).collect();
    std::fs::write(&config, format!("{}sshKey: |\n{indented}", &text[..start])).unwrap();
    let out_dir = work.path().join("out");
    let out = keelson(&[
        "build",
        "--config",
        config.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
    ]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bootstrap = std::fs::read(out_dir.join("bootstrap.ign")).unwrap();
    let base64 = bootstrap.len().div_ceil(3) * 4;
    assert!(base64 > 65_535, "{} bytes", bootstrap.len());
    assert!(
        stderr.contains(&format!(
            "bootstrap.ign is {} bytes, {base64} in base64, over Nova's user_data limit of 65535 bytes of base64",
            bootstrap.len()
        )),
        "{stderr}"
    );
    let heat: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(out_dir.join("openstack.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        heat["resources"]["bootstrap"]["properties"]["user_data"],
        serde_json::json!({"get_param": "bootstrap_user_data"})
    );
    let pointer = out_dir.join("bootstrap.pointer.ign");
    ok(&keelson(&[
        "pointer",
        "--for",
        out_dir.join("bootstrap.ign").to_str().unwrap(),
        "--source",
        "http://172.24.4.2:9292/v2/images/0c6f/file",
        "--header",
        "X-Auth-Token=gAAAAB-token",
        "--out",
        pointer.to_str().unwrap(),
    ]));
    let text = std::fs::read(&pointer).unwrap();
    assert!(text.len().div_ceil(3) * 4 <= 65_535);
    let doc: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let merge = &doc["ignition"]["config"]["merge"][0];
    assert_eq!(merge["httpHeaders"][0]["value"], "gAAAAB-token");
    use sha2::Digest;
    assert_eq!(
        merge["verification"]["hash"],
        format!("sha512-{}", hex::encode(sha2::Sha512::digest(&bootstrap)))
    );
    // The cluster CA from out/tls rides along, as in every pointer keelson writes.
    let ca = std::fs::read_to_string(out_dir.join("tls/ca.crt")).unwrap();
    let cas = &doc["ignition"]["security"]["tls"]["certificateAuthorities"];
    assert_eq!(cas.as_array().unwrap().len(), 1);
    assert!(
        cas[0]["source"].as_str().unwrap().len() > ca.len() / 2,
        "the CA is there"
    );
    // A header in spec 2.2 is refused, naming why.
    let out22 = work.path().join("out22");
    ok(&keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        out22.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--spec",
        "2.2.0",
    ]));
    let refused = keelson(&[
        "pointer",
        "--for",
        out22.join("bootstrap.ign").to_str().unwrap(),
        "--source",
        "http://172.24.4.2:9292/v2/images/0c6f/file",
        "--header",
        "X-Auth-Token=t",
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("spec 2.2.0, which has no httpHeaders"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `--version` names the release and the commit it was built from (or `unknown`).
#[test]
fn version_names_the_release_and_the_commit() {
    let out = ok(&keelson(&["--version"]));
    keelson_testkit::cmd::check_version_line(&out, "keelson", env!("CARGO_PKG_VERSION"));
}
