//! `keelson-agent`: PID 1 in the appliance image, or a service on RHCOS.

use clap::{Parser, Subcommand};
use keelson_agent::{dns, members, metadata, proxy, run, status, vrrp};

#[derive(Debug, Parser)]
#[command(
    name = "keelson-agent",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("KEELSON_COMMIT"), ")"),
    about = "keelson node agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the services for this node.
    Run(run::RunArgs),
    /// What the running agent knows (VIPs, services, members).
    Status(status::StatusArgs),
    /// Print this node's metadata (config drive or metadata service) as JSON.
    Metadata(metadata::MetadataArgs),
    /// Run the API proxy alone.
    Proxy(proxy::ProxyArgs),
    /// Run the DNS server alone.
    Dns(dns::DnsArgs),
    /// Run member discovery alone, printing the member list (tests, debugging).
    #[command(hide = true)]
    Members(members::MembersArgs),
    /// Run VRRP and its health checks alone, printing the VRRP status (tests, debugging).
    #[command(hide = true)]
    Vrrp(vrrp::VrrpArgs),
}

fn main() -> anyhow::Result<()> {
    // Before anything opens a socket: a registry of a large cluster holds a connection per
    // node (keelson_agent::process_limits).
    keelson_agent::process_limits::raise_open_files();
    // In the appliance the kernel starts us as /init: PID 1 never returns.
    if std::process::id() == 1 {
        keelson_agent::init::main();
    }
    let cli = Cli::parse();
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .finish()
            .with(keelson_agent::log::filter("info"))
            .init();
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::cli(args).await,
            Command::Status(args) => status::cli(args).await,
            Command::Metadata(args) => metadata::cli(args).await,
            Command::Proxy(args) => proxy::cli(args).await,
            Command::Dns(args) => dns::cli(args).await,
            Command::Members(args) => members::cli(args).await,
            Command::Vrrp(args) => vrrp::cli(args).await,
        }
    })
}
