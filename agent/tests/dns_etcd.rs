//! The etcd names of the 4.2 era, proven with the real client. Three masters in
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

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use keelson_testkit::agent::{RunCluster, RunNode};
use keelson_testkit::cmd::Proc;
use keelson_testkit::dig::dig_in;
use keelson_testkit::http::curl_in;
use keelson_testkit::netns::{Resolver, exec_in};
use keelson_testkit::segment::Segment;
use keelson_testkit::wait::wait_for;
use keelson_testkit::{require, require_root};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

/// The installer's names for the masters of `examples/install-config-4.2.yaml`
/// (`<infraID>-master-<i>`).
const MASTERS: [&str; 3] = [
    "ocp4-x7k2z-master-0",
    "ocp4-x7k2z-master-1",
    "ocp4-x7k2z-master-2",
];

/// `keelson build --spec 2.2.0`'s cluster.json for the 4.2 install-config: the etcd names on
/// for its three masters. Members over mDNS (the bridge carries multicast; unicast members
/// would need VRRP to elect a registry first), renewals shortened.
fn cluster_json() -> serde_json::Value {
    let text = include_str!("../../examples/install-config-4.2.yaml");
    let ic = keelson_cluster::install_config::InstallConfig::parse(text).unwrap();
    let mut cluster = ic.cluster_config();
    cluster.ignition.spec = keelson_cluster::SpecVersion::V2_2.as_str().into();
    cluster.dns.etcd = Some(keelson_cluster::cluster::EtcdRecords::for_spec(
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

/// Runs `args` in namespace `ns` (with its resolver) and returns the output.
fn in_ns(ns: &str, args: &[&str]) -> Output {
    exec_in(ns, args[0]).args(&args[1..]).output().unwrap()
}

/// dig's header, answer and authority for `name`/`qtype` at node `server`, from `ns`.
fn dig(ns: &str, server: std::net::Ipv4Addr, name: &str, qtype: &str) -> String {
    let args = [
        "+time=1",
        "+tries=2",
        "+noall",
        "+comments",
        "+answer",
        "+authority",
    ];
    let mut args = args.to_vec();
    args.extend([name, qtype]);
    dig_in(ns, server.into(), &args)
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
        Proc::spawn(
            exec_in(&self.ns, "etcd")
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
                .stderr(log),
        )
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

/// `etcdctl --discovery-srv <zone> member list` from namespace `ns`: stdout and stderr.
fn member_list(ns: &str, zone: &str, ca: &Path) -> String {
    let ca = ca.display().to_string();
    let out = in_ns(
        ns,
        &[
            "etcdctl",
            "--discovery-srv",
            zone,
            "--cacert",
            &ca,
            "--dial-timeout=2s",
            "--command-timeout=3s",
            "-w",
            "simple",
            "member",
            "list",
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn etcd_bootstraps_through_srv_records() {
    if !require_root()
        || !require("etcd")
        || !require("etcdctl")
        || !require("dig")
        || !require("curl")
    {
        return;
    }
    let cluster = RunCluster::new(AGENT, cluster_json());
    let zone = "ocp4.osd2019.local";
    // Three masters and a fourth host on 10.0.0.0/24, inside the install-config's machine
    // network; each asks the keelson DNS of its own node (the fourth, master 2's).
    let seg = Segment::ipv4_only("ketcd", 4, 0);
    let ip = |i: usize| seg.ip4(i);
    let _resolvers: Vec<Resolver> = (0..4)
        .map(|i| Resolver::new(&seg.nodes[i], &[ip(i.min(2)).into()]))
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
        dig(&seg.nodes[0], ip(0), &format!("etcd-1.{zone}"), "A").contains(&ip(1).to_string())
    });
    let early = dig(&seg.nodes[0], ip(0), &srv_name, "SRV");
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
            Etcd::new(&root, &seg.nodes[i], name, &ip(i).to_string(), cert, ca)
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
            let out = dig(&seg.nodes[i], ip(i), &srv_name, "SRV");
            (0..3).all(|k| out.contains(&format!("0 10 2380 etcd-{k}.{zone}.")))
        });
    }
    let text = Command::new(AGENT)
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

    // The three etcds bootstrap. `ID, started, name, peer URL, client URL, learner`: each
    // master started, under its own name, with the etcd name of its index.
    let mut running: Vec<Proc> = etcds[..3].iter().map(|e| e.start(zone)).collect();
    let want: Vec<String> = MASTERS
        .iter()
        .enumerate()
        .map(|(i, master)| format!(", started, {master}, https://etcd-{i}.{zone}:2380, "))
        .collect();
    let ca_file = etcds[0].dir.join("ca.crt");
    let mut last = String::new();
    let waited = Instant::now();
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
            waited.elapsed() < Duration::from_secs(60),
            "three started members expected; last `etcdctl member list`:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(300));
        last = member_list(&seg.nodes[0], zone, &ca_file);
    }
    let started = last.lines().filter(|l| l.contains(", started, ")).count();
    assert_eq!(started, 3, "{last}");
    eprintln!("etcdctl --discovery-srv {zone} member list:\n{last}");
    for e in &etcds[..3] {
        assert!(
            e.log().contains(&format!("etcd-0.{zone}")),
            "{} logged the cluster it found by DNS",
            e.name
        );
        assert!(
            !e.log().contains("does not match any of DNSNames"),
            "{}: a peer's certificate failed etcd's SAN check:\n{}",
            e.name,
            e.log()
        );
    }

    // A fourth etcd whose address is no SRV target: etcd's own error.
    let mut fourth = etcds[3].start(zone);
    let st =
        Etcd::exit_within(&mut fourth, Duration::from_secs(30)).expect("the fourth etcd stops");
    assert!(!st.success());
    let log = etcds[3].log();
    let own_error = format!(
        "cannot find local etcd member \"{}\" in SRV records",
        etcds[3].name
    );
    assert!(
        log.contains(&own_error),
        "etcd's own error expected:\n{log}"
    );

    // The SAN check is what the A records feed: master 1's certificate is accepted on
    // master 0's peer port from master 1's address, refused from the fourth host's.
    let file = |n: &str| etcds[1].dir.join(n).display().to_string();
    let (ca1, cert1, key1) = (file("ca.crt"), file("peer.crt"), file("peer.key"));
    let url = format!("https://etcd-0.{zone}:2380/members");
    let args = [
        "--http1.1",
        "--max-time",
        "5",
        "--cacert",
        &ca1,
        "--cert",
        &cert1,
        "--key",
        &key1,
        &url,
    ];
    let from_1 = curl_in(&seg.nodes[1], &args);
    assert!(
        from_1.status == 200 && from_1.text().contains("etcd-1"),
        "from etcd-1's address: {from_1:?}"
    );
    let from_3 = curl_in(&seg.nodes[3], &args);
    assert_eq!(from_3.status, 0, "refused from another address: {from_3:?}");
    let refused = format!("rejected connection from \"{}:", ip(3));
    wait_for("the refusal in etcd's log", Duration::from_secs(5), || {
        etcds[0]
            .log()
            .lines()
            .any(|l| l.contains(&refused) && l.contains("does not match any of DNSNames"))
    });
    drop(running);
}
