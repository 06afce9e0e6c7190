//! `keelson-agent status`: what the running agent knows, built on request as one typed
//! [`model::AgentStatus`] (by `AgentContext::status`), served as JSON on a unix socket
//! (`/run/keelson/agent.sock`) and read back into the same struct by the client, which
//! prints one screen or the JSON. `/metrics` exports the same struct.

pub mod histogram;
pub mod model;
pub mod process;
mod summary;

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use model::AgentStatus;
pub use summary::{bgp_lines, summary};

/// Where the running agent serves its status.
pub const SOCKET: &str = "/run/keelson/agent.sock";

/// Serves the document `status` builds on `path` until `stop` (one document per
/// connection, built when the client connects).
pub async fn serve(
    path: PathBuf,
    status: impl Fn() -> AgentStatus,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("binding {}", path.display()))?;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((mut conn, _)) = accepted else { continue };
                let mut body = serde_json::to_vec_pretty(&status()).unwrap_or_default();
                body.push(b'\n');
                tokio::spawn(async move {
                    let _ = conn.write_all(&body).await;
                    let _ = conn.shutdown().await;
                });
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// `keelson-agent status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the JSON document instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// The agent's status socket.
    #[arg(long, default_value = SOCKET)]
    pub socket: PathBuf,
}

/// Reads the running agent's status.
pub async fn fetch(socket: &Path) -> anyhow::Result<AgentStatus> {
    let mut conn = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| {
            format!(
                "connecting to {} (is keelson-agent running?)",
                socket.display()
            )
        })?;
    let mut body = Vec::new();
    conn.read_to_end(&mut body).await?;
    serde_json::from_slice(&body)
        .with_context(|| format!("status document from {}", socket.display()))
}

/// Runs `keelson-agent status`.
pub async fn cli(args: StatusArgs) -> anyhow::Result<()> {
    let doc = fetch(&args.socket).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", summary(&doc));
    }
    Ok(())
}
