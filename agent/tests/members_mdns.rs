//! Members over mDNS with real packets: agents in network namespaces on a bridge converge,
//! drop a killed node within the expiry, drop a stopped one at once (goodbye), ignore another
//! cluster; and interoperate with avahi-daemon both ways.
//!
//! Needs root (namespaces); skipped otherwise unless CI=true.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

fn skip(reason: &str) -> bool {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{reason}");
    }
    eprintln!("skipped: {reason}");
    true
}

fn sh(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success(), "{args:?} failed");
}

/// A bridge namespace plus one namespace per node, each with `eth0` on the bridge.
/// Everything is deleted on drop.
struct Segment {
    prefix: String,
    nodes: Vec<String>,
}

impl Segment {
    fn new(prefix: &str, count: usize, subnet: u8) -> Self {
        Self::with_addr(prefix, count, |i| format!("10.{subnet}.0.{}/24", 10 + i))
    }

    fn with_addr(prefix: &str, count: usize, addr: impl Fn(usize) -> String) -> Self {
        let seg = Segment {
            prefix: prefix.to_string(),
            nodes: (0..count).map(|i| format!("{prefix}-n{i}")).collect(),
        };
        seg.cleanup();
        let br = format!("{prefix}-br");
        sh(&["ip", "netns", "add", &br]);
        sh(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &br, "link", "set", "br0", "up"]);
        for (i, ns) in seg.nodes.iter().enumerate() {
            sh(&["ip", "netns", "add", ns]);
            let outer = format!("{prefix}v{i}");
            sh(&[
                "ip", "-n", &br, "link", "add", &outer, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]);
            sh(&[
                "ip", "-n", &br, "link", "set", &outer, "master", "br0", "up",
            ]);
            let addr = addr(i);
            if addr.contains(':') {
                sh(&["ip", "-n", ns, "addr", "add", &addr, "dev", "eth0", "nodad"]);
            } else {
                sh(&["ip", "-n", ns, "addr", "add", &addr, "dev", "eth0"]);
            }
            sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        seg
    }

    fn cleanup(&self) {
        for ns in self
            .nodes
            .iter()
            .cloned()
            .chain([format!("{}-br", self.prefix)])
        {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A child process killed on drop.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first so daemons (avahi) remove their pid files; then make sure.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An agent running `members` in a namespace; `latest` is the last list it printed.
struct Agent {
    proc: Proc,
    latest: Arc<Mutex<Vec<BTreeMap<String, serde_json::Value>>>>,
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
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            env!("CARGO_BIN_EXE_keelson-agent"),
            "members",
            "--cluster",
        ])
        .arg(cluster)
        .arg("--node")
        .arg(&node)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let latest = Arc::new(Mutex::new(Vec::new()));
    let l2 = latest.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(list) = serde_json::from_str(&line) {
                *l2.lock().unwrap() = list;
            }
        }
    });
    Agent {
        proc: Proc(child),
        latest,
    }
}

impl Agent {
    fn names(&self) -> Vec<String> {
        self.latest
            .lock()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn member(&self, name: &str) -> Option<BTreeMap<String, serde_json::Value>> {
        self.latest
            .lock()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
    }
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if cond() {
            return t.elapsed();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

#[test]
fn three_agents_converge_expire_and_ignore_other_cluster() {
    if !is_root() && skip("needs root for network namespaces") {
        return;
    }
    let seg = Segment::new("kdm", 4, 71);
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
    let _stranger = start_agent(
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
    let first = agents[0].latest.lock().unwrap().clone();
    for a in &agents[1..] {
        assert_eq!(*a.latest.lock().unwrap(), first);
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

    // SIGKILL worker-0: no goodbye; dropped after the expiry, not before.
    let mut killed = agents.pop().unwrap();
    killed.proc.0.kill().unwrap();
    let _ = killed.proc.0.wait();
    drop(killed);
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
    let stopped = agents.pop().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stopped.proc.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
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
    if !is_root() && skip("needs root for network namespaces") {
        return;
    }
    let seg = Segment::with_addr("kd6", 3, |i| format!("fd00:73::{}/64", 10 + i));
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
                &format!("fd00:73::{}/64", 10 + i),
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
            serde_json::json!(["fd00:73::12"])
        );
    }
    drop(agents);
    drop(seg);
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn avahi_interop_both_ways() {
    if !is_root() && skip("needs root for network namespaces") {
        return;
    }
    for tool in [
        "avahi-daemon",
        "avahi-browse",
        "avahi-publish",
        "dbus-daemon",
    ] {
        if !have(tool) && skip(&format!("{tool} is not installed")) {
            return;
        }
    }
    // avahi's pid file is fixed (/run/avahi-daemon/pid): only one may run on the machine.
    let running = Command::new("avahi-daemon")
        .arg("-c")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if running && skip("an avahi-daemon already runs on this machine (its pid file is fixed)") {
        return;
    }
    let seg = Segment::new("kda", 3, 72);
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
    let _bus = Proc(
        Command::new("dbus-daemon")
            .arg(format!("--config-file={}", bus_conf.display()))
            .arg("--nofork")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
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
    let _avahi = Proc(
        Command::new("ip")
            .args(["netns", "exec", avahi_ns, "env"])
            .arg(format!("DBUS_SYSTEM_BUS_ADDRESS={bus_env}"))
            .args([
                "avahi-daemon",
                "--no-drop-root",
                "--no-chroot",
                "--no-rlimits",
                "-f",
            ])
            .arg(&avahi_conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
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
    let _published = Proc(
        avahi_cmd("avahi-publish")
            .args(["-s", "avahi-node", "_keelson._tcp", "22623", "role=worker"])
            .arg("cluster=ocp4.example.com")
            .arg("version=9.9.9")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
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
    let mut last = String::new();
    wait_for(
        "avahi-browse resolves master-0",
        Duration::from_secs(15),
        || {
            let out = avahi_cmd("avahi-browse")
                .args(["-r", "-t", "-p", "_keelson._tcp"])
                .stderr(Stdio::null())
                .output()
                .unwrap();
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            last.lines().any(|l| {
                l.starts_with("=;")
                    && l.contains(";master-0;")
                    && l.contains("master-0.local;10.72.0.10;22623")
                    && l.contains("\"role=master\"")
                    && l.contains("\"cluster=ocp4.example.com\"")
            })
        },
    );
    eprintln!("avahi-browse: {last}");

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
    wait_for(
        "avahi-browse resolves master-1 with its proof",
        Duration::from_secs(15),
        || {
            let out = avahi_cmd("avahi-browse")
                .args(["-r", "-t", "-p", "_keelson._tcp"])
                .stderr(Stdio::null())
                .output()
                .unwrap();
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            last.lines().any(|l| {
                l.starts_with("=;")
                    && l.contains(";master-1;")
                    && l.contains("master-1.local;10.72.0.12;22623")
                    && l.contains("\"addrs=10.72.0.12\"")
                    && l.contains(&format!("\"kid={key_id}\""))
                    && l.contains("\"mac=")
            })
        },
    );
    eprintln!("avahi-browse: {last}");
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
