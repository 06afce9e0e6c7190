//! keelson beside openshift-install (`keelson build --openshift-install-dir DIR`,
//! docs/own-ignition.md "OpenShift"): what `openshift-install create ignition-configs`
//! writes, checked, and composed with keelson's configs.
//!
//! openshift-install writes `bootstrap.ign` (a full config: bootkube, the bootstrap's own
//! machine-config-server, kubelet, certificates; hundreds of KiB), `master.ign` and
//! `worker.ign` (pointers: merge — `append` in spec 2.2 — of
//! `https://api-int.<cluster>.<baseDomain>:22623/config/<role>`, trusting the
//! machine-config-server's CA) and `metadata.json`. In the composition OpenShift's
//! machine-config-server keeps :22623; keelson's Ignition server moves to
//! [`KEELSON_TLS_PORT`]; `bootstrap.ign` is OpenShift's with keelson's bootstrap merged in,
//! and each pointer gets keelson's config as a second source beside OpenShift's.

use serde_json::Value;

use super::convert::{self, ConvertError};
use super::merge::{self, MergeError, Named};
use crate::cluster::Role;
use crate::version::SpecVersion;

/// keelson's Ignition server (TLS) when OpenShift's machine-config-server has :22623 and
/// :22624: the next ports after keelson's metrics (:22625), outside every range OpenShift
/// reserves on its nodes (9000-9999, 10250-10259, 30000-32767, 2379-2380, 6443,
/// 22623-22624), so a cluster's firewall rules stay one block, 22623-22627.
pub const KEELSON_TLS_PORT: u16 = 22626;
/// keelson's plain-HTTP Ignition port beside it.
pub const KEELSON_PLAIN_PORT: u16 = 22627;
/// The machine-config-server's port, where OpenShift's pointers send Ignition.
pub const MCS_PORT: u16 = 22623;

/// What is wrong with openshift-install's output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenShiftError {
    /// A file is not a config of the shape openshift-install writes.
    #[error("{file}: {why}")]
    Shape {
        /// `master.ign`, ...
        file: String,
        /// What was expected.
        why: String,
    },
    /// A config could not be converted to the build's spec.
    #[error("{file}: {source}")]
    Convert {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: ConvertError,
    },
    /// Composing clashed.
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// openshift-install's output, read.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenShiftConfigs {
    /// The spec openshift-install wrote (2.2.0 for 4.2-4.5, 3.x since 4.6).
    pub spec: SpecVersion,
    /// `bootstrap.ign`, normalized.
    pub bootstrap: Value,
    /// `master.ign`, normalized.
    pub master: Value,
    /// `worker.ign`, normalized.
    pub worker: Value,
    /// `metadata.json`'s `clusterName`.
    pub cluster_name: String,
    /// Where the pointers send Ignition (`https://api-int.<zone>:22623/config/`).
    pub mcs_base: String,
}

impl OpenShiftConfigs {
    /// Reads the four files' contents; `name` prefixes file names in errors (the directory).
    pub fn parse(
        dir: &str,
        bootstrap: &[u8],
        master: &[u8],
        worker: &[u8],
        metadata: &[u8],
    ) -> Result<Self, OpenShiftError> {
        let file = |f: &str| format!("{dir}/{f}");
        let read = |f: &str, bytes: &[u8]| {
            convert::read(bytes)
                .map(|(spec, v)| (spec, merge::normalize(&v)))
                .map_err(|source| OpenShiftError::Convert {
                    file: file(f),
                    source,
                })
        };
        let (spec, bootstrap) = read("bootstrap.ign", bootstrap)?;
        let (mspec, master) = read("master.ign", master)?;
        let (wspec, worker) = read("worker.ign", worker)?;
        for (f, s) in [("master.ign", mspec), ("worker.ign", wspec)] {
            if s != spec {
                return Err(OpenShiftError::Shape {
                    file: file(f),
                    why: format!(
                        "spec {s}, while bootstrap.ign is {spec}: expected one run of openshift-install"
                    ),
                });
            }
        }
        if bootstrap.get("storage").is_none() && bootstrap.get("systemd").is_none() {
            return Err(OpenShiftError::Shape {
                file: file("bootstrap.ign"),
                why: "expected the full bootstrap config openshift-install writes (storage and systemd)".into(),
            });
        }
        let mut mcs_base = None;
        for (f, role, config) in [
            ("master.ign", Role::Master, &master),
            ("worker.ign", Role::Worker, &worker),
        ] {
            let base = pointer_base(config, spec, role)
                .map_err(|why| OpenShiftError::Shape { file: file(f), why })?;
            match &mcs_base {
                None => mcs_base = Some(base),
                Some(b) if *b == base => {}
                Some(b) => {
                    return Err(OpenShiftError::Shape {
                        file: file(f),
                        why: format!("points at {base}, master.ign at {b}: expected one server"),
                    });
                }
            }
        }
        let meta: Value = serde_json::from_slice(metadata).map_err(|e| OpenShiftError::Shape {
            file: file("metadata.json"),
            why: format!("not JSON: {e}"),
        })?;
        let cluster_name = meta["clusterName"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| OpenShiftError::Shape {
                file: file("metadata.json"),
                why: "expected clusterName".into(),
            })?
            .to_owned();
        Ok(Self {
            spec,
            bootstrap,
            master,
            worker,
            cluster_name,
            mcs_base: mcs_base.unwrap_or_default(),
        })
    }

    /// The pointer openshift-install wrote for `role`.
    pub fn pointer(&self, role: Role) -> &Value {
        match role {
            Role::Worker => &self.worker,
            _ => &self.master,
        }
    }

    /// The host the pointers name (`api-int.<cluster>.<baseDomain>`, or the API VIP on
    /// platforms where openshift-install points at it).
    pub fn mcs_host(&self) -> &str {
        self.mcs_base
            .trim_start_matches("https://")
            .split('/')
            .next()
            .unwrap_or_default()
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or_default()
    }

    /// Whether the pointers name a host that a node must resolve before its Ignition can
    /// fetch (platform `none`): then its first resolver must be the cluster's DNS.
    pub fn needs_dns(&self) -> bool {
        let host = self
            .mcs_host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        host.parse::<std::net::IpAddr>().is_err()
    }
}

/// Weight of the API instance's machine-config-server check in the composition: above the
/// local-apiserver check's 20, so a master whose machine-config-server answers holds the VIP
/// before one whose apiserver does (new nodes boot from the VIP; the API reaches every
/// master through any holder's proxy), and below the bootstrap's lead over a master (30),
/// so the bootstrap keeps the VIP until it goes.
pub const MCS_CHECK_WEIGHT: i32 = 25;

/// `cluster` as it runs beside OpenShift (docs/own-ignition.md): keelson's Ignition server
/// off OpenShift's ports, the API VIP following where the machine-config-server answers
/// (bootstrap first, then the masters), and no `core` keys of keelson's (OpenShift's configs
/// carry the node's users).
pub fn adapt_cluster(cluster: &mut crate::ClusterConfig) {
    use crate::cluster::{HealthCheckConfig, HealthCheckKind};
    cluster.ignition.tls_port = KEELSON_TLS_PORT;
    cluster.ignition.plain_port = KEELSON_PLAIN_PORT;
    cluster.ssh_authorized_keys.clear();
    for inst in &mut cluster.vrrp.instances {
        if inst.priorities.bootstrap.is_none() {
            continue;
        }
        if inst
            .checks
            .iter()
            .any(|c| c.name == "machine-config-server")
        {
            continue;
        }
        inst.checks.push(HealthCheckConfig {
            name: "machine-config-server".into(),
            check: HealthCheckKind::Http {
                url: format!("https://127.0.0.1:{MCS_PORT}/healthz"),
                expect_status: 200,
            },
            interval_ms: 2000,
            rise: 1,
            fall: 2,
            weight: MCS_CHECK_WEIGHT,
            timeout_ms: Some(5000),
        });
    }
}

/// `https://<host>:22623/config/` of a pointer for `role`, or what is wrong with it.
fn pointer_base(config: &Value, spec: SpecVersion, role: Role) -> Result<String, String> {
    let key = if spec.is_v2() { "append" } else { "merge" };
    let refs = config["ignition"]["config"][key]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let suffix = format!("/config/{}", role.as_str());
    let sources: Vec<&str> = refs.iter().filter_map(|r| r["source"].as_str()).collect();
    let Some(source) = sources
        .iter()
        .find(|s| s.starts_with("https://") && s.ends_with(&suffix))
    else {
        return Err(format!(
            "expected a pointer: ignition.config.{key} with https://<api-int>:{MCS_PORT}{suffix}, got {sources:?}"
        ));
    };
    if !source.contains(&format!(":{MCS_PORT}/")) {
        return Err(format!(
            "{source}: expected the machine-config-server's port {MCS_PORT}"
        ));
    }
    let has_ca = config["ignition"]["security"]["tls"]["certificateAuthorities"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    if !has_ca {
        return Err(format!(
            "{source} with no ignition.security.tls.certificateAuthorities: expected the machine-config-server's CA, as openshift-install writes it"
        ));
    }
    Ok(source.trim_end_matches(&suffix).to_owned() + "/config/")
}

/// OpenShift's pointer for a role with keelson's config as a second source: one config
/// that merges (appends, in 2.2) OpenShift's rendered config from the machine-config-server
/// and keelson's from keelson's server, trusting both CAs. `keelson_pointer` is keelson's own
/// pointer for the role, in `spec`.
pub fn compose_pointer(
    openshift: &Value,
    keelson_pointer: &Value,
    spec: SpecVersion,
    openshift_spec: SpecVersion,
    role: Role,
) -> Result<Value, OpenShiftError> {
    let theirs = convert::convert(openshift, openshift_spec, spec).map_err(|source| {
        OpenShiftError::Convert {
            file: format!("{}.ign", role.as_str()),
            source,
        }
    })?;
    Ok(merge::merge(
        Named {
            config: &theirs,
            name: &format!("openshift-install's {}.ign", role.as_str()),
        },
        Named {
            config: keelson_pointer,
            name: &format!("keelson's {} pointer", role.as_str()),
        },
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../testdata/openshift-install/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn parse(era: &str) -> OpenShiftConfigs {
        OpenShiftConfigs::parse(
            era,
            &fixture(&format!("{era}/bootstrap.ign")),
            &fixture(&format!("{era}/master.ign")),
            &fixture(&format!("{era}/worker.ign")),
            &fixture(&format!("{era}/metadata.json")),
        )
        .unwrap()
    }

    #[test]
    fn both_eras_read() {
        let old = parse("4.2");
        assert_eq!(old.spec, SpecVersion::V2_2);
        assert_eq!(old.mcs_host(), "api-int.ocp4.osd2019.local");
        assert!(old.needs_dns());
        let new = parse("4.14");
        assert!(!new.spec.is_v2());
        assert_eq!(new.cluster_name, "ocp4");
        assert_eq!(
            new.mcs_base,
            "https://api-int.ocp4.osd2019.local:22623/config/"
        );
    }

    #[test]
    fn the_pointer_gets_keelsons_source_after_openshifts() {
        let new = parse("4.14");
        let keelson = serde_json::json!({"ignition": {"version": new.spec.as_str(),
            "config": {"merge": [{"source": "https://10.0.0.5:22626/config/master"}]},
            "security": {"tls": {"certificateAuthorities": [{"source": "data:,keelson-ca"}]}}}});
        let composed =
            compose_pointer(&new.master, &keelson, new.spec, new.spec, Role::Master).unwrap();
        let merge = composed["ignition"]["config"]["merge"].as_array().unwrap();
        assert_eq!(merge.len(), 2);
        assert_eq!(
            merge[0]["source"],
            "https://api-int.ocp4.osd2019.local:22623/config/master"
        );
        assert_eq!(merge[1]["source"], "https://10.0.0.5:22626/config/master");
        let cas = composed["ignition"]["security"]["tls"]["certificateAuthorities"]
            .as_array()
            .unwrap();
        assert_eq!(cas.len(), 2);
    }

    #[test]
    fn a_full_config_where_a_pointer_belongs_is_refused() {
        let era = "4.14";
        let e = OpenShiftConfigs::parse(
            era,
            &fixture(&format!("{era}/bootstrap.ign")),
            &fixture(&format!("{era}/bootstrap.ign")),
            &fixture(&format!("{era}/worker.ign")),
            &fixture(&format!("{era}/metadata.json")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("4.14/master.ign: expected a pointer"), "{e}");
    }
}
