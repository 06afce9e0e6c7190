//! Files served under `/assets/<name>` (the agent binary for RHCOS nodes).
//!
//! Only names registered here are served, and names are restricted to
//! `[A-Za-z0-9._-]` not starting with a dot, so no request path can reach any other file.
//! Contents are read once at start-up: the set is small (one binary) and serving from
//! memory keeps the request path free of file-system I/O.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

/// A bad asset name or an unreadable assets directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AssetError {
    /// The name is not a plain file name.
    #[error("asset name {0:?}: expected [A-Za-z0-9._-], not starting with '.'")]
    BadName(String),
    /// Reading the directory or a file failed.
    #[error("reading {path}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Whether `name` may be served as an asset.
pub fn valid_asset_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The named files served under `/assets/`.
#[derive(Debug, Clone, Default)]
pub struct Assets {
    files: BTreeMap<String, Bytes>,
}

impl Assets {
    /// No assets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) asset `name`.
    pub fn insert(&mut self, name: &str, contents: Bytes) -> Result<(), AssetError> {
        if !valid_asset_name(name) {
            return Err(AssetError::BadName(name.to_string()));
        }
        self.files.insert(name.to_string(), contents);
        Ok(())
    }

    /// Every regular file of `dir` whose name is a valid asset name (others are skipped
    /// with a warning; symlinks are followed, since `dir` is the operator's own). A missing
    /// directory gives no assets.
    pub fn from_dir(dir: &Path) -> Result<Self, AssetError> {
        let io = |source| AssetError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut assets = Self::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(assets),
            Err(e) => return Err(io(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io)?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !path.is_file() || !valid_asset_name(&name) {
                tracing::warn!(path = %path.display(), "not served as an asset (not a regular file, or name outside [A-Za-z0-9._-])");
                continue;
            }
            let contents = std::fs::read(&path).map_err(|source| AssetError::Io {
                path: path.display().to_string(),
                source,
            })?;
            assets.files.insert(name, Bytes::from(contents));
        }
        Ok(assets)
    }

    /// The contents of `name`.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.files.get(name)
    }

    /// The names served.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["keelson-agent", "a.b_c-1", "x"] {
            assert!(valid_asset_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a%2Fb", "a b", "é", "a\\b"] {
            assert!(!valid_asset_name(bad), "{bad}");
        }
        assert!(Assets::new().insert("../x", Bytes::new()).is_err());
    }

    #[test]
    fn from_dir_reads_files_and_skips_others() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("keelson-agent"), b"\x7fELF").unwrap();
        std::fs::write(d.path().join(".hidden"), b"x").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let a = Assets::from_dir(d.path()).unwrap();
        assert_eq!(a.names().collect::<Vec<_>>(), ["keelson-agent"]);
        assert_eq!(a.get("keelson-agent").unwrap().as_ref(), b"\x7fELF");
        assert_eq!(
            Assets::from_dir(&d.path().join("nope"))
                .unwrap()
                .names()
                .count(),
            0
        );
    }
}
