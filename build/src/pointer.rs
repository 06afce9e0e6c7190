//! `keelson pointer`: the small config a node boots from when its full config is hosted
//! elsewhere (docs/openstack.md, "A bootstrap config over the user_data limit"): it merges
//! the hosted copy by URL, checks its sha512, sends the headers the host wants and trusts the
//! cluster CA and the CAs named. `examples/openstack/create-cluster.sh` hosts `bootstrap.ign`
//! in Glance and boots the bootstrap from this.

use std::path::PathBuf;

use anyhow::Context;
use keelson_cluster::render::{self, hosted};

/// `keelson pointer`.
#[derive(Debug, clap::Args)]
pub struct PointerArgs {
    /// The full config that is hosted (e.g. out/bootstrap.ign): its sha512 and spec.
    #[arg(long = "for", value_name = "CONFIG")]
    pub config: PathBuf,
    /// Where the node fetches the hosted copy (http:// or https://).
    #[arg(long, value_name = "URL")]
    pub source: String,
    /// An HTTP header sent with the request, NAME=VALUE (repeatable; spec 3.1.0 and later),
    /// e.g. X-Auth-Token=<token> for Glance.
    #[arg(long = "header", value_name = "NAME=VALUE")]
    pub headers: Vec<String>,
    /// A CA (PEM) to trust for an https:// source, besides the cluster CA (repeatable).
    #[arg(long = "ca", value_name = "FILE")]
    pub cas: Vec<PathBuf>,
    /// Write the pointer here (default: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `keelson pointer`.
pub fn run(args: PointerArgs) -> anyhow::Result<()> {
    let full = std::fs::read(&args.config).with_context(|| args.config.display().to_string())?;
    let mut cas = Vec::new();
    // The cluster CA beside the config (`--out`'s tls/), as in every pointer keelson writes.
    let cluster_ca = args
        .config
        .parent()
        .map(|d| d.join("tls").join(keelson_cluster::tls_files::CA_CERT));
    if let Some(path) = cluster_ca.filter(|p| p.exists()) {
        cas.push(std::fs::read_to_string(&path).with_context(|| path.display().to_string())?);
    }
    for path in &args.cas {
        cas.push(
            std::fs::read_to_string(path).with_context(|| format!("--ca {}", path.display()))?,
        );
    }
    let headers = args
        .headers
        .iter()
        .map(|h| hosted::parse_header(h))
        .collect::<Result<Vec<_>, _>>()?;
    let source = hosted::HostedSource {
        url: args.source.clone(),
        headers,
        cas,
    };
    let pointer = hosted::pointer_to(&full, &source)
        .with_context(|| format!("--for {}", args.config.display()))?;
    render::check_user_data("the pointer", &pointer)?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, &pointer).with_context(|| path.display().to_string())?;
            eprintln!(
                "keelson: wrote {} ({} bytes, {} in base64), which merges {} ({} bytes) from {}",
                path.display(),
                pointer.len(),
                render::base64_len(pointer.len()),
                args.config.display(),
                full.len(),
                args.source
            );
        }
        None => {
            use std::io::Write;
            std::io::stdout().write_all(&pointer)?;
            println!();
        }
    }
    Ok(())
}
