//! Member discovery: who is in the cluster, with which address and role (DESIGN §4.6).

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("members is not implemented yet")
}
