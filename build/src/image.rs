//! `keelson image`: the appliance image alone (`keelson build` calls the same code).

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::Digest;

/// `keelson image --out DIR`.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// Output directory (`keelson.qcow2`, `image-manifest.json`).
    #[arg(long)]
    pub out: PathBuf,
    /// The static keelson-agent (default: next to this program, else the Makefile's build).
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// A kernel bzImage of your own (default: Debian's cloud kernel from `make setup`).
    #[arg(long, requires = "modules")]
    pub kernel: Option<PathBuf>,
    /// Its `lib/modules/<version>` directory (with modules.dep).
    #[arg(long, requires = "kernel")]
    pub modules: Option<PathBuf>,
    /// Extra file for the image, `IMAGE_PATH=HOST_FILE` (repeatable).
    #[arg(long = "extra-file", value_parser = parse_extra)]
    pub extra_files: Vec<(String, PathBuf)>,
    /// Extra kernel command-line words.
    #[arg(long, default_value = "")]
    pub cmdline: String,
}

fn parse_extra(text: &str) -> Result<(String, PathBuf), String> {
    let (inside, host) = text
        .split_once('=')
        .ok_or_else(|| format!("expected IMAGE_PATH=HOST_FILE, got {text:?}"))?;
    if !inside.starts_with('/') {
        return Err(format!(
            "{inside:?}: the path in the image must be absolute"
        ));
    }
    Ok((inside.to_owned(), PathBuf::from(host)))
}

/// The agent binary that goes into images and is served to nodes: always a static executable.
#[derive(Debug, Clone)]
pub struct AgentBinary {
    /// Where it was found.
    pub path: PathBuf,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl AgentBinary {
    /// `PATH (N bytes, sha256 HEX)`, for the line `keelson build` prints.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} bytes, sha256 {})",
            self.path.display(),
            self.bytes.len(),
            hex::encode(sha2::Sha256::digest(&self.bytes))
        )
    }
}

/// Why an executable cannot be the appliance's `/init` or an RHCOS node's agent.
fn not_static(path: &Path, bytes: &[u8]) -> Option<String> {
    // e_machine, at offset 18 of every ELF header: 62 is x86-64.
    if bytes.get(..4) != Some(b"\x7fELF") {
        return Some("not an ELF executable".into());
    }
    let machine = bytes.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]]));
    if machine != Some(62) {
        return Some(format!(
            "built for ELF machine {machine:?}, expected x86-64 (62)"
        ));
    }
    let needs = match keelson_image::daemon::needs(path, bytes) {
        Ok(needs) => needs,
        Err(e) => return Some(e.to_string()),
    };
    // A static-pie executable has a dynamic section of its own (for self-relocation) but no
    // interpreter and no needed libraries; those two are what a kernel cannot run as /init.
    match (needs.interpreter, needs.libraries.is_empty()) {
        (Some(interp), _) => Some(format!(
            "dynamically linked (interpreter {interp}, needs {})",
            needs.libraries.join(", ")
        )),
        (None, false) => Some(format!(
            "dynamically linked (needs {})",
            needs.libraries.join(", ")
        )),
        (None, true) => None,
    }
}

/// Reads `path` and checks that it is a static x86_64 executable.
pub fn load_static_agent(path: &Path) -> anyhow::Result<AgentBinary> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if let Some(why) = not_static(path, &bytes) {
        anyhow::bail!(
            "{}: {why}; the agent in an image or served to nodes must be the static build \
             (`make agent` writes target/x86_64-unknown-linux-gnu/release/keelson-agent)",
            path.display()
        );
    }
    Ok(AgentBinary {
        path: path.to_path_buf(),
        bytes,
    })
}

/// The agent binary to put into images and configs: `--agent`, else the first static one of
/// `KEELSON_AGENT_BIN`, the Makefile's static builds (beside this program's target directory,
/// then under the current directory) and `keelson-agent` next to this executable. A plain
/// `cargo build` leaves a dynamically linked `keelson-agent` next to `keelson`: it is passed
/// over for the static one, and refused when it is all there is.
pub fn find_agent(explicit: Option<&Path>) -> anyhow::Result<AgentBinary> {
    if let Some(path) = explicit {
        anyhow::ensure!(path.is_file(), "--agent {}: no such file", path.display());
        return load_static_agent(path);
    }
    let mut candidates = Vec::new();
    if let Some(env) = std::env::var_os("KEELSON_AGENT_BIN") {
        candidates.push(PathBuf::from(env));
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    for profile in ["release", "ci-release"] {
        let static_build = format!("x86_64-unknown-linux-gnu/{profile}/keelson-agent");
        // target/<profile>/keelson -> target/x86_64-unknown-linux-gnu/<profile>/keelson-agent
        if let Some(target) = exe_dir.as_ref().and_then(|d| d.parent()) {
            candidates.push(target.join(&static_build));
        }
        candidates.push(Path::new("target").join(&static_build));
    }
    if let Some(dir) = &exe_dir {
        candidates.push(dir.join("keelson-agent"));
    }
    let mut refused = Vec::new();
    for path in candidates.iter().filter(|p| p.is_file()) {
        match load_static_agent(path) {
            Ok(agent) => return Ok(agent),
            Err(e) => refused.push(format!("{e:#}")),
        }
    }
    if let Some(first) = refused.first() {
        anyhow::bail!("no static keelson-agent found: {first}");
    }
    anyhow::bail!(
        "no keelson-agent found (looked at {}); build it with `make agent` or pass --agent",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Runs `keelson image`.
pub fn run(args: ImageArgs) -> anyhow::Result<()> {
    let agent = find_agent(args.agent.as_deref())?;
    eprintln!("keelson: agent {}", agent.describe());
    let opts = keelson_image::ImageOptions {
        kernel: args.kernel,
        modules: args.modules,
        extra_files: args.extra_files,
        cmdline_extra: args.cmdline,
        ..keelson_image::ImageOptions::new(&args.out, agent.path)
    };
    eprintln!("keelson: building the appliance image (kernel, initramfs, disk, qcow2)");
    let manifest = keelson_image::build(&opts)?;
    println!(
        "{}: {} bytes, sha256 {}; initramfs {} bytes; kernel {}",
        args.out.join(&manifest.file).display(),
        manifest.qcow2_bytes,
        manifest.qcow2_sha256,
        manifest.initramfs.bytes,
        manifest.kernel.version
    );
    Ok(())
}
