//! A two-rack leaf-spine fabric in network namespaces, for the BGP VIP test and
//! `bench/bgp_failover.sh` (docs/bgp.md).
//!
//! ```text
//!                 spine (AS 65000, the client sits here)
//!                /                    \
//!   ToR A (AS 65001)                 ToR B (AS 65002)
//!    10.71.1.0/24, fd71:1::/64        10.71.2.0/24, fd71:2::/64
//!     |          |                      |      |
//!    m0         m1                     m2     w2   masters (AS 64512), a spare host
//! ```
//!
//! The routers run a real routing daemon (BIRD 2 or FRR) with BGP and BFD (300 ms x 3),
//! hash ECMP on the 5-tuple (`fib_multipath_hash_policy=1`, as fabrics do: with one client
//! address an L3 hash would pin every connection to one path) and install every equal path.
//! Each master runs `keelson-agent run --only proxy,bgp` (which starts BIRD itself, or
//! writes an FRR configuration that the harness loads into FRR daemons it starts beside
//! it, as on RHCOS) and `kube-standin --plain` as its apiserver on its own addresses. Each
//! master's proxy forwards to its own apiserver only, so an answer names the master the
//! fabric chose, and an outage measured here is the VIP's, not the proxy's backend
//! failover (that one is `bench/proxy_vs_haproxy.sh`'s).
//!
//! Every namespace, interface and address here is the harness's own; nothing reaches
//! another network. Namespaces are named `kbg-*`.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

mod prober;

pub use prober::{Answer, Prober, count_by_node, get_version};

/// The API VIPs the masters announce.
pub const VIP4: &str = "10.71.255.5";
/// The IPv6 API VIP.
pub const VIP6: &str = "fd71:ff::5";
/// The port the proxies serve the VIPs on.
pub const VIP_PORT: u16 = 6443;
/// The spine namespace (the client sits here).
pub const SPINE: &str = "kbg-sp";
/// BFD timers of every session, as keelson's default.
pub const BFD_MS: u32 = 300;

/// Which routing daemon the fabric runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// BIRD 2 (the masters' is started by the agent).
    Bird,
    /// FRR (the masters' is started by the harness from the configuration the agent wrote).
    Frr,
}

impl Daemon {
    /// Its name in `cluster.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Daemon::Bird => "bird",
            Daemon::Frr => "frr",
        }
    }
}

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

struct Router {
    ns: &'static str,
    asn: u32,
    router_id: &'static str,
    /// (local v4, peer v4, local v6, peer v6, peer asn, name)
    peers: Vec<(String, String, String, String, u32, String)>,
}

/// The fabric; everything is removed on drop.
#[derive(Debug)]
pub struct Fabric {
    /// The daemon.
    pub daemon: Daemon,
    /// The masters.
    pub masters: Vec<Master>,
    work: tempfile::TempDir,
    agent: PathBuf,
    standin: PathBuf,
    children: Mutex<Vec<(String, Child)>>,
}

/// Runs `args[0]` with the rest as its arguments; its stdout, or an error naming the
/// command and its stderr when it fails.
fn run_ok(args: &[&str]) -> Result<String> {
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

fn ip(ns: &str, args: &[&str]) -> Result<String> {
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

fn remove_namespaces() {
    for ns in NAMESPACES {
        kill_namespace(ns);
    }
    for ns in NAMESPACES {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        let _ = std::fs::remove_dir_all(format!("/var/run/frr/{ns}"));
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{ns}"));
    }
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
    /// Builds the namespaces, links, addresses and static routes, and starts the routers'
    /// daemons. The masters are started with [`Fabric::start_master`].
    pub fn build(daemon: Daemon, agent: &Path, standin: &Path) -> Result<Fabric> {
        remove_namespaces();
        let masters: Vec<Master> = [(0, 10), (0, 11), (1, 10)]
            .iter()
            .enumerate()
            .map(|(i, (rack, host))| Master {
                name: format!("m{i}"),
                ns: format!("kbg-m{i}"),
                rack: *rack,
                v4: format!("10.71.{}.{host}", rack + 1),
                v6: format!("fd71:{}::{host}", rack + 1),
                tor_port: format!("t-m{i}"),
            })
            .collect();
        let fabric = Fabric {
            daemon,
            masters,
            work: tempfile::Builder::new().prefix("kbg-").tempdir()?,
            agent: agent.to_path_buf(),
            standin: standin.to_path_buf(),
            children: Mutex::new(Vec::new()),
        };
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
        for r in fabric.routers() {
            fabric.start_router(&r)?;
        }
        Ok(fabric)
    }

    /// The ToR namespace of `rack`.
    pub fn tor_ns(&self, rack: usize) -> &'static str {
        if rack == 0 { "kbg-ta" } else { "kbg-tb" }
    }

    fn routers(&self) -> Vec<Router> {
        let mut spine = Router {
            ns: SPINE,
            asn: 65000,
            router_id: "10.71.10.1",
            peers: vec![],
        };
        let mut tors = Vec::new();
        for (rack, (ns, asn)) in [("kbg-ta", 65001), ("kbg-tb", 65002)]
            .into_iter()
            .enumerate()
        {
            let n = rack + 1;
            spine.peers.push((
                format!("10.71.{n}0.1"),
                format!("10.71.{n}0.2"),
                format!("fd71:{n}0::1"),
                format!("fd71:{n}0::2"),
                asn,
                format!("tor{n}"),
            ));
            let mut tor = Router {
                ns,
                asn,
                router_id: if rack == 0 {
                    "10.71.10.2"
                } else {
                    "10.71.20.2"
                },
                peers: vec![(
                    format!("10.71.{n}0.2"),
                    format!("10.71.{n}0.1"),
                    format!("fd71:{n}0::2"),
                    format!("fd71:{n}0::1"),
                    65000,
                    "spine".into(),
                )],
            };
            for m in self.masters.iter().filter(|m| m.rack == rack) {
                tor.peers.push((
                    format!("10.71.{n}.1"),
                    m.v4.clone(),
                    format!("fd71:{n}::1"),
                    m.v6.clone(),
                    64512,
                    m.name.clone(),
                ));
            }
            tors.push(tor);
        }
        let mut all = vec![spine];
        all.extend(tors);
        all
    }

    fn bird_router_conf(r: &Router) -> String {
        let mut s = format!(
            "router id {};\nlog stderr {{ info, remote, warning, error, auth, fatal, bug }};\n\
             protocol device {{ }}\n\
             protocol kernel {{ merge paths on; ipv4 {{ import none; export all; }}; }}\n\
             protocol kernel {{ merge paths on; ipv6 {{ import none; export all; }}; }}\n\
             protocol bfd {{ interface \"*\" {{ min rx interval {BFD_MS} ms; min tx interval {BFD_MS} ms; multiplier 3; }}; }}\n\
             template bgp fabric {{ direct; bfd on; hold time 9; keepalive time 3; connect retry time 5; error wait time 1, 10; }}\n",
            r.router_id
        );
        for (l4, p4, l6, p6, asn, name) in &r.peers {
            s.push_str(&format!(
                "protocol bgp {name}_4 from fabric {{ local {l4} as {me}; neighbor {p4} as {asn}; ipv4 {{ import all; export all; }}; }}\n\
                 protocol bgp {name}_6 from fabric {{ local {l6} as {me}; neighbor {p6} as {asn}; ipv6 {{ import all; export all; }}; }}\n",
                me = r.asn
            ));
        }
        s
    }

    fn frr_router_conf(r: &Router) -> String {
        // IPv6 routes via the peer's global address, as BIRD installs them (FRR prefers the
        // link-local next hop a peer sends beside it).
        let mut s = format!(
            "frr defaults datacenter\nhostname {ns}\nlog stdout informational\n!\n\
             bfd\n profile fabric\n  detect-multiplier 3\n  receive-interval {BFD_MS}\n  transmit-interval {BFD_MS}\n exit\nexit\n!\n\
             route-map prefer-global permit 10\n set ipv6 next-hop prefer-global\nexit\n!\n\
             router bgp {asn}\n bgp router-id {rid}\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax\n",
            ns = r.ns,
            asn = r.asn,
            rid = r.router_id
        );
        for (_, p4, _, p6, asn, _) in &r.peers {
            for p in [p4, p6] {
                s.push_str(&format!(
                    " neighbor {p} remote-as {asn}\n neighbor {p} timers 3 9\n neighbor {p} timers connect 5\n neighbor {p} bfd profile fabric\n"
                ));
            }
        }
        s.push_str(" address-family ipv4 unicast\n  maximum-paths 16\n");
        for (_, p4, ..) in &r.peers {
            s.push_str(&format!("  neighbor {p4} activate\n"));
        }
        s.push_str(" exit-address-family\n address-family ipv6 unicast\n  maximum-paths 16\n");
        for (_, _, _, p6, ..) in &r.peers {
            s.push_str(&format!(
                "  neighbor {p6} activate\n  neighbor {p6} route-map prefer-global in\n"
            ));
        }
        s.push_str(" exit-address-family\nexit\n!\n");
        s
    }

    fn spawn(&self, ns: &str, log: &str, program: &Path, args: &[&str]) -> Result<()> {
        let out = std::fs::File::create(self.work.path().join(log))?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} in {ns}", program.display()))?;
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ns.to_owned(), child));
        Ok(())
    }

    /// Starts FRR's zebra, bgpd and bfdd in `ns` (pathspace `ns`) and loads `conf` into
    /// them with vtysh.
    fn start_frr(&self, ns: &str, conf: &Path) -> Result<()> {
        let run = PathBuf::from(format!("/var/run/frr/{ns}"));
        let etc = PathBuf::from(format!("/etc/frr/{ns}"));
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run)?;
        std::fs::create_dir_all(&etc)?;
        std::fs::write(etc.join("vtysh.conf"), "")?;
        run_ok(&["chown", "-R", "frr:frr", &run.display().to_string()])?;
        // One after the other, each once the one before answers: bgpd registers its BFD
        // peers with bfdd through zebra, and FRR 8.4 loses registrations made before
        // that path is up (the sessions never appear).
        for (d, ready) in [
            ("zebra", "zserv.api"),
            ("bfdd", "bfdd.vty"),
            ("bgpd", "bgpd.vty"),
        ] {
            self.spawn(
                ns,
                &format!("{ns}-{d}.log"),
                Path::new(&format!("/usr/lib/frr/{d}")),
                &["-N", ns],
            )?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !run.join(ready).exists() {
                if Instant::now() > deadline {
                    bail!(
                        "FRR {d} in {ns} did not start (logs in {})",
                        self.work.path().display()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let out = Command::new("vtysh")
            .args(["-N", ns, "-f"])
            .arg(conf)
            .output()?;
        if !out.status.success() {
            bail!(
                "vtysh -N {ns} -f {}: {}{}",
                conf.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn start_router(&self, r: &Router) -> Result<()> {
        match self.daemon {
            Daemon::Bird => {
                let conf = self.work.path().join(format!("{}.bird.conf", r.ns));
                std::fs::write(&conf, Self::bird_router_conf(r))?;
                let sock = self.work.path().join(format!("{}.ctl", r.ns));
                self.spawn(
                    r.ns,
                    &format!("{}-bird.log", r.ns),
                    Path::new("bird"),
                    &[
                        "-f",
                        "-c",
                        &conf.display().to_string(),
                        "-s",
                        &sock.display().to_string(),
                    ],
                )
            }
            Daemon::Frr => {
                let conf = self.work.path().join(format!("{}.frr.conf", r.ns));
                std::fs::write(&conf, Self::frr_router_conf(r))?;
                self.start_frr(r.ns, &conf)
            }
        }
    }

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

    /// The next hops `ns` routes `vip` through (empty when it has no route).
    pub fn nexthops(&self, ns: &str, vip: &str) -> Vec<String> {
        let family = if vip.contains(':') { "-6" } else { "-4" };
        let Ok(text) = ip(ns, &[family, "route", "show", vip]) else {
            return vec![];
        };
        let mut hops: Vec<String> = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .map(|w| w[1].to_owned())
            .collect();
        hops.sort();
        hops.dedup();
        hops
    }

    /// Waits until `ns` routes `vip` through exactly `want` (sorted), up to `limit`.
    pub fn wait_nexthops(&self, ns: &str, vip: &str, want: &[&str], limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        loop {
            let now = self.nexthops(ns, vip);
            if now == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{ns}: {vip} via {now:?}, expected {want:?} within {limit:?} (logs in {})",
                    self.work.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The next hops of `vip` at the ToR of `rack` that are masters (their addresses).
    pub fn tor_nexthops(&self, rack: usize, vip: &str) -> Vec<String> {
        self.nexthops(self.tor_ns(rack), vip)
    }

    /// The spine's next hops for `vip` (ToR addresses).
    pub fn spine_nexthops(&self, vip: &str) -> Vec<String> {
        self.nexthops(SPINE, vip)
    }

    /// Whether the BFD session of router namespace `ns` with `peer` is up.
    pub fn bfd_up(&self, ns: &str, peer: &str) -> bool {
        let out = match self.daemon {
            Daemon::Bird => Command::new("birdc")
                .arg("-s")
                .arg(self.work.path().join(format!("{ns}.ctl")))
                .args(["show", "bfd", "sessions"])
                .output(),
            Daemon::Frr => Command::new("vtysh")
                .args(["-N", ns, "-c", "show bfd peers brief"])
                .output(),
        };
        let Ok(out) = out else { return false };
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.contains(&peer) && w.iter().any(|x| x.eq_ignore_ascii_case("up"))
        })
    }

    /// Waits until every ToR's BFD sessions with its masters are up (so a death is noticed
    /// by BFD, not by the BGP hold timer).
    pub fn wait_bfd(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        for m in &self.masters {
            let tor = self.tor_ns(m.rack);
            while !(self.bfd_up(tor, &m.v4) && self.bfd_up(tor, &m.v6)) {
                if Instant::now() > deadline {
                    bail!("{tor}: BFD with {} not up within {limit:?}", m.name);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Master `i`'s agent status document.
    pub fn status(&self, i: usize) -> Result<serde_json::Value> {
        let mut s = std::os::unix::net::UnixStream::connect(self.status_socket(i))?;
        let mut body = Vec::new();
        s.read_to_end(&mut body)?;
        Ok(serde_json::from_slice(&body)?)
    }

    /// Where the logs are.
    pub fn work_dir(&self) -> &Path {
        self.work.path()
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        remove_namespaces();
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for (_, c) in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var_os("KBG_KEEP_LOGS").is_some() {
            eprintln!("fabric logs kept in {}", self.work.path().display());
            self.work.disable_cleanup(true);
        }
    }
}

/// `addr:port` of a VIP.
pub fn vip_addr(vip: &str) -> SocketAddr {
    SocketAddr::new(vip.parse::<IpAddr>().expect("VIP literal"), VIP_PORT)
}
