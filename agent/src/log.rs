//! Logging: the filter every command sets up `tracing` with, and the console line PID 1
//! writes before `tracing` is up and for the steps operators look for.

/// The log filter: `RUST_LOG` when it parses (`info,keelson_agent::vrrp=debug`: levels per
/// target), else `default`. `Targets` rather than `EnvFilter`: no span or field filters, but
/// no regex engine in the static binary either (about 0.5 MB of its 12 MiB budget).
pub fn filter(default: &str) -> tracing_subscriber::filter::Targets {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse().ok())
        .or_else(|| default.parse().ok())
        .unwrap_or_default()
}

/// Logs straight to the console, independent of `tracing` (used before it is set up and for
/// the steps operators look for).
pub fn console(message: &str) {
    eprintln!("keelson-agent: {message}");
}
