//! `openstack-cluster`: boots the keelson cluster on the all-in-one OpenStack of this
//! machine through Nova, Neutron and Glance, and checks it from outside
//! (`make openstack-cluster`, docs/openstack.md). `scripts/openstack/run.sh` brings the
//! cloud up before and down after.
//!
//! `openstack-cluster [--subset]`: the whole cluster (bootstrap, three masters, two workers)
//! with every scenario; `--subset` (what `make test` runs) the bootstrap and one master:
//! boot, cloud, DNS, API, both port security scenarios and the pivot. Both end with Heat's
//! validator on `keelson build`'s template.
//!
//! Environment: `KEELSON_BIN`, `KEELSON_AGENT_BIN`, `KEELSON_STANDIN_BIN` (as
//! `qemu-cluster`), `OPENSTACK_CLUSTER_MASTERS` (`standin`, the default, or `appliance`),
//! `OPENSTACK_CLUSTER_WORK` (default `target/openstack-cluster`), `OPENSTACK_CLUSTER_KEEP=1`
//! (leave the servers and the network for a look afterwards).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use keelson_qemu_tests::cluster::{Config, ImageKind};
use keelson_qemu_tests::openstack::{Deployment, OpenStackCluster, scenarios as os};
use keelson_qemu_tests::payload::{build, env_path, standin};
use keelson_qemu_tests::report::Report;
use keelson_qemu_tests::scenarios;
use keelson_qemu_tests::testbed::Testbed;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let subset = match args.as_slice() {
        [] => false,
        [a] if a == "--subset" => true,
        _ => {
            eprintln!("usage: openstack-cluster [--subset]");
            std::process::exit(2);
        }
    };
    let work = env_path("OPENSTACK_CLUSTER_WORK", "target/openstack-cluster");
    let summary = work.join(SUMMARY);
    // A summary left by an earlier run must not stand for this one's.
    let _ = std::fs::remove_file(&summary);
    if let Err(e) = run(subset, &work, &summary) {
        let line = format!("openstack-cluster: {e:#}");
        eprintln!("{line}");
        append(&summary, &line);
        std::process::exit(1);
    }
}

/// The run's closing table and verdict (and the error that ended it, if one did), in the work
/// directory: `scripts/openstack/run.sh` prints it again after stopping the cloud, whose
/// twenty lines of log would otherwise be all a log's tail shows of a failed run.
const SUMMARY: &str = "summary.txt";

/// Appends `text` and a newline to `path`; the summary is a convenience, so a failure to write
/// it is reported, not fatal.
fn append(path: &Path, text: &str) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{text}"));
    if let Err(e) = written {
        eprintln!("openstack-cluster: writing {}: {e}", path.display());
    }
}

fn masters() -> Result<ImageKind> {
    match std::env::var("OPENSTACK_CLUSTER_MASTERS").as_deref() {
        Err(_) | Ok("") | Ok("standin") => Ok(ImageKind::Standin),
        Ok("appliance") => Ok(ImageKind::Appliance),
        Ok(other) => bail!("OPENSTACK_CLUSTER_MASTERS={other:?}: expected standin or appliance"),
    }
}

fn deployment(subset: bool, master_image: ImageKind) -> Deployment {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    if subset {
        Deployment {
            masters: names(&["master-0"]),
            workers: vec![],
            master_image,
            // One node of each kind of metadata source.
            config_drive: names(&["master-0"]),
        }
    } else {
        Deployment {
            masters: names(&["master-0", "master-1", "master-2"]),
            workers: names(&["worker-0", "worker-1"]),
            master_image,
            config_drive: names(&["bootstrap", "master-1", "worker-0"]),
        }
    }
}

/// The scenarios of a run, in order.
fn order(subset: bool) -> Vec<&'static str> {
    if subset {
        vec![
            "1 boot",
            "1b cloud",
            "2 dns",
            "3 api",
            "P1 vip-pair",
            "P2 vrrp-112",
            "4 pivot",
            "H heat",
        ]
    } else {
        vec![
            "1 boot",
            "1b cloud",
            "2 dns",
            "3 api",
            "4 pivot",
            "4a cloud",
            "4b dns",
            "4c api",
            "5 failover",
            "6 rejoin",
            "P1 vip-pair",
            "P2 vrrp-112",
            "H heat",
        ]
    }
}

fn scenarios(c: &mut OpenStackCluster, report: &mut Report, subset: bool) -> Option<()> {
    let all: Vec<String> = c.plan().iter().map(|n| n.name.clone()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let control: Vec<String> = c
        .plan()
        .iter()
        .filter(|n| n.role != "worker")
        .map(|n| n.name.clone())
        .collect();
    let control_refs: Vec<&str> = control.iter().map(String::as_str).collect();
    let d = |s: &String| s.clone();
    report.run(c, "1 boot", &all, |c| scenarios::boot(c), d)?;
    report.run(
        c,
        "1b cloud",
        &control_refs,
        |c| os::cloud(c, &control_refs),
        d,
    )?;
    report.run(
        c,
        "2 dns",
        &control_refs,
        |c| scenarios::dns(c, &control),
        d,
    )?;
    report.run(c, "3 api", &control_refs, |c| scenarios::api_spread(c), d)?;
    if subset {
        report.run(c, "P1 vip-pair", &all, os::vip_not_allowed, d)?;
        report.run(c, "P2 vrrp-112", &all, os::vrrp_blocked, d)?;
        report.run(c, "4 pivot", &all, |c| scenarios::pivot(c), d)?;
        report.run(c, "H heat", &[], |c| os::heat_template(c), d)?;
        return Some(());
    }
    report.run(c, "4 pivot", &all, |c| scenarios::pivot(c), d)?;
    let workers: Vec<&str> = all
        .iter()
        .copied()
        .filter(|n| !control_refs.contains(n))
        .collect();
    report.run(c, "4a cloud", &workers, |c| os::cloud(c, &workers), d)?;
    let everyone: Vec<String> = all[1..].iter().map(|s| s.to_string()).collect();
    report.run(c, "4b dns", &all[1..], |c| scenarios::dns(c, &everyone), d)?;
    report.run(c, "4c api", &all[1..4], |c| scenarios::api_on_rhcos(c), d)?;
    let (dead, _) = report.run(
        c,
        "5 failover",
        &all[1..],
        |c| scenarios::failover(c),
        |(_, d)| d.clone(),
    )?;
    report.run(
        c,
        "6 rejoin",
        &all[1..4],
        |c| scenarios::rejoin(c, &dead),
        d,
    )?;
    report.run(c, "P1 vip-pair", &all[1..], os::vip_not_allowed, d)?;
    report.run(c, "P2 vrrp-112", &all[1..], os::vrrp_blocked, d)?;
    report.run(c, "H heat", &[], |c| os::heat_template(c), d)?;
    Some(())
}

/// The resident memory of the cloud's own processes (PSS, so shared pages count once), in
/// MiB: every process of the OpenStack services' users, and the infrastructure's daemons.
fn openstack_memory_mib() -> Result<f64> {
    const USERS: &[&str] = &[
        "keystone",
        "glance",
        "placement",
        "nova",
        "neutron",
        "heat",
        "rabbitmq",
        "mysql",
        "memcache",
    ];
    const ROOT_DAEMONS: &[&str] = &[
        "libvirtd",
        "virtlogd",
        "privsep-helper",
        "dnsmasq",
        "haproxy",
    ];
    let mut kib = 0u64;
    for pid in keelson_qemu_tests::openstack::pids()? {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        let user = uid.and_then(|u| {
            std::fs::read_to_string("/etc/passwd")
                .ok()?
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.get(2)?.parse::<u32>().ok()? == u).then(|| f[0].to_owned())
                })
        });
        let ours = user.as_deref().is_some_and(|u| USERS.contains(&u))
            || ROOT_DAEMONS.contains(&comm.trim());
        if !ours {
            continue;
        }
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        kib += rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(kib as f64 / 1024.0)
}

fn run(subset: bool, work: &Path, summary: &Path) -> Result<()> {
    let start = Instant::now();
    std::fs::create_dir_all(work)?;
    let master_image = masters()?;
    eprintln!(
        "openstack-cluster: {}; building the cluster's payloads and image in {}",
        if subset {
            "subset (bootstrap and one master)"
        } else {
            "the whole cluster"
        },
        work.display()
    );
    let out = build(
        work,
        Config::Unicast,
        master_image,
        keelson_qemu_tests::cluster::Payload::Keelson,
    )?;
    let rhcos_disk = match master_image {
        ImageKind::Standin => Some(keelson_qemu_tests::standin::disk(&standin()?)?),
        ImageKind::Appliance => None,
    };
    let memory_idle = openstack_memory_mib()?;
    let mut cluster =
        OpenStackCluster::new(work, &out, rhcos_disk, deployment(subset, master_image))
            .context("preparing the cloud (is it up? scripts/openstack/up.sh)")?;
    let mut report = Report::new("openstack-cluster");
    let order = order(subset);
    let done = scenarios(&mut cluster, &mut report, subset).is_some();
    let memory_busy = openstack_memory_mib()?;
    let table = report.table(&order);
    print!("{table}");
    let passed = done && report.passed(&order);
    for (what, t) in &cluster.timings {
        println!("{what}: {:.1} s", t.as_secs_f64());
    }
    println!(
        "OpenStack's memory (PSS of its processes): {memory_idle:.0} MiB before the cluster, {memory_busy:.0} MiB with it running (guests not counted)"
    );
    let verdict = format!(
        "openstack-cluster: {} {} in {:.0} s; consoles: /var/lib/nova/instances/<id>/console.log, the script's output in {}",
        if subset { "subset" } else { "whole cluster" },
        if passed { "PASSED" } else { "FAILED" },
        start.elapsed().as_secs_f64(),
        work.join("create-cluster.log").display()
    );
    println!("\n{verdict}");
    append(summary, &format!("{table}\n{verdict}"));
    if std::env::var("OPENSTACK_CLUSTER_KEEP").as_deref() == Ok("1") {
        eprintln!(
            "openstack-cluster: OPENSTACK_CLUSTER_KEEP=1: servers and network left as they are"
        );
    } else {
        let t = Instant::now();
        cluster.clean()?;
        eprintln!(
            "openstack-cluster: servers, ports, security group, network and images deleted in {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    if !passed {
        bail!("a scenario failed");
    }
    Ok(())
}
