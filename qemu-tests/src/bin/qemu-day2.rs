//! `qemu-day2`: the QEMU cluster's day-2 operations (`make qemu-day2`,
//! docs/operations.md): boots the control plane as `qemu-cluster` does (bootstrap, three
//! masters on the RHCOS stand-in, no workers: their agent is PID 1 of the appliance, which
//! docs/operations.md reprovisions rather than restarts), pivots, then runs
//! [`keelson_qemu_tests::day2`]: a rolling agent upgrade through the API VIP with a client
//! counting failures, the membership key rotated node by node (one node left on the old key
//! and refused, then caught up), and a master replaced by a new one at another address.
//!
//! `qemu-day2 [--config multicast|unicast] [--segment switch|hub]`: `multicast` (the default) runs VRRP multicast and
//! mDNS members, so a new master at a new address needs no `cluster.json` edit (unicast lists
//! no master addresses either, but multicast is the configuration docs/operations.md's
//! replacement needs nothing for). Environment as `qemu-cluster`'s, and `KEELSON_AGENT_NEW`:
//! the binary the roll installs (default: `KEELSON_AGENT_BIN`, a rolling restart through the
//! upgrade procedure); `QEMU_CLUSTER_WORK` defaults to `target/qemu-day2/<config>`.
//! `--segment` (multicast configuration only): `switch` (the default) puts the VMs on a
//! learning bridge of taps where multicast passes; `hub` on QEMU's multicast socket segment,
//! where every frame of a bulk transfer between two VMs reaches every VM's QEMU
//! (docs/qemu-cluster.md, "Day 2").

use std::time::Instant;

use anyhow::{Result, bail};
use keelson_qemu_tests::cluster::{self, Cluster, Config, ImageKind, MulticastSegment};
use keelson_qemu_tests::day2;
use keelson_qemu_tests::payload::{build, env_path, standin};
use keelson_qemu_tests::report::Report;
use keelson_qemu_tests::scenarios;

fn main() {
    if let Err(e) = parse(std::env::args().skip(1)).and_then(|(c, s)| run(c, s)) {
        eprintln!("qemu-day2: {e:#}");
        std::process::exit(1);
    }
}

/// `[--config multicast|unicast] [--segment switch|hub]`.
fn parse(mut args: impl Iterator<Item = String>) -> Result<(Config, MulticastSegment)> {
    let mut config = Config::Multicast;
    let mut segment = MulticastSegment::Switch;
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--config", Some(v)) => config = v.parse()?,
            ("--segment", Some(v)) => segment = v.parse()?,
            _ => bail!("usage: qemu-day2 [--config multicast|unicast] [--segment switch|hub]"),
        }
    }
    Ok((config, segment))
}

fn run(config: Config, segment: MulticastSegment) -> Result<()> {
    let start = Instant::now();
    let work = env_path(
        "QEMU_CLUSTER_WORK",
        &format!("target/qemu-day2/{}", config.as_str()),
    );
    std::fs::create_dir_all(&work)?;
    let new_agent = env_path(
        "KEELSON_AGENT_NEW",
        &env_path(
            "KEELSON_AGENT_BIN",
            "target/x86_64-unknown-linux-gnu/release/keelson-agent",
        )
        .to_string_lossy(),
    );
    if !new_agent.exists() {
        bail!("no agent to roll out at {}", new_agent.display());
    }
    eprintln!(
        "qemu-day2: {} configuration; payloads in {}; the roll installs {}",
        config.as_str(),
        work.display(),
        new_agent.display()
    );
    // The procedures run in systemd nodes through their guest agent: the stand-in.
    let masters = ImageKind::Standin;
    // Day 2 is keelson's own cluster: its steps fetch the agent from keelson's :22623.
    let payload = keelson_qemu_tests::cluster::Payload::Keelson;
    let out = build(&work, config, masters, payload)?;
    let image = out.join("keelson.qcow2");
    let plan: Vec<_> = cluster::plan(masters)
        .into_iter()
        .filter(|n| n.role != "worker")
        .collect();
    let mut cluster = Cluster::with_segment(
        &work,
        &out,
        &image,
        config,
        segment,
        payload,
        plan,
        Some(standin()?),
    )?;
    eprintln!("qemu-day2: segment: {}", cluster.segment_text());
    let mut report = Report::new("qemu-day2");
    let all = ["bootstrap", "master-0", "master-1", "master-2"];
    let masters_only = ["master-0", "master-1", "master-2", "master-3"];
    let order = [
        "1 boot",
        "2 pivot",
        "3 api",
        "4 roll",
        "5 rotate",
        "6 replace",
        "7 findings",
    ];
    let passed = (|| {
        report.run(
            &mut cluster,
            order[0],
            &all,
            |c| scenarios::boot(c),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            order[1],
            &all,
            |c| scenarios::pivot(c),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            order[2],
            &all[1..],
            |c| scenarios::api_spread(c),
            |d| d.clone(),
        )?;
        // The rotation and the replacement do not need the roll (or the rotation) to have
        // passed: run each either way, for its figures (the run still fails).
        let _ = report.run(
            &mut cluster,
            order[3],
            &all[1..],
            |c| day2::roll(c, &new_agent),
            |d| d.clone(),
        );
        let _ = report.run(&mut cluster, order[4], &all[1..], day2::rotate, |d| {
            d.clone()
        });
        let replaced = report.run(&mut cluster, order[5], &masters_only, day2::replace, |d| {
            d.clone()
        });
        report.run(
            &mut cluster,
            order[6],
            &masters_only,
            day2::no_port_findings,
            |d| d.clone(),
        )?;
        replaced.map(|_| ())
    })()
    .is_some()
        && report.passed(&order);
    report.print(&order);
    println!(
        "\nqemu-day2: {} configuration {} in {:.0} s (accel {}), consoles in {}",
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
