//! Members over mDNS with real packets: agents in network namespaces on a bridge converge,
//! drop a killed node within the expiry, drop a stopped one at once (goodbye), ignore another
//! cluster; interoperate with avahi-daemon both ways; and carry A-label node names through
//! members and the cluster DNS.
//!
//! Needs root (namespaces); the avahi test needs avahi and dbus.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keelson_testkit::agent::RunNet;
use keelson_testkit::cmd::{JsonLines, spawn_json_lines};
use keelson_testkit::dig::{answers, dig_in, status};
use keelson_testkit::{Proc, Segment, require, require_root, wait_for};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");

/// An agent running `members` in a namespace; its stdout carries the member list.
struct Agent {
    proc: Proc,
    list: JsonLines,
}

fn write_config(dir: &Path, zone_name: &str, expiry: u32) -> PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    v["name"] = zone_name.into();
    v["members"]["renewIntervalSecs"] = 1.into();
    v["members"]["expirySecs"] = expiry.into();
    let p = dir.join(format!("cluster-{zone_name}.json"));
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

fn start_agent(dir: &Path, ns: &str, cluster: &Path, name: &str, role: &str, addr: &str) -> Agent {
    start_agent_with(dir, ns, cluster, name, role, addr, &[])
}

/// [`start_agent`] with more arguments for `keelson-agent members`.
fn start_agent_with(
    dir: &Path,
    ns: &str,
    cluster: &Path,
    name: &str,
    role: &str,
    addr: &str,
    extra: &[&str],
) -> Agent {
    let node = dir.join(format!("{name}.json"));
    std::fs::write(
        &node,
        serde_json::json!({"name": name, "role": role, "interface": "eth0", "addresses": [addr]})
            .to_string(),
    )
    .unwrap();
    let (proc, list) = spawn_json_lines(
        Command::new("ip")
            .args(["netns", "exec", ns, AGENT])
            .args(["members", "--cluster"])
            .arg(cluster)
            .arg("--node")
            .arg(&node)
            .args(extra)
            .stderr(Stdio::inherit()),
    );
    Agent { proc, list }
}

impl Agent {
    /// The latest member list it printed.
    fn latest(&self) -> Vec<BTreeMap<String, serde_json::Value>> {
        serde_json::from_value(self.list.latest()).unwrap_or_default()
    }

    fn names(&self) -> Vec<String> {
        self.latest()
            .iter()
            .map(|m| m["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn member(&self, name: &str) -> Option<BTreeMap<String, serde_json::Value>> {
        self.latest().into_iter().find(|m| m["name"] == name)
    }
}

#[test]
fn three_agents_converge_expire_and_ignore_other_cluster() {
    if !require_root() {
        return;
    }
    let seg = Segment::ipv4_only("kdm", 4, 71);
    let dir = tempfile::tempdir().unwrap();
    let expiry = 4;
    let cluster = write_config(dir.path(), "ocp4", expiry);
    let other = write_config(dir.path(), "other", expiry);
    let names = ["master-0", "master-1", "worker-0"];
    let mut agents: Vec<Agent> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let role = if n.starts_with("master") {
                "master"
            } else {
                "worker"
            };
            start_agent(
                dir.path(),
                &seg.nodes[i],
                &cluster,
                n,
                role,
                &format!("10.71.0.{}/24", 10 + i),
            )
        })
        .collect();
    // Another cluster on the same segment, with a clashing-looking name.
    let stranger = start_agent(
        dir.path(),
        &seg.nodes[3],
        &other,
        "master-9",
        "master",
        "10.71.0.13/24",
    );

    let all: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let took = wait_for("convergence", Duration::from_secs(15), || {
        agents.iter().all(|a| a.names() == all)
    });
    eprintln!("converged in {took:?}");
    // The same list everywhere: names, roles, addresses, versions.
    let first = agents[0].latest();
    for a in &agents[1..] {
        assert_eq!(a.latest(), first);
    }
    for a in &agents {
        let m = a.member("worker-0").unwrap();
        assert_eq!(m["addresses"], serde_json::json!(["10.71.0.12"]));
        assert_eq!(m["role"], "worker");
        assert!(!a.names().contains(&"master-9".to_string()));
    }
    // Stays converged over a few renewals, the stranger never shows.
    std::thread::sleep(Duration::from_secs(2));
    for a in &agents {
        assert_eq!(a.names(), all);
    }
    // And the stranger ran all along (reading its list fails if it died), in its own
    // cluster only: ignored, not absent.
    assert_eq!(
        stranger.names(),
        ["master-9"],
        "the other cluster's agent lists only itself"
    );

    // SIGKILL worker-0: no goodbye; dropped after the expiry, not before.
    agents.pop().unwrap().proc.kill9();
    let t = Instant::now();
    let expect: Vec<String> = all[..2].to_vec();
    wait_for(
        "expiry of worker-0",
        Duration::from_secs(u64::from(expiry) + 4),
        || agents.iter().all(|a| a.names() == expect),
    );
    let gone = t.elapsed();
    eprintln!("killed node dropped after {gone:?} (expiry {expiry}s)");
    assert!(
        gone >= Duration::from_secs(u64::from(expiry) - 2),
        "dropped too early: {gone:?}"
    );

    // SIGTERM master-1: goodbye, dropped well before the expiry.
    let mut stopped = agents.pop().unwrap();
    stopped.proc.signal_term();
    let t = Instant::now();
    wait_for("goodbye of master-1", Duration::from_secs(3), || {
        agents[0].names() == ["master-0".to_string()]
    });
    eprintln!("stopped node dropped after {:?}", t.elapsed());
    drop(stopped);
    drop(seg);
}

#[test]
fn ipv6_only_agents_converge() {
    if !require_root() {
        return;
    }
    let seg = Segment::ipv6_only("kd6", 3, 0x73);
    let dir = tempfile::tempdir().unwrap();
    let cluster = write_config(dir.path(), "ocp4", 4);
    let names = ["master-0", "master-1", "master-2"];
    let agents: Vec<Agent> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            start_agent(
                dir.path(),
                &seg.nodes[i],
                &cluster,
                n,
                "master",
                &format!("{}/64", seg.v6(i)),
            )
        })
        .collect();
    let all: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    // The link-local address the group is reached from needs DAD first (a second or two).
    let took = wait_for("IPv6 convergence", Duration::from_secs(15), || {
        agents.iter().all(|a| a.names() == all)
    });
    eprintln!("IPv6-only converged in {took:?}");
    for a in &agents {
        assert_eq!(
            a.member("master-2").unwrap()["addresses"],
            serde_json::json!(["fd73::12"])
        );
    }
    drop(agents);
    drop(seg);
}

#[test]
fn avahi_interop_both_ways() {
    if !require_root() {
        return;
    }
    for tool in [
        "avahi-daemon",
        "avahi-browse",
        "avahi-publish",
        "dbus-daemon",
        "unshare",
        "mount",
    ] {
        if !require(tool) {
            return;
        }
    }
    let seg = Segment::ipv4_only("kda", 3, 72);
    let dir = tempfile::tempdir().unwrap();
    // A private system bus for avahi and its clients.
    let bus_sock = dir.path().join("bus");
    let bus_conf = dir.path().join("bus.conf");
    std::fs::write(
        &bus_conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
            bus_sock.display()
        ),
    )
    .unwrap();
    let _bus = Proc::spawn(
        Command::new("dbus-daemon")
            .arg(format!("--config-file={}", bus_conf.display()))
            .arg("--nofork")
            .stdout(Stdio::null()),
    );
    wait_for("dbus socket", Duration::from_secs(5), || bus_sock.exists());
    let bus_env = format!("unix:path={}", bus_sock.display());

    let avahi_conf = dir.path().join("avahi.conf");
    std::fs::write(
        &avahi_conf,
        "[server]\nhost-name=avahi-node\nuse-ipv4=yes\nuse-ipv6=no\nallow-interfaces=eth0\n\
         enable-dbus=yes\n[wide-area]\nenable-wide-area=no\n[publish]\npublish-hinfo=no\n\
         publish-workstation=no\n",
    )
    .unwrap();
    let avahi_ns = &seg.nodes[1];
    // avahi-daemon's pid file is fixed (/run/avahi-daemon/pid) and it refuses to start
    // while another one's is there: this one gets a /run of its own (a private mount
    // namespace), so an avahi-daemon the machine runs is no concern of this test.
    let _avahi = Proc::spawn(
        Command::new("ip")
            .args(["netns", "exec", avahi_ns, "unshare", "--mount", "sh", "-c"])
            .arg(
                "mount -t tmpfs keelson-test /run && mkdir /run/avahi-daemon && \
                 exec avahi-daemon --no-drop-root --no-chroot --no-rlimits -f \"$0\"",
            )
            .arg(&avahi_conf)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus_env)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let avahi_cmd = |tool: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", avahi_ns, "env"])
            .arg(format!("DBUS_SYSTEM_BUS_ADDRESS={bus_env}"))
            .arg(tool);
        c
    };
    // avahi announces a keelson node of our cluster (as a node without the agent would).
    wait_for("avahi-daemon on the bus", Duration::from_secs(10), || {
        avahi_cmd("avahi-browse")
            .args(["-a", "-t", "-p"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    });
    let _published = Proc::spawn(
        avahi_cmd("avahi-publish")
            .args(["-s", "avahi-node", "_keelson._tcp", "22623", "role=worker"])
            .arg("cluster=ocp4.example.com")
            .arg("version=9.9.9")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let cluster = write_config(dir.path(), "ocp4", 10);
    let agent = start_agent(
        dir.path(),
        &seg.nodes[0],
        &cluster,
        "master-0",
        "master",
        "10.72.0.10/24",
    );

    // The agent sees avahi's node, with avahi's address and TXT.
    wait_for("agent sees avahi-node", Duration::from_secs(15), || {
        agent.member("avahi-node").is_some()
    });
    let m = agent.member("avahi-node").unwrap();
    assert_eq!(m["addresses"], serde_json::json!(["10.72.0.11"]));
    assert_eq!(m["role"], "worker");
    assert_eq!(m["version"], "9.9.9");

    // avahi sees the agent's node, resolved: address and TXT.
    let browse_until = |what: &str, resolved: &dyn Fn(&str) -> bool| {
        let mut last = String::new();
        wait_for(what, Duration::from_secs(15), || {
            let out = avahi_cmd("avahi-browse")
                .args(["-r", "-t", "-p", "_keelson._tcp"])
                .stderr(Stdio::null())
                .output()
                .unwrap();
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            last.lines().any(|l| l.starts_with("=;") && resolved(l))
        });
        eprintln!("avahi-browse: {last}");
    };
    browse_until("avahi-browse resolves master-0", &|l| {
        l.contains(";master-0;")
            && l.contains("master-0.local;10.72.0.10;22623")
            && l.contains("\"role=master\"")
            && l.contains("\"cluster=ocp4.example.com\"")
    });

    // A node of a cluster whose records are authenticated (cluster.json names the key):
    // avahi still browses and resolves it, the proof in its TXT record; it believes neither
    // avahi's unsigned node nor the unauthenticated agent, which still sees it.
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let key_text = keelson_cluster::membership::generate().unwrap();
    std::fs::write(tls.join("membership.key"), &key_text).unwrap();
    let key_id = keelson_cluster::membership::key_id(
        &keelson_cluster::membership::parse_key(&key_text).unwrap(),
    );
    let mut signed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cluster).unwrap()).unwrap();
    signed["members"]["keyId"] = key_id.clone().into();
    let signed_path = dir.path().join("cluster-signed.json");
    std::fs::write(&signed_path, signed.to_string()).unwrap();
    let tls_arg = tls.display().to_string();
    let authenticated = start_agent_with(
        dir.path(),
        &seg.nodes[2],
        &signed_path,
        "master-1",
        "master",
        "10.72.0.12/24",
        &["--tls-dir", &tls_arg],
    );
    browse_until("avahi-browse resolves master-1 with its proof", &|l| {
        l.contains(";master-1;")
            && l.contains("master-1.local;10.72.0.12;22623")
            && l.contains("\"addrs=10.72.0.12\"")
            && l.contains(&format!("\"kid={key_id}\""))
            && l.contains("\"mac=")
    });
    wait_for("master-0 sees master-1", Duration::from_secs(15), || {
        agent.member("master-1").is_some()
    });
    // A few renewals in which master-1 heard avahi-node and master-0 announce.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(authenticated.names(), ["master-1"]);
    drop(authenticated);
    drop(agent);
    drop(seg);
}

/// A node named with an A-label (`xn--...`: RFC 5890's ASCII form of an
/// internationalised name, which OpenShift node names may be) is a member like any other:
/// two `keelson-agent run` nodes (members over mDNS with signed records, and the cluster
/// DNS) list each other, and each one's DNS answers the other's name. `xn--cwl6ngym1` is
/// the name a property test once drew, which hickory's IDNA refused on the way out.
#[test]
fn a_label_node_names_go_through_mdns_members_and_dns() {
    if !require_root() || !require("dig") {
        return;
    }
    const A_LABEL: &str = "xn--cwl6ngym1";
    // Subnet 0: cluster.json's machine network 10.0.0.0/24.
    let seg = Segment::ipv4_only("kdx", 2, 0);
    let mut cluster: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    cluster["members"]["renewIntervalSecs"] = 1.into();
    cluster["members"]["expirySecs"] = 4.into();
    let nodes = [(A_LABEL, "master"), ("master-0", "master")];
    let mut net = RunNet::new(AGENT, seg, cluster, &nodes, "members,dns");
    net.start(0);
    net.start(1);
    net.wait_ready(&[0, 1]);
    let both = ["master-0", A_LABEL];
    let took = net.wait("both nodes list both", Duration::from_secs(20), || {
        (0..2).all(|i| net.member_names(i) == both)
    });
    eprintln!("members agree after {took:?}");
    let auth = &net.status(1)["discovery"]["auth"];
    assert_eq!(auth["authenticated"], true, "signed records: {auth}");
    for (asker, named) in [(1, 0), (0, 1)] {
        let name = format!("{}.ocp4.example.com", net.name(named).to_ascii_uppercase());
        let out = dig_in(
            &net.seg.nodes[asker],
            net.seg.ip4(asker).into(),
            &["+noidnin", "+noidnout", "+time=2", "+tries=2", &name, "A"],
        );
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert_eq!(
            answers(&out),
            [format!("{name}. 60 A {}", net.seg.ip4(named))],
            "{out}"
        );
    }
}
