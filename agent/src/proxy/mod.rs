//! The L4 API load balancer with backend health checks (DESIGN §4.4).

use std::net::SocketAddr;

/// `keelson-agent proxy`: run the proxy alone (debugging, benchmarks).
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Frontend address to listen on.
    #[arg(long, default_value = "0.0.0.0:9445")]
    pub listen: SocketAddr,
    /// A backend address (repeat for more).
    #[arg(long = "backend", required = true)]
    pub backends: Vec<SocketAddr>,
    /// Backend health check.
    #[arg(long, default_value = "tls-readyz")]
    pub check: String,
}

/// Runs `keelson-agent proxy`.
pub async fn cli(_args: ProxyArgs) -> anyhow::Result<()> {
    anyhow::bail!("the proxy is not implemented yet")
}

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("proxy is not implemented yet")
}
