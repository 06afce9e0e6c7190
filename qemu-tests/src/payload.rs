//! The cluster's payloads as the whole-cluster runs build them: `keelson build` of
//! `examples/install-config.yaml` with the stand-in apiserver and router as operator
//! services, and the RHCOS stand-in the masters boot. Shared by `qemu-cluster` and
//! `openstack-cluster`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cluster::{API_VIP, Config, HOST_ADDRESS, INGRESS_VIP, ImageKind, Payload};

/// The RHCOS stand-in for the masters: built on first use, then taken from the cache
/// ([`standin_cache`]).
pub fn standin() -> Result<crate::standin::StandinImage> {
    let apiserver = env_path(
        "KEELSON_STANDIN_BIN",
        "target/x86_64-unknown-linux-gnu/release/kube-standin",
    );
    let cache = standin_cache();
    let (image, times) = crate::standin::ensure(&cache, &apiserver)?;
    let m = &image.manifest;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let took = |d: Option<Duration>| {
        d.map(|d| format!("built in {:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| "cached".into())
    };
    eprintln!(
        "standin: {} (kernel {}, ignition {}, {} packages): root files {:.0} MiB, root.qcow2 {:.0} MiB, \
         kernel {:.1} MiB, initramfs {:.1} MiB; base {}, image {}; {:.1} s in all",
        image.dir.display(),
        m.kernel_release,
        m.ignition_version,
        m.packages,
        mib(m.bytes.root_files),
        mib(m.bytes.root_qcow2),
        mib(m.bytes.kernel),
        mib(m.bytes.initrd),
        took(times.base),
        took(times.image),
        times.total.as_secs_f64()
    );
    Ok(image)
}

/// The workspace root (the parent of `qemu-tests/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("qemu-tests sits in the workspace")
        .to_path_buf()
}

/// Where the stand-in's layers are kept: `$STANDIN_CACHE`, else the user's cache
/// (`$XDG_CACHE_HOME/keelson/standin`, `~/.cache/keelson/standin`), so every clone and
/// worktree on a machine shares one build (each layer's directory is named by the hash of
/// its inputs: a changed recipe or apiserver builds anew beside the old); `.cache/standin`
/// in the checkout where there is no home.
pub fn standin_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("STANDIN_CACHE") {
        return PathBuf::from(dir);
    }
    let user = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|d| !d.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    match user {
        Some(dir) => dir.join("keelson/standin"),
        None => workspace().join(".cache/standin"),
    }
}

/// `var` from the environment as a path, else `default` under the workspace.
pub fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(default))
}

/// The operator services of the test cluster: the stand-in kube-apiserver on the control
/// plane and, with `--plain` on :1936, the ingress router's readiness endpoint: running on
/// the workers, stopped on the masters (`--control`: the harness starts and stops either,
/// scenario `5b ingress`).
/// Both are the `kube-standin` build asset. On appliance nodes the API stand-in binds the
/// node's own address, not the wildcard, so the agent's proxy can bind VIP:6443 itself (the
/// appliance has no `nft` for the redirect). The RHCOS stand-in masters run their own
/// apiserver on `*:6443` from systemd, as RHCOS runs kube-apiserver, so the agent there
/// runs none and reaches VIP:6443 through its nftables redirect (docs/proxy.md).
///
/// Beside OpenShift the appliance bootstrap also runs the machine-config-server stand-in on
/// :22623 (`kube-standin --mcs`), serving what openshift-install's `bootstrap.ign` put under
/// `/etc/mcs/`; the RHCOS bootstrap runs its own from bootkube, the stand-in masters from
/// the unit OpenShift's rendered config brings.
fn services_patch(masters: ImageKind, payload: Payload) -> String {
    let api_roles = match masters {
        ImageKind::Appliance => r#"["bootstrap", "master"]"#,
        ImageKind::Standin => r#"["bootstrap"]"#,
    };
    // Appliance masters run no units: their machine-config-server is a service too.
    let mcs = match payload {
        Payload::Keelson => String::new(),
        Payload::OpenShift => format!(
            r#",
    {{"name": "machine-config-server", "path": "/usr/local/bin/kube-standin",
     "args": ["--mcs", "{}", "--listen", "0.0.0.0:22623"], "roles": {api_roles},
     "asset": "kube-standin"}}"#,
            crate::openshift::MCS_DIR
        ),
    };
    format!(
        r#"{{
  "services": [
    {{"name": "kube-apiserver", "path": "/usr/local/bin/kube-standin",
     "args": ["--listen", "${{KEELSON_NODE_ADDRESS}}:6443"], "roles": {api_roles},
     "asset": "kube-standin"}},
    {{"name": "router", "path": "/usr/local/bin/kube-standin",
     "args": ["--plain", "--control", "--listen", "0.0.0.0:1936"], "roles": ["worker"],
     "asset": "kube-standin"}},
    {{"name": "router-stopped", "path": "/usr/local/bin/kube-standin",
     "args": ["--plain", "--control", "--stopped", "--listen", "0.0.0.0:1936"],
     "roles": ["master"], "asset": "kube-standin"}}{mcs}
  ]
}}
"#
    )
}

/// The patch of `config` over the build's defaults: the stand-ins always; for the
/// multicast configuration, every VRRP instance multicast and the members on mDNS; with
/// `handback_secs`, that hand-back window on every VRRP instance (docs/vrrp.md: the example
/// install-config is OpenStack's, where the build leaves it off, and the test segments have
/// no port security). Both through `vrrp`'s fields for every instance
/// (docs/cluster-json.md), as an operator writes them.
fn cluster_patch(
    config: Config,
    masters: ImageKind,
    payload: Payload,
    handback_secs: Option<u32>,
) -> Result<String> {
    let mut patch: serde_json::Value = serde_json::from_str(&services_patch(masters, payload))?;
    let mut vrrp = serde_json::Map::new();
    if config == Config::Multicast {
        vrrp.insert("transport".into(), "multicast".into());
        patch["members"] = serde_json::json!({"transport": "mdns"});
    }
    if let Some(secs) = handback_secs {
        vrrp.insert("handbackSecs".into(), secs.into());
    }
    if !vrrp.is_empty() {
        patch["vrrp"] = vrrp.into();
    }
    Ok(serde_json::to_string_pretty(&patch)?)
}

/// `KEELSON_HANDBACK_SECS`: the hand-back window the harness sets on every VRRP instance
/// (`make qemu-day2` sets 30; unset: the build's default, off for the example's OpenStack).
fn handback_from_env() -> Result<Option<u32>> {
    match std::env::var("KEELSON_HANDBACK_SECS") {
        Ok(v) if !v.is_empty() => v
            .parse()
            .map(Some)
            .with_context(|| format!("KEELSON_HANDBACK_SECS={v:?}: expected seconds")),
        _ => Ok(None),
    }
}

/// Runs `keelson build` with `args`.
fn keelson_build(keelson: &Path, args: &[&std::ffi::OsStr]) -> Result<()> {
    let status = Command::new(keelson)
        .arg("build")
        .args(args)
        .status()
        .with_context(|| format!("running {}", keelson.display()))?;
    if !status.success() {
        bail!("keelson build failed ({status})");
    }
    Ok(())
}

/// The example install-config as OpenShift's UPI has it: `platform: none`, no VIPs (keelson
/// takes them on its command line).
fn platform_none(example: &str) -> Result<String> {
    let at = example
        .find("platform:")
        .context("the example install-config has no platform")?;
    let end = example[at..]
        .find("pullSecret")
        .context("the example install-config has no pullSecret after its platform")?
        + at;
    Ok(format!(
        "{}platform:\n  none: {{}}\n{}",
        &example[..at],
        &example[end..]
    ))
}

/// `keelson build` of the example cluster with the stand-ins; returns the output directory.
/// Beside OpenShift: openshift-install's output (made by [`crate::openshift`]) composed with
/// `--openshift-install-dir`, the operator's own configs with `--merge`.
pub fn build(work: &Path, config: Config, masters: ImageKind, payload: Payload) -> Result<PathBuf> {
    build_from(
        &workspace().join("examples/install-config.yaml"),
        work,
        config,
        masters,
        payload,
    )
}

/// [`build`] from another install-config (the OpenStack run's, with its floating IPs).
pub fn build_from(
    install_config: &Path,
    work: &Path,
    config: Config,
    masters: ImageKind,
    payload: Payload,
) -> Result<PathBuf> {
    let keelson = env_path("KEELSON_BIN", "target/debug/keelson");
    let agent = env_path(
        "KEELSON_AGENT_BIN",
        "target/x86_64-unknown-linux-gnu/release/keelson-agent",
    );
    let standin = env_path(
        "KEELSON_STANDIN_BIN",
        "target/x86_64-unknown-linux-gnu/release/kube-standin",
    );
    for (what, path) in [
        ("keelson", &keelson),
        ("agent", &agent),
        ("stand-in", &standin),
    ] {
        if !path.exists() {
            bail!("no {what} at {} (run `make agent build`)", path.display());
        }
    }
    // The stand-in is served as /assets/kube-standin: the asset takes the file's name.
    let assets = work.join("assets");
    std::fs::create_dir_all(&assets)?;
    let asset = assets.join("kube-standin");
    std::fs::copy(&standin, &asset).context("copying the stand-in")?;
    let mut install_config = install_config.to_path_buf();
    let handback = handback_from_env()?;
    let patch = work.join("cluster-patch.json");
    std::fs::write(&patch, cluster_patch(config, masters, payload, handback)?)?;
    let out = work.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    if payload == Payload::OpenShift {
        let example = std::fs::read_to_string(&install_config)?;
        let upi = work.join("install-config.yaml");
        std::fs::write(&upi, platform_none(&example)?)?;
        install_config = upi;
        let ssh_key = example
            .lines()
            .find_map(|l| l.strip_prefix("sshKey: "))
            .context("the example install-config has no sshKey")?;
        let install_dir = work.join("openshift-install");
        let _ = std::fs::remove_dir_all(&install_dir);
        crate::openshift::write_install_dir(&install_dir, "ocp4", crate::scenarios::ZONE, ssh_key)?;
        let operator = work.join("operator");
        crate::openshift::write_operator_configs(&operator)?;
        args.extend(
            [
                "--openshift-install-dir".into(),
                install_dir.into_os_string(),
                "--api-vip".into(),
                API_VIP.into(),
                "--ingress-vip".into(),
                INGRESS_VIP.into(),
                "--merge".into(),
                format!("master={}", operator.join("master.ign").display()).into(),
                "--merge".into(),
                format!("worker={}", operator.join("worker.ign").display()).into(),
                // The appliance bootstrap already runs this very agent and never fetches it
                // (its copy verifies); without a URL the RHCOS bootstrap's config would
                // carry it inline, over the appliance's 4 MiB limit for a config.
                "--agent-url".into(),
                format!("http://{HOST_ADDRESS}:8080/keelson-agent").into(),
            ]
            .into_iter()
            .map(|a: std::ffi::OsString| a),
        );
    }
    let mut all: Vec<&std::ffi::OsStr> = vec![
        "--config".as_ref(),
        install_config.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--agent".as_ref(),
        agent.as_os_str(),
        "--asset".as_ref(),
        asset.as_os_str(),
        "--cluster-patch".as_ref(),
        patch.as_os_str(),
        "--quiet".as_ref(),
    ];
    all.extend(args.iter().map(|a| a.as_os_str()));
    keelson_build(&keelson, &all)?;
    check_instances(&out.join("cluster.json"), config, handback)?;
    Ok(out)
}

/// The built cluster.json's VRRP instances run the transport of `config` and the hand-back
/// window asked for: the patch's fields for every instance took (a cluster that silently
/// ran the build's defaults would prove another configuration than the one it names).
fn check_instances(path: &Path, config: Config, handback_secs: Option<u32>) -> Result<()> {
    let cluster: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).with_context(|| path.display().to_string())?)
            .with_context(|| path.display().to_string())?;
    let transport = match config {
        Config::Multicast => "multicast",
        Config::Unicast | Config::DualStack => "unicast",
    };
    let instances = cluster["vrrp"]["instances"]
        .as_array()
        .with_context(|| format!("{}: vrrp.instances", path.display()))?;
    for inst in instances {
        anyhow::ensure!(
            inst["transport"] == transport,
            "{}: vrrp instance {}: transport {}, expected {transport}",
            path.display(),
            inst["name"],
            inst["transport"]
        );
        if let Some(secs) = handback_secs {
            anyhow::ensure!(
                inst["handbackSecs"] == secs,
                "{}: vrrp instance {}: handbackSecs {}, expected {secs}",
                path.display(),
                inst["name"],
                inst["handbackSecs"]
            );
        }
    }
    Ok(())
}
