//! The masters: each one's `cluster.json` and `node.json`, its agent
//! (`run --only proxy,bgp`) and apiserver stand-ins, killing it (link cut, processes
//! stopped) and bringing its link back, and its status document.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::topology::{ip, kill_namespace};
use super::{Daemon, Fabric, VIP_PORT, VIP4, VIP6};

/// One master of the fabric.
#[derive(Debug, Clone)]
pub struct Master {
    /// Node name (`m0`).
    pub name: String,
    /// Its namespace.
    pub ns: String,
    /// The rack (0: A, 1: B).
    pub rack: usize,
    /// IPv4 address.
    pub v4: String,
    /// IPv6 address.
    pub v6: String,
    /// The ToR-side end of its link.
    pub tor_port: String,
}

/// The static agent `make agent` builds (or `KEELSON_AGENT_BIN`), else the debug build.
pub fn find_agent() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::var_os("KEELSON_AGENT_BIN")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            root.join("target/x86_64-unknown-linux-gnu/release/keelson-agent"),
            root.join("target/debug/keelson-agent"),
        ])
        .find(|p| p.is_file())
}

impl Fabric {
    /// The run directory of master `i`'s agent (its BIRD/FRR configuration, BIRD's socket).
    pub fn run_dir(&self, i: usize) -> PathBuf {
        self.work
            .path()
            .join(format!("{}-run", self.masters[i].name))
    }

    /// Master `i`'s status socket.
    pub fn status_socket(&self, i: usize) -> PathBuf {
        self.work
            .path()
            .join(format!("{}-status.sock", self.masters[i].name))
    }

    /// Master `i`'s `cluster.json`: the fabric's BGP settings, the API VIPs in bgp mode
    /// (checks: the proxy has a healthy backend, the local apiserver answers), the proxy
    /// forwarding to this master's own apiserver.
    pub fn cluster_json(&self, i: usize) -> serde_json::Value {
        let m = &self.masters[i];
        let n = m.rack + 1;
        let checks = |url: String| {
            serde_json::json!([
                {"name": "api-proxy", "check": {"type": "proxyHealthyBackend"},
                 "intervalMs": 250, "rise": 1, "fall": 2, "weight": 50},
                {"name": "local-apiserver",
                 "check": {"type": "http", "url": url, "expectStatus": 200},
                 "intervalMs": 250, "rise": 2, "fall": 2, "weight": 10}
            ])
        };
        let instance = |name: &str, vip: &str, checks: serde_json::Value| {
            serde_json::json!({
                "name": name, "vip": vip, "vrid": 71, "version": "3", "advertIntervalMs": 1000,
                "transport": "multicast", "preempt": true, "garpRefreshSecs": 60,
                "priorities": {"bootstrap": 70, "master": 40}, "checks": checks
            })
        };
        let (daemon_kind, run) = match self.daemon {
            Daemon::Bird => ("bird", "agent"),
            Daemon::Frr => ("frr", "external"),
        };
        serde_json::json!({
            "version": 1, "name": "kbg", "baseDomain": "example.com",
            "machineNetworks": ["10.71.1.0/24", "10.71.2.0/24", "fd71:1::/64", "fd71:2::/64"],
            "apiVips": [VIP4, VIP6], "ingressVips": [],
            "vrrp": {"instances": [
                instance("api", VIP4, checks("http://${KEELSON_NODE_ADDRESS}:6443/readyz".into())),
                instance("api-v6", VIP6, checks("http://${KEELSON_NODE_ADDRESS6}:6443/readyz".into()))
            ]},
            "api": {"frontendPort": 9445, "vipPort": VIP_PORT, "backendPort": 6443, "monitorPort": 50936,
                    "staticBackends": [format!("{}:6443", m.v4), format!("[{}]:6443", m.v6)],
                    "check": "tcp", "checkIntervalMs": 250, "fall": 2, "rise": 1,
                    "connectTimeoutMs": 1000, "idleTimeoutSecs": 60, "maxConnections": 1000},
            "dns": {"port": 53, "ttl": 60, "manageResolvConf": false},
            "ignition": {"tlsPort": 22623, "plainPort": 22624, "allowedNetworks": [], "spec": "3.2.0"},
            "members": {"transport": "mdns", "renewIntervalSecs": 2, "expirySecs": 6},
            "bgp": {
                "vips": ["api", "api-v6"],
                "localAsn": 64512,
                "peers": [
                    {"address": "10.71.1.1", "asn": 65001},
                    {"address": "fd71:1::1", "asn": 65001},
                    {"address": "10.71.2.1", "asn": 65002},
                    {"address": "fd71:2::1", "asn": 65002}
                ],
                "communities": [format!("64512:{n}")],
                "daemon": {"kind": daemon_kind, "run": run,
                           "runDir": self.run_dir(i).display().to_string()}
            }
        })
    }

    /// Starts master `i`'s apiserver stand-ins (IPv4 and IPv6).
    pub fn start_apiserver(&self, i: usize) -> Result<()> {
        let m = &self.masters[i];
        for (fam, addr) in [
            ("4", format!("{}:6443", m.v4)),
            ("6", format!("[{}]:6443", m.v6)),
        ] {
            self.spawn(
                &m.ns,
                &format!("{}-apiserver{fam}.log", m.name),
                &self.standin.clone(),
                &["--plain", "--name", &m.name, "--listen", &addr],
            )?;
        }
        Ok(())
    }

    /// Stops master `i`'s apiserver stand-ins (the processes we started in its namespace
    /// that are the stand-in).
    pub fn stop_apiserver(&self, i: usize) {
        let ns = &self.masters[i].ns;
        let standin = self.standin.display().to_string();
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for (child_ns, child) in children.iter_mut() {
            if child_ns != ns {
                continue;
            }
            // `ip netns exec` execs the program: the child's command line is the stand-in.
            let cmdline =
                std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).starts_with(&standin) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Starts master `i`'s agent (`run --only proxy,bgp`); with FRR also FRR, once the agent
    /// wrote its configuration.
    pub fn start_agent(&self, i: usize) -> Result<()> {
        let m = &self.masters[i];
        let cluster = self.work.path().join(format!("{}-cluster.json", m.name));
        std::fs::write(&cluster, serde_json::to_vec_pretty(&self.cluster_json(i))?)?;
        let node = self.work.path().join(format!("{}-node.json", m.name));
        std::fs::write(
            &node,
            serde_json::to_vec(&serde_json::json!({
                "name": m.name, "role": "master", "interface": "eth0",
                "addresses": [format!("{}/24", m.v4), format!("{}/64", m.v6)]
            }))?,
        )?;
        let _ = std::fs::remove_dir_all(self.run_dir(i));
        self.spawn(
            &m.ns,
            &format!("{}-agent.log", m.name),
            &self.agent.clone(),
            &[
                "run",
                "--cluster",
                &cluster.display().to_string(),
                "--node",
                &node.display().to_string(),
                "--only",
                "proxy,bgp",
                "--status-socket",
                &self.status_socket(i).display().to_string(),
            ],
        )?;
        if self.daemon == Daemon::Frr {
            let conf = self.run_dir(i).join("frr.conf");
            let deadline = Instant::now() + Duration::from_secs(10);
            while !conf.exists() {
                if Instant::now() > deadline {
                    bail!("{}: the agent wrote no {}", m.name, conf.display());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            self.start_frr(&m.ns, &conf)?;
        }
        Ok(())
    }

    /// Starts master `i`: apiserver, agent (and daemon).
    pub fn start_master(&self, i: usize) -> Result<()> {
        self.start_apiserver(i)?;
        self.start_agent(i)
    }

    /// Kills master `i`: cuts its link at the ToR, then stops and kills every process in
    /// its namespace. Returns the moment of the cut.
    pub fn kill_master(&self, i: usize) -> Result<Instant> {
        let m = &self.masters[i];
        let t = Instant::now();
        ip(self.tor_ns(m.rack), &["link", "set", &m.tor_port, "down"])?;
        kill_namespace(&m.ns);
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        children.retain_mut(|(ns, c)| {
            if *ns == m.ns {
                let _ = c.wait();
                false
            } else {
                true
            }
        });
        // What a dead node leaves behind: its kernel state. A restarted agent must cope.
        Ok(t)
    }

    /// Reconnects master `i`'s link.
    pub fn restore_link(&self, i: usize) -> Result<()> {
        let m = &self.masters[i];
        ip(self.tor_ns(m.rack), &["link", "set", &m.tor_port, "up"]).map(|_| ())
    }

    /// Master `i`'s agent status document.
    pub fn status(&self, i: usize) -> Result<serde_json::Value> {
        let mut s = std::os::unix::net::UnixStream::connect(self.status_socket(i))?;
        let mut body = Vec::new();
        s.read_to_end(&mut body)?;
        Ok(serde_json::from_slice(&body)?)
    }
}
