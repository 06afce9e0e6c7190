//! Where served configs come from: a [`ConfigSource`] renders the full config of a pool
//! for a spec version; [`Cache`] keeps each rendering (rendering is pure and configs are
//! a few KB, so every request after the first is a map lookup).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::cluster::Role;
use crate::version::SpecVersion;

/// Why a source could not produce a config (logged; the client gets a 500).
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Renders the full Ignition config served at `/config/<pool>`.
///
/// Must be pure: the same `(pool, spec)` gives the same bytes, since the server caches the
/// first successful answer for the life of the process.
pub trait ConfigSource: Send + Sync + 'static {
    /// The config of `pool` (`Role::Master` or `Role::Worker`) in spec `spec`.
    fn config(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError>;
}

/// Caches a source's successful renderings per `(pool, spec)`. Errors are not cached,
/// so a transient failure (a file not there yet) heals on the next request.
pub(crate) struct Cache {
    source: Arc<dyn ConfigSource>,
    rendered: RwLock<HashMap<(Role, SpecVersion), Bytes>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

impl Cache {
    pub(crate) fn new(source: Arc<dyn ConfigSource>) -> Self {
        Self {
            source,
            rendered: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn get(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError> {
        // A poisoned lock only means another request panicked mid-insert of an immutable
        // value; the map itself is still consistent.
        if let Some(b) = self
            .rendered
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(pool, spec))
        {
            return Ok(b.clone());
        }
        let bytes = self.source.config(pool, spec)?;
        self.rendered
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((pool, spec), bytes.clone());
        Ok(bytes)
    }
}

/// Renders configs from cluster.json and the TLS files with the same code `keelson render`
/// uses, so a node serves exactly what the operator would render for that spec version.
#[derive(Debug, Clone)]
pub struct RenderSource {
    cluster: crate::ClusterConfig,
    assets: crate::render::NodeAssets,
}

impl RenderSource {
    /// A source for `cluster` with the node's `assets`.
    pub fn new(cluster: crate::ClusterConfig, assets: crate::render::NodeAssets) -> Self {
        Self { cluster, assets }
    }

    /// Reads the TLS files from `tls_dir` (`ca.crt`, `server.crt`, `server.key`), the
    /// operator's master and worker configs from `merge/` beside it (`/etc/keelson/merge/`
    /// on a node, `out/merge/` for `keelson serve`; docs/own-ignition.md) and hashes `agent`
    /// (the binary served as `/assets/keelson-agent`).
    pub fn from_files(
        cluster: crate::ClusterConfig,
        tls_dir: &std::path::Path,
        agent: &std::path::Path,
    ) -> Result<Self, SourceError> {
        let read = |name: &str| {
            let path = tls_dir.join(name);
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
        };
        let agent_bytes = std::fs::read(agent).map_err(|e| format!("{}: {e}", agent.display()))?;
        let membership_keys: std::collections::BTreeMap<String, String> =
            crate::tls_files::MEMBERSHIP_KEYS
                .iter()
                .filter_map(|name| {
                    std::fs::read_to_string(tls_dir.join(name))
                        .ok()
                        .map(|t| (name.to_string(), t))
                })
                .collect();
        // A cluster whose records are authenticated hands the key to every node it serves;
        // without it they could not join.
        if let Some(id) = &cluster.members.key_id
            && !membership_keys.contains_key(crate::tls_files::MEMBERSHIP_KEY)
        {
            return Err(format!(
                "{}: missing (cluster.json members.keyId names membership key {id})",
                tls_dir.join(crate::tls_files::MEMBERSHIP_KEY).display()
            )
            .into());
        }
        let mut operator = crate::render::operator::OperatorConfigs::new();
        let merge_dir = tls_dir
            .parent()
            .unwrap_or(std::path::Path::new("/"))
            .join("merge");
        for pool in [Role::Master, Role::Worker] {
            let path = merge_dir.join(format!("{}.ign", pool.as_str()));
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let shown = path.display().to_string();
                    let config =
                        crate::render::operator::OperatorConfig::from_node_file(&shown, &bytes)
                            .map_err(|e| format!("{shown}: {e}"))?;
                    operator.insert(pool, config);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display()).into()),
            }
        }
        use sha2::Digest;
        Ok(Self::new(
            cluster,
            crate::render::NodeAssets {
                ca_pem: read(crate::tls_files::CA_CERT)?,
                server_cert_pem: read(crate::tls_files::SERVER_CERT)?,
                server_key_pem: read(crate::tls_files::SERVER_KEY)?,
                agent_sha512: hex::encode(sha2::Sha512::digest(&agent_bytes)),
                agent_url: None,
                agent_inline: None,
                membership_keys,
                operator,
            },
        ))
    }
}

impl ConfigSource for RenderSource {
    fn config(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError> {
        Ok(Bytes::from(crate::render::render_full(
            &self.cluster,
            pool,
            spec,
            &self.assets,
        )?))
    }
}

#[cfg(all(test, feature = "build"))]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_naming_a_membership_key_is_not_served_without_it() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["ca.crt", "server.crt", "server.key"] {
            std::fs::write(dir.path().join(name), "pem\n").unwrap();
        }
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"\x7fELF").unwrap();
        let mut cluster = crate::install_config::InstallConfig::parse(include_str!(
            "../../../examples/install-config.yaml"
        ))
        .unwrap()
        .cluster_config();
        // Without a key named: served as before.
        assert!(RenderSource::from_files(cluster.clone(), dir.path(), &agent).is_ok());
        let key = crate::membership::generate().unwrap();
        cluster.members.key_id = Some(crate::membership::key_id(
            &crate::membership::parse_key(&key).unwrap(),
        ));
        let e = RenderSource::from_files(cluster.clone(), dir.path(), &agent)
            .unwrap_err()
            .to_string();
        assert!(e.contains("membership.key: missing"), "{e}");
        std::fs::write(dir.path().join("membership.key"), &key).unwrap();
        let source = RenderSource::from_files(cluster, dir.path(), &agent).unwrap();
        assert_eq!(
            source.assets.membership_keys.get("membership.key"),
            Some(&key)
        );
    }
}
