//! The operator's own Ignition configs (`keelson build --merge ROLE=FILE`,
//! docs/own-ignition.md): read, checked, brought to the build's spec, and merged into what
//! that role receives — `bootstrap.ign` at build time, and the configs the Ignition
//! servers render for masters and workers at every request.
//!
//! The servers render per request and per spec version (`Accept`), so the operator's
//! master and worker configs travel with the nodes that serve: the bootstrap's and the
//! masters' full configs carry them under [`MERGE_DIR`], and a node's server merges the
//! one of the pool asked for into keelson's own rendering, converted to the spec the client
//! asked for ([`OperatorConfig::in_spec`]).

use std::collections::BTreeMap;

use serde_json::Value;

use super::convert::{self, ConvertError};
use super::merge::{self, MergeError, Named};
use crate::cluster::Role;
use crate::version::SpecVersion;

/// Where the bootstrap and the masters keep the operator's master and worker configs, to
/// serve them merged (`<role>.ign`, in the build's spec).
pub use crate::paths::MERGE_DIR;

/// The node path of the operator's config for `pool`.
pub fn merge_path(pool: Role) -> String {
    format!("{MERGE_DIR}/{}.ign", pool.as_str())
}

/// What is wrong with an operator's config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorConfigError {
    /// It could not be read or converted to the build's spec.
    #[error("{origin}: {source}")]
    Convert {
        /// `--merge master=FILE`.
        origin: String,
        /// Why.
        #[source]
        source: ConvertError,
    },
    /// A field keelson cannot merge.
    #[error("{origin}: {field}: {why}")]
    Refused {
        /// `--merge master=FILE`.
        origin: String,
        /// The field.
        field: String,
        /// Why, and what to do.
        why: String,
    },
    /// It clashes with keelson's own config for the role.
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// One role's operator config, in the spec it is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Where it came from, for messages (`--merge master=butane/master.ign`).
    pub origin: String,
    /// The spec it is kept in (the build's).
    pub spec: SpecVersion,
    /// The config, [`merge::normalize`]d.
    pub config: Value,
}

impl OperatorConfig {
    /// Reads `bytes` (named `origin` in errors) and brings it to `spec`: refuses what
    /// cannot be merged (`config.replace`, which would discard keelson's config; an HTTPS
    /// reference with no CA to check it by) and what `spec` cannot say.
    pub fn parse(
        origin: &str,
        bytes: &[u8],
        spec: SpecVersion,
    ) -> Result<Self, OperatorConfigError> {
        let convert_err = |source| OperatorConfigError::Convert {
            origin: origin.into(),
            source,
        };
        let (from, value) = convert::read(bytes).map_err(convert_err)?;
        let value = merge::normalize(&value);
        check_references(origin, &value, from)?;
        let config = convert::convert(&value, from, spec).map_err(convert_err)?;
        Ok(Self {
            origin: origin.into(),
            spec,
            config: merge::normalize(&config),
        })
    }

    /// A config kept on a node (under [`MERGE_DIR`]), as [`OperatorConfig::to_bytes`] wrote it.
    pub fn from_node_file(path: &str, bytes: &[u8]) -> Result<Self, ConvertError> {
        let (spec, config) = convert::read(bytes)?;
        Ok(Self {
            origin: path.into(),
            spec,
            config,
        })
    }

    /// The bytes kept on a node.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.config).unwrap_or_default()
    }

    /// The config in `spec`, for a client that asked for it.
    pub fn in_spec(&self, spec: SpecVersion) -> Result<Value, ConvertError> {
        convert::convert(&self.config, self.spec, spec)
    }
}

/// References to other configs must be checkable: `replace` throws keelson's config away,
/// and an HTTPS source needs the CA the node checks its server by.
fn check_references(
    origin: &str,
    config: &Value,
    spec: SpecVersion,
) -> Result<(), OperatorConfigError> {
    let ign = &config["ignition"];
    if !ign["config"]["replace"].is_null() {
        return Err(OperatorConfigError::Refused {
            origin: origin.into(),
            field: "ignition.config.replace".into(),
            why: "a config that replaces itself discards every other part of it, keelson's included; reference it with merge (3.x) or append (2.2) instead".into(),
        });
    }
    let key = if spec.is_v2() { "append" } else { "merge" };
    let refs = ign["config"][key].as_array().cloned().unwrap_or_default();
    let has_ca = ign["security"]["tls"]["certificateAuthorities"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    for (i, r) in refs.iter().enumerate() {
        let source = r["source"].as_str().unwrap_or_default();
        if source.starts_with("https://") && !has_ca {
            return Err(OperatorConfigError::Refused {
                origin: origin.into(),
                field: format!("ignition.config.{key}[{i}]"),
                why: format!(
                    "{source} with no ignition.security.tls.certificateAuthorities: the node could not check the server (openshift-install's pointers carry the machine-config-server's CA)"
                ),
            });
        }
    }
    Ok(())
}

/// The operator's configs of a build, by role.
pub type OperatorConfigs = BTreeMap<Role, OperatorConfig>;

/// `keelson` (rendered in `spec`, as bytes) with `operator` merged in; `what` names
/// keelson's side in errors (`keelson's master config`).
pub fn merge_into(
    keelson: &[u8],
    what: &str,
    operator: &OperatorConfig,
    spec: SpecVersion,
) -> Result<Vec<u8>, OperatorConfigError> {
    let base: Value =
        serde_json::from_slice(keelson).map_err(|e| OperatorConfigError::Refused {
            origin: what.into(),
            field: "(config)".into(),
            why: format!("not JSON: {e}"),
        })?;
    let theirs = operator
        .in_spec(spec)
        .map_err(|source| OperatorConfigError::Convert {
            origin: operator.origin.clone(),
            source,
        })?;
    let merged = merge::merge(
        Named {
            config: &base,
            name: what,
        },
        Named {
            config: &theirs,
            name: &operator.origin,
        },
    )?;
    Ok(serde_json::to_vec(&merged).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_and_unverifiable_references_are_refused() {
        let e = OperatorConfig::parse(
            "--merge master=a.ign",
            br#"{"ignition":{"version":"3.2.0","config":{"replace":{"source":"https://x/c"}}}}"#,
            SpecVersion::V3_2,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("--merge master=a.ign: ignition.config.replace:"),
            "{e}"
        );
        let e = OperatorConfig::parse(
            "--merge master=a.ign",
            br#"{"ignition":{"version":"2.2.0","config":{"append":[{"source":"https://api-int.c.x:22623/config/master","verification":{}}]}}}"#,
            SpecVersion::V2_2,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "ignition.config.append[0]: https://api-int.c.x:22623/config/master with no"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_config_comes_to_the_build_spec_and_back_to_the_client_spec() {
        let op = OperatorConfig::parse(
            "--merge worker=w.ign",
            br#"{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"/etc/w","contents":{"source":"data:,w"}}]}}"#,
            SpecVersion::V3_2,
        )
        .unwrap();
        assert_eq!(op.config["ignition"]["version"], "3.2.0");
        let kept = OperatorConfig::from_node_file("/etc/keelson/merge/worker.ign", &op.to_bytes())
            .unwrap();
        assert_eq!(kept.spec, SpecVersion::V3_2);
        assert_eq!(
            kept.in_spec(SpecVersion::V3_4).unwrap()["ignition"]["version"],
            "3.4.0"
        );
        let v2 = kept.in_spec(SpecVersion::V2_2).unwrap();
        assert_eq!(v2["storage"]["files"][0]["filesystem"], "root");
    }

    #[test]
    fn not_ignition_is_said_so() {
        let e = OperatorConfig::parse("--merge master=m.bu", b"variant: fcos\n", SpecVersion::V3_2)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--merge master=m.bu: expected an Ignition config (JSON)"),
            "{e}"
        );
    }
}
