//! nftables rules, written by the `nft` tool: nftables' netlink protocol (expressions, sets,
//! transactions) has no maintained, small Rust crate, and RHCOS ships `nft`. The appliance
//! has no `nft`: what needs it there fails with [`NftError::Spawn`] and says so.

use std::io;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

/// Why a ruleset could not be written.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be started (not installed?).
    #[error("running nft: {0}")]
    Spawn(#[source] io::Error),
    /// `nft` rejected the rules.
    #[error("nft -f - failed ({status}): {stderr}")]
    Rejected {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
}

/// Runs `nft -f -` with `script`.
pub async fn apply(script: &str) -> Result<(), NftError> {
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(NftError::Spawn)?;
    }
    let out = child.wait_with_output().await.map_err(NftError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NftError::Rejected {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
