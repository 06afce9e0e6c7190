//! The :22623/:22624 Ignition config service on a node (shares code with `keelson serve`).

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("ignition_server is not implemented yet")
}
