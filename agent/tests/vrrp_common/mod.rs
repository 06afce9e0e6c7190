//! Shared by the VRRP namespace tests: a bridge segment of namespaces, agents and
//! keepalived run inside them, VIP holder polling. Everything is removed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Whether to skip (not root and not CI); panics in CI.
pub fn skip() -> bool {
    if is_root() {
        return false;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("VRRP namespace tests need root");
    }
    eprintln!("skipped: VRRP namespace tests need root");
    true
}

pub fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bridge namespace `<prefix>-br` plus namespaces `<prefix>-n<i>`, each with `eth0` on
/// the bridge, IPv4 `10.<subnet>.0.<10+i>/24` and IPv6 `fd<subnet>::<10+i>/64`, DAD off.
pub struct Segment {
    pub prefix: String,
    pub nodes: Vec<String>,
    pub subnet: u8,
}

impl Segment {
    pub fn new(prefix: &str, count: usize, subnet: u8) -> Self {
        let seg = Segment {
            prefix: prefix.to_string(),
            nodes: (0..count).map(|i| format!("{prefix}-n{i}")).collect(),
            subnet,
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
            for k in ["all", "default", "eth0"] {
                sh(&[
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{k}.accept_dad=0"),
                ]);
            }
            sh(&["ip", "-n", ns, "addr", "add", &seg.v4(i), "dev", "eth0"]);
            let v6 = format!("{}/64", seg.v6(i));
            sh(&["ip", "-n", ns, "addr", "add", &v6, "dev", "eth0", "nodad"]);
            sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        seg
    }

    /// Node i's IPv4 address with prefix.
    pub fn v4(&self, i: usize) -> String {
        format!("10.{}.0.{}/24", self.subnet, 10 + i)
    }

    /// Node i's IPv6 address (no prefix).
    pub fn v6(&self, i: usize) -> String {
        format!("fd{:02x}::{}", self.subnet, 10 + i)
    }

    /// The IPv4 VIP of this segment, `10.<subnet>.0.<last>`.
    pub fn vip4(&self, last: u8) -> String {
        format!("10.{}.0.{last}", self.subnet)
    }

    /// Whether node i has `vip` on eth0.
    pub fn holds(&self, i: usize, vip: &str) -> bool {
        let out = Command::new("ip")
            .args(["-n", &self.nodes[i], "-o", "addr", "show", "dev", "eth0"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .any(|w| w.split('/').next() == Some(vip))
    }

    /// Indices of the nodes holding `vip`.
    pub fn holders(&self, vip: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.holds(i, vip))
            .collect()
    }

    /// Waits until exactly node `i` holds `vip` (and no other), up to `limit`; returns the
    /// time it took, or panics naming who held it.
    pub fn wait_sole_holder(&self, i: usize, vip: &str, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let h = self.holders(vip);
            if h == [i] {
                return t.elapsed();
            }
            if t.elapsed() > limit {
                panic!("{vip}: expected only node {i} to hold it within {limit:?}, holders {h:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts that node `i` stays the sole holder for `dur`.
    pub fn assert_stable(&self, i: usize, vip: &str, dur: Duration) {
        let t = Instant::now();
        while t.elapsed() < dur {
            let h = self.holders(vip);
            assert_eq!(h, vec![i], "{vip}: holders changed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn set_link(&self, i: usize, up: bool) {
        sh(&[
            "ip",
            "-n",
            &self.nodes[i],
            "link",
            "set",
            "eth0",
            if up { "up" } else { "down" },
        ]);
    }

    /// Drops every multicast frame at the bridge (an nftables bridge rule in the bridge
    /// namespace, as a network that blocks multicast does), counting them.
    pub fn drop_multicast(&self) {
        let rules = "table bridge nomcast {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n    meta pkttype multicast counter drop\n  }\n}\n";
        nft(&format!("{}-br", self.prefix), rules);
    }

    /// Frames the multicast rule dropped so far.
    pub fn multicast_dropped(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("{}-br", self.prefix)])
            .args(["nft", "-j", "list", "table", "bridge", "nomcast"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["rule"]["expr"].as_array())
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum()
    }

    /// Cuts nodes `isolated` off from the others at the bridge (their links stay up, as
    /// in a switch or fabric partition); [`Segment::heal`] undoes it.
    pub fn partition(&self, isolated: &[usize]) {
        let ports: Vec<String> = isolated
            .iter()
            .map(|i| format!("\"{}v{i}\"", self.prefix))
            .collect();
        let set = ports.join(", ");
        let rules = format!(
            "table bridge split {{\n  chain forward {{\n    type filter hook forward priority -1; policy accept;\n    iifname {{ {set} }} oifname != {{ {set} }} drop\n    oifname {{ {set} }} iifname != {{ {set} }} drop\n  }}\n}}\n"
        );
        nft(&format!("{}-br", self.prefix), &rules);
    }

    /// Ends a [`Segment::partition`].
    pub fn heal(&self) {
        sh(&[
            "ip",
            "netns",
            "exec",
            &format!("{}-br", self.prefix),
            "nft",
            "delete",
            "table",
            "bridge",
            "split",
        ]);
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

/// Loads nftables `rules` in namespace `ns`.
pub fn nft(ns: &str, rules: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft in {ns}: {}\n{rules}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process: SIGTERM then SIGKILL on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }

    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// SIGTERM and wait for exit (up to 5 s).
    pub fn term(&mut self) {
        let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.term();
    }
}

/// A `keelson-agent vrrp` in a namespace; `status` is the last status line it printed.
pub struct Agent {
    pub proc: Proc,
    pub status: Arc<Mutex<serde_json::Value>>,
}

impl Agent {
    /// The status of instance `name`.
    pub fn instance(&self, name: &str) -> serde_json::Value {
        self.status.lock().unwrap()[name].clone()
    }
}

/// The base of the test cluster.json (instances set by the test).
pub fn cluster_json(instances: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "name": "kvr",
        "baseDomain": "example.com",
        "machineNetworks": ["10.0.0.0/8"],
        "apiVips": [],
        "ingressVips": [],
        "vrrp": {"instances": instances},
        "api": {
            "frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
            "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 2,
            "connectTimeoutMs": 1000, "idleTimeoutSecs": 60, "maxConnections": 1000
        },
        "dns": {"port": 53, "ttl": 60, "manageResolvConf": false},
        "ignition": {"tlsPort": 22623, "plainPort": 22624, "allowedNetworks": [], "spec": "3.2.0"},
        "members": {"transport": "mdns", "renewIntervalSecs": 2, "expirySecs": 6}
    })
}

/// One instance of cluster.json with the test's defaults (v3 multicast, 100 ms adverts,
/// priorities bootstrap 70 / master 40 / worker 20).
pub fn instance(name: &str, vip: &str, vrid: u8) -> serde_json::Value {
    serde_json::json!({
        "name": name, "vip": vip, "vrid": vrid, "version": "3", "advertIntervalMs": 100,
        "transport": "multicast", "preempt": true, "garpRefreshSecs": 60,
        "priorities": {"bootstrap": 70, "master": 40, "worker": 20}
    })
}

/// Starts `keelson-agent vrrp` in node `i`'s namespace with `role`.
pub fn start_agent(
    seg: &Segment,
    dir: &Path,
    cluster: &serde_json::Value,
    i: usize,
    role: &str,
) -> Agent {
    let cpath = dir.join(format!("cluster-{i}.json"));
    std::fs::write(&cpath, cluster.to_string()).unwrap();
    let npath = dir.join(format!("node-{i}.json"));
    std::fs::write(
        &npath,
        serde_json::json!({
            "name": format!("node{i}"), "role": role, "interface": "eth0",
            "addresses": [seg.v4(i), format!("{}/64", seg.v6(i))]
        })
        .to_string(),
    )
    .unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &seg.nodes[i]])
        .arg(env!("CARGO_BIN_EXE_keelson-agent"))
        .args(["vrrp", "--cluster"])
        .arg(&cpath)
        .arg("--node")
        .arg(&npath)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let status = Arc::new(Mutex::new(serde_json::Value::Null));
    let out = child.stdout.take().unwrap();
    let s = status.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                *s.lock().unwrap() = v;
            }
        }
    });
    Agent {
        proc: Proc(child),
        status,
    }
}

/// Starts keepalived (VRRP only) in node `i`'s namespace with config `conf`.
pub fn start_keepalived(seg: &Segment, dir: &Path, i: usize, conf: &str) -> Proc {
    let cpath: PathBuf = dir.join(format!("keepalived-{i}.conf"));
    std::fs::write(&cpath, conf).unwrap();
    let pid = |n: &str| dir.join(format!("{n}-{i}.pid"));
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &seg.nodes[i],
            "keepalived",
            "-n",
            "-l",
            "-P",
            "-f",
        ])
        .arg(&cpath)
        .arg("-p")
        .arg(pid("ka"))
        .arg("-r")
        .arg(pid("vrrp"))
        .arg("-c")
        .arg(pid("checkers"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Proc(child)
}

/// Master_Down_Interval for an interval (ms) and a backup priority, as RFC 5798 §6.1.
pub fn master_down(interval_ms: u64, prio: u64) -> Duration {
    Duration::from_micros(3 * interval_ms * 1000 + (256 - prio) * interval_ms * 1000 / 256)
}

/// The files `keelson-agent run` nodes of one test cluster share, as `keelson build` writes
/// them: `cluster.json` naming the membership key (member records authenticated), and
/// `tls/` with the CA, the server pair and that key. Each node's node.json, log, status
/// socket and state directory sit beside them, by node index.
pub struct RunCluster {
    pub dir: tempfile::TempDir,
    pub cluster: PathBuf,
    pub tls: PathBuf,
    pub pki: keelson_cluster::pki::Pki,
}

/// One `keelson-agent run` process and its log.
pub struct RunNode {
    pub proc: Proc,
    pub log: PathBuf,
}

impl RunNode {
    /// Whether it printed its ready line (every service up).
    pub fn is_ready(&self) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains("keelson-agent ready:")
    }
}

impl RunCluster {
    pub fn new(mut cluster: serde_json::Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config =
            keelson_cluster::ClusterConfig::from_json(cluster.to_string().as_bytes()).unwrap();
        let tls = dir.path().join("tls");
        let pki = keelson_cluster::pki::load_or_create(&tls, &config, None).unwrap();
        pki.write(&tls).unwrap();
        cluster["members"]["keyId"] = pki.membership_key_id().unwrap().into();
        let cpath = dir.path().join("cluster.json");
        std::fs::write(&cpath, cluster.to_string()).unwrap();
        RunCluster {
            dir,
            cluster: cpath,
            tls,
            pki,
        }
    }

    pub fn state_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("state-{i}"))
    }

    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("status-{i}.sock"))
    }

    /// Starts `keelson-agent run --only <services>` as node `i` (`name`, `role`, IPv4
    /// `address` on `eth0`) in namespace `ns`, its log in the cluster's directory.
    pub fn start(
        &self,
        ns: &str,
        i: usize,
        (name, role, address): (&str, &str, &str),
        services: &str,
    ) -> RunNode {
        let npath = self.dir.path().join(format!("node-{i}.json"));
        std::fs::write(
            &npath,
            serde_json::json!({
                "name": name, "role": role, "interface": "eth0", "addresses": [address]
            })
            .to_string(),
        )
        .unwrap();
        let log = self.dir.path().join(format!("node-{i}.log"));
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                env!("CARGO_BIN_EXE_keelson-agent"),
                "run",
            ])
            .arg("--cluster")
            .arg(&self.cluster)
            .arg("--node")
            .arg(&npath)
            .args(["--only", services])
            .arg("--tls-dir")
            .arg(&self.tls)
            .arg("--state-dir")
            .arg(self.state_dir(i))
            .arg("--status-socket")
            .arg(self.socket(i))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        RunNode {
            proc: Proc(child),
            log,
        }
    }

    /// `keelson-agent status --json` of node `i`.
    pub fn status(&self, i: usize) -> serde_json::Value {
        status_at(&self.socket(i))
    }
}

/// `keelson-agent status --json` from the agent serving `socket` (null when none answers).
pub fn status_at(socket: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_keelson-agent"))
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// The member names in a status document.
pub fn member_names(status: &serde_json::Value) -> Vec<String> {
    status["members"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `f` on a thread inside network namespace `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}
