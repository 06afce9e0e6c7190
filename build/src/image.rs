//! `keelson image`: the appliance image alone (`keelson build` calls the same code).

use std::path::{Path, PathBuf};

use anyhow::Context;

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

/// The agent binary to put into images and configs: `--agent`, else `keelson-agent` next to
/// this executable, else the Makefile's static build.
pub fn find_agent(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(path.is_file(), "--agent {}: no such file", path.display());
        return Ok(path.to_path_buf());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.push(dir.join("keelson-agent"));
    }
    if let Some(env) = std::env::var_os("KEELSON_AGENT_BIN") {
        candidates.push(PathBuf::from(env));
    }
    for profile in ["release", "ci-release"] {
        candidates.push(PathBuf::from(format!(
            "target/x86_64-unknown-linux-gnu/{profile}/keelson-agent"
        )));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "no keelson-agent found (looked at {}); build it with `make agent` or pass --agent",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// Runs `keelson image`.
pub fn run(args: ImageArgs) -> anyhow::Result<()> {
    let agent = find_agent(args.agent.as_deref())?;
    let opts = keelson_image::ImageOptions {
        kernel: args.kernel,
        modules: args.modules,
        extra_files: args.extra_files,
        cmdline_extra: args.cmdline,
        ..keelson_image::ImageOptions::new(&args.out, agent)
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
