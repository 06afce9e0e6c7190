//! Health checks whose results move VRRP priorities (DESIGN §4.3).

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("health is not implemented yet")
}
