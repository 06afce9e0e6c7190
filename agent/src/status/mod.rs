//! `keelson-agent status`: what the running agent knows, served as one JSON document on a
//! unix socket (`/run/keelson/agent.sock`), printed as a table or as JSON by the client.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;

/// Where the running agent serves its status.
pub const SOCKET: &str = "/run/keelson/agent.sock";

/// The status document.
pub fn snapshot(ctx: &AgentContext, started: Instant) -> serde_json::Value {
    let members = ctx.bus.members.borrow().clone();
    serde_json::json!({
        "node": ctx.node.name,
        "role": ctx.node.role.as_str(),
        "interface": ctx.node.interface,
        "addresses": ctx.node.addresses,
        "cluster": ctx.cluster.zone(),
        "uptimeSecs": started.elapsed().as_secs(),
        "ready": *ctx.bus.ready.borrow(),
        "vipsHeld": *ctx.bus.vips_held.borrow(),
        "proxyHealthy": *ctx.bus.proxy_healthy.borrow(),
        "ignitionRunning": *ctx.bus.ignition_running.borrow(),
        "dnsUpstreams": *ctx.bus.dns_upstreams.borrow(),
        "members": &*members,
        "services": *ctx.bus.status.borrow(),
    })
}

/// Serves the snapshot on `path` until `stop` (one document per connection).
pub async fn serve(
    ctx: AgentContext,
    path: PathBuf,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let started = Instant::now();
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
                let mut body = serde_json::to_vec_pretty(&snapshot(&ctx, started)).unwrap_or_default();
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
pub async fn fetch(socket: &Path) -> anyhow::Result<serde_json::Value> {
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
    serde_json::from_slice(&body).context("status document")
}

/// A human summary of the status document.
pub fn summary(doc: &serde_json::Value) -> String {
    let list = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| x.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let mut out = format!(
        "node {} ({}) in {} on {} {}\nup {} s; ready: {}\nVIPs held: {}\nproxy healthy: {}; ignition server: {}\nDNS upstreams: {}\n",
        doc["node"].as_str().unwrap_or("?"),
        doc["role"].as_str().unwrap_or("?"),
        doc["cluster"].as_str().unwrap_or("?"),
        doc["interface"].as_str().unwrap_or("?"),
        list(&doc["addresses"]),
        doc["uptimeSecs"],
        list(&doc["ready"]),
        list(&doc["vipsHeld"]),
        doc["proxyHealthy"],
        doc["ignitionRunning"],
        list(&doc["dnsUpstreams"]),
    );
    if let Ok(bgp) =
        serde_json::from_value::<crate::bgp::status::BgpStatus>(doc["services"]["bgp"].clone())
    {
        out.push_str(&crate::bgp::status::summary(&bgp));
    }
    if let Some(members) = doc["members"].as_array() {
        out.push_str(&format!("members ({}):\n", members.len()));
        for m in members {
            out.push_str(&format!(
                "  {:<16} {:<9} {}\n",
                m["name"].as_str().unwrap_or("?"),
                m["role"].as_str().unwrap_or("?"),
                list(&m["addresses"])
            ));
        }
    }
    out
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
    async fn served_snapshot_reads_back() {
        let cluster = keelson_ignition::ClusterConfig::from_json(include_bytes!(
            "../dns/testdata/cluster.json"
        ))
        .unwrap();
        let node = crate::node::NodeIdentity {
            name: "master-1".into(),
            role: keelson_ignition::Role::Master,
            interface: "eth0".into(),
            addresses: vec!["10.0.0.12/24".parse().unwrap()],
        };
        let ctx = AgentContext::new(cluster, node);
        ctx.bus.mark_ready("dns");
        ctx.bus
            .publish_status("dns", serde_json::json!({"queries": 3}));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(ctx, path.clone(), stop.clone()));
        let mut doc = None;
        for _ in 0..50 {
            if let Ok(d) = fetch(&path).await {
                doc = Some(d);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let doc = doc.unwrap();
        assert_eq!(doc["node"], "master-1");
        assert_eq!(doc["ready"][0], "dns");
        assert_eq!(doc["services"]["dns"]["queries"], 3);
        let text = summary(&doc);
        assert!(
            text.contains("node master-1 (master)") && text.contains("10.0.0.12/24"),
            "{text}"
        );
        stop.cancel();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "socket removed on stop");
        let err = fetch(&path).await.unwrap_err().to_string();
        assert!(err.contains("is keelson-agent running"), "{err}");
    }
}
