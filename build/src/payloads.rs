//! `keelson build`, `render` and `validate`: from install-config.yaml to the files of
//! docs/architecture.md, "From install-config to a running node" (`bootstrap.ign`,
//! `master.ign`, `worker.ign`, `cluster.json`, `tls/`, `assets/keelson-agent`, `keelson.qcow2`,
//! `SHA256SUMS`), and `openstack.yaml`, the cluster as one Heat template (docs/openstack.md).
//!
//! Everything is written into a temporary directory next to `--out` and moved into place
//! at the end, so a failed build never leaves half-written files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use keelson_cluster::cluster::EtcdRecords;
use keelson_cluster::install_config::{GivenVips, InstallConfig};
use keelson_cluster::render::{self, NodeAssets};
use keelson_cluster::{ClusterConfig, Role, SpecVersion, pki};
use sha2::{Digest, Sha256, Sha512};

use crate::compose::{Composition, MergeArg};

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
    /// Ignition spec of the configs (2.2.0 for RHCOS 4.2-4.5; 3.0.0-3.5.0). Default: 3.2.0,
    /// or the spec of --openshift-install-dir's configs.
    #[arg(long)]
    pub spec: Option<SpecVersion>,
    #[command(flatten)]
    pub own: OwnIgnitionArgs,
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
    /// A JSON merge patch (RFC 7396) applied to the generated cluster.json
    /// (docs/cluster-json.md).
    #[arg(long, value_name = "PATCH.json")]
    pub cluster_patch: Option<PathBuf>,
    /// A file served as `/assets/<file name>` (repeatable): the executable of a cluster.json
    /// service whose `asset` names it.
    #[arg(long = "asset", value_name = "FILE")]
    pub assets: Vec<PathBuf>,
    /// Where the routing daemon the appliance image carries for bgp-mode VIPs (BIRD, at
    /// `bgp.daemon.path`) and its libraries are found (default: this machine).
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub routing_daemon_root: PathBuf,
    /// An explicit VRRP router ID, `api=N` or `ingress=N` (repeatable): instead of the one
    /// derived from the cluster name (`keelson vrids`, docs/vrrp.md "VRIDs").
    #[arg(long = "vrid", value_name = "ROLE=N")]
    pub vrids: Vec<crate::vrids::VridArg>,
    /// Print only errors.
    #[arg(long)]
    pub quiet: bool,
}

/// The files the appliance image needs to run the routing daemon of bgp-mode VIPs (BIRD and
/// its libraries, from `root`), when the cluster has them and the agent runs the daemon;
/// none otherwise.
pub fn routing_daemon_files(
    cluster: &ClusterConfig,
    root: &Path,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    use keelson_cluster::bgp::{DaemonKind, DaemonRun};
    let Some(bgp) = &cluster.bgp else {
        return Ok(vec![]);
    };
    if bgp.vips.is_empty()
        || bgp.daemon.run != DaemonRun::Agent
        || bgp.daemon.kind != DaemonKind::Bird
    {
        return Ok(vec![]);
    }
    keelson_image::daemon::closure(root, &bgp.daemon.path).with_context(|| {
        format!(
            "the appliance image carries BIRD for the bgp VIPs: {} under {} (install Debian's bird2, or --routing-daemon-root)",
            bgp.daemon.path,
            root.display()
        )
    })
}

/// The operator's own Ignition (docs/own-ignition.md), and the VIPs of an install-config
/// that has none (`platform: none`).
#[derive(Debug, Default, clap::Args)]
pub struct OwnIgnitionArgs {
    /// The operator's Ignition config for a role (spec 2.2 or 3.x, full or pointer), merged
    /// into what that role receives: bootstrap.ign, and the configs the Ignition servers
    /// serve to masters and workers (repeatable; ROLE is bootstrap, master or worker).
    #[arg(long = "merge", value_name = "ROLE=FILE", value_parser = crate::compose::parse_merge)]
    pub merges: Vec<MergeArg>,
    /// The output of `openshift-install create ignition-configs` (4.2-era spec 2.2 or 3.x):
    /// bootstrap.ign becomes OpenShift's with keelson's merged in, master.ign and worker.ign
    /// OpenShift's pointers with keelson's config as a second source; OpenShift's
    /// machine-config-server keeps :22623 and keelson's server moves to :22626.
    #[arg(long, value_name = "DIR")]
    pub openshift_install_dir: Option<PathBuf>,
    /// The API VIP (repeatable, one per family), for an install-config without one
    /// (`platform: none`); it takes the place of the platform's.
    #[command(flatten)]
    pub vips: VipArgs,
}

/// VIPs on the command line.
#[derive(Debug, Default, clap::Args)]
pub struct VipArgs {
    /// The API VIP (repeatable, one per address family), for an install-config that has
    /// none (`platform: none`); it takes the place of the platform's.
    #[arg(long = "api-vip", value_name = "IP")]
    pub api: Vec<std::net::IpAddr>,
    /// The ingress VIP (repeatable, one per address family), as --api-vip.
    #[arg(long = "ingress-vip", value_name = "IP")]
    pub ingress: Vec<std::net::IpAddr>,
}

impl VipArgs {
    /// The VIPs as the install-config reader takes them.
    pub fn given(&self) -> GivenVips {
        GivenVips {
            api: self.api.clone(),
            ingress: self.ingress.clone(),
        }
    }
}

impl OwnIgnitionArgs {
    /// `--spec` if given, else the one the composition implies.
    fn spec(&self, explicit: Option<SpecVersion>) -> anyhow::Result<SpecVersion> {
        match explicit {
            Some(s) => Ok(s),
            None => Composition::default_spec(self.openshift_install_dir.as_deref()),
        }
    }

    fn composition(&self, spec: SpecVersion) -> anyhow::Result<Composition> {
        Composition::load(&self.merges, self.openshift_install_dir.as_deref(), spec)
    }
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
    /// Ignition spec (default as for build).
    #[arg(long)]
    pub spec: Option<SpecVersion>,
    #[command(flatten)]
    pub own: OwnIgnitionArgs,
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
    /// The build's cluster.json merge patch (as for build).
    #[arg(long, value_name = "PATCH.json")]
    pub cluster_patch: Option<PathBuf>,
    /// The build's assets (as for build).
    #[arg(long = "asset", value_name = "FILE")]
    pub assets: Vec<PathBuf>,
    /// The build's explicit VRIDs (as for build).
    #[arg(long = "vrid", value_name = "ROLE=N")]
    pub vrids: Vec<crate::vrids::VridArg>,
}

/// `keelson validate`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// install-config.yaml.
    #[arg(long)]
    pub config: PathBuf,
    #[command(flatten)]
    pub vips: VipArgs,
    /// A cluster.json merge patch to check as well (as for build; its misspelt or wrong
    /// fields are named).
    #[arg(long, value_name = "PATCH.json")]
    pub cluster_patch: Option<PathBuf>,
}

/// Reads and checks an install-config, with the VIPs given on the command line; errors
/// name the file.
pub fn load_install_config(path: &Path, vips: &GivenVips) -> anyhow::Result<InstallConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    InstallConfig::parse_with(&text, vips).with_context(|| format!("{}", path.display()))
}

/// An operator file served under `/assets/` (`--asset`).
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/assets/` (the file name).
    pub name: String,
    /// Where it was read from.
    pub path: PathBuf,
    /// Its contents.
    pub bytes: Vec<u8>,
}

/// Where the appliance image carries the build's assets, so an appliance bootstrap can
/// run and serve them (docs/architecture.md: the bootstrap cannot fetch from itself).
pub const IMAGE_ASSETS_DIR: &str = keelson_cluster::paths::ASSETS_DIR;

/// Reads the `--asset` files; names must be plain, distinct, and not the agent's.
pub fn load_assets(paths: &[PathBuf]) -> anyhow::Result<Vec<Asset>> {
    let mut out: Vec<Asset> = Vec::new();
    for path in paths {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| keelson_cluster::cluster::is_asset_name(n) && *n != AGENT_ASSET)
            .with_context(|| {
                format!(
                    "--asset {}: expected a file name of [A-Za-z0-9._-] other than {AGENT_ASSET}",
                    path.display()
                )
            })?;
        if out.iter().any(|a| a.name == name) {
            anyhow::bail!("--asset {}: a second asset named {name}", path.display());
        }
        let bytes = std::fs::read(path).with_context(|| format!("--asset {}", path.display()))?;
        out.push(Asset {
            name: name.to_owned(),
            path: path.clone(),
            bytes,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What `keelson build` and `keelson render` both start from: the Ignition spec (the given
/// one, or the one beside openshift-install's output), the composition with it, and the
/// cluster.json with the operator's patch and explicit VRIDs applied.
fn resolve(
    ic: &InstallConfig,
    own: &OwnIgnitionArgs,
    spec: Option<SpecVersion>,
    patch: Option<&Path>,
    assets: &[Asset],
    vrids: &[crate::vrids::VridArg],
) -> anyhow::Result<(SpecVersion, Composition, ClusterConfig)> {
    let spec = own.spec(spec)?;
    let composition = own.composition(spec)?;
    let cluster = cluster_config(ic, spec, &composition, patch, assets)?;
    let cluster = crate::vrids::apply(cluster, vrids)?;
    Ok((spec, composition, cluster))
}

/// The cluster.json a build writes: the install-config's defaults, the Ignition spec of the
/// build, what running beside openshift-install changes, then the operator's merge patch,
/// in which a service's `"asset": "NAME"` is shorthand for the asset of that name with its
/// sha512 filled in; checked.
pub fn cluster_config(
    ic: &InstallConfig,
    spec: SpecVersion,
    composition: &Composition,
    patch: Option<&Path>,
    assets: &[Asset],
) -> anyhow::Result<ClusterConfig> {
    let mut cluster = ic.cluster_config();
    cluster.ignition.spec = spec.as_str().into();
    // The etcd names follow the payload's era (docs/dns.md); the patch may still say otherwise.
    cluster.dns.etcd = Some(EtcdRecords::for_spec(spec.as_str(), ic.masters));
    composition.adapt(&mut cluster)?;
    if let Some(path) = patch {
        let text = std::fs::read(path).with_context(|| path.display().to_string())?;
        let mut value: serde_json::Value = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not JSON", path.display()))?;
        fill_asset_hashes(&mut value, assets).with_context(|| path.display().to_string())?;
        cluster = cluster
            .with_merge_patch(&value)
            .with_context(|| format!("applying {}", path.display()))?;
    }
    cluster.check()?;
    for (i, svc) in cluster.services.iter().enumerate() {
        if let Some(asset) = &svc.asset {
            let Some(file) = assets.iter().find(|a| a.name == asset.name) else {
                anyhow::bail!(
                    "cluster.json services[{i}].asset: expected --asset .../{} on the command line",
                    asset.name
                );
            };
            if hex::encode(Sha512::digest(&file.bytes)) != asset.sha512 {
                anyhow::bail!(
                    "cluster.json services[{i}].asset.sha512: expected the sha512 of --asset {}",
                    asset.name
                );
            }
        }
    }
    Ok(cluster)
}

/// Replaces `services[i].asset: "NAME"` in a patch by `{name, sha512}` of that asset.
fn fill_asset_hashes(patch: &mut serde_json::Value, assets: &[Asset]) -> anyhow::Result<()> {
    let Some(services) = patch.get_mut("services").and_then(|s| s.as_array_mut()) else {
        return Ok(());
    };
    for (i, svc) in services.iter_mut().enumerate() {
        let Some(asset) = svc.get_mut("asset") else {
            continue;
        };
        if let Some(name) = asset.as_str().map(str::to_owned) {
            let file = assets.iter().find(|a| a.name == name).with_context(|| {
                format!("services[{i}].asset: expected --asset .../{name} on the command line")
            })?;
            *asset = serde_json::json!({
                "name": name,
                "sha512": hex::encode(Sha512::digest(&file.bytes)),
            });
        }
    }
    Ok(())
}

fn source_date_epoch() -> Option<u64> {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

fn assets_for(
    pki: &pki::Pki,
    agent: &[u8],
    agent_url: Option<String>,
    composition: &Composition,
) -> NodeAssets {
    // Beside openshift-install the bootstrap is RHCOS and its config is hosted anyway:
    // without a URL to fetch the agent from, it carries the agent itself.
    let agent_inline = (composition.openshift.is_some() && agent_url.is_none())
        .then(|| std::sync::Arc::from(agent));
    NodeAssets {
        ca_pem: pki.ca_cert_pem.clone(),
        server_cert_pem: pki.server_cert_pem.clone(),
        server_key_pem: pki.server_key_pem.clone(),
        agent_sha512: hex::encode(Sha512::digest(agent)),
        agent_url,
        agent_inline,
        membership_keys: pki.membership_keys.clone(),
        operator: composition.operator.clone(),
    }
}

/// `cluster` naming the build's membership key (`members.keyId`), so every agent
/// authenticates member records (docs/members.md).
fn with_membership_key(mut cluster: ClusterConfig, pki: &pki::Pki) -> ClusterConfig {
    cluster.members.key_id = pki.membership_key_id();
    cluster
}

/// Runs `keelson validate`.
pub fn validate(args: ConfigArgs) -> anyhow::Result<()> {
    let ic = load_install_config(&args.config, &args.vips.given())?;
    for note in &ic.notes {
        eprintln!("note: {note}");
    }
    let cluster = match &args.cluster_patch {
        Some(patch) => cluster_config(
            &ic,
            SpecVersion::DEFAULT,
            &Composition::default(),
            Some(patch),
            &[],
        )?,
        None => ic.cluster_config(),
    };
    cluster.check()?;
    if let Some(bgp) = &cluster.bgp {
        println!(
            "bgp: {} announced by BGP (AS{}, {} peers)",
            bgp.vips.join(", "),
            bgp.local_asn,
            bgp.peers.len()
        );
    }
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

/// Runs `keelson render`.
pub fn render_cmd(args: RenderArgs) -> anyhow::Result<()> {
    let ic = load_install_config(&args.config, &args.own.vips.given())?;
    let assets = load_assets(&args.assets)?;
    let (spec, composition, cluster) = resolve(
        &ic,
        &args.own,
        args.spec,
        args.cluster_patch.as_deref(),
        &assets,
        &args.vrids,
    )?;
    let tls = args.dir.join("tls");
    let pki = pki::load_or_create(&tls, &cluster, source_date_epoch())?;
    let cluster = with_membership_key(cluster, &pki);
    if !tls.join(pki::files::CA_CERT).exists() {
        eprintln!(
            "note: {} has no CA yet; this config uses a throw-away one (run keelson build first)",
            tls.display()
        );
    }
    let bytes = if args.pointer {
        pointer(&cluster, args.role, spec, &pki.ca_cert_pem, &composition)?
    } else {
        let agent = crate::image::find_agent(args.agent.as_deref())?;
        render::render_full(
            &cluster,
            args.role,
            spec,
            &assets_for(&pki, &agent.bytes, args.agent_url, &composition),
        )?
    };
    use std::io::Write;
    std::io::stdout().write_all(&bytes)?;
    println!();
    Ok(())
}

/// The build's outputs, written into `dir`.
// Over 100 lines on purpose: every file of a build in the order it is written.
#[allow(clippy::too_many_arguments)]
pub fn write_outputs(
    dir: &Path,
    cluster: &ClusterConfig,
    pki: &pki::Pki,
    agent: &[u8],
    spec: SpecVersion,
    agent_url: Option<String>,
    extra_assets: &[Asset],
    composition: &Composition,
) -> anyhow::Result<Vec<String>> {
    let assets = assets_for(pki, agent, agent_url, composition);
    let bootstrap = render::render_full(cluster, Role::Bootstrap, spec, &assets)?;
    // Too large for user_data is no reason not to write it: it is hosted, and the bootstrap
    // boots from a pointer to it (`keelson pointer`; docs/openstack.md). Beside
    // openshift-install it always is: OpenShift's own bootstrap config is hundreds of KiB.
    if let Err(e) = render::check_user_data("bootstrap.ign", &bootstrap) {
        eprintln!("keelson: note: {e}; host it: examples/openstack/create-cluster.sh does");
    }
    let master = pointer(cluster, Role::Master, spec, &pki.ca_cert_pem, composition)?;
    render::check_user_data("master.ign", &master)?;
    let worker = pointer(cluster, Role::Worker, spec, &pki.ca_cert_pem, composition)?;
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
    let mut names: Vec<String> = vec![
        "bootstrap.ign".into(),
        "master.ign".into(),
        "worker.ign".into(),
        "cluster.json".into(),
        format!("assets/{AGENT_ASSET}"),
        "tls/ca.crt".into(),
        "tls/server.crt".into(),
    ];
    for asset in extra_assets {
        let name = format!("assets/{}", asset.name);
        write(&name, &asset.bytes)?;
        names.push(name);
    }
    // What the nodes that serve keep under /etc/keelson/merge/, so `keelson serve --dir`
    // serves what they do.
    for pool in [Role::Master, Role::Worker] {
        if let Some(op) = composition.operator.get(&pool) {
            let name = format!("merge/{}.ign", pool.as_str());
            write(&name, &op.to_bytes())?;
            names.push(name);
        }
    }
    Ok(names)
}

/// The pointer config given to `role` as user_data: keelson's own, or beside
/// openshift-install, OpenShift's with keelson's as a second source.
fn pointer(
    cluster: &ClusterConfig,
    role: Role,
    spec: SpecVersion,
    ca_pem: &str,
    composition: &Composition,
) -> anyhow::Result<Vec<u8>> {
    let own = render::render_pointer(cluster, role, spec, ca_pem)?;
    let Some(os) = &composition.openshift else {
        return Ok(own);
    };
    let own: serde_json::Value = serde_json::from_slice(&own)?;
    let composed = keelson_cluster::render::openshift::compose_pointer(
        os.pointer(role),
        &own,
        spec,
        os.spec,
        role,
    )?;
    Ok(serde_json::to_vec(&composed)?)
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

/// What `keelson build` says when it writes a bootstrap.ign without `--agent-url`.
pub const NO_AGENT_URL_WARNING: &str = "bootstrap.ign is for the keelson appliance image \
(keelson.qcow2, whose PID 1 is the agent); an RHCOS bootstrap booted from it would run no \
keelson-agent, so no API VIP and no Ignition server for the masters. For an RHCOS bootstrap \
pass --agent-url URL, where the bootstrap can download the agent binary (out/assets/keelson-agent, \
sha512-verified).";

/// Runs `keelson build`.
pub fn build(args: BuildArgs) -> anyhow::Result<()> {
    let say = |m: &str| {
        if !args.quiet {
            eprintln!("keelson: {m}");
        }
    };
    let ic = load_install_config(&args.config, &args.own.vips.given())?;
    for note in &ic.notes {
        say(&format!("note: {note}"));
    }
    let assets = load_assets(&args.assets)?;
    let (spec, composition, cluster) = resolve(
        &ic,
        &args.own,
        args.spec,
        args.cluster_patch.as_deref(),
        &assets,
        &args.vrids,
    )?;
    // A warning, shown with --quiet too: a VRID shared with a neighbour breaks both.
    if let Some(w) = crate::vrids::warning(&cluster, &args.vrids) {
        eprintln!("keelson: warning: {w}");
    }
    let agent_binary = crate::image::find_agent(args.agent.as_deref())?;
    say(&format!("agent: {}", agent_binary.describe()));
    let agent = &agent_binary.bytes;

    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let staging = tempfile::Builder::new()
        .prefix(".keelson-build-")
        .tempdir_in(&args.out)
        .context("creating a staging directory in --out")?;
    let pki = pki::load_or_create(&args.out.join("tls"), &cluster, source_date_epoch())?;
    let cluster = with_membership_key(cluster, &pki);
    say(&format!(
        "rendering spec {} configs for {}",
        spec,
        cluster.zone()
    ));
    match (&args.agent_url, &composition.openshift) {
        (Some(url), _) => say(&format!(
            "bootstrap.ign fetches the agent from {url} (RHCOS bootstrap; sha512-verified)"
        )),
        (None, Some(_)) => say(
            "bootstrap.ign carries the agent inline (RHCOS bootstrap beside openshift-install; its config is hosted)",
        ),
        // A warning, not progress: shown with --quiet too. An RHCOS bootstrap booted from
        // this config comes up without the agent, so without VIPs and without the Ignition
        // server the masters fetch their configs from; nothing else would say so.
        (None, None) => eprintln!("keelson: warning: {}", NO_AGENT_URL_WARNING),
    }
    for line in composition_notes(&composition, args.agent_url.is_none()) {
        eprintln!("keelson: note: {line}");
    }
    let mut names = write_outputs(
        staging.path(),
        &cluster,
        &pki,
        agent,
        spec,
        args.agent_url.clone(),
        &assets,
        &composition,
    )?;
    // The cluster on OpenStack (openstack.json) and as one Heat template, next to the configs
    // they take as user_data.
    names.extend(crate::openstack::write_files(
        staging.path(),
        &ic,
        &cluster,
    )?);
    if !args.no_image {
        say("building the appliance image (kernel, initramfs, disk, qcow2)");
        names.extend(write_image(
            &args,
            staging.path(),
            &cluster,
            &assets,
            &agent_binary.path,
            &say,
        )?);
    }
    let sums = sha256sums(staging.path(), &names)?;
    std::fs::write(staging.path().join("SHA256SUMS"), &sums)?;
    names.push("SHA256SUMS".into());
    // The secrets are not deliverables (not in SHA256SUMS), but they are kept: a rebuild
    // into this --out reuses them (the same inputs give the same bytes).
    names.push("tls/ca.key".into());
    names.push("tls/server.key".into());
    for name in pki.membership_keys.keys() {
        names.push(format!("tls/{name}"));
    }
    // Move everything into place only now that it is all written.
    move_into_place(staging.path(), &args.out, &names)?;
    say(&format!(
        "wrote {} (user_data: bootstrap.ign for the bootstrap, master.ign and worker.ign for the rest)",
        args.out.display()
    ));
    if !args.quiet {
        print!("{sums}");
    }
    Ok(())
}

/// What an operator should know about the composition before booting it: what the appliance
/// bootstrap will not apply of their bootstrap config, and where a pointer needs DNS.
fn composition_notes(composition: &Composition, appliance_bootstrap: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(os) = &composition.openshift {
        if os.needs_dns() {
            out.push(format!(
                "OpenShift's pointers name {}: a node's Ignition resolves it in the initramfs, so the machine network's first DNS server (DHCP's, or `nameserver=` with static addresses) must be the API VIP, where keelson's DNS answers (docs/own-ignition.md)",
                os.mcs_host()
            ));
        }
        return out;
    }
    if !appliance_bootstrap {
        return out;
    }
    if let Some(op) = composition.operator.get(&Role::Bootstrap) {
        let c = &op.config;
        let names = |list: &serde_json::Value, key: &str| -> Vec<String> {
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e[key].as_str().map(str::to_owned))
                .collect()
        };
        let units = names(&c["systemd"]["units"], "name");
        if !units.is_empty() {
            out.push(format!(
                "{}: the appliance bootstrap has no systemd and will not run {} (declare processes as cluster.json services, or boot an RHCOS bootstrap with --agent-url)",
                op.origin,
                units.join(", ")
            ));
        }
        let users: Vec<String> = names(&c["passwd"]["users"], "name")
            .into_iter()
            .filter(|u| u != "core")
            .collect();
        if !users.is_empty() {
            out.push(format!(
                "{}: the appliance bootstrap has only core's keys and will not create {}",
                op.origin,
                users.join(", ")
            ));
        }
    }
    out
}

/// Builds the appliance image into `staging` with the agent at `agent`, the assets and the
/// routing daemon of BGP VIPs; returns the names it wrote.
fn write_image(
    args: &BuildArgs,
    staging: &Path,
    cluster: &ClusterConfig,
    assets: &[Asset],
    agent: &Path,
    say: &dyn Fn(&str),
) -> anyhow::Result<Vec<String>> {
    let daemon = routing_daemon_files(cluster, &args.routing_daemon_root)?;
    if !daemon.is_empty() {
        say(&format!(
            "the image carries the routing daemon of the bgp VIPs ({} files: the program, its loader and libraries)",
            daemon.len()
        ));
    }
    let opts = keelson_image::ImageOptions {
        kernel: args.kernel.clone(),
        modules: args.modules.clone(),
        extra_files: assets
            .iter()
            .map(|a| (format!("{IMAGE_ASSETS_DIR}/{}", a.name), a.path.clone()))
            .chain(daemon)
            .collect(),
        ..keelson_image::ImageOptions::new(staging, agent)
    };
    let manifest = keelson_image::build(&opts)?;
    Ok(vec![manifest.file, keelson_image::MANIFEST.into()])
}

/// Renames every file of `names` from `staging` into `out`, making their directories.
fn move_into_place(staging: &Path, out: &Path, names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let to = out.join(name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(staging.join(name), &to).with_context(|| to.display().to_string())?;
    }
    Ok(())
}
