//! `bgp-failover`: the client-seen outage when an API VIP holder dies, BGP anycast (this
//! repository's fabric, `keelson_qemu_tests::fabric`) against VRRP (`bench/vrrp_failover.sh`'s
//! two-node segment, keelson and keepalived), side by side in one run (the bar docs/bgp.md
//! sets: BGP at most 0.35 x keepalived). Run by `bench/bgp_failover.sh`.
//!
//! Every round, for each setup: a client opens a new connection to `VIP:6443` every 50 ms
//! (each with a 1 s limit, a `GET /version`), a holder dies — its link cut on the switch
//! side, then every process in its namespace stopped and killed — and the outage is the
//! time from the cut to the sending of the last request that failed.
//!
//! - BGP: the dying master is m2, alone in rack B: ToR B's BFD (300 ms x 3) must notice it
//!   and the spine must move everything to rack A. Also printed: each daemon's memory on a
//!   master.
//! - VRRP at OpenShift's settings: VRRPv3 multicast, 1 s adverts, both nodes priority 100
//!   (a master with its checks passing: base 40 + 50 + 10); whichever won the election
//!   dies, the other takes over at Master_Down = 3 s + skew 0.61 s and sends a gratuitous
//!   ARP. A stand-in apiserver listens on `*:6443` on both nodes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use keelson_qemu_tests::fabric::{self, Daemon, Fabric, Prober, SPINE, VIP4, vip_addr};
use keelson_qemu_tests::probe::outage;
use keelson_testkit::Segment;

const PERIOD: Duration = Duration::from_millis(50);
const TIMEOUT: Duration = Duration::from_secs(1);

/// Which setup a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Bgp(Daemon),
    Keelson,
    Keepalived,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Bgp(Daemon::Bird) => "bgp (BIRD)",
            Setup::Bgp(Daemon::Frr) => "bgp (FRR)",
            Setup::Keelson => "vrrp keelson",
            Setup::Keepalived => "vrrp keepalived",
        }
    }
}

/// Resident memory of the processes in `ns` whose name is one of `names`, KiB.
fn rss_kib(ns: &str, names: &[&str]) -> u64 {
    let out = Command::new("ip").args(["netns", "pids", ns]).output();
    let Ok(out) = out else { return 0 };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter(|st| {
            st.lines()
                .next()
                .and_then(|l| l.strip_prefix("Name:"))
                .is_some_and(|n| names.contains(&n.trim()))
        })
        .filter_map(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .sum()
}

/// One BGP round: returns (outage, daemon RSS on m0 in KiB).
fn bgp_round(daemon: Daemon, agent: &Path, standin: &Path) -> Result<(Duration, u64)> {
    let f = Fabric::build(daemon, agent, standin)?;
    for i in 0..3 {
        f.start_master(i)?;
    }
    f.wait_nexthops(
        SPINE,
        VIP4,
        &["10.71.10.2", "10.71.20.2"],
        Duration::from_secs(60),
    )?;
    f.wait_nexthops("kbg-tb", VIP4, &["10.71.2.10"], Duration::from_secs(60))?;
    f.wait_nexthops(
        "kbg-ta",
        VIP4,
        &["10.71.1.10", "10.71.1.11"],
        Duration::from_secs(60),
    )?;
    if let Some(secs) = std::env::var("KBG_PAUSE").ok().and_then(|s| s.parse().ok()) {
        eprintln!("fabric up; pausing {secs} s for a look (KBG_PAUSE)");
        std::thread::sleep(Duration::from_secs(secs));
    }
    f.wait_bfd(Duration::from_secs(30))?;
    let rss = match daemon {
        Daemon::Bird => rss_kib("kbg-m0", &["bird"]),
        Daemon::Frr => rss_kib("kbg-m0", &["zebra", "bgpd", "bfdd"]),
    };
    let p = Prober::start(SPINE, vip_addr(VIP4), PERIOD, TIMEOUT);
    std::thread::sleep(Duration::from_secs(2));
    let cut = f.kill_master(2)?;
    f.wait_nexthops(SPINE, VIP4, &["10.71.10.2"], Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(2));
    let answers = p.finish();
    let samples: Vec<_> = answers.iter().map(|a| a.sample).collect();
    let o = outage(&samples, cut);
    if o.failures_before > 0 {
        let t0 = answers[0].sample.sent;
        let when: Vec<String> = answers
            .iter()
            .filter(|a| !a.sample.ok && a.sample.done < cut)
            .map(|a| format!("{:?}", a.sample.sent - t0))
            .collect();
        bail!(
            "bgp ({}): {} requests failed before the cut (sent at {when:?} after the first; logs in {})",
            daemon.as_str(),
            o.failures_before,
            f.work_dir().display()
        );
    }
    Ok((o.last_failure.unwrap_or_default(), rss))
}

/// The VRRP segment of `bench/vrrp_failover.sh`: testkit's bridge segment with nodes A
/// (10.72.0.11, [`NODE_A`]) and B (10.72.0.10, [`NODE_B`]), client C ([`CLIENT`]), and
/// the programs started on it.
struct VrrpSegment {
    seg: Segment,
    children: Vec<Child>,
    work: tempfile::TempDir,
}

const VRRP_VIP: &str = "10.72.0.100";
/// Node A, the higher address (10.72.0.11): with equal priorities it wins the election.
const NODE_A: usize = 1;
/// Node B (10.72.0.10).
const NODE_B: usize = 0;
/// The client that probes the VIP.
const CLIENT: usize = 2;

impl VrrpSegment {
    fn build() -> Result<VrrpSegment> {
        Ok(VrrpSegment {
            seg: Segment::ipv4_only("kvb", 3, 72),
            children: Vec::new(),
            work: tempfile::Builder::new().prefix("kvb-").tempdir()?,
        })
    }

    fn spawn(&mut self, ns: &str, log: &str, program: &Path, args: &[&str]) -> Result<()> {
        let out = std::fs::File::create(self.work.path().join(log))?;
        self.children.push(
            Command::new("ip")
                .args(["netns", "exec", ns])
                .arg(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()?,
        );
        Ok(())
    }

    fn start(&mut self, setup: Setup, agent: &Path, standin: &Path) -> Result<()> {
        for (i, node) in [(NODE_A, "a"), (NODE_B, "b")] {
            let ns = self.seg.nodes[i].clone();
            let ns = ns.as_str();
            let addr = self.seg.ip4(i).to_string();
            self.spawn(
                ns,
                &format!("{node}-standin.log"),
                standin,
                &["--plain", "--name", node, "--listen", "0.0.0.0:6443"],
            )?;
            match setup {
                Setup::Keelson => {
                    let cluster = self.work.path().join(format!("{node}-cluster.json"));
                    std::fs::write(
                        &cluster,
                        serde_json::to_vec(&serde_json::json!({
                            "version": 1, "name": "kvb", "baseDomain": "example.com",
                            "machineNetworks": ["10.72.0.0/24"], "apiVips": [], "ingressVips": [],
                            "vrrp": {"instances": [{"name": "api", "vip": VRRP_VIP, "vrid": 72,
                                "version": "3", "advertIntervalMs": 1000, "transport": "multicast",
                                "preempt": true, "garpRefreshSecs": 60,
                                "priorities": {"master": 100}}]},
                            "api": {"frontendPort": 9445, "vipPort": 6443, "backendPort": 6443,
                                "monitorPort": 50936, "check": "tcp", "checkIntervalMs": 1000,
                                "fall": 3, "rise": 2, "connectTimeoutMs": 1000,
                                "idleTimeoutSecs": 60, "maxConnections": 1000},
                            "dns": {"port": 53, "ttl": 60, "manageResolvConf": false},
                            "ignition": {"tlsPort": 22623, "plainPort": 22624,
                                "allowedNetworks": [], "spec": "3.2.0"},
                            "members": {"transport": "mdns", "renewIntervalSecs": 2, "expirySecs": 6}
                        }))?,
                    )?;
                    let nodef = self.work.path().join(format!("{node}-node.json"));
                    std::fs::write(
                        &nodef,
                        format!(
                            r#"{{"name":"{node}","role":"master","interface":"eth0","addresses":["{addr}/24"]}}"#
                        ),
                    )?;
                    let (c, n) = (cluster.display().to_string(), nodef.display().to_string());
                    self.spawn(
                        ns,
                        &format!("{node}-vrrp.log"),
                        agent,
                        &["vrrp", "--cluster", &c, "--node", &n],
                    )?;
                }
                Setup::Keepalived => {
                    let conf = self.work.path().join(format!("{node}-keepalived.conf"));
                    std::fs::write(
                        &conf,
                        format!(
                            "global_defs {{\n  router_id {node}\n  vrrp_garp_master_delay 0\n}}\n\
                             vrrp_instance api {{\n  state BACKUP\n  interface eth0\n  version 3\n\
                             \x20 virtual_router_id 72\n  priority 100\n  advert_int 1\n\
                             \x20 virtual_ipaddress {{\n    {VRRP_VIP}/32 dev eth0\n  }}\n}}\n"
                        ),
                    )?;
                    let p = |f: &str| {
                        self.work
                            .path()
                            .join(format!("{node}-{f}.pid"))
                            .display()
                            .to_string()
                    };
                    let (c, a, b, k) = (conf.display().to_string(), p("ka"), p("vrrp"), p("chk"));
                    self.spawn(
                        ns,
                        &format!("{node}-keepalived.log"),
                        Path::new("keepalived"),
                        &["-n", "-P", "-f", &c, "-p", &a, "-r", &b, "-c", &k],
                    )?;
                }
                Setup::Bgp(_) => bail!("not a VRRP setup"),
            }
        }
        Ok(())
    }

    fn holds(&self, i: usize) -> bool {
        self.seg.holds(i, VRRP_VIP)
    }
}

impl Drop for VrrpSegment {
    fn drop(&mut self) {
        if std::env::var_os("KBG_KEEP_LOGS").is_some() {
            eprintln!("segment logs kept in {}", self.work.path().display());
            self.work.disable_cleanup(true);
        }
        for ns in &self.seg.nodes {
            fabric::kill_namespace(ns);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // `seg` deletes the namespaces when it drops, after this.
    }
}

fn vrrp_round(setup: Setup, agent: &Path, standin: &Path) -> Result<Duration> {
    let mut seg = VrrpSegment::build()?;
    seg.start(setup, agent, standin)?;
    // Whoever won the election holds the VIP (equal priorities: no preemption after).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (holder, backup) = loop {
        match (seg.holds(NODE_A), seg.holds(NODE_B)) {
            (true, false) => break (NODE_A, NODE_B),
            (false, true) => break (NODE_B, NODE_A),
            _ if Instant::now() > deadline => {
                bail!("{}: no single holder within 30 s", setup.label())
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let addr = std::net::SocketAddr::new(VRRP_VIP.parse()?, 6443);
    let p = Prober::start(&seg.seg.nodes[CLIENT], addr, PERIOD, TIMEOUT);
    // The backup hears a few adverts (it runs on the holder's Master_Down timer), as in
    // the VRRP bench.
    std::thread::sleep(Duration::from_secs(4));
    let cut = Instant::now();
    seg.seg.set_bridge_port(holder, false);
    fabric::kill_namespace(&seg.seg.nodes[holder]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seg.holds(backup) {
        if Instant::now() > deadline {
            bail!("{}: the backup never took over", setup.label());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_secs(2));
    let answers = p.finish();
    let samples: Vec<_> = answers.iter().map(|a| a.sample).collect();
    let o = outage(&samples, cut);
    if o.failures_before > 0 {
        bail!(
            "{}: {} requests failed before the cut",
            setup.label(),
            o.failures_before
        );
    }
    Ok(o.last_failure.unwrap_or_default())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> Result<()> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().context("runs: expected a number"))
        .transpose()?
        .unwrap_or(5);
    let daemons: Vec<Daemon> = match std::env::var("DAEMONS").as_deref() {
        Ok("bird") => vec![Daemon::Bird],
        Ok("frr") => vec![Daemon::Frr],
        Ok("none") => vec![],
        _ => vec![Daemon::Bird, Daemon::Frr],
    };
    let agent = fabric::find_agent().context("no keelson-agent: run `make agent`")?;
    let standin: PathBuf = std::env::var_os("KEELSON_STANDIN_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("kube-standin")))
        })
        .filter(|p| p.is_file())
        .context("no kube-standin next to this program (cargo build --bin kube-standin)")?;
    let mut setups: Vec<Setup> = daemons.into_iter().map(Setup::Bgp).collect();
    setups.extend([Setup::Keelson, Setup::Keepalived]);
    println!(
        "client-seen outage after the VIP holder dies (ms): new connection every {} ms, {} s limit each; runs={runs}",
        PERIOD.as_millis(),
        TIMEOUT.as_secs()
    );
    println!("agent: {}", agent.display());
    let mut results: Vec<(Setup, Vec<f64>, Vec<u64>)> = setups
        .iter()
        .map(|s| (*s, Vec::new(), Vec::new()))
        .collect();
    for run in 1..=runs {
        let mut line = format!("  run {run}:");
        for (setup, outages, rss) in results.iter_mut() {
            let ms = match *setup {
                Setup::Bgp(d) => {
                    let (o, r) = bgp_round(d, &agent, &standin)?;
                    rss.push(r);
                    o
                }
                s => vrrp_round(s, &agent, &standin)?,
            };
            let ms = ms.as_secs_f64() * 1000.0;
            outages.push(ms);
            line.push_str(&format!(" {} {ms:.0}", setup.label()));
        }
        println!("{line}");
    }
    let keepalived = results
        .iter()
        .find(|(s, ..)| *s == Setup::Keepalived)
        .map(|(_, o, _)| median(o))
        .unwrap_or(f64::NAN);
    for (setup, outages, rss) in &results {
        let m = median(outages);
        let mut line = format!(
            "{:<16} median {m:6.0} ms  (min {:.0}, max {:.0})  {:.2} x keepalived",
            setup.label(),
            outages.iter().copied().fold(f64::INFINITY, f64::min),
            outages.iter().copied().fold(0.0, f64::max),
            m / keepalived
        );
        if !rss.is_empty() {
            let mut r = rss.clone();
            r.sort_unstable();
            line.push_str(&format!("  daemon RSS on a master {} KiB", r[r.len() / 2]));
        }
        println!("{line}");
    }
    for (setup, outages, _) in &results {
        if let Setup::Bgp(_) = setup {
            let ratio = median(outages) / keepalived;
            println!(
                "bar (docs/bgp.md): {} outage <= 0.35 x keepalived: {:.2} -> {}",
                setup.label(),
                ratio,
                if ratio <= 0.35 { "met" } else { "NOT met" }
            );
        }
    }
    Ok(())
}
