//! `qemu-cluster`: boots a whole keelson cluster under QEMU and checks it from outside
//! (`make qemu-cluster`, docs/qemu-cluster.md).
//!
//! `qemu-cluster [--config unicast|multicast]`: `unicast` (the default) runs `cluster.json`
//! as `keelson build` writes it — unicast VRRP and unicast members — on a bridge that drops
//! every multicast frame; `multicast` runs VRRP multicast and mDNS members on QEMU's
//! multicast socket segment.
//!
//! Environment: `KEELSON_BIN` (the `keelson` program), `KEELSON_AGENT_BIN` (the static agent),
//! `KEELSON_STANDIN_BIN` (the static stand-in API server), `QEMU_CLUSTER_CONFIG` (the
//! configuration when `--config` is not given), `QEMU_CLUSTER_WORK` (working directory,
//! default `target/qemu-cluster/<config>`), `ACCEL` (`tcg` by default).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use keelson_qemu_tests::cluster::{self, Cluster, Config, ImageKind};
use keelson_qemu_tests::scenarios;
use keelson_qemu_tests::segment::{Segment, TapBridge};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: qemu-cluster [--config unicast|multicast] | qemu-cluster standin | qemu-cluster bridge GROUP PORT NETNS";
    let default_config =
        std::env::var("QEMU_CLUSTER_CONFIG").unwrap_or_else(|_| "unicast".to_string());
    let result = match args.next().as_deref() {
        // Debug aid: bridge a segment into an existing namespace until killed.
        Some("bridge") => bridge(args.collect()),
        // Builds (or finds in the cache) the RHCOS stand-in and prints what it is.
        Some("standin") => standin().map(|_| ()),
        None => default_config.parse().and_then(run),
        Some("--config") => match args.next() {
            Some(c) => c.parse().and_then(run),
            None => Err(anyhow::anyhow!(
                "--config: expected unicast or multicast; {usage}"
            )),
        },
        Some(other) => Err(anyhow::anyhow!("unknown argument {other:?}; {usage}")),
    };
    if let Err(e) = result {
        eprintln!("qemu-cluster: {e:#}");
        std::process::exit(1);
    }
}

fn bridge(args: Vec<String>) -> Result<()> {
    let [group, port, netns] = args.as_slice() else {
        bail!("usage: qemu-cluster bridge GROUP PORT NETNS");
    };
    let segment = Segment {
        group: group.parse()?,
        port: port.parse()?,
    };
    let _bridge = TapBridge::start(segment, netns, "kqtap0")?;
    eprintln!("bridging {group}:{port} into {netns}/kqtap0");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The RHCOS stand-in for the masters: built on first use, then taken from `.cache/standin/`.
fn standin() -> Result<keelson_qemu_tests::standin::StandinImage> {
    let apiserver = env_path(
        "KEELSON_STANDIN_BIN",
        "target/x86_64-unknown-linux-gnu/release/kube-standin",
    );
    let cache = env_path("STANDIN_CACHE", ".cache/standin");
    let (image, times) = keelson_qemu_tests::standin::ensure(&cache, &apiserver)?;
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

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("qemu-tests sits in the workspace")
        .to_path_buf()
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(default))
}

/// The operator services of the test cluster: the stand-in kube-apiserver on the control
/// plane and, with `--plain` on :1936, the ingress router's readiness endpoint on workers.
/// Both are the `kube-standin` build asset. On appliance nodes the API stand-in binds the
/// node's own address, not the wildcard, so the agent's proxy can bind VIP:6443 itself (the
/// appliance has no `nft` for the redirect). The RHCOS stand-in masters run their own
/// apiserver on `*:6443` from systemd, as RHCOS runs kube-apiserver, so the agent there
/// runs none and reaches VIP:6443 through its nftables redirect (docs/proxy.md).
fn services_patch(masters: ImageKind) -> String {
    let api_roles = match masters {
        ImageKind::Appliance => r#"["bootstrap", "master"]"#,
        ImageKind::Standin => r#"["bootstrap"]"#,
    };
    format!(
        r#"{{
  "services": [
    {{"name": "kube-apiserver", "path": "/usr/local/bin/kube-standin",
     "args": ["--listen", "${{KEELSON_NODE_ADDRESS}}:6443"], "roles": {api_roles},
     "asset": "kube-standin"}},
    {{"name": "router", "path": "/usr/local/bin/kube-standin",
     "args": ["--plain", "--listen", "0.0.0.0:1936"], "roles": ["worker"],
     "asset": "kube-standin"}}
  ]
}}
"#
    )
}

/// The patch of `config` over the build's defaults (`defaults`: the `cluster.json` a plain
/// build writes): the stand-ins always; for the multicast configuration, every VRRP
/// instance multicast and the members on mDNS (a merge patch replaces arrays whole, so the
/// instances are the build's own with one field changed).
fn cluster_patch(
    config: Config,
    masters: ImageKind,
    defaults: &serde_json::Value,
) -> Result<String> {
    let mut patch: serde_json::Value = serde_json::from_str(&services_patch(masters))?;
    if config == Config::Multicast {
        let mut vrrp = defaults["vrrp"].clone();
        for inst in vrrp["instances"]
            .as_array_mut()
            .context("cluster.json: vrrp.instances")?
        {
            inst["transport"] = "multicast".into();
        }
        patch["vrrp"] = vrrp;
        patch["members"] = serde_json::json!({"transport": "mdns"});
    }
    Ok(serde_json::to_string_pretty(&patch)?)
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

/// `keelson build` of the example cluster with the stand-ins; returns the output directory.
fn build(work: &Path, config: Config, masters: ImageKind) -> Result<PathBuf> {
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
    let install_config = workspace().join("examples/install-config.yaml");
    // The build's own cluster.json first (no image: quick), for the patch to start from.
    let defaults_dir = work.join("defaults");
    let _ = std::fs::remove_dir_all(&defaults_dir);
    keelson_build(
        &keelson,
        &[
            "--config".as_ref(),
            install_config.as_os_str(),
            "--out".as_ref(),
            defaults_dir.as_os_str(),
            "--agent".as_ref(),
            agent.as_os_str(),
            "--no-image".as_ref(),
            "--quiet".as_ref(),
        ],
    )?;
    let defaults: serde_json::Value = serde_json::from_slice(
        &std::fs::read(defaults_dir.join("cluster.json")).context("the build's cluster.json")?,
    )?;
    let patch = work.join("cluster-patch.json");
    std::fs::write(&patch, cluster_patch(config, masters, &defaults)?)?;
    let out = work.join("out");
    let _ = std::fs::remove_dir_all(&out);
    keelson_build(
        &keelson,
        &[
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
        ],
    )?;
    Ok(out)
}

/// One row of the closing table.
struct Row {
    scenario: &'static str,
    ok: bool,
    time: Duration,
    detail: String,
}

struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Runs one scenario; on failure prints the consoles of `involved` and returns false.
    fn run<T>(
        &mut self,
        cluster: &mut Cluster,
        scenario: &'static str,
        involved: &[&str],
        f: impl FnOnce(&mut Cluster) -> Result<T>,
        detail: impl FnOnce(&T) -> String,
    ) -> Option<T> {
        eprintln!("qemu-cluster: {scenario} ...");
        let start = Instant::now();
        let result = f(cluster);
        let time = start.elapsed();
        match result {
            Ok(v) => {
                let d = detail(&v);
                eprintln!(
                    "qemu-cluster: {scenario}: ok in {:.1} s: {d}",
                    time.as_secs_f64()
                );
                self.rows.push(Row {
                    scenario,
                    ok: true,
                    time,
                    detail: d,
                });
                Some(v)
            }
            Err(e) => {
                eprintln!("qemu-cluster: {scenario}: FAILED: {e:#}");
                eprintln!("{}", cluster.consoles(involved, 40));
                self.rows.push(Row {
                    scenario,
                    ok: false,
                    time,
                    detail: format!("{e:#}").lines().next().unwrap_or("").to_owned(),
                });
                None
            }
        }
    }

    fn print(&self, skipped: &[&str]) {
        println!();
        println!("{:<10} {:<7} {:>8}  detail", "scenario", "result", "time");
        for r in &self.rows {
            println!(
                "{:<10} {:<7} {:>6.1} s  {}",
                r.scenario,
                if r.ok { "ok" } else { "FAILED" },
                r.time.as_secs_f64(),
                r.detail
            );
        }
        for s in skipped {
            println!(
                "{s:<10} {:<7} {:>8}  (an earlier scenario failed)",
                "skipped", "-"
            );
        }
    }
}

fn run(config: Config) -> Result<()> {
    let start = Instant::now();
    let work = env_path(
        "QEMU_CLUSTER_WORK",
        &format!("target/qemu-cluster/{}", config.as_str()),
    );
    std::fs::create_dir_all(&work)?;
    eprintln!(
        "qemu-cluster: {} configuration; building the cluster's payloads and image in {}",
        config.as_str(),
        work.display()
    );
    let masters = cluster::master_image()?;
    let out = build(&work, config, masters)?;
    let image = out.join("keelson.qcow2");
    let standin = match masters {
        ImageKind::Standin => Some(standin()?),
        ImageKind::Appliance => None,
    };
    eprintln!(
        "qemu-cluster: bootstrap and workers boot the appliance, masters the {}",
        masters.as_str()
    );
    let mut cluster = Cluster::new(&work, &out, &image, config, cluster::plan(masters), standin)?;
    match config {
        Config::Unicast => eprintln!(
            "qemu-cluster: segment: bridge {} of taps in {}, every multicast frame dropped (checked)",
            cluster.host_iface, cluster.netns.name
        ),
        Config::Multicast => eprintln!(
            "qemu-cluster: segment: QEMU multicast socket {}:{}",
            cluster.segment.group, cluster.segment.port
        ),
    }
    let mut report = Report { rows: Vec::new() };
    let all = [
        "bootstrap",
        "master-0",
        "master-1",
        "master-2",
        "worker-0",
        "worker-1",
    ];
    let control = ["bootstrap", "master-0", "master-1", "master-2"];
    let order = [
        "1 boot",
        "1b cloud",
        "2 dns",
        "3 api",
        "4 pivot",
        "4b dns",
        "4c api",
        "5 failover",
        "6 rejoin",
        "7 renewal",
    ];

    let passed = (|| {
        report.run(&mut cluster, order[0], &all, scenarios::boot, |d| d.clone())?;
        report.run(
            &mut cluster,
            order[1],
            &all,
            |c| scenarios::cloud_boot(c),
            |d| d.clone(),
        )?;
        let control_names: Vec<String> = control.iter().map(|s| s.to_string()).collect();
        report.run(
            &mut cluster,
            order[2],
            &control,
            |c| scenarios::dns(c, &control_names),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            order[3],
            &control,
            |c| scenarios::api_spread(c),
            |d| d.clone(),
        )?;
        report.run(&mut cluster, order[4], &all, scenarios::pivot, |d| {
            d.clone()
        })?;
        // DNS from the workers, now that they have booted.
        let everyone: Vec<String> = all[1..].iter().map(|s| s.to_string()).collect();
        report.run(
            &mut cluster,
            order[5],
            &all[1..],
            |c| scenarios::dns(c, &everyone),
            |d| d.clone(),
        )?;
        // The API through the VIP again, now that a master holds it: on the RHCOS stand-in
        // its apiserver owns *:6443 and the VIP goes through the agent's nftables redirect.
        report.run(
            &mut cluster,
            order[6],
            &all[1..4],
            |c| scenarios::api_on_rhcos(c),
            |d| d.clone(),
        )?;
        let (dead, _) = report.run(
            &mut cluster,
            order[7],
            &all[1..],
            scenarios::failover,
            |(_, d)| d.clone(),
        )?;
        report.run(
            &mut cluster,
            order[8],
            &all[1..4],
            |c| scenarios::rejoin(c, &dead),
            |d| d.clone(),
        )?;
        report.run(&mut cluster, order[9], &all, scenarios::renewals, |d| {
            d.clone()
        })?;
        Some(())
    })()
    .is_some();

    let skipped: Vec<&str> = order
        .iter()
        .copied()
        .filter(|o| !report.rows.iter().any(|r| r.scenario == *o))
        .collect();
    report.print(&skipped);
    if let Some(dropped) = cluster.multicast_dropped()? {
        println!("multicast frames dropped at the bridge: {dropped}");
    }
    println!(
        "\nqemu-cluster: {} configuration {} in {:.0} s (accel {}), consoles in {}",
        config.as_str(),
        if passed { "PASSED" } else { "FAILED" },
        start.elapsed().as_secs_f64(),
        keelson_qemu_tests::vm::accel(),
        work.display()
    );
    drop(cluster);
    if !passed {
        bail!("a scenario failed");
    }
    Ok(())
}
