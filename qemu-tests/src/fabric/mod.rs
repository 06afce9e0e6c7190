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
//!
//! - here: the [`Fabric`] itself (built, its processes, removed on drop) and its constants;
//! - `topology`: the namespaces, links, bridges, addresses and static routes;
//! - `routers`: the spine's and ToRs' BGP sessions, as BIRD or FRR configurations, and
//!   their daemons;
//! - `masters`: each master's configuration, agent and apiserver stand-ins, its death
//!   and its link's return;
//! - `observe`: the routes and BFD sessions as the routers see them;
//! - `prober`: the client on the spine that measures what reaches the VIP ([`Prober`]).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result};

mod masters;
mod observe;
mod prober;
mod routers;
mod topology;

pub use masters::{Master, find_agent};
pub use prober::{Answer, Prober, count_by_node, get_version};
use topology::remove_namespaces;
pub use topology::{NAMESPACES, RACK_B_SPARE, kill_namespace};

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
        topology::wire(&fabric)?;
        for r in fabric.routers() {
            fabric.start_router(&r)?;
        }
        Ok(fabric)
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
