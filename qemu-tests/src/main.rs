//! `qemu-cluster`: boots a whole keelson cluster under QEMU and checks it from outside
//! (`make qemu-cluster`, docs/qemu-cluster.md).
//!
//! `qemu-cluster [--config unicast|multicast|dualstack]`: `unicast` (the default) runs
//! `cluster.json` as `keelson build` writes it — unicast VRRP and unicast members — on a
//! bridge that drops every multicast frame; `multicast` runs VRRP multicast and mDNS members
//! on QEMU's multicast socket segment; `dualstack` a cluster with IPv4 and IPv6 VIPs, every
//! node on the appliance (`keelson_qemu_tests::dual_stack`).
//!
//! Environment: `KEELSON_BIN` (the `keelson` program), `KEELSON_AGENT_BIN` (the static agent),
//! `KEELSON_STANDIN_BIN` (the static stand-in API server), `QEMU_CLUSTER_CONFIG` (the
//! configuration when `--config` is not given), `QEMU_CLUSTER_WORK` (working directory,
//! default `target/qemu-cluster/<config>`), `ACCEL` (`tcg` by default).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use keelson_qemu_tests::cluster::{self, Cluster, Config, ImageKind};
use keelson_qemu_tests::payload::{build, env_path, standin};
use keelson_qemu_tests::report::Report;
use keelson_qemu_tests::scenarios;
use keelson_qemu_tests::segment::{Segment, TapBridge};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: qemu-cluster [--config unicast|multicast|dualstack] | qemu-cluster standin | qemu-cluster bridge GROUP PORT NETNS";
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
                "--config: expected unicast, multicast or dualstack; {usage}"
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

fn run(config: Config) -> Result<()> {
    let start = Instant::now();
    let work = env_path(
        "QEMU_CLUSTER_WORK",
        &format!("target/qemu-cluster/{}", config.as_str()),
    );
    std::fs::create_dir_all(&work)?;
    if config == Config::DualStack {
        if !keelson_qemu_tests::dual_stack::run(&work)? {
            bail!("a scenario failed");
        }
        return Ok(());
    }
    eprintln!(
        "qemu-cluster: {} configuration; building the cluster's payloads and image in {}",
        config.as_str(),
        work.display()
    );
    let masters = cluster::master_image()?;
    let payload = cluster::Payload::for_config(config)?;
    let out = build(&work, config, masters, payload)?;
    let image = out.join("keelson.qcow2");
    let standin = match masters {
        ImageKind::Standin => Some(standin()?),
        ImageKind::Appliance => None,
    };
    eprintln!(
        "qemu-cluster: bootstrap and workers boot the appliance, masters the {}",
        masters.as_str()
    );
    eprintln!("qemu-cluster: payloads: {}", payload.as_str());
    let mut cluster = Cluster::new(
        &work,
        &out,
        &image,
        config,
        payload,
        cluster::plan(masters),
        standin,
    )?;
    eprintln!("qemu-cluster: segment: {}", cluster.segment_text());
    let mut report = Report::new("qemu-cluster");
    let all = [
        "bootstrap",
        "master-0",
        "master-1",
        "master-2",
        "worker-0",
        "worker-1",
    ];
    let control = ["bootstrap", "master-0", "master-1", "master-2"];
    let own = payload == cluster::Payload::OpenShift;
    let mut order = vec![
        "1 boot", "1b cloud", "2 dns", "3 api", "4 pivot", "4b dns", "4c api",
    ];
    if own {
        order.push("4d own");
    }
    order.extend(["5 failover", "5b ingress", "6 rejoin", "7 renewal"]);

    let passed = (|| {
        report.run(
            &mut cluster,
            "1 boot",
            &all,
            |c| scenarios::boot(c),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "1b cloud",
            &all,
            |c| scenarios::cloud_boot(c),
            |d| d.clone(),
        )?;
        let control_names: Vec<String> = control.iter().map(|s| s.to_string()).collect();
        report.run(
            &mut cluster,
            "2 dns",
            &control,
            |c| scenarios::dns(c, &control_names),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "3 api",
            &control,
            |c| scenarios::api_spread(c),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "4 pivot",
            &all,
            |c| scenarios::pivot(c),
            |d| d.clone(),
        )?;
        // DNS from the workers, now that they have booted.
        let everyone: Vec<String> = all[1..].iter().map(|s| s.to_string()).collect();
        report.run(
            &mut cluster,
            "4b dns",
            &all[1..],
            |c| scenarios::dns(c, &everyone),
            |d| d.clone(),
        )?;
        // The API through the VIP again, now that a master holds it: on the RHCOS stand-in
        // its apiserver owns *:6443 and the VIP goes through the agent's nftables redirect.
        report.run(
            &mut cluster,
            "4c api",
            &all[1..4],
            |c| scenarios::api_on_rhcos(c),
            |d| d.clone(),
        )?;
        if own {
            report.run(
                &mut cluster,
                "4d own",
                &all[1..],
                |c| scenarios::own_ignition(c),
                |d| d.clone(),
            )?;
        }
        let (dead, _) = report.run(
            &mut cluster,
            "5 failover",
            &all[1..],
            |c| scenarios::failover(c),
            |(_, d)| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "5b ingress",
            &all[1..],
            |c| scenarios::ingress_routers(c),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "6 rejoin",
            &all[1..4],
            |c| scenarios::rejoin(c, &dead),
            |d| d.clone(),
        )?;
        report.run(&mut cluster, "7 renewal", &all, scenarios::renewals, |d| {
            d.clone()
        })?;
        Some(())
    })()
    .is_some();

    report.print(&order);
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
