//! `keelson`: builds a cluster's payloads from an install-config.yaml.

mod build;
mod heat;
mod image;
mod serve;

use clap::{Parser, Subcommand};

/// keelson: Ignition payloads, cluster CA and appliance image for a cluster.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a cluster's payloads: Ignition configs, cluster.json, TLS, image, SHA256SUMS.
    Build(build::BuildArgs),
    /// Print one role's Ignition config.
    Render(build::RenderArgs),
    /// Check an install-config.yaml.
    Validate(build::ConfigArgs),
    /// Print the VRRP router IDs derived from the cluster name.
    Vrids(build::ConfigArgs),
    /// Build the appliance image (keelson.qcow2) alone.
    Image(image::ImageArgs),
    /// Serve a build directory's Ignition configs (:22623 TLS, :22624 plain).
    Serve(serve::ServeArgs),
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
        Command::Build(args) => build::build(args),
        Command::Render(args) => build::render_cmd(args),
        Command::Validate(args) => build::validate(args),
        Command::Vrids(args) => build::vrids(args),
        Command::Image(args) => image::run(args),
        Command::Serve(args) => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(serve::run(args))),
    };
    if let Err(e) = result {
        eprintln!("keelson: {e:#}");
        std::process::exit(2);
    }
}
