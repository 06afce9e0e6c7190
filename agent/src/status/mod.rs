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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn served_status_reads_back_typed() {
        let cluster = keelson_cluster::ClusterConfig::from_json(include_bytes!(
            "../dns/testdata/cluster.json"
        ))
        .unwrap();
        let node = crate::node::NodeIdentity {
            name: "master-1".parse().unwrap(),
            role: keelson_cluster::Role::Master,
            interface: "eth0".into(),
            addresses: vec!["10.0.0.12/24".parse().unwrap()],
        };
        let ctx = crate::context::AgentContext::new(cluster, node);
        ctx.bus.mark_ready("dns");
        let view = ctx.bus.views.discovery.install(|| model::DiscoveryStatus {
            transport: "mdns".into(),
            received: 7,
            drops: [("malformed".to_string(), 1)].into(),
            refused: 0,
            registries: Default::default(),
            auth: None,
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let stop = CancellationToken::new();
        let started = std::time::Instant::now();
        let server = {
            let ctx = ctx.clone();
            tokio::spawn(serve(
                path.clone(),
                move || ctx.status(started),
                stop.clone(),
            ))
        };
        let mut doc = None;
        for _ in 0..50 {
            if let Ok(d) = fetch(&path).await {
                doc = Some(d);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let doc = doc.unwrap();
        assert_eq!(doc.node.name, "master-1");
        assert_eq!(doc.ready, vec!["dns".to_string()]);
        assert!(doc.other.bgp.is_none());
        assert_eq!(doc.discovery.as_ref().unwrap().received, 7);
        assert_eq!(doc.build.version, crate::VERSION);
        assert!(doc.process.resident_memory_bytes > 0);
        let text = summary(&doc);
        assert!(
            text.contains("node master-1 (master)") && text.contains("10.0.0.12/24"),
            "{text}"
        );
        assert!(text.contains("malformed 1"), "{text}");
        // A subsystem that stopped takes its view with it.
        drop(view);
        assert!(ctx.status(started).discovery.is_none());
        stop.cancel();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "socket removed on stop");
        let err = fetch(&path).await.unwrap_err().to_string();
        assert!(err.contains("is keelson-agent running"), "{err}");
    }
}
