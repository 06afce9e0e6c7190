//! keelson's merge of an operator's config held against the real Ignition program (Debian's
//! 2.14, what the RHCOS stand-in's initramfs runs): the tree Ignition writes from keelson's
//! merged config is the tree it writes when it merges the two configs itself (keelson's as
//! the parent, the operator's as a `merge` child), for spec 3.x, and for spec 2.2 through
//! the 2.2-to-3 translation (Ignition 2.x reads no spec 2; RHCOS 4.2-4.5's Ignition 0.x
//! appended, which for configs without clashes is the same union). And why a clash is an
//! error: Ignition's result then depends on which config it took as the child.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use keelson_cluster::install_config::InstallConfig;
use keelson_cluster::render::merge::{self, Named};
use keelson_cluster::render::operator::OperatorConfig;
use keelson_cluster::render::{self, NodeAssets, convert};
use keelson_cluster::{ClusterConfig, Role, SpecVersion};
use serde_json::{Value, json};

const IGNITION_BIN: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

fn cluster() -> ClusterConfig {
    InstallConfig::parse(include_str!("../../examples/install-config.yaml"))
        .unwrap()
        .cluster_config()
}

fn assets() -> NodeAssets {
    // A real CA: Ignition parses the certificate authorities it is given.
    let dir = tempfile::tempdir().unwrap();
    let pki = keelson_cluster::pki::load_or_create(dir.path(), &cluster(), Some(0)).unwrap();
    NodeAssets {
        ca_pem: pki.ca_cert_pem,
        server_cert_pem: pki.server_cert_pem,
        server_key_pem: pki.server_key_pem,
        agent_sha512: "ab".repeat(64),
        agent_url: None,
        agent_inline: None,
        membership_keys: pki.membership_keys,
        operator: Default::default(),
    }
}

/// An operator's config of the kind Butane writes: a unit with a drop-in that leaves a
/// marker, a file, a directory, a link, a user, a group, an append to /etc/motd.
fn operator_v3() -> Value {
    json!({
        "ignition": {"version": "3.2.0"},
        "storage": {
            "files": [
                {"path": "/etc/operator/settings.conf", "mode": 416, "overwrite": true,
                 "contents": {"source": "data:,answer%3D42%0A"}},
                {"path": "/etc/motd", "mode": 420, "append": [{"source": "data:,operator%20was%20here%0A"}]}
            ],
            "directories": [{"path": "/var/lib/operator", "mode": 488}],
            "links": [{"path": "/etc/operator/current", "target": "/etc/operator/settings.conf"}]
        },
        "systemd": {"units": [{
            "name": "operator-marker.service", "enabled": true,
            "contents": "[Unit]\nDescription=leaves a marker\n[Service]\nType=oneshot\nExecStart=/bin/touch /var/lib/operator/ran\n[Install]\nWantedBy=multi-user.target\n",
            "dropins": [{"name": "10-env.conf", "contents": "[Service]\nEnvironment=FROM=operator\n"}]
        }]},
        "passwd": {
            "users": [{"name": "operator", "sshAuthorizedKeys": ["ssh-ed25519 AAAAoperator op@example"], "groups": ["opgroup"]}],
            "groups": [{"name": "opgroup", "gid": 4242}]
        }
    })
}

/// What Ignition wrote under a root, comparable: path -> (kind, mode, owner, contents).
type Tree = BTreeMap<String, String>;

fn snapshot(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            // Ignition's own bookkeeping and the shadow tools' backups and lock.
            if rel.ends_with(".ignition-result.json")
                || rel.ends_with('-')
                || rel.ends_with(".pwd.lock")
                || rel == "etc/shadow"
                || rel == "etc/gshadow"
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let owner = format!("{}:{}", meta.uid(), meta.gid());
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                walk(root, &path, out);
                format!("dir {mode:o} {owner}")
            } else {
                let bytes = std::fs::read(&path).unwrap();
                format!(
                    "file {mode:o} {owner} {}",
                    String::from_utf8_lossy(&bytes).replace('\n', "\\n")
                )
            };
            out.insert(rel, what);
        }
    }
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

/// Runs Ignition's fetch and files stages on `config` into a fresh root (with the host's
/// account files, which `useradd --root` edits, and SELinux off) and returns what it wrote.
fn apply(config: &Value) -> Tree {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("etc/selinux")).unwrap();
    std::fs::write(
        root.join("etc/selinux/config"),
        "SELINUX=disabled\nSELINUXTYPE=targeted\n",
    )
    .unwrap();
    for f in ["passwd", "group", "shadow", "gshadow"] {
        std::fs::copy(Path::new("/etc").join(f), root.join("etc").join(f)).unwrap();
    }
    // Debian's Ignition relabels what it wrote for SELinux with `setfiles` once the root
    // has an SELinux config (and fails without one). Labels are not what this test
    // compares, so a `setfiles` that takes the list and does nothing stands in for it.
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("setfiles"), "#!/bin/sh\ncat >/dev/null\n").unwrap();
    std::fs::set_permissions(bin.join("setfiles"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let config_path = work.path().join("config.ign");
    std::fs::write(&config_path, serde_json::to_vec(config).unwrap()).unwrap();
    for stage in ["fetch", "files"] {
        let out = Command::new("timeout")
            .arg("120")
            .arg(IGNITION_BIN)
            .args([
                "-platform",
                "file",
                "-stage",
                stage,
                "-log-to-stdout",
                "-root",
            ])
            .arg(&root)
            .arg("-config-cache")
            .arg(work.path().join("cache.json"))
            .arg("-state-file")
            .arg(work.path().join("state"))
            .arg("-neednet")
            .arg(work.path().join("neednet"))
            .env("IGNITION_CONFIG_FILE", &config_path)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ignition -stage {stage} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    snapshot(&root)
}

/// `parent` with `child` as a `merge` reference (a data URL): Ignition merges them itself.
fn with_child(parent: &Value, child: &Value) -> Value {
    let mut p = parent.clone();
    let url = render::plain_data_url(&serde_json::to_vec(child).unwrap());
    p["ignition"]["config"] = json!({"merge": [{"source": url}]});
    p
}

fn ready() -> bool {
    keelson_testkit::require_root() && keelson_testkit::require_file(IGNITION_BIN, "Ignition 2.14")
}

fn bootstrap_parts(spec: SpecVersion, operator: Value) -> (Value, Value, Value) {
    let cluster = cluster();
    let base = assets();
    let own: Value = serde_json::from_slice(
        &render::render_full(&cluster, Role::Bootstrap, spec, &base).unwrap(),
    )
    .unwrap();
    let op = OperatorConfig::parse(
        "--merge bootstrap=operator.ign",
        &serde_json::to_vec(&operator).unwrap(),
        spec,
    )
    .unwrap();
    let mut with_op = base;
    with_op.operator.insert(Role::Bootstrap, op.clone());
    let merged: Value = serde_json::from_slice(
        &render::render_full(&cluster, Role::Bootstrap, spec, &with_op).unwrap(),
    )
    .unwrap();
    (own, op.config, merged)
}

#[test]
fn spec_3_merge_is_what_ignition_applies() {
    if !ready() {
        return;
    }
    let (own, op, merged) = bootstrap_parts(SpecVersion::V3_2, operator_v3());
    let ours = apply(&merged);
    let ignitions = apply(&with_child(&own, &op));
    assert_eq!(ours, ignitions);
    // What each side wanted is there: keelson's files and the operator's.
    assert!(ours["etc/keelson/cluster.json"].starts_with("file 644 0:0"));
    assert!(ours.contains_key("etc/systemd/system/operator-marker.service.d/10-env.conf"));
    assert_eq!(
        ours["etc/operator/current"],
        "link -> /etc/operator/settings.conf"
    );
    assert!(ours["etc/operator/settings.conf"].starts_with("file 640 0:0 answer=42"));
    assert!(ours["var/lib/operator"].starts_with("dir 750"));
    assert!(ours.contains_key("home/operator/.ssh/authorized_keys.d/ignition"));
    assert!(ours.contains_key("home/core/.ssh/authorized_keys.d/ignition"));
    // The order of entries is Ignition's with keelson's config as the parent: keelson's
    // first. It matters even without a clash, as users without a `uid` take the next free
    // one in the order they are created.
    let created_first = |t: &Tree| {
        let p = &t["etc/passwd"];
        p.find("\\ncore:").unwrap() < p.find("\\noperator:").unwrap()
    };
    assert!(created_first(&ours), "{}", ours["etc/passwd"]);
    assert!(!created_first(&apply(&with_child(&op, &own))));
}

#[test]
fn spec_2_2_merge_is_what_ignition_applies_through_the_translation() {
    if !ready() {
        return;
    }
    let op_v2 = convert::convert(&operator_v3(), SpecVersion::V3_2, SpecVersion::V2_2).unwrap();
    let (own, op, merged) = bootstrap_parts(SpecVersion::V2_2, op_v2);
    assert_eq!(merged["ignition"]["version"], "2.2.0");
    let up = |v: &Value| convert::convert(v, SpecVersion::V2_2, SpecVersion::V3_0).unwrap();
    let ours = apply(&up(&merged));
    let ignitions = apply(&with_child(&up(&own), &up(&op)));
    assert_eq!(ours, ignitions);
    assert!(ours.contains_key("etc/systemd/system/operator-marker.service"));
    assert!(ours["etc/motd"].contains("operator was here"));
}

/// The rule keelson enforces, shown on Ignition itself: two configs that write one path
/// differently give a node whatever the config Ignition took as the child says.
#[test]
fn a_clash_is_an_error_because_ignition_lets_the_child_win() {
    if !ready() {
        return;
    }
    let a = json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
        {"path": "/etc/x", "mode": 420, "overwrite": true, "contents": {"source": "data:,from-a"}}]}});
    let b = json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
        {"path": "/etc/x", "mode": 420, "overwrite": true, "contents": {"source": "data:,from-b"}}]}});
    let ab = apply(&with_child(&a, &b));
    let ba = apply(&with_child(&b, &a));
    assert!(ab["etc/x"].ends_with("from-b"));
    assert!(ba["etc/x"].ends_with("from-a"));
    let e = merge::merge(
        Named {
            config: &a,
            name: "a.ign",
        },
        Named {
            config: &b,
            name: "b.ign",
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("storage.files path \"/etc/x\": defined by a.ign and by b.ign"),
        "{e}"
    );
}
