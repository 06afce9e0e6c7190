//! keelson-agent: the node agent.
//!
//! One module per concern, each owning its state (DESIGN §1); they talk through the
//! watch channels of [`context::Bus`]. Pure protocol logic lives apart from the socket
//! and netlink code at each module's edge so it can be tested without either.

pub mod apply;
pub mod bgp;
pub mod context;
pub mod dns;
pub mod health;
pub mod ignition_server;
pub mod init;
pub mod members;
pub mod metadata;
pub mod metrics;
pub mod net;
pub mod node;
pub mod proxy;
pub mod retry;
pub mod run;
pub mod status;
pub mod supervisor;
pub mod vrrp;

/// The log filter: `RUST_LOG` when it parses (`info,keelson_agent::vrrp=debug`: levels per
/// target), else `default`. `Targets` rather than `EnvFilter`: no span or field filters, but
/// no regex engine in the static binary either (about 0.5 MB of its 12 MiB budget).
pub fn log_filter(default: &str) -> tracing_subscriber::filter::Targets {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse().ok())
        .or_else(|| default.parse().ok())
        .unwrap_or_default()
}

/// The agent's version, as members announce it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
