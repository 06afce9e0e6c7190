//! VRRP (RFC 5798 v3, RFC 3768 v2): codecs, state machine, sockets, GARP / unsolicited NA.

pub mod codec;
pub mod fsm;

/// Runs this subsystem until `stop` is cancelled.
pub async fn run(
    _ctx: crate::context::AgentContext,
    _stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("vrrp is not implemented yet")
}
