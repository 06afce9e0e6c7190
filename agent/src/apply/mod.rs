//! Appliance mode: apply the Ignition subset the agent needs from user_data (DESIGN §2):
//! fetch and verify pointer configs, write files (cluster.json, TLS, operator files), and
//! refuse, with a clear log line, what it cannot honour.

use std::path::{Path, PathBuf};

/// What applying user_data did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written, as absolute paths under the root.
    pub files_written: Vec<PathBuf>,
    /// Parts of the config not honoured, one line each (logged on the console).
    pub refused: Vec<String>,
}

/// Errors applying user_data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// Not implemented yet.
    #[error("applying user_data is not implemented yet")]
    Unimplemented,
}

/// Applies an Ignition config given as user_data, writing files under `root` (`/` on a node).
pub async fn apply_user_data(_user_data: &[u8], _root: &Path) -> Result<Applied, ApplyError> {
    Err(ApplyError::Unimplemented)
}
