//! The operator's side of a build (docs/own-ignition.md): `--merge ROLE=FILE` configs and
//! openshift-install's output (`--openshift-install-dir`), read and checked before anything
//! is written, and what they change in the build.

use std::path::{Path, PathBuf};

use anyhow::Context;
use keelson_cluster::render::merge::{self, Named};
use keelson_cluster::render::openshift::{self, OpenShiftConfigs};
use keelson_cluster::render::operator::{OperatorConfig, OperatorConfigs};
use keelson_cluster::{ClusterConfig, Role, SpecVersion};

/// One `--merge ROLE=FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeArg {
    /// The role whose config it joins.
    pub role: Role,
    /// The operator's Ignition config.
    pub file: PathBuf,
}

/// clap's parser for `ROLE=FILE`.
pub fn parse_merge(text: &str) -> Result<MergeArg, String> {
    let (role, file) = text
        .split_once('=')
        .ok_or_else(|| format!("expected ROLE=FILE (bootstrap, master or worker), got {text:?}"))?;
    let role: Role = role.parse().map_err(|_| {
        format!("{role:?}: expected a role of bootstrap, master or worker (ROLE=FILE)")
    })?;
    if file.is_empty() {
        return Err(format!("{text:?}: expected a file after {role}="));
    }
    Ok(MergeArg {
        role,
        file: PathBuf::from(file),
    })
}

/// What the operator brings to a build.
#[derive(Debug, Default)]
pub struct Composition {
    /// The operator's config per role (openshift-install's bootstrap.ign first, then every
    /// `--merge` of the role in command-line order), in the build's spec.
    pub operator: OperatorConfigs,
    /// openshift-install's output, when the build composes with it.
    pub openshift: Option<OpenShiftConfigs>,
}

impl Composition {
    /// Reads `--openshift-install-dir` and every `--merge`, checked and converted to `spec`.
    pub fn load(
        merges: &[MergeArg],
        openshift_dir: Option<&Path>,
        spec: SpecVersion,
    ) -> anyhow::Result<Self> {
        let mut out = Self::default();
        if let Some(dir) = openshift_dir {
            let os = read_openshift_dir(dir)?;
            let origin = format!(
                "openshift-install's {}",
                dir.join("bootstrap.ign").display()
            );
            let bootstrap = serde_json::to_vec(&os.bootstrap)?;
            out.operator.insert(
                Role::Bootstrap,
                OperatorConfig::parse(&origin, &bootstrap, spec)?,
            );
            out.openshift = Some(os);
        }
        for m in merges {
            let origin = format!("--merge {}={}", m.role, m.file.display());
            let bytes = std::fs::read(&m.file).with_context(|| origin.clone())?;
            let config = OperatorConfig::parse(&origin, &bytes, spec)?;
            let joined = match out.operator.remove(&m.role) {
                None => config,
                Some(first) => join(first, config)?,
            };
            out.operator.insert(m.role, joined);
        }
        Ok(out)
    }

    /// The spec the build writes when `--spec` is not given: openshift-install's, so the
    /// pointers stay in the era their nodes read; else keelson's default.
    pub fn default_spec(openshift_dir: Option<&Path>) -> anyhow::Result<SpecVersion> {
        match openshift_dir {
            None => Ok(SpecVersion::DEFAULT),
            Some(dir) => Ok(read_openshift_dir(dir)?.spec),
        }
    }

    /// Checks the install-config against openshift-install's output and adapts the
    /// cluster to run beside it (keelson's Ignition server on its own ports, the API VIP
    /// following the machine-config-server).
    pub fn adapt(&self, cluster: &mut ClusterConfig) -> anyhow::Result<()> {
        let Some(os) = &self.openshift else {
            return Ok(());
        };
        anyhow::ensure!(
            os.cluster_name == cluster.name,
            "metadata.json clusterName is {:?} but the install-config's metadata.name is {:?}: expected the install-config openshift-install was run with",
            os.cluster_name,
            cluster.name
        );
        let zone = cluster.zone();
        let host = os.mcs_host();
        let api_vip_hosts: Vec<String> = cluster.api_vips.iter().map(|v| v.to_string()).collect();
        anyhow::ensure!(
            host == format!("api-int.{zone}") || api_vip_hosts.iter().any(|v| v == host),
            "master.ign points at {host}: expected api-int.{zone} (platform none) or the API VIP, as openshift-install writes for this install-config"
        );
        openshift::adapt_cluster(cluster);
        Ok(())
    }
}

/// Two configs of one role, the second merged into the first.
fn join(first: OperatorConfig, second: OperatorConfig) -> anyhow::Result<OperatorConfig> {
    let merged = merge::merge(
        Named {
            config: &first.config,
            name: &first.origin,
        },
        Named {
            config: &second.config,
            name: &second.origin,
        },
    )?;
    Ok(OperatorConfig {
        origin: format!("{} and {}", first.origin, second.origin),
        spec: first.spec,
        config: merged,
    })
}

/// openshift-install's `bootstrap.ign`, `master.ign`, `worker.ign` and `metadata.json`.
pub fn read_openshift_dir(dir: &Path) -> anyhow::Result<OpenShiftConfigs> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).with_context(|| {
            format!(
                "--openshift-install-dir {}: {name} (expected the output of `openshift-install create ignition-configs`)",
                dir.display()
            )
        })
    };
    Ok(OpenShiftConfigs::parse(
        &dir.display().to_string(),
        &read("bootstrap.ign")?,
        &read("master.ign")?,
        &read("worker.ign")?,
        &read("metadata.json")?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_args_name_what_is_wrong() {
        assert_eq!(
            parse_merge("master=a.ign").unwrap(),
            MergeArg {
                role: Role::Master,
                file: "a.ign".into()
            }
        );
        assert!(
            parse_merge("a.ign")
                .unwrap_err()
                .contains("expected ROLE=FILE")
        );
        assert!(
            parse_merge("infra=a.ign")
                .unwrap_err()
                .contains("\"infra\": expected a role")
        );
        assert!(
            parse_merge("worker=")
                .unwrap_err()
                .contains("expected a file")
        );
    }
}
