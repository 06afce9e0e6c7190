//! Where served configs come from: a [`ConfigSource`] renders the full config of a pool
//! for a spec version; [`Cache`] keeps each rendering (rendering is pure and configs are
//! a few KB, so every request after the first is a map lookup).

use std::collections::HashMap;
use std::path::PathBuf;
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

/// TEMPORARY (replaced by the `render_full` adapter at merge): serves `DIR/<pool>-full.json`
/// as written by hand or by an earlier `keelson build`, but only for the spec version the
/// file declares in `ignition.version`: any other version is an error (500), never a config
/// the client cannot parse.
#[derive(Debug, Clone)]
pub struct FileSource {
    dir: PathBuf,
}

impl FileSource {
    /// A source over `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

impl ConfigSource for FileSource {
    fn config(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError> {
        let path = self.dir.join(format!("{pool}-full.json"));
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let doc: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let version = doc
            .pointer("/ignition/version")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("{}: ignition.version: expected a string", path.display()))?;
        if version != spec.as_str() {
            return Err(format!(
                "{}: holds spec {version}, client asked for {spec} (this temporary source does not convert)",
                path.display()
            )
            .into());
        }
        Ok(Bytes::from(bytes))
    }
}
