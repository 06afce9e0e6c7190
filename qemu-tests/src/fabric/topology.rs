//! The fabric's network: its namespaces, the veth links and bridges between spine, ToRs
//! and hosts, their addresses and static routes, and the `ip` commands that make them.

use std::process::Command;

use anyhow::{Context, Result, bail};

use super::{Fabric, SPINE};

/// Runs `args[0]` with the rest as its arguments; its stdout, or an error naming the
/// command and its stderr when it fails.
pub(super) fn run_ok(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["ip", "-n", ns];
    all.extend_from_slice(args);
    run_ok(&all)
}

fn sysctl(ns: &str, kv: &str) -> Result<()> {
    run_ok(&["ip", "netns", "exec", ns, "sysctl", "-qw", kv]).map(|_| ())
}

/// Stops then kills every process in namespace `ns` (stopped first, so none reacts to the
/// death of another: a BGP daemon must not send a Cease that a real crash would not).
pub fn kill_namespace(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for sig in [
        nix::sys::signal::Signal::SIGSTOP,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        for p in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), sig);
        }
    }
}

/// Every namespace the fabric uses.
pub const NAMESPACES: [&str; 7] = [
    "kbg-sp", "kbg-ta", "kbg-tb", "kbg-m0", "kbg-m1", "kbg-m2", "kbg-w2",
];

/// Another host in rack B (no services): it keeps ToR B's bridge up when m2's port goes
/// down, as the other hosts of a real rack do, so a dead m2 is noticed by BFD and not by
/// the ToR losing its last port.
pub const RACK_B_SPARE: &str = "kbg-w2";

pub(super) fn remove_namespaces() {
    for ns in NAMESPACES {
        kill_namespace(ns);
    }
    for ns in NAMESPACES {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        let _ = std::fs::remove_dir_all(format!("/var/run/frr/{ns}"));
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{ns}"));
    }
}

/// Creates the namespaces and wires them: spine to ToRs, every master and the rack B
/// spare to its ToR's bridge, addresses and static routes (routers learn only the VIPs by
/// BGP).
pub(super) fn wire(fabric: &Fabric) -> Result<()> {
    for ns in NAMESPACES {
        run_ok(&["ip", "netns", "add", ns])?;
        ip(ns, &["link", "set", "lo", "up"])?;
        for k in ["all", "default"] {
            sysctl(ns, &format!("net.ipv6.conf.{k}.accept_dad=0"))?;
        }
    }
    for ns in ["kbg-sp", "kbg-ta", "kbg-tb"] {
        for kv in [
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
            "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv6.fib_multipath_hash_policy=1",
        ] {
            sysctl(ns, kv)?;
        }
    }
    // Spine to ToRs.
    for (tor, n) in [("kbg-ta", 1), ("kbg-tb", 2)] {
        let (sp_if, tor_if) = (format!("s-t{n}"), "up0".to_string());
        ip(
            SPINE,
            &[
                "link", "add", &sp_if, "type", "veth", "peer", "name", &tor_if, "netns", tor,
            ],
        )?;
        ip(
            SPINE,
            &["addr", "add", &format!("10.71.{n}0.1/30"), "dev", &sp_if],
        )?;
        ip(
            SPINE,
            &[
                "addr",
                "add",
                &format!("fd71:{n}0::1/64"),
                "dev",
                &sp_if,
                "nodad",
            ],
        )?;
        ip(SPINE, &["link", "set", &sp_if, "up"])?;
        ip(
            tor,
            &["addr", "add", &format!("10.71.{n}0.2/30"), "dev", &tor_if],
        )?;
        ip(
            tor,
            &[
                "addr",
                "add",
                &format!("fd71:{n}0::2/64"),
                "dev",
                &tor_if,
                "nodad",
            ],
        )?;
        ip(tor, &["link", "set", &tor_if, "up"])?;
        // The racks' subnets (routers learn only the VIPs by BGP).
        ip(
            SPINE,
            &[
                "route",
                "add",
                &format!("10.71.{n}.0/24"),
                "via",
                &format!("10.71.{n}0.2"),
            ],
        )?;
        ip(
            SPINE,
            &[
                "route",
                "add",
                &format!("fd71:{n}::/64"),
                "via",
                &format!("fd71:{n}0::2"),
            ],
        )?;
        ip(
            tor,
            &["route", "add", "default", "via", &format!("10.71.{n}0.1")],
        )?;
        ip(
            tor,
            &["route", "add", "default", "via", &format!("fd71:{n}0::1")],
        )?;
        ip(tor, &["link", "add", "br0", "type", "bridge"])?;
        ip(
            tor,
            &["addr", "add", &format!("10.71.{n}.1/24"), "dev", "br0"],
        )?;
        ip(
            tor,
            &[
                "addr",
                "add",
                &format!("fd71:{n}::1/64"),
                "dev",
                "br0",
                "nodad",
            ],
        )?;
        ip(tor, &["link", "set", "br0", "up"])?;
    }
    for m in &fabric.masters {
        let tor = fabric.tor_ns(m.rack);
        ip(
            tor,
            &[
                "link",
                "add",
                &m.tor_port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &m.ns,
            ],
        )?;
        ip(tor, &["link", "set", &m.tor_port, "master", "br0", "up"])?;
        ip(
            &m.ns,
            &["addr", "add", &format!("{}/24", m.v4), "dev", "eth0"],
        )?;
        ip(
            &m.ns,
            &[
                "addr",
                "add",
                &format!("{}/64", m.v6),
                "dev",
                "eth0",
                "nodad",
            ],
        )?;
        ip(&m.ns, &["link", "set", "eth0", "up"])?;
        ip(
            &m.ns,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("10.71.{}.1", m.rack + 1),
            ],
        )?;
        ip(
            &m.ns,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("fd71:{}::1", m.rack + 1),
            ],
        )?;
    }
    ip(
        "kbg-tb",
        &[
            "link",
            "add",
            "t-w2",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            RACK_B_SPARE,
        ],
    )?;
    ip("kbg-tb", &["link", "set", "t-w2", "master", "br0", "up"])?;
    ip(
        RACK_B_SPARE,
        &["addr", "add", "10.71.2.20/24", "dev", "eth0"],
    )?;
    ip(RACK_B_SPARE, &["link", "set", "eth0", "up"])?;
    Ok(())
}

impl Fabric {
    /// The ToR namespace of `rack`.
    pub fn tor_ns(&self, rack: usize) -> &'static str {
        if rack == 0 { "kbg-ta" } else { "kbg-tb" }
    }
}
