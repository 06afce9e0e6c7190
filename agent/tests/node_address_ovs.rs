//! The node's address moves onto an Open vSwitch bridge under a running agent, as OpenShift's
//! `ovs-configuration` does at boot with OVN-Kubernetes: a bridge `br-ex` with the NIC's MAC,
//! the NIC made its port, the NIC's address taken off it and put on the bridge. Three
//! `keelson-agent run` masters (members, VRRP and the Ignition server members register with; unicast, as `keelson build` writes) on a
//! bridge segment; the API VIP's holder is the one whose address moves, while a client on the
//! segment asks an HTTP server on every node through the VIP every 100 ms. The agent follows
//! the address without a restart: its VRRP runs on br-ex (it hears the others' adverts
//! there), exactly one node holds the VIP, and the client lost at most one VRRP failover's
//! worth of requests. Then the address leaves every link: a status finding, cleared when it
//! comes back.
//!
//! Real Open vSwitch (Debian's openvswitch-switch, its daemons started by its own `ovs-ctl`
//! inside the node's namespace, no systemd). This kernel has no openvswitch module, so the
//! bridge uses OVS's userspace datapath (`datapath_type=netdev`), which reads the NIC through
//! a packet socket; the kernel datapath instead takes every frame the NIC receives from the
//! host's stack. An nftables `netdev` ingress rule on the NIC plays that part: packet sockets
//! see a frame before the hook drops it for the stack, so OVS still gets everything and the
//! node's own sockets on the NIC (VRRP's, ARP's) get nothing, as on a real node.
//!
//! Needs root, nftables, ethtool and openvswitch-switch.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunCluster, RunNode, master_down, member_names};
use keelson_testkit::http::HttpServer;
use keelson_testkit::netns::bind_tcp_in;
use keelson_testkit::segment::nft;
use keelson_testkit::{Segment, require, require_file, require_root, sh, wait_for_ok};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const OVS_CTL: &str = "/usr/share/openvswitch/scripts/ovs-ctl";
const VIP: &str = "10.0.0.5";
const PORT: u16 = 18090;
/// How often the client asks, and how long it waits for an answer.
const EVERY: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(1);

/// Open vSwitch's daemons in one namespace, their database and sockets in a directory of
/// their own; stopped with `ovs-ctl stop` on drop.
struct Ovs {
    ns: String,
    dir: tempfile::TempDir,
}

impl Ovs {
    fn start(ns: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ovs = Ovs {
            ns: ns.to_owned(),
            dir,
        };
        let out = ovs
            .ctl()
            .args([
                "start",
                "--system-id=random",
                "--no-monitor",
                "--no-record-hostname",
                "--no-mlockall",
                "--ovsdb-server-priority=0",
                "--ovs-vswitchd-priority=0",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-ctl start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ovs
    }

    fn env(&self, cmd: &mut Command) {
        let d = self.dir.path();
        for var in ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR"] {
            cmd.env(var, d);
        }
    }

    fn ctl(&self) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, OVS_CTL]);
        self.env(&mut cmd);
        cmd
    }

    fn vsctl(&self, args: &[&str]) {
        let db = format!("--db=unix:{}", self.dir.path().join("db.sock").display());
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "ovs-vsctl", &db])
            .args(args);
        self.env(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        let _ = self.ctl().arg("stop").output();
    }
}

/// The nodes (of `nodes`) holding `address` on any link.
fn holders(seg: &Segment, nodes: &[usize], address: &str) -> Vec<usize> {
    nodes
        .iter()
        .copied()
        .filter(|&i| {
            let out = sh(&["ip", "-n", &seg.nodes[i], "-o", "addr", "show"]);
            out.split_whitespace()
                .any(|w| w.split('/').next() == Some(address))
        })
        .collect()
}

/// A client asking `url` every [`EVERY`] from namespace `ns`: (sent, answered) per request.
struct Client {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, bool)>>,
}

impl Client {
    fn start(ns: &str, url: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, ns, url) = (stop.clone(), ns.to_owned(), url.to_owned());
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let ok = Command::new("ip")
                    .args(["netns", "exec", &ns, "curl", "-sf", "-o", "/dev/null"])
                    .args(["-m", &format!("{}", TIMEOUT.as_secs_f64())])
                    .arg(&url)
                    .status()
                    .is_ok_and(|s| s.success());
                out.push((sent, ok));
                std::thread::sleep(EVERY.saturating_sub(sent.elapsed()));
            }
            out
        });
        Client { stop, thread }
    }

    fn finish(self) -> Vec<(Instant, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn node_status(files: &RunCluster, i: usize) -> serde_json::Value {
    files.status(i)["node"].clone()
}

fn api(files: &RunCluster, i: usize) -> serde_json::Value {
    files.status(i)["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api").cloned())
        .unwrap_or_default()
}

fn mac(ns: &str, link: &str) -> String {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", link]);
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("a MAC")
        .to_owned()
}

#[test]
fn the_holders_address_moves_onto_an_ovs_br_ex_and_the_agent_follows_it() {
    if !require_root()
        || !require("nft")
        || !require("ethtool")
        || !require("ovs-vsctl")
        || !require_file(OVS_CTL, "ovs-ctl (openvswitch-switch)")
    {
        return;
    }
    // Three masters and a client (node 3, no agent), IPv4, multicast dropped (unicast VRRP
    // and members, as built).
    let seg = Segment::ipv4_only("kna", 4, 0);
    seg.drop_multicast();
    for ns in &seg.nodes {
        // Senders finish their checksums: the userspace datapath forwards a veth's
        // unfinished ones as they are, and the receiver drops them.
        sh(&[
            "ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off",
        ]);
    }
    let mut cluster = keelson_testkit::agent::example_cluster_json(1000, 1, 10);
    let mut inst = cluster["vrrp"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "api")
        .unwrap()
        .clone();
    // Equal masters, no checks: the move alone decides what happens.
    inst["checks"] = serde_json::json!([]);
    inst["handbackSecs"] = 0.into();
    let prio = inst["priorities"]["master"].as_u64().unwrap();
    cluster["vrrp"]["instances"] = serde_json::json!([inst]);
    cluster["dns"]["manageResolvConf"] = false.into();
    let masters = [0, 1, 2];
    let _servers: Vec<HttpServer> = masters
        .iter()
        .map(|&i| {
            let l = bind_tcp_in(&seg.nodes[i], ([0, 0, 0, 0], PORT).into());
            HttpServer::start(l, [("/", format!("master-{i}"))])
        })
        .collect();
    let files = RunCluster::new(AGENT, cluster);
    let nodes: Vec<RunNode> = masters
        .iter()
        .map(|&i| {
            files.start(
                &seg.nodes[i],
                i,
                (&format!("master-{i}"), "master", &seg.v4(i)),
                "members,vrrp,ignition",
            )
        })
        .collect();
    let dump = || {
        for (i, n) in nodes.iter().enumerate() {
            eprintln!("---- master-{i}\n{}", n.log_tail(60));
        }
    };
    wait_for_ok(
        "three masters listing each other",
        Duration::from_secs(60),
        || {
            // A node serves its status once it is ready: ask only then.
            if !nodes.iter().all(RunNode::is_ready) {
                return Err("not every node ready".into());
            }
            let lists: Vec<usize> = masters
                .iter()
                .map(|&i| member_names(&files.status(i)).len())
                .collect();
            if lists == [3, 3, 3] {
                Ok(())
            } else {
                Err(format!("members {lists:?}"))
            }
        },
    );
    let bound = master_down(1000, prio);
    let holder = seg.wait_steady_holder(VIP, bound, Duration::from_secs(60));
    let ns = seg.nodes[holder].clone();
    let url = format!("http://{VIP}:{PORT}/");
    let client = Client::start(&seg.nodes[3], &url);
    std::thread::sleep(Duration::from_secs(2));

    // What ovs-configuration does: br-ex with the NIC's MAC, the NIC its port, the NIC's
    // address (and its routes) moved onto the bridge.
    let ovs = Ovs::start(&ns);
    let nic_mac = mac(&ns, "eth0");
    let moved_at = Instant::now();
    ovs.vsctl(&[
        "add-br",
        "br-ex",
        "--",
        "set",
        "bridge",
        "br-ex",
        "datapath_type=netdev",
        &format!("other-config:hwaddr={nic_mac}"),
    ]);
    nft(
        &ns,
        "table netdev kna_port {\n  chain in {\n    type filter hook ingress device eth0 priority 0; policy drop;\n  }\n}\n",
    );
    ovs.vsctl(&["add-port", "br-ex", "eth0"]);
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "del",
        &seg.v4(holder),
        "dev",
        "eth0",
    ]);
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        &seg.v4(holder),
        "dev",
        "br-ex",
    ]);
    sh(&["ip", "-n", &ns, "link", "set", "br-ex", "up"]);
    sh(&[
        "ip", "netns", "exec", &ns, "ethtool", "-K", "br-ex", "tx", "off",
    ]);
    let took = moved_at.elapsed();

    // The agent follows: its identity is on br-ex, once.
    let followed = wait_for_ok("the agent on br-ex", Duration::from_secs(20), || {
        let n = node_status(&files, holder);
        if n["interface"] == "br-ex" && n["addressMoves"] == 1 && n["addressProblem"].is_null() {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });
    // Its VRRP runs on br-ex: it hears the others (or they hear it), and one node alone
    // holds the VIP, long enough to be sure.
    let after = seg.wait_steady_holder(VIP, bound, Duration::from_secs(60));
    let h = holders(&seg, &masters, VIP);
    if h.len() != 1 {
        dump();
        panic!("after the move {VIP} is held by {h:?}");
    }
    let hears = wait_for_ok(
        "the moved node's VRRP hearing adverts on br-ex",
        Duration::from_secs(10),
        || {
            let a = api(&files, holder);
            let first = a["advertsReceived"].as_u64().unwrap_or(0);
            std::thread::sleep(Duration::from_millis(2500));
            let b = api(&files, holder);
            let heard = b["advertsReceived"].as_u64().unwrap_or(0) > first;
            let others_hear = masters
                .iter()
                .filter(|&&i| i != holder)
                .all(|&i| api(&files, i)["master"].as_str() == Some(&seg.ip4(after).to_string()));
            if (after == holder && others_hear) || (after != holder && heard) {
                Ok(())
            } else {
                Err(format!("holder now {after}: {b}"))
            }
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    let samples = client.finish();
    let failed: Vec<&(Instant, bool)> = samples.iter().filter(|(_, ok)| !ok).collect();
    let worth = (bound + TIMEOUT).as_millis() / EVERY.as_millis();
    eprintln!(
        "node_address_ovs: move took {took:?}, followed {followed:?} later; VIP holder {holder} -> {after} (steady), VRRP on br-ex confirmed {hears:?} later; {} of {} requests failed (a failover's worth: {worth})",
        failed.len(),
        samples.len()
    );
    assert!(
        failed.iter().all(|(t, _)| *t >= moved_at - TIMEOUT),
        "requests failed before the move"
    );
    if failed.len() as u128 > worth {
        dump();
        panic!(
            "{} requests failed across the move, more than one VRRP failover's worth ({worth})",
            failed.len()
        );
    }
    let log = std::fs::read_to_string(&nodes[holder].log).unwrap();
    assert!(
        log.contains("service vrrp: the node's address is now on br-ex"),
        "no restart of VRRP on br-ex in the log"
    );
    // The address leaves every link: a finding, the identity kept; back: cleared.
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "del",
        &seg.v4(holder),
        "dev",
        "br-ex",
    ]);
    wait_for_ok("an address finding", Duration::from_secs(10), || {
        let n = node_status(&files, holder);
        let p = n["addressProblem"]["problem"].as_str().unwrap_or("");
        if p.contains("is on no link") && n["interface"] == "br-ex" {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        &seg.v4(holder),
        "dev",
        "br-ex",
    ]);
    wait_for_ok("the finding cleared", Duration::from_secs(10), || {
        let n = node_status(&files, holder);
        if n["addressProblem"].is_null() && n["addressMoves"] == 1 {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });
    drop(ovs);
}
