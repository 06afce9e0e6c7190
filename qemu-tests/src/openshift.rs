//! The QEMU cluster beside OpenShift (docs/qemu-cluster.md, "Beside openshift-install"): what
//! `openshift-install create ignition-configs` writes for a `platform: none` cluster, made
//! here in its exact shapes (openshift-install itself cannot run on this machine), and the
//! machine-config-server stand-in's content.
//!
//! - `master.ign`, `worker.ign`: pointers to `https://api-int.<zone>:22623/config/<role>`
//!   with OpenShift's root CA as a data URL;
//! - `bootstrap.ign`: a full config carrying what the bootstrap's machine-config-server
//!   serves (its certificate for `api-int.<zone>` from that CA, the rendered master and
//!   worker configs under `/etc/mcs/`), an appended `/etc/motd` and `bootkube.service`;
//! - `metadata.json`.
//!
//! The rendered configs are what the masters and workers get from OpenShift: a file, a unit
//! that leaves a marker, `core`'s key, and on the masters the machine-config-server itself
//! (`kube-standin --mcs`, in the stand-in image), as OpenShift runs one on every master once
//! the control plane is up — so the API VIP has somewhere to go when the bootstrap leaves.

use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine;
use serde_json::{Value, json};

/// Where a node keeps what its machine-config-server stand-in serves.
pub const MCS_DIR: &str = "/etc/mcs";
/// The file the rendered configs write, naming the pool (checked in each node).
pub const RENDERED_MARKER: &str = "/etc/openshift/rendered";
/// What the rendered configs' unit leaves behind when it ran.
pub const UNIT_MARKER: &str = "/var/lib/openshift-marker";
/// The unit that leaves it.
pub const MARKER_UNIT: &str = "openshift-marker.service";
/// The machine-config-server stand-in's unit on the masters.
pub const MCS_UNIT: &str = "machine-config-server.service";
/// The stand-in binary in the stand-in image.
const STANDIN_BIN: &str = "/usr/local/libexec/kube-standin";

/// `data:` URL as openshift-install writes them (vincent-petithory/dataurl).
fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:text/plain;charset=utf-8;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn file(path: &str, mode: u32, bytes: &[u8]) -> Value {
    json!({"overwrite": true, "path": path, "user": {"name": "root"},
           "contents": {"source": data_url(bytes)}, "mode": mode})
}

/// OpenShift's root CA and the machine-config-server's certificate and key (PEM).
struct Pki {
    ca_pem: String,
    mcs_cert_pem: String,
    mcs_key_pem: String,
}

fn pki(zone: &str) -> Result<Pki> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, "openshift");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "root-ca");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    // As on platform none: the name the pointers use, no IP address.
    let mut params = CertificateParams::new(vec![format!("api-int.{zone}")])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "system:machine-config-server");
    let cert = params.signed_by(&key, &ca)?;
    Ok(Pki {
        ca_pem: ca.pem(),
        mcs_cert_pem: cert.pem(),
        mcs_key_pem: key.serialize_pem(),
    })
}

/// `core`'s key, which OpenShift's configs carry.
fn core(ssh_key: &str) -> Value {
    json!({"users": [{"name": "core", "sshAuthorizedKeys": [ssh_key]}]})
}

fn marker_unit() -> Value {
    json!({
        "name": MARKER_UNIT, "enabled": true,
        "contents": format!("[Unit]\nDescription=Leaves a marker: the machine-config-server's config ran\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh -c 'echo ran > {UNIT_MARKER}'\n\n[Install]\nWantedBy=multi-user.target\n")
    })
}

/// The rendered worker config.
fn rendered_worker(ssh_key: &str) -> Value {
    json!({
        "ignition": {"version": "3.2.0"},
        "passwd": core(ssh_key),
        "storage": {"files": [file(RENDERED_MARKER, 420, b"worker\n")]},
        "systemd": {"units": [marker_unit()]}
    })
}

/// The rendered master config: the machine-config-server with its certificate and the
/// worker config it serves, and `master` — the master config itself when given, which a
/// config cannot carry of itself (so the masters' own servers hand a master the config
/// without this one file).
fn rendered_master(pki: &Pki, ssh_key: &str, worker: &Value, master: Option<&Value>) -> Value {
    let mut files = vec![
        file(RENDERED_MARKER, 420, b"master\n"),
        file(
            &format!("{MCS_DIR}/tls.crt"),
            420,
            pki.mcs_cert_pem.as_bytes(),
        ),
        file(
            &format!("{MCS_DIR}/tls.key"),
            384,
            pki.mcs_key_pem.as_bytes(),
        ),
        file(
            &format!("{MCS_DIR}/worker.ign"),
            420,
            &serde_json::to_vec(worker).unwrap_or_default(),
        ),
    ];
    if let Some(m) = master {
        files.push(file(
            &format!("{MCS_DIR}/master.ign"),
            420,
            &serde_json::to_vec(m).unwrap_or_default(),
        ));
    }
    json!({
        "ignition": {"version": "3.2.0"},
        "passwd": core(ssh_key),
        "storage": {"files": files},
        "systemd": {"units": [
            marker_unit(),
            {"name": MCS_UNIT, "enabled": true,
             "contents": format!("[Unit]\nDescription=machine-config-server stand-in: OpenShift's configs on :22623\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nExecStart={STANDIN_BIN} --mcs {MCS_DIR} --listen 0.0.0.0:22623\nRestart=always\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n")}
        ]}
    })
}

/// Writes openshift-install's output for cluster `name` in `zone` into `dir`.
pub fn write_install_dir(dir: &Path, name: &str, zone: &str, ssh_key: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let pki = pki(zone)?;
    let write = |file: &str, v: &Value| {
        let path = dir.join(file);
        std::fs::write(&path, serde_json::to_vec(v)?).with_context(|| path.display().to_string())
    };
    let worker = rendered_worker(ssh_key);
    let master_inner = rendered_master(&pki, ssh_key, &worker, None);
    let master = rendered_master(&pki, ssh_key, &worker, Some(&master_inner));
    for role in ["master", "worker"] {
        write(
            &format!("{role}.ign"),
            &json!({"ignition": {
                "config": {"merge": [{"source": format!("https://api-int.{zone}:22623/config/{role}")}]},
                "security": {"tls": {"certificateAuthorities": [{"source": data_url(pki.ca_pem.as_bytes())}]}},
                "version": "3.2.0"}}),
        )?;
    }
    let bootstrap = json!({
        "ignition": {"version": "3.2.0"},
        "passwd": core(ssh_key),
        "storage": {"files": [
            {"overwrite": false, "path": "/etc/motd", "user": {"name": "root"},
             "append": [{"source": data_url(b"This is the bootstrap node; it will be destroyed when the master is fully up.\n")}],
             "mode": 420},
            file("/opt/openshift/tls/root-ca.crt", 420, pki.ca_pem.as_bytes()),
            file(&format!("{MCS_DIR}/tls.crt"), 420, pki.mcs_cert_pem.as_bytes()),
            file(&format!("{MCS_DIR}/tls.key"), 384, pki.mcs_key_pem.as_bytes()),
            file(&format!("{MCS_DIR}/master.ign"), 420, &serde_json::to_vec(&master)?),
            file(&format!("{MCS_DIR}/worker.ign"), 420, &serde_json::to_vec(&worker)?),
        ]},
        "systemd": {"units": [
            {"name": "bootkube.service",
             "contents": "[Unit]\nDescription=Bootstrap a Kubernetes cluster\n\n[Service]\nWorkingDirectory=/opt/openshift\nExecStart=/usr/local/bin/bootkube.sh\nRestart=on-failure\nRestartSec=5s\n"}
        ]}
    });
    write("bootstrap.ign", &bootstrap)?;
    write(
        "metadata.json",
        &json!({"clusterName": name, "clusterID": "5f1c2a9e-0b7d-4e61-9c3a-7d2e8f4b6a10", "infraID": format!("{name}-kq7x2")}),
    )?;
    Ok(())
}

/// The operator's own configs, merged with `keelson build --merge` (docs/own-ignition.md):
/// for the masters a unit that leaves a marker, a file and a user; for the workers a file
/// and a unit (which the appliance refuses, and says so).
pub fn write_operator_configs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let unit = |name: &str, marker: &str| {
        json!({"name": name, "enabled": true,
               "contents": format!("[Unit]\nDescription=The operator's own unit: leaves a marker\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh -c 'echo ran > {marker}'\n\n[Install]\nWantedBy=multi-user.target\n")})
    };
    let master = json!({
        "ignition": {"version": "3.1.0"},
        "storage": {"files": [{"path": OPERATOR_FILE, "mode": 420, "overwrite": true,
            "contents": {"source": "data:,operator%20master%0A"}}]},
        "systemd": {"units": [unit(OPERATOR_UNIT, OPERATOR_MARKER)]},
        "passwd": {"users": [{"name": OPERATOR_USER, "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorsOwnKeyForTheQemuCluster000000000 op@example"]}]}
    });
    let worker = json!({
        "ignition": {"version": "3.1.0"},
        "storage": {"files": [{"path": OPERATOR_FILE, "mode": 420, "overwrite": true,
            "contents": {"source": "data:,operator%20worker%0A"}}]},
        "systemd": {"units": [unit(OPERATOR_UNIT, OPERATOR_MARKER)]}
    });
    std::fs::write(dir.join("master.ign"), serde_json::to_vec(&master)?)?;
    std::fs::write(dir.join("worker.ign"), serde_json::to_vec(&worker)?)?;
    Ok(())
}

/// The operator's file.
pub const OPERATOR_FILE: &str = "/etc/operator/config";
/// The operator's unit.
pub const OPERATOR_UNIT: &str = "operator-marker.service";
/// What it leaves.
pub const OPERATOR_MARKER: &str = "/var/lib/operator-marker";
/// The operator's user.
pub const OPERATOR_USER: &str = "clusterops";

#[cfg(test)]
mod tests {
    use super::*;

    /// What this writes reads as openshift-install's output: the checks `keelson build
    /// --openshift-install-dir` makes.
    #[test]
    fn the_install_dir_has_openshift_install_shapes() {
        let dir = tempfile::tempdir().unwrap();
        write_install_dir(
            dir.path(),
            "ocp4",
            "ocp4.osd2019.local",
            "ssh-ed25519 AAAA x",
        )
        .unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let os = keelson_cluster::render::openshift::OpenShiftConfigs::parse(
            "dir",
            &read("bootstrap.ign"),
            &read("master.ign"),
            &read("worker.ign"),
            &read("metadata.json"),
        )
        .unwrap();
        assert_eq!(os.mcs_host(), "api-int.ocp4.osd2019.local");
        assert!(os.needs_dns());
        assert_eq!(os.cluster_name, "ocp4");
    }
}
