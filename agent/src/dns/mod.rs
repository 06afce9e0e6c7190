//! The cluster DNS server: authoritative zone plus forwarding (DESIGN §4.5).

use std::net::SocketAddr;
use std::path::PathBuf;

/// `keelson-agent dns`: run the DNS server alone.
#[derive(Debug, clap::Args)]
pub struct DnsArgs {
    /// cluster.json.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Address to answer on.
    #[arg(long, default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// A JSON file with the member list (array of members).
    #[arg(long)]
    pub members: Option<PathBuf>,
    /// Upstream resolver (repeat for more).
    #[arg(long = "upstream")]
    pub upstreams: Vec<SocketAddr>,
}

/// Runs `keelson-agent dns`.
pub async fn cli(_args: DnsArgs) -> anyhow::Result<()> {
    anyhow::bail!("DNS is not implemented yet")
}

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("dns is not implemented yet")
}
