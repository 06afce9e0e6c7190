//! A forger on the machine network, without the membership key, tries to join a
//! cluster whose member records are authenticated (`keelson build`'s cluster.json for the
//! example install-config, with its `members.keyId` and `tls/membership.key`), over both
//! transports:
//!
//! - unicast members on a bridge that drops every multicast frame;
//! - mDNS members on a bridge that passes multicast.
//!
//! Two masters run `keelson-agent run` (VRRP in unicast, members, DNS, the API proxy, and
//! for unicast the Ignition server and its registry) in namespaces on the bridge; the
//! forger is a third namespace. It registers (announces) a fake master, without a MAC and
//! with a made-up one; it replays a genuine record of master-1 it captured: at once from its
//! own address, an older one from master-1's address after a newer one was heard, one from
//! master-1's address once it is older than the window, and turns one into a goodbye. The
//! member lists, the VRRP destinations, the proxy backends and the DNS answers stay exactly
//! as they were, and master-0's drop counters show every attempt under its reason. Then
//! master-1 dies and the forger replays its last record over and over from its address: it
//! is dropped at the expiry all the same. Last, master-1 comes back (its new records are
//! believed) and stops (its signed goodbye is).
//!
//! "From master-1's address": the forger's packets are sent from master-1's namespace (as a
//! host that took the address over would send them; UDP and, once master-1 is dead, TCP
//! need nothing more). "Captured": mDNS announcements travel in the clear, and the forger
//! captures them off the wire. Unicast registrations travel over TLS that only the
//! cluster's server key terminates, so nobody on the segment can capture one; the test
//! stands in for a capture (by an insider, or from a leaked server key) by serving a
//! registry of its own, with the cluster's server certificate, at the forger's address,
//! which master-1 remembers as a master: the bytes replayed are those master-1's agent sent.
//!
//! Needs root (namespaces), nftables, dig and curl.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keelson_testkit::agent::{RunNet, status_at};
use keelson_testkit::{Segment, in_netns, require, require_root};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");

/// Root for the namespaces; nft, dig and curl for the bridge, the DNS answers, the
/// registrations.
fn can_run() -> bool {
    require_root() && require("nft") && require("dig") && require("curl")
}

const ZONE: &str = "ocp4.osd2019.local";
const M0: usize = 0;
const M1: usize = 1;
const FORGER: usize = 2;
/// Members renewal interval and expiry of the test (s).
const RENEW_S: u64 = 1;
const EXPIRY_S: u64 = 4;
/// `members.maxClockSkewSecs` of the test: short, so a captured record goes stale soon.
const WINDOW_S: u64 = 12;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    Unicast,
    Mdns,
}

/// `keelson build`'s cluster.json for examples/install-config.yaml, timers shortened.
fn cluster_json(transport: Transport) -> serde_json::Value {
    let text = include_str!("../../examples/install-config.yaml");
    let ic = keelson_cluster::install_config::InstallConfig::parse(text).unwrap();
    let mut c = serde_json::to_value(ic.cluster_config()).unwrap();
    for inst in c["vrrp"]["instances"].as_array_mut().unwrap() {
        assert_eq!(inst["transport"], "unicast", "the default: {inst}");
        inst["advertIntervalMs"] = 100.into();
    }
    c["members"]["transport"] = match transport {
        Transport::Unicast => "unicast",
        Transport::Mdns => "mdns",
    }
    .into();
    c["members"]["renewIntervalSecs"] = RENEW_S.into();
    c["members"]["expirySecs"] = EXPIRY_S.into();
    c["members"]["maxClockSkewSecs"] = WINDOW_S.into();
    // The namespaces share the host's /etc/resolv.conf: leave it alone.
    c["dns"]["manageResolvConf"] = false.into();
    c
}

/// What the cluster looks like from one master.
#[derive(Debug, Clone, PartialEq)]
struct View {
    members: serde_json::Value,
    vrrp_destinations: Vec<serde_json::Value>,
    proxy_backends: Vec<String>,
}

/// Two masters and the forger's namespace on one bridge.
struct Net {
    net: RunNet,
    key: Vec<u8>,
}

impl std::ops::Deref for Net {
    type Target = RunNet;
    fn deref(&self) -> &RunNet {
        &self.net
    }
}

impl std::ops::DerefMut for Net {
    fn deref_mut(&mut self) -> &mut RunNet {
        &mut self.net
    }
}

impl Net {
    fn new(prefix: &str, transport: Transport) -> Self {
        // Subnet 0: the example's machine network 10.0.0.0/16, inside our own namespaces.
        let seg = Segment::new(prefix, 3, 0);
        if transport == Transport::Unicast {
            seg.drop_multicast();
        }
        let services = match transport {
            Transport::Unicast => "vrrp,members,ignition,dns,proxy",
            Transport::Mdns => "vrrp,members,dns,proxy",
        };
        // As `keelson build`: the membership key cluster.json names.
        let nodes = [
            ("master-0", "master"),
            ("master-1", "master"),
            ("forger", "master"),
        ];
        let net = RunNet::new(AGENT, seg, cluster_json(transport), &nodes, services);
        let key = keelson_cluster::membership::parse_key(
            &net.files.pki.membership_keys["membership.key"],
        )
        .unwrap();
        Net { net, key }
    }

    fn ip(&self, i: usize) -> Ipv4Addr {
        self.seg.ip4(i)
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.files.socket(i)
    }

    fn view(&self, i: usize) -> View {
        view_at(&self.socket(i))
    }

    /// Node `i`'s members auth status: `{"authenticated": .., "drops": {..}}`.
    fn auth(&self, i: usize) -> serde_json::Value {
        self.status(i)["discovery"]["auth"].clone()
    }

    /// The drop counters of node `i` now.
    fn drops_now(&self, i: usize) -> serde_json::Value {
        // The status is read live; give the last packet sent a moment to be handled.
        std::thread::sleep(Duration::from_millis(500));
        let auth = self.auth(i);
        assert_eq!(auth["authenticated"], true, "{auth}");
        auth["drops"].clone()
    }

    /// Replays (`replay`) master-1's records every 300 ms while master-0 lists the dead
    /// master-1; it must drop it all the same, within the expiry.
    fn dropped_despite(&self, mut replay: impl FnMut()) {
        let t = Instant::now();
        while self.member_names(M0).contains(&"master-1".to_string()) {
            replay();
            assert!(
                t.elapsed() < Duration::from_secs(EXPIRY_S + 4),
                "master-1 kept alive by replays"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        eprintln!(
            "dead master-1 dropped after {:.1} s despite replays",
            t.elapsed().as_secs_f64()
        );
    }

    /// master-1 comes back (its new records are believed: both list both again) and stops
    /// (its signed goodbye is believed: master-0 drops it before the expiry).
    fn back_and_goodbye(&mut self) {
        self.start(M1);
        self.wait_ready(&[M1]);
        self.wait_settled("master-1 back");
        self.stop(M1);
        let gone = self.wait(
            "master-1's goodbye",
            Duration::from_secs(EXPIRY_S - 1),
            || !self.member_names(M0).contains(&"master-1".to_string()),
        );
        eprintln!(
            "stopped master-1 dropped after {:.2} s (goodbye)",
            gone.as_secs_f64()
        );
    }

    /// `dig` from the forger at master-0's DNS server: the answer section for `name`.
    fn dig(&self, name: &str) -> String {
        dig_at(&self.seg.nodes[FORGER], self.ip(M0), name)
    }

    /// Watches both masters' views and master-0's DNS answers from now until the watch is
    /// ended, against what they are now: a forged member lives until the expiry, so one
    /// believed even for a moment is seen.
    fn watch(&self) -> Watch {
        let sockets = [self.socket(M0), self.socket(M1)];
        let (ns, server) = (self.seg.nodes[FORGER].clone(), self.ip(M0));
        let names = ["master-0", "master-1", "master-9"];
        let views = sockets.clone().map(|s| view_at(&s));
        // A settled node has VRRP instances: an empty list means the status document changed
        // shape under this test, which would then compare nothing.
        for v in &views {
            assert!(
                !v.vrrp_destinations.is_empty(),
                "no vrrp in the status: {v:?}"
            );
        }
        let dns = names.map(|n| dig_at(&ns, server, n));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (views2, dns2) = (views.clone(), dns.clone());
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                let now = sockets.clone().map(|s| view_at(&s));
                if now != views2 {
                    seen.push(format!("views {now:?}"));
                }
                let answers = names.map(|n| dig_at(&ns, server, n));
                if answers != dns2 {
                    seen.push(format!("DNS {answers:?}"));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        });
        eprintln!("before: {views:?}\n{dns:?}");
        assert!(dns[1].contains("10.0.0.11"), "{}", dns[1]);
        assert!(dns[2].contains("NXDOMAIN"), "{}", dns[2]);
        Watch {
            stop,
            thread: Some(thread),
            views,
            dns,
        }
    }

    /// Waits until both masters list both, with both proxy backends and each other as a
    /// VRRP destination.
    fn wait_settled(&self, phase: &str) {
        let both = vec![self.name(M0), self.name(M1)];
        self.wait(phase, Duration::from_secs(30), || {
            [M0, M1].iter().all(|&i| {
                let v = self.view(i);
                let names: Vec<String> = v.members.as_array().map_or(Vec::new(), |a| {
                    a.iter()
                        .filter_map(|m| m["name"].as_str().map(str::to_string))
                        .collect()
                });
                let other = self.ip(1 - i).to_string();
                names == both
                    && v.proxy_backends.len() == 2
                    && v.vrrp_destinations
                        .iter()
                        .any(|d| d.to_string().contains(&other))
            })
        });
    }
}

/// What the node at status socket `socket` sees: members, VRRP destinations, backends.
fn view_at(socket: &std::path::Path) -> View {
    let st = status_at(AGENT, socket);
    let vrrp_destinations: Vec<serde_json::Value> = st["vrrp"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|inst| serde_json::json!({inst["name"].as_str().unwrap_or_default(): inst["destinations"]}))
                .collect()
        })
        .unwrap_or_default();
    // Empty while the node is still starting its VRRP instances; `wait_settled` waits past
    // that and `watch` insists on a non-empty baseline.
    let mut proxy_backends: Vec<String> = st["proxy"]["backends"]
        .as_array()
        .map(|a| a.iter().map(|b| b["addr"].to_string()).collect())
        .unwrap_or_default();
    proxy_backends.sort();
    View {
        members: st["members"].clone(),
        vrrp_destinations,
        proxy_backends,
    }
}

/// `dig` from namespace `ns` at `server`: the status and the answers for `name`.
fn dig_at(ns: &str, server: Ipv4Addr, name: &str) -> String {
    let text = keelson_testkit::dig::dig_in(
        ns,
        server.into(),
        &[
            "+time=2",
            "+tries=2",
            "+noall",
            "+comments",
            "+answer",
            &format!("{name}.{ZONE}"),
        ],
    );
    // The status line and the answers; not the query id or the timing.
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains("status:") || (!l.starts_with(';') && !l.trim().is_empty()))
        .map(|l| {
            if let Some(i) = l.find("status:") {
                l[i..].split(',').next().unwrap_or("").to_string()
            } else {
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            }
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

/// What [`Net::watch`] saw.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<String>>>,
    views: [View; 2],
    dns: [String; 3],
}

impl Watch {
    /// Ends the watch and asserts that nothing changed at any moment, nor now.
    fn assert_unchanged(mut self, net: &Net) {
        self.stop.store(true, Ordering::Relaxed);
        let seen = self.thread.take().unwrap().join().unwrap();
        assert!(
            seen.is_empty(),
            "changed during the attacks (before: {:?} {:?}): {seen:#?}",
            self.views,
            self.dns
        );
        assert_eq!(
            [net.view(M0), net.view(M1)],
            self.views,
            "members, VRRP destinations or proxy backends changed"
        );
        let names = ["master-0", "master-1", "master-9"];
        assert_eq!(names.map(|n| net.dig(n)), self.dns, "DNS answers changed");
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sleeps until a record signed at `time_ms` is more than the window old.
fn until_stale(time_ms: u64) {
    let stale_at = time_ms + WINDOW_S * 1000 + 1000;
    let now = unix_ms();
    if stale_at > now {
        std::thread::sleep(Duration::from_millis(stale_at - now));
    }
}

// ---- unicast -------------------------------------------------------------------------

/// One captured registration: its bytes and its proof's time and sequence number.
#[derive(Clone, Debug)]
struct Captured {
    body: Vec<u8>,
    time_ms: u64,
    seq: u64,
}

/// The test's registry at the forger's address (the stand-in for a capture): answers every
/// registration with an empty list and hands the bodies over.
struct CaptureRegistry {
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Captured>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CaptureRegistry {
    fn start(net: &Net) -> Self {
        let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_file_iter(net.files.tls.join("server.crt"))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
        let key: rustls::pki_types::PrivateKeyDer<'static> =
            rustls::pki_types::pem::PemObject::from_pem_file(net.files.tls.join("server.key"))
                .unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let bind = SocketAddr::new(IpAddr::V4(net.ip(FORGER)), 22623);
        let stop2 = stop.clone();
        let thread = in_netns(&net.seg.nodes[FORGER], move || {
            let listener = TcpListener::bind(bind).unwrap();
            listener.set_nonblocking(true).unwrap();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((tcp, _)) => {
                        if let Some(c) = serve_one(&config, tcp) {
                            let _ = tx.send(c);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        CaptureRegistry {
            stop,
            rx,
            thread: Some(thread),
        }
    }

    /// The next registration master-1 sends.
    fn next(&self) -> Captured {
        self.rx
            .recv_timeout(Duration::from_secs(15))
            .expect("master-1 registered with the forger's address")
    }

    /// The latest registration received so far (waiting for one if none is queued).
    fn latest(&self) -> Captured {
        let mut last = self.next();
        while let Ok(c) = self.rx.try_recv() {
            last = c;
        }
        last
    }

    fn close(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for CaptureRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Serves one HTTPS request: a registration is answered `[]` and returned.
fn serve_one(config: &Arc<rustls::ServerConfig>, mut tcp: std::net::TcpStream) -> Option<Captured> {
    tcp.set_nonblocking(false).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut conn = rustls::ServerConnection::new(config.clone()).ok()?;
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, length) = loop {
        let n = tls.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (p + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = tls.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let is_registration = buf.starts_with(b"POST /keelson/v1/members ");
    let answer: &[u8] = if is_registration { b"[]" } else { b"" };
    let _ = write!(
        tls,
        "HTTP/1.1 {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        if is_registration {
            "200 OK"
        } else {
            "204 No Content"
        },
        answer.len()
    );
    let _ = tls.write_all(answer);
    let _ = tls.flush();
    conn.send_close_notify();
    let _ = conn.complete_io(&mut tcp);
    if !is_registration {
        return None;
    }
    let body = buf[head_end..head_end + length].to_vec();
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    Some(Captured {
        time_ms: v["auth"]["timeMs"].as_u64()?,
        seq: v["auth"]["seq"].as_u64()?,
        body,
    })
}

/// `curl` from namespace `ns` to master-0's registry: the HTTP status.
fn curl(net: &Net, ns: usize, method: &str, path: &str, body: &[u8]) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body).unwrap();
    let data = format!("@{}", file.path().display());
    let url = format!("https://{}:22623{path}", net.ip(M0));
    let reply = keelson_testkit::http::curl_in(
        &net.seg.nodes[ns],
        &[
            "-k",
            "--max-time",
            "5",
            "-X",
            method,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &data,
            &url,
        ],
    );
    reply.status.to_string()
}

#[test]
fn unicast_forger_without_the_key_changes_nothing() {
    if !can_run() {
        return;
    }
    let mut net = Net::new("kmf-u", Transport::Unicast);
    // master-1 remembers a master at the forger's address (where the test's capture
    // registry listens).
    std::fs::create_dir_all(net.files.state_dir(M1)).unwrap();
    std::fs::write(
        net.files.state_dir(M1).join("members.json"),
        serde_json::json!({
            "cluster": ZONE,
            "members": [{"name": "master-7", "addresses": [net.ip(FORGER)],
                         "lastSeenUnix": unix_ms() / 1000}]
        })
        .to_string(),
    )
    .unwrap();
    let mut capture = CaptureRegistry::start(&net);
    net.start(M0);
    net.start(M1);
    net.wait_ready(&[M0, M1]);
    net.wait_settled("cluster up");
    // Genuine traffic is never dropped.
    let zero = serde_json::json!({"noMac": 0, "badMac": 0, "unknownKey": 0, "stale": 0, "replay": 0, "addressMismatch": 0});
    assert_eq!(net.drops_now(M0), zero);
    assert_eq!(net.auth(M1)["drops"], zero);
    // A registration (not one queued since the start), then the one that makes it no
    // longer one of the last few master-0 accepted (those count as duplicates), and one
    // more: master-1's round with b is over, so master-0 has heard b.
    let a = capture.latest();
    let mut b = capture.next();
    for _ in 0..keelson_agent::members::auth::RECENT {
        b = capture.next();
    }
    assert!(b.seq > a.seq, "{a:?} {b:?}");
    let _c = capture.next();

    let watch = net.watch();

    let path = "/keelson/v1/members";
    let fake = serde_json::json!({"name": "master-9", "role": "master",
        "addresses": [net.ip(FORGER)], "version": env!("CARGO_PKG_VERSION")});
    // 1. A fake master, no MAC.
    let reg = serde_json::json!({"cluster": ZONE, "member": fake});
    assert_eq!(
        curl(&net, FORGER, "POST", path, reg.to_string().as_bytes()),
        "401"
    );
    // 2. A fake master with a made-up MAC (the key ID is no secret).
    let key_id = keelson_cluster::membership::key_id(&net.key);
    let reg = serde_json::json!({"cluster": ZONE, "member": fake, "auth":
        {"keyId": key_id, "timeMs": unix_ms(), "seq": u64::MAX, "mac": "ab".repeat(32)}});
    assert_eq!(
        curl(&net, FORGER, "POST", path, reg.to_string().as_bytes()),
        "401"
    );
    // 3. master-1's registration replayed from the forger's address.
    assert_eq!(curl(&net, FORGER, "POST", path, &b.body), "403");
    // 4. An older one replayed from master-1's address, a newer one heard since.
    eprintln!(
        "replaying a (seq {}, {} ms old; b seq {}, {} ms old)",
        a.seq,
        unix_ms() - a.time_ms,
        b.seq,
        unix_ms() - b.time_ms
    );
    assert_eq!(curl(&net, M1, "POST", path, &a.body), "401");
    // 5. A goodbye for master-1 without a MAC; one carrying a registration's proof.
    let bye = format!("{path}/master-1");
    assert_eq!(curl(&net, FORGER, "DELETE", &bye, b"{}"), "401");
    let reg: serde_json::Value = serde_json::from_slice(&b.body).unwrap();
    let stolen = serde_json::json!({"auth": reg["auth"]});
    assert_eq!(
        curl(&net, M1, "DELETE", &bye, stolen.to_string().as_bytes()),
        "401"
    );
    // 6. A registration replayed from master-1's address once it is older than the window.
    until_stale(b.time_ms);
    assert_eq!(curl(&net, M1, "POST", path, &b.body), "401");

    // Nothing moved, two renewals later.
    std::thread::sleep(Duration::from_secs(2 * RENEW_S + 1));
    watch.assert_unchanged(&net);
    let drops = net.drops_now(M0);
    eprintln!("master-0 drops: {drops}");
    assert_eq!(
        drops,
        serde_json::json!({"noMac": 2, "badMac": 2, "unknownKey": 0, "stale": 1, "replay": 1, "addressMismatch": 1}),
        "every attempt under its reason"
    );
    assert_eq!(net.auth(M1)["drops"], zero, "master-1 was not attacked");

    // master-1 dies just after a registration; the forger replays that last registration
    // from its address: answered (a duplicate) but master-1 is dropped at the expiry.
    let _ = capture.latest();
    let last = capture.next();
    std::thread::sleep(Duration::from_millis(300));
    net.kill(M1);
    capture.close();
    let mut answers = std::collections::BTreeSet::new();
    net.dropped_despite(|| {
        answers.insert(curl(&net, M1, "POST", path, &last.body));
    });
    eprintln!("the replays were answered {answers:?}");
    assert!(
        answers.contains("200"),
        "the replays were not duplicates: {answers:?}"
    );

    // master-1 back: its new records are believed; stopped, its signed goodbye is.
    net.back_and_goodbye();
    let drops = net.drops_now(M0);
    assert_eq!(drops["noMac"], 2, "{drops}");
    assert_eq!(drops["badMac"], 2, "{drops}");
    assert_eq!(drops["addressMismatch"], 1, "{drops}");
}

// ---- mDNS ----------------------------------------------------------------------------

/// A socket on 5353 in the current namespace, sending from `from` (the group joined when
/// `listen`).
fn mdns_socket(from: Ipv4Addr, listen: bool) -> UdpSocket {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_reuse_port(true).unwrap();
    s.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5353).into())
        .unwrap();
    if listen {
        s.join_multicast_v4(&Ipv4Addr::new(224, 0, 0, 251), &from)
            .unwrap();
    }
    s.set_multicast_if_v4(&from).unwrap();
    s.set_multicast_ttl_v4(255).unwrap();
    s.set_multicast_loop_v4(false).unwrap();
    s.into()
}

/// Multicasts `packet` from 5353 in namespace `ns`, from address `from`.
fn mdns_send(net: &Net, ns: usize, packet: Vec<u8>) {
    let from = net.ip(ns);
    in_netns(&net.seg.nodes[ns], move || {
        mdns_socket(from, false)
            .send_to(
                &packet,
                SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 251), 5353),
            )
            .unwrap();
    })
    .join()
    .unwrap();
}

/// The proof items of master-1's TXT record in an mDNS packet, if it carries one with a
/// TTL: (time, seq).
fn master1_proof(packet: &[u8]) -> Option<(u64, u64)> {
    use hickory_proto::rr::RData;
    let msg = hickory_proto::op::Message::from_vec(packet).ok()?;
    msg.answers.iter().find_map(|r| {
        let RData::TXT(txt) = &r.data else {
            return None;
        };
        if r.ttl == 0 || !r.name.to_ascii().starts_with("master-1._keelson") {
            return None;
        }
        let item = |k: &str| {
            txt.txt_data.iter().find_map(|d| {
                std::str::from_utf8(d)
                    .ok()?
                    .strip_prefix(k)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        };
        Some((item("time=")?, item("seq=")?))
    })
}

/// One announcement of master-1: the packet, its proof's time and sequence number.
type Heard = (Vec<u8>, u64, u64);

/// The forger's ear on the segment: every announcement of master-1, in order.
struct Sniffer {
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Heard>,
    /// The last one taken from `rx`.
    last: std::cell::RefCell<Option<Heard>>,
}

impl Sniffer {
    fn start(net: &Net) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let from = net.ip(FORGER);
        let stop2 = stop.clone();
        in_netns(&net.seg.nodes[FORGER], move || {
            let sock = mdns_socket(from, true);
            sock.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 9000];
            while !stop2.load(Ordering::Relaxed) {
                if let Ok((n, _)) = sock.recv_from(&mut buf)
                    && let Some((time, seq)) = master1_proof(&buf[..n])
                {
                    let _ = tx.send((buf[..n].to_vec(), time, seq));
                }
            }
        });
        Sniffer {
            stop,
            rx,
            last: std::cell::RefCell::new(None),
        }
    }

    /// The next announcement of master-1 with a sequence number above `after`.
    fn next_after(&self, after: u64) -> Heard {
        loop {
            let c = self
                .rx
                .recv_timeout(Duration::from_secs(15))
                .expect("master-1 announces");
            *self.last.borrow_mut() = Some(c.clone());
            if c.2 > after {
                return c;
            }
        }
    }

    /// The latest announcement heard so far (waiting for one if none was).
    fn latest(&self) -> Heard {
        while let Ok(c) = self.rx.try_recv() {
            *self.last.borrow_mut() = Some(c);
        }
        let last = self.last.borrow().clone();
        last.unwrap_or_else(|| self.next_after(0))
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// An announcement of a fake master at the forger's address: unsigned, or signed with a key
/// the forger made up but claiming the cluster key's ID.
fn fake_master(net: &Net, claimed_key_id: Option<&str>) -> Vec<u8> {
    use keelson_agent::members::mdns::Announce;
    let announce = Announce {
        member: keelson_agent::member::Member {
            name: "master-9".parse().unwrap(),
            role: keelson_cluster::Role::Master,
            addresses: vec![IpAddr::V4(net.ip(FORGER))],
            version: env!("CARGO_PKG_VERSION").into(),
        },
        zone: ZONE.into(),
        port: 22623,
        ttl: EXPIRY_S as u32,
    };
    let Some(claimed) = claimed_key_id else {
        return announce.packet(EXPIRY_S as u32).unwrap();
    };
    let made_up = Arc::new(keelson_agent::members::auth::Keys::from_raw(&[vec![
        0x5a;
        32
    ]]));
    let signer = keelson_agent::members::auth::Signer::new(made_up.clone(), SystemTime::now());
    let packet = announce
        .packet_signed(EXPIRY_S as u32, Some(&signer), SystemTime::now())
        .unwrap();
    // The same length: swap the made-up key's ID for the cluster's in the bytes.
    let ours = format!("kid={}", made_up.signing_id());
    let theirs = format!("kid={claimed}");
    let at = packet
        .windows(ours.len())
        .position(|w| w == ours.as_bytes())
        .unwrap();
    let mut packet = packet;
    packet[at..at + theirs.len()].copy_from_slice(theirs.as_bytes());
    packet
}

/// The drop counts of `now` less those of `base`, reason by reason.
fn since(now: &serde_json::Value, base: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (reason, n) in now.as_object().expect("drop counts are an object") {
        let before = base[reason].as_u64().unwrap_or(0);
        out.insert(reason.clone(), (n.as_u64().unwrap_or(0) - before).into());
    }
    out.into()
}

/// `packet` with every TTL 0: a goodbye.
fn as_goodbye(packet: &[u8]) -> Vec<u8> {
    let mut msg = hickory_proto::op::Message::from_vec(packet).unwrap();
    for r in &mut msg.answers {
        r.ttl = 0;
    }
    msg.to_vec().unwrap()
}

#[test]
fn mdns_forger_without_the_key_changes_nothing() {
    if !can_run() {
        return;
    }
    let mut net = Net::new("kmf-m", Transport::Mdns);
    let sniffer = Sniffer::start(&net);
    net.start(M0);
    net.start(M1);
    net.wait_ready(&[M0, M1]);
    net.wait_settled("cluster up");
    // Genuine announcements are never dropped for their key, MAC, time or address (IPv4
    // and IPv6 copies included). A `replay` of a genuine one can happen at start-up: two
    // records signed a moment apart (an announcement and an answer to the other node's
    // query) can leave in the other order, and the older, never accepted, is then below
    // the newest (a false alarm, renewing nothing; noted for a fix on the sending side).
    // The counts below are taken over this start.
    let base0 = net.drops_now(M0);
    let base1 = net.auth(M1)["drops"].clone();
    for (node, base) in [("master-0", &base0), ("master-1", &base1)] {
        let mut keyed = base.clone();
        let replays = keyed["replay"].take().as_u64().unwrap_or(0);
        assert_eq!(
            keyed,
            serde_json::json!({"noMac": 0, "badMac": 0, "unknownKey": 0, "stale": 0, "replay": null, "addressMismatch": 0}),
            "{node}: genuine announcements dropped"
        );
        assert!(
            replays <= 2,
            "{node}: {replays} genuine announcements dropped as replays"
        );
    }
    // An announcement, then the one that makes it no longer one of the last few master-0
    // accepted (those count as duplicates).
    let (a, _, a_seq) = sniffer.latest();
    let mut b = sniffer.next_after(a_seq);
    for _ in 0..keelson_agent::members::auth::RECENT {
        b = sniffer.next_after(b.2);
    }
    let (b, b_time, b_seq) = b;
    // master-0 heard b too (it is multicast); give it a moment.
    std::thread::sleep(Duration::from_millis(300));

    let watch = net.watch();

    let key_id = keelson_cluster::membership::key_id(&net.key);
    // 1. A fake master, no MAC.
    mdns_send(&net, FORGER, fake_master(&net, None));
    // 2. A fake master with a made-up MAC under the cluster key's ID.
    mdns_send(&net, FORGER, fake_master(&net, Some(&key_id)));
    // 3. master-1's announcement replayed from the forger's address.
    mdns_send(&net, FORGER, b.clone());
    // 4. An older one replayed from master-1's address, a newer one heard since.
    mdns_send(&net, M1, a.clone());
    // 5. The announcement turned into a goodbye (every TTL 0), from master-1's address.
    mdns_send(&net, M1, as_goodbye(&b));
    // 6. Replayed from master-1's address once it is older than the window.
    until_stale(b_time);
    mdns_send(&net, M1, b.clone());

    std::thread::sleep(Duration::from_secs(2 * RENEW_S + 1));
    watch.assert_unchanged(&net);
    let drops = net.drops_now(M0);
    eprintln!("master-0 drops: {drops} (b was seq {b_seq})");
    assert_eq!(
        since(&drops, &base0),
        serde_json::json!({"noMac": 1, "badMac": 2, "unknownKey": 0, "stale": 1, "replay": 1, "addressMismatch": 1}),
        "every attempt under its reason"
    );
    // master-1 heard the fake master too (its own records it ignores).
    assert_eq!(
        since(&net.auth(M1)["drops"], &base1),
        serde_json::json!({"noMac": 1, "badMac": 1, "unknownKey": 0, "stale": 0, "replay": 0, "addressMismatch": 0})
    );

    // master-1 dies; the forger replays its last announcement from its address over and
    // over: master-1 is dropped at the expiry all the same.
    let _ = sniffer.next_after(sniffer.latest().2);
    std::thread::sleep(Duration::from_millis(300));
    net.kill(M1);
    std::thread::sleep(Duration::from_millis(100));
    let (last, _, _) = sniffer.latest();
    net.dropped_despite(|| mdns_send(&net, M1, last.clone()));

    // master-1 back: its new announcements are believed; stopped, its signed goodbye is.
    net.back_and_goodbye();
    let drops = net.drops_now(M0);
    assert_eq!(drops["noMac"], 1, "{drops}");
    assert_eq!(drops["badMac"], 2, "{drops}");
}
