//! `keelson`: builds a cluster's payloads from an install-config.yaml.

mod compose;
mod heat;
mod image;
mod openstack;
mod payloads;
mod pointer;
mod serve;
mod status;
mod vrids;

use clap::{Parser, Subcommand};

/// keelson: Ignition payloads, cluster CA and appliance image for a cluster.
#[derive(Debug, Parser)]
#[command(
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("KEELSON_COMMIT"), ")"),
    about
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a cluster's payloads: Ignition configs, cluster.json, TLS, image, SHA256SUMS.
    Build(payloads::BuildArgs),
    /// Print one role's Ignition config.
    Render(payloads::RenderArgs),
    /// Check an install-config.yaml.
    Validate(payloads::ConfigArgs),
    /// Print the VRRP router IDs of the cluster, or scan a segment for those in use.
    Vrids(vrids::VridsArgs),
    /// Build the appliance image (keelson.qcow2) alone.
    Image(image::ImageArgs),
    /// Serve a build directory's Ignition configs (:22623 TLS, :22624 plain).
    Serve(serve::ServeArgs),
    /// Write the small config that boots a node from a hosted copy of its full config.
    Pointer(pointer::PointerArgs),
    /// The running cluster in one table: each VIP's holder, every member's state.
    Status(status::StatusArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => payloads::build(args),
        Command::Render(args) => payloads::render_cmd(args),
        Command::Validate(args) => payloads::validate(args),
        Command::Vrids(args) => vrids::run(args),
        Command::Image(args) => image::run(args),
        Command::Pointer(args) => pointer::run(args),
        Command::Status(args) => status::run(args),
        Command::Serve(args) => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(serve::run(args))),
    };
    if let Err(e) = result {
        eprintln!("keelson: {e:#}");
        std::process::exit(2);
    }
}
