//! The one way a command stops from outside: SIGTERM (systemd's stop, `kill`) or SIGINT
//! (Ctrl-C) cancel its stop token, so it stops in order rather than dying mid-write. PID 1
//! listens for more (SIGPWR, ctrl-alt-del, the power button): `init/power.rs`.

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Cancels `stop` on the first SIGTERM or SIGINT, logging which. The handlers are installed
/// before this returns (an error if the kernel refuses), so a signal sent once it has
/// returned is never lost to the default action. Abort the handle to stop listening.
pub fn cancel_on_stop_signal(stop: CancellationToken) -> std::io::Result<JoinHandle<()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        stop.cancel();
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sigterm_cancels_the_token() {
        let stop = CancellationToken::new();
        let _watch = cancel_on_stop_signal(stop.clone()).unwrap();
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), stop.cancelled())
            .await
            .expect("SIGTERM did not cancel the stop token");
    }
}
