//! `keelson-agent` processes as the tests start them, in the namespaces of a [`Segment`]:
//! VRRP-only agents (`keelson-agent vrrp`), whole nodes (`keelson-agent run`) with the
//! files `keelson build` writes, and keepalived beside them. The agent's path is the
//! caller's `env!("CARGO_BIN_EXE_keelson-agent")` (only the agent's own tests have it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cmd::{JsonLines, Proc, spawn_json_lines};
use crate::segment::Segment;

/// A `keelson-agent vrrp` in a namespace; `status` holds the last status line it printed.
#[derive(Debug)]
pub struct VrrpAgent {
    /// The process.
    pub proc: Proc,
    /// Its status lines.
    pub status: JsonLines,
}

impl VrrpAgent {
    /// The status of instance `name`.
    pub fn instance(&self, name: &str) -> serde_json::Value {
        self.status.latest()[name].clone()
    }
}

/// A test cluster.json around `instances` (cluster `kvr`, machine network 10.0.0.0/8, no
/// VIPs, mDNS members with 2 s renewals).
pub fn vrrp_cluster_json(instances: serde_json::Value) -> serde_json::Value {
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

/// One VRRP instance with the tests' defaults: v3 multicast, 100 ms adverts, preemption,
/// priorities bootstrap 70 / master 40 / worker 20.
pub fn vrrp_instance(name: &str, vip: &str, vrid: u8) -> serde_json::Value {
    serde_json::json!({
        "name": name, "vip": vip, "vrid": vrid, "version": "3", "advertIntervalMs": 100,
        "transport": "multicast", "preempt": true, "garpRefreshSecs": 60,
        "priorities": {"bootstrap": 70, "master": 40, "worker": 20}
    })
}

/// Starts `agent vrrp` as node `i` of `seg` (`node<i>`, `role`, both of its addresses on
/// `eth0`), its files in `dir`.
pub fn start_vrrp_agent(
    agent: &str,
    seg: &Segment,
    dir: &Path,
    cluster: &serde_json::Value,
    i: usize,
    role: &str,
) -> VrrpAgent {
    let cpath = dir.join(format!("cluster-{i}.json"));
    std::fs::write(&cpath, cluster.to_string()).unwrap();
    let npath = dir.join(format!("node-{i}.json"));
    let node = serde_json::json!({
        "name": format!("node{i}"), "role": role, "interface": "eth0",
        "addresses": [seg.v4(i), format!("{}/64", seg.v6(i))]
    });
    std::fs::write(&npath, node.to_string()).unwrap();
    let (proc, status) = spawn_json_lines(
        Command::new("ip")
            .args(["netns", "exec", &seg.nodes[i], agent, "vrrp", "--cluster"])
            .arg(&cpath)
            .arg("--node")
            .arg(&npath)
            .env("RUST_LOG", "info")
            .stderr(Stdio::inherit()),
    );
    VrrpAgent { proc, status }
}

/// Starts keepalived (VRRP only, in the foreground) as node `i` of `seg` with config
/// `conf`; its files in `dir`.
pub fn start_keepalived(seg: &Segment, dir: &Path, i: usize, conf: &str) -> Proc {
    let cpath = dir.join(format!("keepalived-{i}.conf"));
    std::fs::write(&cpath, conf).unwrap();
    let pid = |n: &str| dir.join(format!("{n}-{i}.pid"));
    Proc::spawn(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &seg.nodes[i],
                "keepalived",
                "-n",
                "-l",
                "-P",
            ])
            .arg("-f")
            .arg(&cpath)
            .arg("-p")
            .arg(pid("ka"))
            .arg("-r")
            .arg(pid("vrrp"))
            .arg("-c")
            .arg(pid("checkers"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )
}

/// Master_Down_Interval (RFC 5798 §6.1); the timing bounds live in [`crate::timing`].
pub use crate::timing::master_down;

/// `keelson build`'s cluster.json for `examples/install-config.yaml` (unicast VRRP and
/// members, its defaults, checked), with the timers of a test: `advert_ms` on every VRRP
/// instance, members renewed every `renew_s` and expired after `expiry_s`.
pub fn example_cluster_json(advert_ms: u64, renew_s: u64, expiry_s: u64) -> serde_json::Value {
    let text = include_str!("../../examples/install-config.yaml");
    let ic = keelson_cluster::install_config::InstallConfig::parse(text).unwrap();
    let mut c = serde_json::to_value(ic.cluster_config()).unwrap();
    assert_eq!(c["members"]["transport"], "unicast", "the default: {c}");
    for inst in c["vrrp"]["instances"].as_array_mut().unwrap() {
        assert_eq!(inst["transport"], "unicast", "the default: {inst}");
        inst["advertIntervalMs"] = advert_ms.into();
    }
    c["members"]["renewIntervalSecs"] = renew_s.into();
    c["members"]["expirySecs"] = expiry_s.into();
    c
}

/// The files `keelson-agent run` nodes of one test cluster share, as `keelson build` writes
/// them: `cluster.json` naming the membership key (member records authenticated), and
/// `tls/` with the CA, the server pair and that key. Each node's node.json, log, status
/// socket and state directory sit beside them, by node index.
#[derive(Debug)]
pub struct RunCluster {
    /// The directory holding everything.
    pub dir: tempfile::TempDir,
    /// cluster.json.
    pub cluster: PathBuf,
    /// tls/.
    pub tls: PathBuf,
    /// What tls/ holds.
    pub pki: keelson_cluster::pki::Pki,
    agent: String,
}

/// One `keelson-agent run` process and its log.
#[derive(Debug)]
pub struct RunNode {
    /// The process.
    pub proc: Proc,
    /// Its stderr.
    pub log: PathBuf,
    /// The binary it runs (its `status` reads the node's socket).
    pub agent: String,
}

impl RunNode {
    /// Whether it printed its ready line (every service up). Panics, with its log's tail,
    /// when it has ended: a node that died will not get ready.
    pub fn is_ready(&self) -> bool {
        self.assert_alive();
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains("keelson-agent ready:")
    }

    /// How it ended, or `None` while it runs ([`crate::cmd::exited`]).
    pub fn exited(&self) -> Option<String> {
        crate::cmd::exited(self.proc.pid())
    }

    /// Panics, naming how it ended and with its log's tail, unless it runs.
    pub fn assert_alive(&self) {
        if let Some(how) = self.exited() {
            panic!(
                "keelson-agent run ({}) {how}; its log ends:\n{}",
                self.log.display(),
                self.log_tail(30)
            );
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl RunCluster {
    /// Writes `cluster` (with the membership key's ID added) and a fresh tls/ for the
    /// nodes `agent` (the keelson-agent binary) will run.
    pub fn new(agent: &str, cluster: serde_json::Value) -> Self {
        Self::create(agent, cluster, None)
    }

    /// Writes `cluster` and a copy of the `tls/` another `keelson build` wrote (an older
    /// version's: the files the nodes of a rolling upgrade keep), read by this version.
    pub fn from_build(agent: &str, cluster: serde_json::Value, build_tls: &Path) -> Self {
        Self::create(agent, cluster, Some(build_tls))
    }

    fn create(agent: &str, mut cluster: serde_json::Value, build_tls: Option<&Path>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = keelson_cluster::ClusterConfig::from_json(cluster.to_string().as_bytes())
            .expect("the test's cluster.json");
        let tls = dir.path().join("tls");
        if let Some(from) = build_tls {
            std::fs::create_dir(&tls).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), tls.join(entry.file_name())).unwrap();
            }
        }
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
            agent: agent.to_owned(),
        }
    }

    /// Node `i`'s state directory.
    pub fn state_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("state-{i}"))
    }

    /// Node `i`'s status socket.
    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("status-{i}.sock"))
    }

    /// Starts `keelson-agent run --only <services>` as node `i` (`name`, `role`, IPv4
    /// `address` on `eth0`) in namespace `ns`, its log in the cluster's directory.
    pub fn start(&self, ns: &str, i: usize, node: (&str, &str, &str), services: &str) -> RunNode {
        self.start_with(ns, i, node, services, (&self.cluster, &self.tls))
    }

    /// [`RunCluster::start`] with this node's own `cluster.json` and TLS directory (a
    /// node of a key rotation, whose files differ from the others' for a while).
    pub fn start_with(
        &self,
        ns: &str,
        i: usize,
        node: (&str, &str, &str),
        services: &str,
        files: (&Path, &Path),
    ) -> RunNode {
        self.start_as(&self.agent, ns, i, node, services, files)
    }

    /// [`RunCluster::start_with`] running the binary `agent` instead of the cluster's (a
    /// node of a rolling upgrade).
    pub fn start_as(
        &self,
        agent: &str,
        ns: &str,
        i: usize,
        (name, role, address): (&str, &str, &str),
        services: &str,
        (cluster, tls): (&Path, &Path),
    ) -> RunNode {
        let npath = self.dir.path().join(format!("node-{i}.json"));
        let node = serde_json::json!({
            "name": name, "role": role, "interface": "eth0", "addresses": [address]
        });
        std::fs::write(&npath, node.to_string()).unwrap();
        let log = self.dir.path().join(format!("node-{i}.log"));
        let proc = Proc::spawn(
            Command::new("ip")
                .args(["netns", "exec", ns, agent, "run"])
                .arg("--cluster")
                .arg(cluster)
                .arg("--node")
                .arg(&npath)
                .args(["--only", services])
                .arg("--tls-dir")
                .arg(tls)
                .arg("--state-dir")
                .arg(self.state_dir(i))
                .arg("--status-socket")
                .arg(self.socket(i))
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        RunNode {
            proc,
            log,
            agent: agent.to_owned(),
        }
    }

    /// `keelson-agent status --json` of node `i`; panics when it does not answer
    /// ([`status_at`]).
    pub fn status(&self, i: usize) -> serde_json::Value {
        status_at(&self.agent, &self.socket(i))
    }
}

/// `keelson-agent status --json` from the agent serving `socket`. Panics naming the socket
/// and the error when no agent answers there or its answer is not a JSON document: a
/// comparison of two statuses must never compare two failures.
pub fn status_at(agent: &str, socket: &Path) -> serde_json::Value {
    try_status_at(agent, socket).unwrap_or_else(|e| panic!("{e}"))
}

/// [`status_at`] as a `Result`: the error names the socket, the exit status and what the
/// command printed.
pub fn try_status_at(agent: &str, socket: &Path) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new(agent);
    cmd.args(["status", "--json", "--socket"]).arg(socket);
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", crate::cmd::describe(&cmd)))?;
    let failed = |why: String| {
        format!(
            "{} {why}: {}{}",
            crate::cmd::describe(&cmd),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )
    };
    if !out.status.success() {
        return Err(failed(format!("failed ({})", out.status)));
    }
    match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        Ok(doc) if doc.is_object() => Ok(doc),
        Ok(_) => Err(failed("printed no JSON object".into())),
        Err(e) => Err(failed(format!("printed no JSON ({e})"))),
    }
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

/// A test cluster of `keelson-agent run` nodes on a [`Segment`]: node `i` runs in namespace
/// `seg.nodes[i]` with the segment's IPv4 address, under its name and role, the files in a
/// [`RunCluster`]. Nodes are started, stopped (SIGTERM) and killed (SIGKILL) by index; a
/// failed wait prints every node's log tail.
#[derive(Debug)]
pub struct RunNet {
    /// The segment the nodes are on.
    pub seg: Segment,
    /// Their files.
    pub files: RunCluster,
    /// The running nodes, by index.
    pub nodes: Vec<Option<RunNode>>,
    names: Vec<(String, String)>,
    services: String,
    /// Node files other than the shared ones: `cluster.json` and TLS directory, by index.
    own_files: Vec<Option<(PathBuf, PathBuf)>>,
    /// Node binaries other than the cluster's, by index.
    own_agent: Vec<Option<String>>,
}

impl RunNet {
    /// Nodes `(name, role)` on `seg` (one namespace each, in order), running `services`
    /// (`--only`) of `agent` with `cluster` ([`RunCluster::new`]); none started yet.
    pub fn new(
        agent: &str,
        seg: Segment,
        cluster: serde_json::Value,
        nodes: &[(&str, &str)],
        services: &str,
    ) -> Self {
        Self::with_files(seg, RunCluster::new(agent, cluster), nodes, services)
    }

    /// [`RunNet::new`] with the cluster's files already written ([`RunCluster::from_build`]).
    pub fn with_files(
        seg: Segment,
        files: RunCluster,
        nodes: &[(&str, &str)],
        services: &str,
    ) -> Self {
        assert_eq!(seg.nodes.len(), nodes.len(), "one namespace a node");
        RunNet {
            seg,
            files,
            nodes: nodes.iter().map(|_| None).collect(),
            names: nodes
                .iter()
                .map(|(n, r)| (n.to_string(), r.to_string()))
                .collect(),
            services: services.to_owned(),
            own_files: nodes.iter().map(|_| None).collect(),
            own_agent: nodes.iter().map(|_| None).collect(),
        }
    }

    /// From its next start on, node `i` runs with its own `cluster` and `tls` directory
    /// instead of the shared ones.
    pub fn set_files(&mut self, i: usize, cluster: PathBuf, tls: PathBuf) {
        self.own_files[i] = Some((cluster, tls));
    }

    /// From its next start on, node `i` runs the binary `agent` instead of the cluster's
    /// (a rolling upgrade: version N and N+1 side by side).
    pub fn set_agent(&mut self, i: usize, agent: &str) {
        self.own_agent[i] = Some(agent.to_owned());
    }

    /// Node `i`'s name.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i].0
    }

    /// Starts node `i`.
    pub fn start(&mut self, i: usize) {
        let (name, role) = &self.names[i];
        let address = self.seg.v4(i);
        let files = match &self.own_files[i] {
            Some((c, t)) => (c.as_path(), t.as_path()),
            None => (self.files.cluster.as_path(), self.files.tls.as_path()),
        };
        let agent = self.own_agent[i].as_deref().unwrap_or(&self.files.agent);
        let node = self.files.start_as(
            agent,
            &self.seg.nodes[i],
            i,
            (name, role, &address),
            &self.services,
            files,
        );
        self.nodes[i] = Some(node);
    }

    /// SIGTERM (an orderly stop: priority 0, VIP removed, goodbyes), and waits for it.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut n) = self.nodes[i].take() {
            n.proc.term();
        }
    }

    /// SIGKILL: the node just dies (its VIP, if any, stays on its interface).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut n) = self.nodes[i].take() {
            n.proc.kill9();
        }
    }

    /// Deletes node `i`'s state directory (what it remembered).
    pub fn forget(&self, i: usize) {
        let _ = std::fs::remove_dir_all(self.files.state_dir(i));
    }

    /// The indices of the running nodes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .collect()
    }

    /// Whether node `i` runs and printed its ready line (every service up).
    pub fn is_ready(&self, i: usize) -> bool {
        self.nodes[i].as_ref().is_some_and(RunNode::is_ready)
    }

    /// Waits until each of `nodes` is ready, up to 60 s in all; the time it took.
    pub fn wait_ready(&self, nodes: &[usize]) -> Duration {
        let t = std::time::Instant::now();
        for &i in nodes {
            assert!(self.nodes[i].is_some(), "{} is not running", self.name(i));
            self.wait(
                &format!("{} ready", self.name(i)),
                Duration::from_secs(60),
                || self.is_ready(i),
            );
        }
        t.elapsed()
    }

    /// [`crate::wait_for`], printing every node's log tail when it times out.
    pub fn wait(&self, what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
        let t = std::time::Instant::now();
        while !cond() {
            if t.elapsed() > limit {
                self.dump();
                panic!("{what}: not within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        t.elapsed()
    }

    /// `keelson-agent status --json` of node `i`. Panics when the node is not running,
    /// has died (naming how, with its log's tail) or does not answer.
    pub fn status(&self, i: usize) -> serde_json::Value {
        let node = self.nodes[i]
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running: no status to read", self.name(i)));
        node.assert_alive();
        // The node's own binary reads its socket, as on the node itself.
        status_at(&node.agent, &self.files.socket(i))
    }

    /// The member names node `i` lists.
    pub fn member_names(&self, i: usize) -> Vec<String> {
        member_names(&self.status(i))
    }

    /// Prints the last 30 lines of every running node's log (on failure), and how each
    /// that has died ended.
    pub fn dump(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(n) = n {
                eprintln!(
                    "---- {} ({}{})\n{}",
                    self.name(i),
                    n.log.display(),
                    n.exited().map(|how| format!("; {how}")).unwrap_or_default(),
                    n.log_tail(30)
                );
            }
        }
    }
}
