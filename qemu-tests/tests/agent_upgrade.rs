//! The upgrade from the previous version, N -> N+1 (docs/operations.md, "Upgrading the
//! agent" and "Version skew: what N and N+1 may do to each other").
//!
//! Three masters in network namespaces on a bridge that drops multicast run version N
//! (`scripts/previous-agent.sh`: the agent built from git at the commit it names, cached)
//! with the files version N's own `keelson build` wrote from N's example install-config, as
//! a user who installed N has them (unicast VRRP and members, authenticated records; only
//! the timers shortened and the health checks off, as in agent/tests/day2.rs: here the VIP
//! moves only when a stop moves it), each beside a kube-apiserver stand-in on `*:6443`.
//! They are rolled to this version (the static agent `make agent` builds,
//! `$KEELSON_AGENT_BIN`: the binary users install) one at a time, the VIP holder last, as
//! the page says: SIGTERM, the new binary on the same `cluster.json`, TLS and state
//! directories. A client in a fourth namespace sends a request through `VIP:6443` every
//! 100 ms (a new TLS connection each) from before the first restart to after the last.
//! Checked, after every restart and over the whole roll:
//!
//! - the client: 0 failed requests;
//! - VRRP: the VIP always has a holder, and moves once (the holder's restart); every
//!   master, N or N+1, reports the same priority for the same role;
//! - members (unicast): every node lists all three, with the version its binary reports;
//!   no registration refused (`discovery.refused`, nor `registration refused` in a log);
//!   no record dropped for its MAC or key (`badMac`, `noMac`, `unknownKey`);
//! - `members.json`: each upgraded node started on N's state directory without ignoring
//!   what N remembered;
//! - `cluster.json` and `tls/`: N+1 runs on the ones N's build wrote and N ran on (the
//!   same membership key ID); N refuses a cluster.json with a field it does not know,
//!   naming the field.
//!
//! Needs root (namespaces), nftables (the proxy's VIP:6443 redirect past the stand-in's
//! wildcard listener), curl, git (the previous version's source) and the static agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunCluster, RunNet, member_names};
use keelson_testkit::cmd::{Proc, output_ok};
use keelson_testkit::segment::ns_holds;
use keelson_testkit::{Segment, require, require_env, require_root};

const STANDIN: &str = env!("CARGO_BIN_EXE_kube-standin");
const VIP: &str = "10.0.0.5";
/// The masters, and the client's namespace (index 3).
const MASTERS: [usize; 3] = [0, 1, 2];
const CLIENT: usize = 3;
/// How long a list may take to follow a restart on a loaded 2-core machine (the member
/// expiry and slack: the bound is not what is measured; the times are printed).
const LIMIT: Duration = Duration::from_secs(60);

/// Version N's agent: scripts/previous-agent.sh builds it (or finds it cached) and prints
/// its path; N's `keelson` and examples/install-config.yaml sit beside it.
fn previous_agent() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/previous-agent.sh");
    let out = output_ok(Command::new(script).stderr(Stdio::inherit()));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `<binary> --version`'s version ("keelson-agent 0.1.0 (ad32793f997e)" -> "0.1.0"), and
/// the whole line.
fn version_of(agent: &str) -> (String, String) {
    let out = output_ok(Command::new(agent).arg("--version"));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let version = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("{agent} --version: {line:?}"))
        .to_owned();
    (version, line)
}

/// The cluster's files as the user got them when they installed N: version N's
/// `keelson build` of its examples/install-config.yaml into `out` (no image; the static
/// agent it asks for is only copied to `assets/`, so this version's does), then, as in
/// day2.rs, 1 s adverts, members renewed every second and expired after 6, no health
/// checks; and hand-backs on, as `keelson build` sets them on bare metal (the example is
/// OpenStack's, where port security forbids them): the bridge lets a node forward a
/// client's frames, and without them the holder's restart resets a connection caught
/// half-open by the move (docs/operations.md), which "0 failed requests" would count.
/// Returns that cluster.json and `out/tls`.
fn cluster_files_of_n(previous: &str, next: &str, out: &Path) -> (serde_json::Value, PathBuf) {
    let dir = Path::new(previous).parent().unwrap();
    output_ok(
        Command::new(dir.join("keelson"))
            .arg("build")
            .arg("--config")
            .arg(dir.join("install-config.yaml"))
            .arg("--out")
            .arg(out)
            .args(["--no-image", "--quiet", "--agent", next]),
    );
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("cluster.json")).unwrap()).unwrap();
    for inst in c["vrrp"]["instances"].as_array_mut().unwrap() {
        inst["advertIntervalMs"] = 1000.into();
        inst["checks"] = serde_json::json!([]);
        inst["handbackSecs"] = 30.into();
    }
    c["members"]["renewIntervalSecs"] = 1.into();
    c["members"]["expirySecs"] = 6.into();
    // The namespaces share the host's /etc/resolv.conf: leave it alone.
    c["dns"]["manageResolvConf"] = false.into();
    (c, out.join("tls"))
}

/// One request through the VIP: when it was sent, whether it was answered, by whom (or why not).
#[derive(Debug, Clone)]
struct Sample {
    sent: Instant,
    ok: bool,
    what: String,
}

/// The VIP's holder sets, each with when it began.
type HolderSets = Arc<Mutex<Vec<(Instant, Vec<usize>)>>>;

/// A request through `VIP:6443` every 100 ms from the client's namespace (a new TLS
/// connection each, 3 s at most), and who held the VIP every 50 ms, until finished.
struct Watch {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    holders: HolderSets,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(seg: &Segment) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let holders = Arc::new(Mutex::new(Vec::new()));
        let client = {
            let (stop, samples, ns) = (stop.clone(), samples.clone(), seg.nodes[CLIENT].clone());
            std::thread::spawn(move || {
                let url = format!("https://{VIP}:6443/version");
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let r = keelson_testkit::http::curl_in(&ns, &["-k", "--max-time", "3", &url]);
                    let ok = r.exit == Some(0) && r.status == 200;
                    let what = if ok {
                        r.header("x-node").unwrap_or_default()
                    } else {
                        format!("exit {:?}, HTTP {}: {}", r.exit, r.status, r.error.trim())
                    };
                    samples.lock().unwrap().push(Sample { sent, ok, what });
                    std::thread::sleep(Duration::from_millis(100).saturating_sub(sent.elapsed()));
                }
            })
        };
        let vip = {
            let (stop, holders) = (stop.clone(), holders.clone());
            let nodes: Vec<String> = MASTERS.iter().map(|&i| seg.nodes[i].clone()).collect();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let h: Vec<usize> = (0..nodes.len())
                        .filter(|&i| ns_holds(&nodes[i], VIP))
                        .collect();
                    let mut seen = holders.lock().unwrap();
                    if seen.last().map(|(_, l)| l) != Some(&h) {
                        seen.push((Instant::now(), h));
                    }
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Watch {
            stop,
            samples,
            holders,
            threads: vec![client, vip],
        }
    }

    /// The requests so far, and how many failed (with when and why).
    fn failures(&self, since: Instant) -> (usize, Vec<String>) {
        let samples = self.samples.lock().unwrap();
        let failed = samples
            .iter()
            .filter(|s| !s.ok)
            .map(|s| {
                format!(
                    "{:.1} s: {}",
                    s.sent.duration_since(since).as_secs_f64(),
                    s.what
                )
            })
            .collect();
        (samples.len(), failed)
    }

    /// The holder sets seen so far, each change once.
    fn holder_sets(&self) -> Vec<Vec<usize>> {
        self.holders
            .lock()
            .unwrap()
            .iter()
            .map(|(_, h)| h.clone())
            .collect()
    }

    fn finish(mut self) -> Self {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("a watch thread panicked");
        }
        self
    }
}

impl Drop for Watch {
    /// Stops and joins the threads (also when a test fails), before the namespaces go.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Node `i`'s `api` instance status.
fn api(net: &RunNet, i: usize) -> serde_json::Value {
    let st = net.status(i);
    st["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api").cloned())
        .unwrap_or_else(|| panic!("no api instance in {}'s status: {st}", net.name(i)))
}

/// The one master holding the VIP, once one has held it alone for 3 s.
fn steady_holder(net: &RunNet) -> usize {
    net.seg
        .wait_steady_holder(VIP, Duration::from_secs(3), LIMIT)
}

/// Every skew rule that holds at any moment of the roll, on every master: each lists all
/// three with the version its binary reports; no registration refused, no record dropped
/// for its MAC or key; the same priority for the same role. `versions[i]` is node `i`'s.
fn check_skew_rules(net: &RunNet, versions: &[String; 3], step: &str) {
    let names: Vec<String> = MASTERS.iter().map(|&i| net.name(i).to_owned()).collect();
    let mut priorities = Vec::new();
    for i in MASTERS {
        let st = net.status(i);
        let members = st["members"].as_array().cloned().unwrap_or_default();
        for (j, name) in names.iter().enumerate() {
            let m = members
                .iter()
                .find(|m| m["name"] == name.as_str())
                .unwrap_or_else(|| panic!("[{step}] {} does not list {name}: {st}", names[i]));
            assert_eq!(
                m["version"], versions[j],
                "[{step}] {} lists {name} at another version than its binary's: {m}",
                names[i]
            );
        }
        // A refusal of N+1's registration by N (or back) is the broken rule's signal: a
        // 400 naming an unknown field, counted in `discovery.refused` and logged. One
        // refusal is not about versions: a node registering through the API VIP just as
        // the VIP moves to itself is refused by its own registry (409, "is the node
        // serving this registry"); it happens with one version too, and is allowed here.
        let log = std::fs::read_to_string(&net.nodes[i].as_ref().unwrap().log).unwrap();
        let refusals: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("registration refused"))
            .collect();
        let own_registry = format!("{} is the node serving this registry", names[i]);
        let other: Vec<&&str> = refusals
            .iter()
            .filter(|l| !(l.contains("409 Conflict") && l.contains(&own_registry)))
            .collect();
        assert!(
            other.is_empty(),
            "[{step}] {} had registrations refused: {}\n{}",
            names[i],
            st["discovery"],
            refusals.join("\n")
        );
        assert_eq!(
            st["discovery"]["refused"].as_u64(),
            Some(refusals.len() as u64),
            "[{step}] {}: refusals counted and logged differ: {}\n{}",
            names[i],
            st["discovery"],
            refusals.join("\n")
        );
        let drops = &st["discovery"]["auth"]["drops"];
        for reason in ["badMac", "noMac", "unknownKey"] {
            assert_eq!(
                drops[reason], 0,
                "[{step}] {} dropped records ({reason}) across versions: {drops}",
                names[i]
            );
        }
        let a = api(net, i);
        priorities.push((a["basePriority"].clone(), a["priority"].clone()));
    }
    assert!(
        priorities.windows(2).all(|w| w[0] == w[1]),
        "[{step}] masters of versions {versions:?} report different API priorities: {priorities:?}"
    );
}

/// Waits until every master lists all three.
fn all_listed(net: &RunNet, step: &str) -> Duration {
    let mut want: Vec<String> = MASTERS.iter().map(|&i| net.name(i).to_owned()).collect();
    want.sort();
    net.wait(
        &format!("[{step}] every master lists all three"),
        LIMIT,
        || {
            MASTERS.iter().all(|&i| {
                let mut m = member_names(&net.status(i));
                m.sort();
                m == want
            })
        },
    )
}

/// Version N refuses a `cluster.json` with a field it does not know, naming it (the rule
/// that makes "upgrade every node first, then set new fields" the order).
fn previous_refuses_an_unknown_field(net: &RunNet, previous: &str) {
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&net.files.cluster).unwrap()).unwrap();
    c["members"]["fieldOfTheNextVersion"] = 1.into();
    let path = net.files.dir.path().join("cluster-next.json");
    std::fs::write(&path, c.to_string()).unwrap();
    let node = net.files.dir.path().join("node-0.json");
    // In a namespace of its own with no link: were the file accepted, this agent would
    // reach nothing.
    let alone = keelson_testkit::Netns::new("kup-n");
    let out = alone
        .exec("timeout")
        .args(["20", previous, "vrrp", "--cluster"])
        .arg(&path)
        .arg("--node")
        .arg(&node)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && out.status.code() != Some(124),
        "version N accepted a cluster.json with a field it does not know ({}): {err}",
        out.status
    );
    assert!(
        err.contains("fieldOfTheNextVersion"),
        "version N's refusal does not name the field: {err}"
    );
    eprintln!(
        "[cluster.json] version N refuses a field it does not know: {}",
        err.lines()
            .find(|l| l.contains("fieldOfTheNextVersion"))
            .unwrap_or_default()
            .trim()
    );
}

#[test]
fn rolling_upgrade_from_the_previous_version() {
    if !require_root() || !require("nft") || !require("curl") || !require("git") {
        return;
    }
    let Some(next) = require_env(
        "KEELSON_AGENT_BIN",
        "`make test` sets it to the static agent `make agent` builds",
    ) else {
        return;
    };
    let previous = previous_agent();
    let (v_prev, line_prev) = version_of(&previous);
    let (v_next, line_next) = version_of(&next);
    eprintln!("[versions] N: {line_prev} ({previous}); N+1: {line_next} ({next})");
    assert_ne!(line_prev, line_next, "N and N+1 are the same build");

    let seg = Segment::new("kup", 4, 0);
    seg.drop_multicast();
    let apiservers: Vec<Proc> = MASTERS
        .iter()
        .map(|&i| {
            Proc::spawn(
                Command::new("ip")
                    .args(["netns", "exec", &seg.nodes[i], STANDIN])
                    .args(["--listen", "0.0.0.0:6443", "--name"])
                    .arg(format!("master-{i}"))
                    .stderr(Stdio::null()),
            )
        })
        .collect();
    let nodes = [
        ("master-0", "master"),
        ("master-1", "master"),
        ("master-2", "master"),
        ("client", "worker"),
    ];
    let build_n = tempfile::tempdir().unwrap();
    let (cluster_n, tls_n) = cluster_files_of_n(&previous, &next, build_n.path());
    let key_id_n = cluster_n["members"]["keyId"].clone();
    let files = RunCluster::from_build(&previous, cluster_n, &tls_n);
    let mut net = RunNet::with_files(seg, files, &nodes, "vrrp,members,ignition,proxy");
    assert_eq!(
        net.files.pki.membership_key_id().unwrap(),
        key_id_n.as_str().unwrap_or_default(),
        "this version reads another membership key ID from N's tls/ than N's build wrote"
    );
    let mut versions = [v_prev.clone(), v_prev.clone(), v_prev.clone()];

    // Formation, all on N.
    for i in MASTERS {
        net.start(i);
    }
    net.wait_ready(&MASTERS);
    let t = all_listed(&net, "N");
    let holder = steady_holder(&net);
    check_skew_rules(&net, &versions, "N");
    eprintln!(
        "[N] three masters formed ({t:.2?} after ready), {} holds {VIP}",
        net.name(holder)
    );
    previous_refuses_an_unknown_field(&net, &previous);

    // The client, from before the first restart.
    let start = Instant::now();
    let watch = Watch::start(&net.seg);
    net.wait("the first answer through the VIP", LIMIT, || {
        watch.samples.lock().unwrap().iter().any(|s| s.ok)
    });

    // The roll, the holder last.
    let mut order: Vec<usize> = MASTERS.to_vec();
    order.sort_by_key(|&i| i == holder);
    for i in order {
        let step = format!("{} to N+1", net.name(i));
        let remembered = net.files.state_dir(i).join("members.json");
        assert!(
            remembered.exists(),
            "[{step}] version N left no {}",
            remembered.display()
        );
        let t = Instant::now();
        net.stop(i);
        net.set_agent(i, &next);
        net.start(i);
        net.wait_ready(&[i]);
        versions[i] = v_next.clone();
        let listed = all_listed(&net, &step);
        let log = std::fs::read_to_string(&net.nodes[i].as_ref().unwrap().log).unwrap();
        assert!(
            !log.contains("ignoring what was remembered"),
            "[{step}] N+1 could not read N's members.json:\n{log}"
        );
        let now = steady_holder(&net);
        check_skew_rules(&net, &versions, &step);
        let (requests, failed) = watch.failures(start);
        eprintln!(
            "[{step}] restarted in {:.2?}, every master lists all three {listed:.2?} later; {} holds {VIP}; {requests} requests so far, {} failed",
            t.elapsed() - listed,
            net.name(now),
            failed.len()
        );
        if i != holder {
            assert_eq!(now, holder, "[{step}] restarting a backup moved the VIP");
        } else {
            assert_ne!(
                now, holder,
                "[{step}] the holder's restart left it the holder"
            );
        }
    }

    // A few seconds of the upgraded cluster, then the verdict on the whole roll.
    std::thread::sleep(Duration::from_secs(3));
    let watch = watch.finish();
    let (requests, failed) = watch.failures(start);
    let sets = watch.holder_sets();
    let answered_by: std::collections::BTreeSet<String> = watch
        .samples
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.what.clone())
        .collect();
    eprintln!(
        "[roll] {requests} requests through {VIP}:6443 in {:.1} s, {} failed, answered by {answered_by:?}; VIP holder sets seen {sets:?}",
        start.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {requests} requests through the VIP failed during the upgrade: {}",
        failed.len(),
        failed.join("; ")
    );
    assert!(
        sets.iter().all(|h| !h.is_empty()),
        "the VIP was without a holder during the upgrade: {sets:?}"
    );
    let moves = sets.iter().filter(|h| h.len() == 1).count() - 1;
    assert_eq!(
        moves, 1,
        "the VIP moved {moves} times, expected once: {sets:?}"
    );
    assert!(
        answered_by.len() == 3,
        "the proxy spread requests over {answered_by:?}, not over the three masters"
    );
    for i in MASTERS {
        net.stop(i);
    }
    drop(apiservers);
}
