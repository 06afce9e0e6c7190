//! `keelson-agent status`: what the running agent knows, built on request as one typed
//! [`model::AgentStatus`], served as JSON on a unix socket (`/run/keelson/agent.sock`) and
//! read back into the same struct by the client, which prints one screen or the JSON.
//! `/metrics` ([`crate::metrics`]) exports the same struct.

pub mod histogram;
pub mod model;
pub mod process;
mod summary;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::context::AgentContext;
use model::{AgentStatus, BuildInfo, NodeStatus};
pub use summary::summary;

/// Where the running agent serves its status.
pub const SOCKET: &str = "/run/keelson/agent.sock";

/// Sections of the bus's JSON status map that have a typed section (and a view) instead.
const TYPED: &[&str] = &["vrrp", "proxy", "dns", "members", "ignition"];

/// The status now: the bus's values and every installed view, read at this moment.
/// `started` is when the agent started serving (uptime).
pub fn collect(ctx: &AgentContext, started: Instant) -> AgentStatus {
    let bus = &ctx.bus;
    let mut process = process::read();
    process.uptime_seconds = started.elapsed().as_secs_f64();
    let other = bus
        .status
        .borrow()
        .iter()
        .filter(|(k, _)| !TYPED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    AgentStatus {
        node: NodeStatus {
            name: ctx.node.name.clone(),
            role: ctx.node.role,
            interface: ctx.node.interface.clone(),
            addresses: ctx.node.addresses.clone(),
            cluster: ctx.cluster.zone(),
        },
        build: BuildInfo::current(),
        process,
        ready: bus.ready.borrow().iter().cloned().collect(),
        restarts: bus.restarts.borrow().clone(),
        vips_held: bus.vips_held.borrow().iter().copied().collect(),
        proxy_healthy: *bus.proxy_healthy.borrow(),
        ignition_running: *bus.ignition_running.borrow(),
        dns_upstreams: bus.dns_upstreams.borrow().clone(),
        members: bus.members.borrow().to_vec(),
        vrrp: bus.views.vrrp.read().unwrap_or_default(),
        proxy: bus.views.proxy.read(),
        dns: bus.views.dns.read(),
        discovery: bus.views.discovery.read(),
        ignition: bus.views.ignition.read(),
        other,
    }
}

/// Serves the status on `path` until `stop` (one document per connection).
pub async fn serve(
    ctx: AgentContext,
    path: PathBuf,
    started: Instant,
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
                let mut body = serde_json::to_vec_pretty(&collect(&ctx, started)).unwrap_or_default();
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
            .publish_status("bgp", serde_json::json!({"sessions": 2}));
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
        let server = tokio::spawn(serve(
            ctx.clone(),
            path.clone(),
            Instant::now(),
            stop.clone(),
        ));
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
        assert_eq!(doc.other["bgp"]["sessions"], 2);
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
        assert!(collect(&ctx, Instant::now()).discovery.is_none());
        stop.cancel();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "socket removed on stop");
        let err = fetch(&path).await.unwrap_err().to_string();
        assert!(err.contains("is keelson-agent running"), "{err}");
    }
}
