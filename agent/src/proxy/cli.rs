//! `keelson-agent proxy`: the proxy alone, on the command line's frontends and backends
//! (debugging, and the benchmarks beside haproxy).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::cluster::BackendCheck;
use tokio_util::sync::CancellationToken;

use super::{Proxy, ProxyConfig, connect};

/// `keelson-agent proxy`: run the proxy alone (debugging, benchmarks).
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Frontend address to listen on (repeat for more).
    #[arg(long = "listen", default_value = "0.0.0.0:9445")]
    pub listen: Vec<SocketAddr>,
    /// A backend address (repeat for more).
    #[arg(long = "backend", required = true)]
    pub backends: Vec<SocketAddr>,
    /// Backend health check: none, tcp or tls-readyz.
    #[arg(long, default_value = "tls-readyz", value_parser = parse_check)]
    pub check: BackendCheck,
    /// Milliseconds between checks of one backend.
    #[arg(long, default_value_t = 5000)]
    pub check_interval_ms: u64,
    /// Monitor address (`/healthz`, `/stats`); `none` for no monitor.
    #[arg(long, default_value = "0.0.0.0:50936")]
    pub monitor: String,
    /// Maximum concurrent client connections.
    #[arg(long, default_value_t = 20000)]
    pub max_connections: usize,
    /// Idle timeout of a proxied connection, seconds.
    #[arg(long, default_value_t = 86400)]
    pub idle_timeout_secs: u64,
    /// Backend connect timeout, milliseconds.
    #[arg(long, default_value_t = 10000)]
    pub connect_timeout_ms: u64,
    /// Milliseconds without an answer from a backend before the next one is tried
    /// alongside; 0 tries backends one after another.
    #[arg(long, default_value_t = connect::DEFAULT_STAGGER.as_millis() as u64)]
    pub connect_stagger_ms: u64,
    /// Seconds live connections may run on after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,
    /// Copy through user space instead of `splice(2)`.
    #[arg(long)]
    pub no_splice: bool,
}

fn parse_check(s: &str) -> Result<BackendCheck, String> {
    match s {
        "none" => Ok(BackendCheck::None),
        "tcp" => Ok(BackendCheck::Tcp),
        "tls-readyz" => Ok(BackendCheck::TlsReadyz),
        _ => Err(format!("expected none, tcp or tls-readyz, got {s:?}")),
    }
}

/// Runs `keelson-agent proxy`.
pub async fn cli(args: ProxyArgs) -> anyhow::Result<()> {
    let monitor = match args.monitor.as_str() {
        "none" => None,
        m => Some(
            m.parse::<SocketAddr>()
                .with_context(|| format!("--monitor: expected ADDR:PORT or none, got {m:?}"))?,
        ),
    };
    let cfg = ProxyConfig {
        frontends: args.listen,
        monitor,
        check: args.check,
        check_interval: Duration::from_millis(args.check_interval_ms.max(1)),
        max_connections: args.max_connections.max(1),
        idle_timeout: Duration::from_secs(args.idle_timeout_secs.max(1)),
        connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
        connect_stagger: Duration::from_millis(args.connect_stagger_ms),
        drain_timeout: Duration::from_secs(args.drain_secs),
        splice: !args.no_splice,
        ..ProxyConfig::default()
    };
    let proxy = Proxy::bind(cfg, &args.backends)?;
    // The line tests and scripts wait for.
    eprintln!(
        "keelson-agent proxy listening on {:?} monitor {:?}",
        proxy.local_addrs(),
        proxy.monitor_addr()
    );
    let stop = CancellationToken::new();
    crate::signals::cancel_on_stop_signal(stop.clone())?;
    proxy.serve(stop).await
}
