//! `keelson-agent run`: start the services for this node.

use std::path::PathBuf;

/// `keelson-agent run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// cluster.json.
    #[arg(long, default_value = "/etc/keelson/cluster.json")]
    pub cluster: PathBuf,
    /// node.json: overrides the identity metadata would give.
    #[arg(long)]
    pub node: Option<PathBuf>,
    /// Only these services (comma list of vrrp, proxy, dns, members, ignition).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Runs `keelson-agent run`.
pub async fn cli(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("run is not implemented yet")
}
