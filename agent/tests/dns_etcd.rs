//! Issue 26: the etcd names of the 4.2 era, proven with the real client. Three masters in
//! network namespaces on a bridge run `keelson-agent run --only members,dns` with the
//! cluster.json of `examples/install-config-4.2.yaml` built for Ignition spec 2.2 (where
//! the etcd names are on by default); each runs Debian's etcd 3.4 with `--discovery-srv
//! <zone>` and TLS peer certificates from the cluster CA, its own keelson node's DNS as its
//! only resolver (`/etc/netns/<ns>/resolv.conf`, which `ip netns exec` mounts over
//! `/etc/resolv.conf`).
//!
//! - With two masters up, `_etcd-server-ssl._tcp` is NODATA with the SOA, and an etcd
//!   started then stops on its SRV lookup (no partial cluster).
//! - With the third, every node serves the three SRV records; the three etcds bootstrap,
//!   and `etcdctl --discovery-srv` (through `_etcd-client-ssl._tcp`) lists three started
//!   members, each named after its master with the peer URL `https://etcd-<i>.<zone>:2380`
//!   of that master's index.
//! - A fourth etcd, on a fourth namespace whose address is no SRV target, stops with etcd's
//!   own "cannot find local etcd member" error.
//!
//! The peer certificates name only `etcd-<i>.<zone>` (no IP): etcd then checks both ways
//! through DNS, the dialer the server's name against the SRV target, and the listener the
//! dialer's address against the A record of the name in its certificate (`checkCertSAN`
//! of etcd's `pkg/transport`).
//!
//! Needs root (namespaces) and etcd/etcdctl (scripts/setup.sh installs etcd-server and
//! etcd-client); without them it fails under CI and is skipped otherwise.

mod vrrp_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};
use vrrp_common::{Proc, RunCluster, RunNode, Segment};

/// The installer's names for the masters of `examples/install-config-4.2.yaml`
/// (`<infraID>-master-<i>`).
const MASTERS: [&str; 3] = [
    "ocp4-x7k2z-master-0",
    "ocp4-x7k2z-master-1",
    "ocp4-x7k2z-master-2",
];

/// What cannot run here: fails when `CI` is set (to anything), skips loudly otherwise.
// Moves to the shared test harness's `require` once it is on main.
fn require(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "dns_etcd needs {what} (CI is set)"
    );
    eprintln!("SKIPPED dns_etcd: needs {what}");
    false
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `keelson build --spec 2.2.0`'s cluster.json for the 4.2 install-config: the etcd names on
/// for its three masters. Members over mDNS (the bridge carries multicast; unicast members
/// would need VRRP to elect a registry first), renewals shortened.
fn cluster_json() -> serde_json::Value {
    let text = include_str!("../../examples/install-config-4.2.yaml");
    let ic = keelson_ignition::install_config::InstallConfig::parse(text).unwrap();
    let mut cluster = ic.cluster_config();
    cluster.ignition.spec = keelson_ignition::SpecVersion::V2_2.as_str().into();
    cluster.dns.etcd = Some(keelson_ignition::cluster::EtcdRecords::for_spec(
        &cluster.ignition.spec,
        ic.masters,
    ));
    let mut c = serde_json::to_value(&cluster).unwrap();
    assert_eq!(
        c["dns"]["etcd"],
        serde_json::json!({"enabled": true, "masters": 3}),
        "on for a spec 2.2 payload: {c}"
    );
    c["dns"]["manageResolvConf"] = false.into();
    c["members"]["transport"] = "mdns".into();
    c["members"]["renewIntervalSecs"] = 1.into();
    c["members"]["expirySecs"] = 4.into();
    c
}

/// A peer certificate signed by the cluster CA for `names` (server and client use: etcd
/// peers dial each other with it).
fn peer_cert(ca_cert_pem: &str, ca_key_pem: &str, names: &[String]) -> (String, String) {
    let issuer =
        Issuer::from_ca_cert_pem(ca_cert_pem, KeyPair::from_pem(ca_key_pem).unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(names.to_vec()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:etcd-peer:{}", names[0]));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// `/etc/netns/<ns>/resolv.conf` naming one server; removed on drop.
struct Resolver(PathBuf);

impl Resolver {
    fn new(ns: &str, server: &str) -> Self {
        let dir = PathBuf::from("/etc/netns").join(ns);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("resolv.conf"), format!("nameserver {server}\n")).unwrap();
        Resolver(dir)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `args` in namespace `ns` (with its resolver) and returns the output.
fn in_ns(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap()
}

/// `dig +noall +comments +answer +authority` for `name`/`qtype` at `server`, from `ns`.
fn dig(ns: &str, server: &str, name: &str, qtype: &str) -> String {
    let out = in_ns(
        ns,
        &[
            "dig",
            &format!("@{server}"),
            "+time=1",
            "+tries=2",
            "+noall",
            "+comments",
            "+answer",
            "+authority",
            name,
            qtype,
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 200 ms until it returns `Some`, or panics with `what` after `limit`.
fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One etcd member's files and command line.
struct Etcd {
    ns: String,
    name: String,
    ip: String,
    dir: PathBuf,
}

impl Etcd {
    fn new(root: &Path, ns: &str, name: &str, ip: &str, cert: (String, String), ca: &str) -> Self {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("peer.crt"), cert.0).unwrap();
        std::fs::write(dir.join("peer.key"), cert.1).unwrap();
        std::fs::write(dir.join("ca.crt"), ca).unwrap();
        Etcd {
            ns: ns.into(),
            name: name.into(),
            ip: ip.into(),
            dir,
        }
    }

    /// Starts `etcd --discovery-srv <zone>` in its namespace, logging to `etcd.log`.
    fn start(&self, zone: &str) -> Proc {
        let data = self.dir.join("data");
        let _ = std::fs::remove_dir_all(&data);
        let f = |n: &str| self.dir.join(n).display().to_string();
        let log = std::fs::File::create(self.dir.join("etcd.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "etcd"])
            .args(["--name", &self.name])
            .args(["--data-dir", &data.display().to_string()])
            .args(["--discovery-srv", zone])
            .args(["--initial-cluster-token", "keelson-dns-etcd"])
            .args(["--initial-cluster-state", "new"])
            .arg(format!(
                "--initial-advertise-peer-urls=https://{}:2380",
                self.ip
            ))
            .arg(format!("--listen-peer-urls=https://{}:2380", self.ip))
            .arg(format!("--listen-client-urls=https://{}:2379", self.ip))
            .arg(format!("--advertise-client-urls=https://{}:2379", self.ip))
            .args(["--peer-cert-file", &f("peer.crt")])
            .args(["--peer-key-file", &f("peer.key")])
            .args(["--peer-trusted-ca-file", &f("ca.crt")])
            .arg("--peer-client-cert-auth")
            .args(["--cert-file", &f("peer.crt")])
            .args(["--key-file", &f("peer.key")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc(child)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    /// Waits for the process to exit; its status, or `None` if it still runs after `limit`.
    fn exit_within(proc: &mut Proc, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(st)) = proc.0.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

#[test]
fn etcd_bootstraps_through_srv_records() {
    if !require("root", nix::unistd::Uid::effective().is_root())
        || !require("etcd (apt package etcd-server)", have("etcd"))
        || !require("etcdctl (apt package etcd-client)", have("etcdctl"))
        || !require("dig", have("dig"))
        || !require("curl", have("curl"))
    {
        return;
    }
    let cluster = RunCluster::new(cluster_json());
    let zone = "ocp4.osd2019.local";
    // Three masters and a fourth host on 10.0.0.0/24, inside the install-config's machine
    // network.
    let seg = Segment::new(&format!("ke{}", std::process::id() % 10_000), 4, 0);
    let ip = |i: usize| seg.v4(i).split('/').next().unwrap().to_string();
    let resolvers: Vec<Resolver> = (0..4)
        .map(|i| Resolver::new(&seg.nodes[i], &ip(i.min(2))))
        .collect();
    let start = |i: usize| -> RunNode {
        cluster.start(
            &seg.nodes[i],
            i,
            (MASTERS[i], "master", &seg.v4(i)),
            "members,dns",
        )
    };
    let _nodes01 = [start(0), start(1)];

    // Two of three masters: the names exist, the SRV set is NODATA with the SOA.
    let srv_name = format!("_etcd-server-ssl._tcp.{zone}");
    wait_for("etcd-1 on node 0", Duration::from_secs(20), || {
        dig(&seg.nodes[0], &ip(0), &format!("etcd-1.{zone}"), "A")
            .contains(&ip(1))
            .then_some(())
    });
    let early = dig(&seg.nodes[0], &ip(0), &srv_name, "SRV");
    assert!(
        early.contains("status: NOERROR") && early.contains("ANSWER: 0") && early.contains("SOA"),
        "two masters: NODATA with the SOA expected:\n{early}"
    );
    let etcd_status = cluster.status(0)["dns"]["etcd"].clone();
    assert_eq!(etcd_status["srvReady"], false, "{etcd_status}");
    assert_eq!(etcd_status["names"]["etcd-1"], MASTERS[1], "{etcd_status}");
    let root = cluster.dir.path().join("etcd");
    let ca = &cluster.pki.ca_cert_pem;
    let etcds: Vec<Etcd> = (0..4)
        .map(|i| {
            let name = MASTERS.get(i).copied().unwrap_or("ocp4-x7k2z-master-3");
            let cert = peer_cert(ca, &cluster.pki.ca_key_pem, &[format!("etcd-{i}.{zone}")]);
            Etcd::new(&root, &seg.nodes[i], name, &ip(i), cert, ca)
        })
        .collect();
    let mut too_early = etcds[0].start(zone);
    let st = Etcd::exit_within(&mut too_early, Duration::from_secs(30))
        .expect("an etcd started before the SRV set is served stops");
    assert!(!st.success());
    let log = etcds[0].log();
    assert!(
        log.contains("error querying DNS SRV records for _etcd-server-ssl"),
        "etcd's SRV error expected:\n{log}"
    );

    // The third master: every node serves the three records.
    let _node2 = start(2);
    for i in 0..3 {
        wait_for(&format!("SRV on node {i}"), Duration::from_secs(20), || {
            let out = dig(&seg.nodes[i], &ip(i), &srv_name, "SRV");
            (0..3)
                .all(|k| out.contains(&format!("0 10 2380 etcd-{k}.{zone}.")))
                .then_some(())
        });
    }

    let text = Command::new(env!("CARGO_BIN_EXE_keelson-agent"))
        .args(["status", "--socket"])
        .arg(cluster.socket(1))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let want = format!(
        "etcd names: etcd-0={}, etcd-1={}, etcd-2={}; SRV answered (3 of 3 masters)",
        MASTERS[0], MASTERS[1], MASTERS[2]
    );
    assert!(text.contains(&want), "status lacks {want:?}:\n{text}");

    let mut running: Vec<Proc> = etcds[..3].iter().map(|e| e.start(zone)).collect();
    let member_list = || {
        in_ns(
            &seg.nodes[0],
            &[
                "etcdctl",
                "--discovery-srv",
                zone,
                "--cacert",
                &etcds[0].dir.join("ca.crt").display().to_string(),
                "--dial-timeout=2s",
                "--command-timeout=3s",
                "-w",
                "simple",
                "member",
                "list",
            ],
        )
    };
    // `ID, started, name, peer URL, client URL, learner`: each master started, under its
    // own name, with the etcd name of its index.
    let want: Vec<String> = MASTERS
        .iter()
        .enumerate()
        .map(|(i, master)| format!(", started, {master}, https://etcd-{i}.{zone}:2380, "))
        .collect();
    let mut last = String::new();
    let start = Instant::now();
    while !want
        .iter()
        .all(|w| last.lines().any(|l| l.contains(w.as_str())))
    {
        for (i, p) in running.iter_mut().enumerate() {
            if let Ok(Some(st)) = p.0.try_wait() {
                panic!("etcd {i} exited ({st}):\n{}", etcds[i].log());
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "three started members expected; last `etcdctl member list`:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(300));
        let out = member_list();
        last = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
    }
    assert_eq!(
        last.lines().filter(|l| l.contains(", started, ")).count(),
        3,
        "{last}"
    );
    eprintln!("etcdctl --discovery-srv {zone} member list:\n{last}");
    for e in &etcds[..3] {
        assert!(
            e.log().contains(&format!("etcd-0.{zone}")),
            "{} logged the cluster it found by DNS",
            e.name
        );
    }

    // A fourth etcd whose address is no SRV target: etcd's own error.
    let mut fourth = etcds[3].start(zone);
    let st =
        Etcd::exit_within(&mut fourth, Duration::from_secs(30)).expect("the fourth etcd stops");
    assert!(!st.success());
    let log = etcds[3].log();
    assert!(
        log.contains(&format!(
            "cannot find local etcd member \"{}\" in SRV records",
            etcds[3].name
        )),
        "etcd's own error expected:\n{log}"
    );
    // No peer connection was refused on the certificates' names.
    for e in &etcds[..3] {
        let log = e.log();
        assert!(
            !log.contains("does not match any of DNSNames"),
            "{}: a peer's certificate failed etcd's SAN check:\n{log}",
            e.name
        );
    }
    // The SAN check is what the A records feed: master 1's certificate is accepted on
    // master 0's peer port from master 1's address, refused from the fourth host's.
    let curl_peer = |from: usize| {
        let out = in_ns(
            &seg.nodes[from],
            &[
                "curl",
                "-sS",
                "--http1.1",
                "--max-time",
                "5",
                "--cacert",
                &etcds[1].dir.join("ca.crt").display().to_string(),
                "--cert",
                &etcds[1].dir.join("peer.crt").display().to_string(),
                "--key",
                &etcds[1].dir.join("peer.key").display().to_string(),
                &format!("https://etcd-0.{zone}:2380/members"),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, body) = curl_peer(1);
    assert!(
        ok && body.contains("etcd-1"),
        "from etcd-1's address: {body}"
    );
    let (ok, _) = curl_peer(3);
    assert!(!ok, "etcd-1's certificate from another address is refused");
    wait_for("the refusal in etcd's log", Duration::from_secs(5), || {
        let log = etcds[0].log();
        let from = format!("rejected connection from \"{}:", ip(3));
        log.lines()
            .any(|l| l.contains(&from) && l.contains("does not match any of DNSNames"))
            .then_some(())
    });
    drop(running);
    drop(resolvers);
}
