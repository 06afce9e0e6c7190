//! `keelson build`, `render`, `validate` and `vrids`: from install-config.yaml to the files of
//! DESIGN §2 (`bootstrap.ign`, `master.ign`, `worker.ign`, `cluster.json`, `tls/`,
//! `assets/keelson-agent`, `keelson.qcow2`, `SHA256SUMS`).
//!
//! Everything is written into a temporary directory next to `--out` and moved into place
//! at the end, so a failed build never leaves half-written files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use keelson_ignition::install_config::InstallConfig;
use keelson_ignition::render::{self, NodeAssets};
use keelson_ignition::{ClusterConfig, Role, SpecVersion, pki};
use sha2::{Digest, Sha256, Sha512};

/// The agent's name under `assets/` (what masters and workers fetch from :22623).
pub const AGENT_ASSET: &str = "keelson-agent";

/// `keelson build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// install-config.yaml.
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Ignition spec of the configs (2.2.0 for RHCOS 4.2-4.5; 3.0.0-3.5.0).
    #[arg(long, default_value = "3.2.0")]
    pub spec: SpecVersion,
    /// Do not build the appliance image.
    #[arg(long)]
    pub no_image: bool,
    /// The static keelson-agent (default: next to this program, else the Makefile's build).
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// Where an RHCOS bootstrap fetches the agent (sha512-verified); without it bootstrap.ign
    /// is for the keelson appliance image.
    #[arg(long)]
    pub agent_url: Option<String>,
    /// A kernel of your own for the image (with --modules).
    #[arg(long, requires = "modules")]
    pub kernel: Option<PathBuf>,
    /// Its lib/modules/<version> directory.
    #[arg(long, requires = "kernel")]
    pub modules: Option<PathBuf>,
    /// Print only errors.
    #[arg(long)]
    pub quiet: bool,
}

/// `keelson render`.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// install-config.yaml.
    #[arg(long)]
    pub config: PathBuf,
    /// bootstrap, master or worker.
    #[arg(long)]
    pub role: Role,
    /// Ignition spec.
    #[arg(long, default_value = "3.2.0")]
    pub spec: SpecVersion,
    /// The build directory whose tls/ to use (default: the build's `out/`).
    #[arg(long, default_value = "out")]
    pub dir: PathBuf,
    /// The agent binary whose sha512 goes into the config.
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// The bootstrap's agent URL (as for build).
    #[arg(long)]
    pub agent_url: Option<String>,
    /// The pointer config instead of the full one.
    #[arg(long)]
    pub pointer: bool,
}

/// `keelson validate` / `keelson vrids`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// install-config.yaml.
    #[arg(long)]
    pub config: PathBuf,
}

/// Reads and checks an install-config; errors name the file.
pub fn load_install_config(path: &Path) -> anyhow::Result<InstallConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    InstallConfig::parse(&text).with_context(|| format!("{}", path.display()))
}

fn source_date_epoch() -> Option<u64> {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

fn assets_for(pki: &pki::Pki, agent: &[u8], agent_url: Option<String>) -> NodeAssets {
    NodeAssets {
        ca_pem: pki.ca_cert_pem.clone(),
        server_cert_pem: pki.server_cert_pem.clone(),
        server_key_pem: pki.server_key_pem.clone(),
        agent_sha512: hex::encode(Sha512::digest(agent)),
        agent_url,
    }
}

/// Runs `keelson validate`.
pub fn validate(args: ConfigArgs) -> anyhow::Result<()> {
    let ic = load_install_config(&args.config)?;
    for note in &ic.notes {
        eprintln!("note: {note}");
    }
    let cluster = ic.cluster_config();
    cluster.check()?;
    println!(
        "{}: cluster {} ({} masters, {} workers), API VIP {:?}, ingress VIP {:?}: valid",
        args.config.display(),
        cluster.zone(),
        ic.masters,
        ic.workers,
        ic.api_vips,
        ic.ingress_vips
    );
    Ok(())
}

/// Runs `keelson vrids`.
pub fn vrids(args: ConfigArgs) -> anyhow::Result<()> {
    let cluster = load_install_config(&args.config)?.cluster_config();
    for inst in &cluster.vrrp.instances {
        println!(
            "{:<11} vrid {:>3}  vip {:<15} (Fletcher-8 of \"{}-{}\" + 1)",
            inst.name,
            inst.vrid,
            inst.vip,
            cluster.name,
            inst.name.trim_end_matches("-v6")
        );
    }
    Ok(())
}

/// Runs `keelson render`.
pub fn render_cmd(args: RenderArgs) -> anyhow::Result<()> {
    let cluster = load_install_config(&args.config)?.cluster_config();
    let tls = args.dir.join("tls");
    let pki = pki::load_or_create(&tls, &cluster, source_date_epoch())?;
    if !tls.join(pki::files::CA_CERT).exists() {
        eprintln!(
            "note: {} has no CA yet; this config uses a throw-away one (run keelson build first)",
            tls.display()
        );
    }
    let bytes = if args.pointer {
        render::render_pointer(&cluster, args.role, args.spec, &pki.ca_cert_pem)?
    } else {
        let agent_path = crate::image::find_agent(args.agent.as_deref())?;
        let agent = std::fs::read(&agent_path).with_context(|| agent_path.display().to_string())?;
        render::render_full(
            &cluster,
            args.role,
            args.spec,
            &assets_for(&pki, &agent, args.agent_url),
        )?
    };
    use std::io::Write;
    std::io::stdout().write_all(&bytes)?;
    println!();
    Ok(())
}

/// The build's outputs, written into `dir`.
pub fn write_outputs(
    dir: &Path,
    cluster: &ClusterConfig,
    pki: &pki::Pki,
    agent: &[u8],
    spec: SpecVersion,
    agent_url: Option<String>,
) -> anyhow::Result<Vec<String>> {
    let assets = assets_for(pki, agent, agent_url);
    let bootstrap = render::render_full(cluster, Role::Bootstrap, spec, &assets)?;
    render::check_user_data("bootstrap.ign", &bootstrap)?;
    let master = render::render_pointer(cluster, Role::Master, spec, &pki.ca_cert_pem)?;
    render::check_user_data("master.ign", &master)?;
    let worker = render::render_pointer(cluster, Role::Worker, spec, &pki.ca_cert_pem)?;
    render::check_user_data("worker.ign", &worker)?;
    let write = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes).with_context(|| path.display().to_string())
    };
    write("bootstrap.ign", &bootstrap)?;
    write("master.ign", &master)?;
    write("worker.ign", &worker)?;
    write("cluster.json", &cluster.to_json())?;
    write(&format!("assets/{AGENT_ASSET}"), agent)?;
    pki.write(&dir.join("tls"))?;
    Ok(vec![
        "bootstrap.ign".into(),
        "master.ign".into(),
        "worker.ign".into(),
        "cluster.json".into(),
        format!("assets/{AGENT_ASSET}"),
        "tls/ca.crt".into(),
        "tls/server.crt".into(),
    ])
}

/// `SHA256SUMS` text for `names` under `dir` (sorted, `sha256sum` format).
pub fn sha256sums(dir: &Path, names: &[String]) -> anyhow::Result<String> {
    let mut names = names.to_vec();
    names.sort();
    let mut out = String::new();
    for name in names {
        let bytes = std::fs::read(dir.join(&name)).with_context(|| name.clone())?;
        out.push_str(&format!(
            "{}  {name}\n",
            hex::encode(Sha256::digest(&bytes))
        ));
    }
    Ok(out)
}

/// Runs `keelson build`.
pub fn build(args: BuildArgs) -> anyhow::Result<()> {
    let say = |m: &str| {
        if !args.quiet {
            eprintln!("keelson: {m}");
        }
    };
    let ic = load_install_config(&args.config)?;
    for note in &ic.notes {
        say(&format!("note: {note}"));
    }
    let cluster = ic.cluster_config();
    cluster.check()?;
    let agent_path = crate::image::find_agent(args.agent.as_deref())?;
    let agent = std::fs::read(&agent_path).with_context(|| agent_path.display().to_string())?;

    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let staging = tempfile::Builder::new()
        .prefix(".keelson-build-")
        .tempdir_in(&args.out)
        .context("creating a staging directory in --out")?;
    let pki = pki::load_or_create(&args.out.join("tls"), &cluster, source_date_epoch())?;
    say(&format!(
        "rendering spec {} configs for {}",
        args.spec,
        cluster.zone()
    ));
    let mut names = write_outputs(
        staging.path(),
        &cluster,
        &pki,
        &agent,
        args.spec,
        args.agent_url.clone(),
    )?;
    if !args.no_image {
        say("building the appliance image (kernel, initramfs, disk, qcow2)");
        let opts = keelson_image::ImageOptions {
            kernel: args.kernel.clone(),
            modules: args.modules.clone(),
            ..keelson_image::ImageOptions::new(staging.path(), &agent_path)
        };
        let manifest = keelson_image::build(&opts)?;
        names.push(manifest.file.clone());
        names.push(keelson_image::MANIFEST.into());
    }
    let sums = sha256sums(staging.path(), &names)?;
    std::fs::write(staging.path().join("SHA256SUMS"), &sums)?;
    names.push("SHA256SUMS".into());
    names.push("tls/ca.key".into());
    names.push("tls/server.key".into());
    // Move everything into place only now that it is all written.
    for name in &names {
        let to = args.out.join(name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(staging.path().join(name), &to)
            .with_context(|| to.display().to_string())?;
    }
    say(&format!(
        "wrote {} (user_data: bootstrap.ign for the bootstrap, master.ign and worker.ign for the rest)",
        args.out.display()
    ));
    if !args.quiet {
        print!("{sums}");
    }
    Ok(())
}
