//! The DNS server checked with `dig` over UDP and TCP on loopback, forwarding to a dnsmasq
//! the test starts, to a dead upstream and to one that answers garbage, and fed malformed
//! packets through a raw socket.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keelson_testkit::dig::{answers, dig, section, status};
use keelson_testkit::{Proc, free_port, require};

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");

/// Starts `keelson-agent dns` on 127.0.0.1 with a free port; returns it and its address.
fn start_dns(dir: &Path, members: &str, upstreams: &[SocketAddr]) -> (Proc, SocketAddr) {
    start_dns_with(dir, CLUSTER, members, upstreams)
}

/// [`start_dns`] with another cluster.json.
fn start_dns_with(
    dir: &Path,
    cluster_json: &str,
    members: &str,
    upstreams: &[SocketAddr],
) -> (Proc, SocketAddr) {
    let cluster = dir.join("cluster.json");
    std::fs::write(&cluster, cluster_json).unwrap();
    let members_path = dir.join("members.json");
    std::fs::write(&members_path, members).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keelson-agent"));
    cmd.args(["dns", "--listen", "127.0.0.1:0", "--cluster"])
        .arg(&cluster)
        .arg("--members")
        .arg(&members_path);
    for u in upstreams {
        cmd.arg("--upstream").arg(u.to_string());
    }
    let mut proc = Proc::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()));
    let stdout = proc.0.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no listen line from agent: {line:?}"));
    (proc, addr)
}

/// Starts dnsmasq answering `*.example.test` with 192.0.2.1 and a large TXT at
/// `big.example.test` (over 1232 bytes: it truncates over UDP).
fn start_dnsmasq() -> (Proc, SocketAddr) {
    let port = free_port();
    let mut cmd = Command::new("dnsmasq");
    // Nothing of the machine's own dnsmasq configuration (/etc/dnsmasq.conf, which an
    // OpenStack install may fill): only what this test says.
    cmd.args([
        "--conf-file=/dev/null",
        "--no-daemon",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--listen-address=127.0.0.1",
        "--pid-file=",
        "--user=root",
        "--local-ttl=300",
        "--address=/example.test/192.0.2.1",
    ])
    .arg(format!("--port={port}"));
    for i in 0..12 {
        let chunk = format!("{i:02}").repeat(100);
        cmd.arg(format!("--txt-record=big.example.test,{chunk}"));
    }
    let proc = Proc::spawn(cmd.stdout(Stdio::null()).stderr(Stdio::null()));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Wait until it answers.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let out = dig(addr, &["+time=1", "+tries=1", "a.example.test", "A"]);
        if out.contains("192.0.2.1") {
            return (proc, addr);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("dnsmasq did not start on {addr}");
}

fn members_json() -> String {
    serde_json::json!([
        {"name": "master-0", "role": "master", "addresses": ["10.0.0.10", "fd00::10"], "version": "0.1.0"},
        {"name": "master-1", "role": "master", "addresses": ["10.0.0.11"], "version": "0.1.0"},
        {"name": "worker-0", "role": "worker", "addresses": ["10.0.0.20"], "version": "0.1.0"}
    ])
    .to_string()
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `api` answered with the API VIP over `transport` (`+notcp` or `+tcp`).
fn assert_api(addr: SocketAddr, transport: &str) {
    let out = dig(
        addr,
        &[
            transport,
            "+time=2",
            "+tries=1",
            "api.ocp4.example.com",
            "A",
        ],
    );
    assert_eq!(
        answers(&out),
        ["api.ocp4.example.com. 60 A 10.0.0.5"],
        "{out}"
    );
}

fn authority_soa(out: &str) -> bool {
    out.lines().any(|l| l.starts_with(";; AUTHORITY SECTION"))
        && out
            .lines()
            .any(|l| l.contains("\tSOA\t") && l.starts_with("ocp4.example.com."))
}

#[test]
fn authoritative_rules_udp_and_tcp() {
    if !require("dig") {
        return;
    }
    let dir = tmpdir();
    let (_dns, addr) = start_dns(dir.path(), &members_json(), &[]);
    for transport in ["+notcp", "+tcp"] {
        let q = |name: &str, t: &str| dig(addr, &[transport, "+time=2", "+tries=1", name, t]);

        let out = q("api.ocp4.example.com", "A");
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert!(out.contains("flags: qr aa"), "authoritative flag: {out}");
        assert_eq!(answers(&out), ["api.ocp4.example.com. 60 A 10.0.0.5"]);

        let out = q("api-int.ocp4.example.com", "A");
        assert_eq!(answers(&out), ["api-int.ocp4.example.com. 60 A 10.0.0.5"]);

        // The other family: NOERROR, no answer, SOA in authority.
        let out = q("api.ocp4.example.com", "AAAA");
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert!(answers(&out).is_empty(), "{out}");
        assert!(authority_soa(&out), "{out}");

        // Unknown name in the zone: NXDOMAIN with SOA.
        let out = q("nothing.ocp4.example.com", "A");
        assert_eq!(status(&out), "NXDOMAIN", "{out}");
        assert!(authority_soa(&out), "{out}");

        // *.apps at any depth, case-insensitive.
        let out = q("console-openshift-console.apps.ocp4.example.com", "A");
        assert_eq!(
            answers(&out),
            ["console-openshift-console.apps.ocp4.example.com. 60 A 10.0.0.7"]
        );
        let out = q("a.b.c.APPS.Ocp4.Example.COM", "A");
        assert_eq!(answers(&out).len(), 1, "{out}");
        assert!(answers(&out)[0].ends_with("A 10.0.0.7"), "{out}");

        // Nodes: FQDN (both families) and short name.
        let out = q("master-0.ocp4.example.com", "A");
        assert_eq!(answers(&out), ["master-0.ocp4.example.com. 60 A 10.0.0.10"]);
        let out = q("MASTER-0.ocp4.example.com", "AAAA");
        assert_eq!(
            answers(&out),
            ["MASTER-0.ocp4.example.com. 60 AAAA fd00::10"]
        );
        let out = q("worker-0", "A");
        assert_eq!(answers(&out), ["worker-0. 60 A 10.0.0.20"]);
        let out = q("worker-0.ocp4.example.com", "AAAA");
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert!(answers(&out).is_empty() && authority_soa(&out), "{out}");
    }
    // EDNS: the response carries an OPT with our size.
    let out = dig(addr, &["+bufsize=4096", "api.ocp4.example.com", "A"]);
    assert!(
        out.contains("EDNS: version: 0") && out.contains("udp: 1232"),
        "{out}"
    );
    let out = dig(addr, &["+noedns", "api.ocp4.example.com", "A"]);
    assert!(!out.contains("OPT PSEUDOSECTION"), "{out}");
    // A name outside the zone with no upstream: SERVFAIL, not a hang.
    let out = dig(addr, &["+time=4", "+tries=1", "www.example.org", "A"]);
    assert_eq!(status(&out), "SERVFAIL", "{out}");
}

/// `n` dual-stack masters `master-<i>` for members.json.
fn masters_json(n: usize) -> String {
    let list: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "name": format!("master-{i}"), "role": "master",
                "addresses": [format!("10.0.1.{}", 10 + i), format!("fd00::1:{}", 10 + i)],
                "version": "0.1.0"
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

#[test]
fn etcd_srv_with_addresses_and_the_size_rules() {
    if !require("dig") {
        return;
    }
    let with_etcd = |masters: usize| {
        CLUSTER.replace(
            r#""manageResolvConf": false }"#,
            &format!(
                r#""manageResolvConf": false, "etcd": {{"enabled": true, "masters": {masters}}} }}"#
            ),
        )
    };
    let srv = "_etcd-server-ssl._tcp.ocp4.example.com";
    let dir = tmpdir();
    let (_dns, addr) = start_dns_with(dir.path(), &with_etcd(3), &masters_json(3), &[]);
    for args in [&["+notcp", "+noedns"][..], &["+notcp"], &["+tcp"]] {
        let q = |name: &str, t: &str| {
            let mut a = args.to_vec();
            a.extend(["+time=2", "+tries=1", "+ignore", name, t]);
            dig(addr, &a)
        };
        let out = q(srv, "SRV");
        assert!(
            out.contains("flags: qr aa") && !out.contains(" tc"),
            "{out}"
        );
        assert_eq!(
            section(&out, "ANSWER"),
            (0..3)
                .map(|i| format!("{srv}. 60 SRV 0 10 2380 etcd-{i}.ocp4.example.com."))
                .collect::<Vec<_>>(),
            "{out}"
        );
        let extra = section(&out, "ADDITIONAL");
        for i in 0..3 {
            for want in [
                format!("etcd-{i}.ocp4.example.com. 60 A 10.0.1.{}", 10 + i),
                format!("etcd-{i}.ocp4.example.com. 60 AAAA fd00::1:{}", 10 + i),
            ] {
                assert!(extra.contains(&want), "{want} in {out}");
            }
        }
        let out = q("etcd-2.ocp4.example.com", "A");
        assert_eq!(
            section(&out, "ANSWER"),
            ["etcd-2.ocp4.example.com. 60 A 10.0.1.12"]
        );
        let out = q("_etcd-client-ssl._tcp.ocp4.example.com", "SRV");
        assert_eq!(section(&out, "ANSWER").len(), 3, "{out}");
        assert!(out.contains("2379 etcd-0.ocp4.example.com."), "{out}");
    }

    // 24 dual-stack masters: 24 SRV records do not fit 512 bytes (TC, nothing but the
    // question); they fit EDNS's 1232 with some of their 48 address records and no TC; TCP
    // carries everything.
    let dir = tmpdir();
    let (_dns, addr) = start_dns_with(dir.path(), &with_etcd(24), &masters_json(24), &[]);
    let out = dig(
        addr,
        &["+notcp", "+noedns", "+ignore", "+time=2", srv, "SRV"],
    );
    assert!(out.contains(" tc"), "expected TC: {out}");
    assert!(section(&out, "ANSWER").is_empty(), "{out}");
    let out = dig(
        addr,
        &["+notcp", "+bufsize=1232", "+ignore", "+time=2", srv, "SRV"],
    );
    assert!(
        !out.contains(" tc"),
        "additional records go before TC: {out}"
    );
    assert_eq!(section(&out, "ANSWER").len(), 24, "{out}");
    let extra = section(&out, "ADDITIONAL");
    assert!(
        !extra.is_empty() && extra.len() < 48,
        "{} additional: {out}",
        extra.len()
    );
    assert!(
        out.contains("MSG SIZE  rcvd: 1") && !out.contains("rcvd: 0"),
        "{out}"
    );
    let size: usize = out
        .split("MSG SIZE  rcvd: ")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap();
    assert!(size <= 1232, "{size}");
    let out = dig(addr, &["+tcp", "+time=2", srv, "SRV"]);
    assert_eq!(section(&out, "ANSWER").len(), 24, "{out}");
    assert_eq!(section(&out, "ADDITIONAL").len(), 48, "{out}");
    // Without +ignore, dig (as any stub) retries a TC answer over TCP and gets it all.
    let out = dig(addr, &["+noedns", "+time=2", srv, "SRV"]);
    assert_eq!(section(&out, "ANSWER").len(), 24, "{out}");
}

#[test]
fn forwards_with_cache_and_truncation() {
    if !require("dig") || !require("dnsmasq") {
        return;
    }
    let dir = tmpdir();
    let (mut upstream, up_addr) = start_dnsmasq();
    let (_dns, addr) = start_dns(dir.path(), "[]", &[up_addr]);

    for transport in ["+notcp", "+tcp"] {
        let out = dig(
            addr,
            &[transport, "+time=3", "+tries=1", "host.example.test", "A"],
        );
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert!(out.contains("192.0.2.1"), "{out}");
        assert!(
            !out.contains("flags: qr aa"),
            "forwarded answers are not authoritative: {out}"
        );
    }

    // Large answer: over UDP without EDNS the client gets TC and the question only; over
    // TCP the whole answer; with EDNS 1232 still TC (it is bigger than that).
    let out = dig(
        addr,
        &[
            "+notcp",
            "+noedns",
            "+ignore",
            "+time=3",
            "+tries=1",
            "big.example.test",
            "TXT",
        ],
    );
    assert!(out.contains(" tc"), "expected TC: {out}");
    assert!(answers(&out).is_empty(), "{out}");
    let out = dig(
        addr,
        &[
            "+notcp",
            "+bufsize=1232",
            "+ignore",
            "+time=3",
            "+tries=1",
            "big.example.test",
            "TXT",
        ],
    );
    assert!(out.contains(" tc"), "expected TC with EDNS 1232: {out}");
    let out = dig(
        addr,
        &["+tcp", "+time=3", "+tries=1", "big.example.test", "TXT"],
    );
    assert_eq!(answers(&out).len(), 12, "{out}");
    // Without +ignore dig retries over TCP itself and gets everything.
    let out = dig(addr, &["+time=3", "+tries=1", "big.example.test", "TXT"]);
    assert_eq!(answers(&out).len(), 12, "{out}");

    // The cache answers once the upstream is gone, with the TTL counting down.
    drop(upstream.0.kill());
    let _ = upstream.0.wait();
    std::thread::sleep(Duration::from_millis(1100));
    let out = dig(addr, &["+time=3", "+tries=1", "host.example.test", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    let rec = &answers(&out)[0];
    let ttl: u32 = rec.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(
        (290..300).contains(&ttl),
        "ttl should count down from 300: {rec}"
    );
    // Not cached, upstream dead: SERVFAIL.
    let out = dig(addr, &["+time=5", "+tries=1", "other.example.test", "A"]);
    assert_eq!(status(&out), "SERVFAIL", "{out}");
}

/// A UDP "upstream" that never answers, and one that answers garbage.
fn bad_upstreams() -> (UdpSocket, SocketAddr, SocketAddr) {
    let dead = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    let garbage = UdpSocket::bind("127.0.0.1:0").unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, peer)) = garbage.recv_from(&mut buf) {
            // Echo the id with QR set, then nonsense.
            let mut resp = vec![
                buf[0], buf[1], 0x81, 0x80, 0, 1, 0, 5, 0, 0, 0, 0, 0xc0, 0x0c,
            ];
            resp.extend_from_slice(&buf[12..n.min(20)]);
            let _ = garbage.send_to(&resp, peer);
        }
    });
    (dead, dead_addr, garbage_addr)
}

#[test]
fn dead_and_garbage_upstreams_servfail_then_fallback() {
    if !require("dig") || !require("dnsmasq") {
        return;
    }
    let dir = tmpdir();
    let (_dead, dead, garbage) = bad_upstreams();
    let (_dns, addr) = start_dns(dir.path(), "[]", &[dead, garbage]);
    let t = Instant::now();
    let out = dig(addr, &["+time=8", "+tries=1", "www.example.test", "A"]);
    assert_eq!(status(&out), "SERVFAIL", "{out}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "SERVFAIL took {:?}",
        t.elapsed()
    );
    // The zone is still answered meanwhile.
    let out = dig(addr, &["+time=2", "+tries=1", "api.ocp4.example.com", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");

    // Dead and garbage first, a good one last: the answer comes from the last.
    let dir2 = tmpdir();
    let (_up, good) = start_dnsmasq();
    let (_dns2, addr2) = start_dns(dir2.path(), "[]", &[dead, garbage, good]);
    let out = dig(addr2, &["+time=8", "+tries=1", "www.example.test", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert!(out.contains("192.0.2.1"), "{out}");
}

fn raw_exchange(sock: &UdpSocket, server: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    sock.send_to(packet, server).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv_from(&mut buf) {
        Ok((n, _)) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

#[test]
fn malformed_packets_then_good_query() {
    if !require("dig") {
        return;
    }
    let dir = tmpdir();
    let (_dns, addr) = start_dns(dir.path(), &members_json(), &[]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let rcode = |r: &[u8]| r[3] & 0x0f;

    // Runt: dropped.
    assert_eq!(raw_exchange(&sock, addr, &[1, 2, 3]), None);
    // A response (QR set): dropped, never answered (no reflection).
    let mut resp = vec![0x10, 0x01, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(raw_exchange(&sock, addr, &resp), None);
    // Zero questions: FORMERR.
    resp[2] = 0x01;
    resp[3] = 0;
    let r = raw_exchange(&sock, addr, &resp).expect("answer to zero questions");
    assert_eq!(rcode(&r), 1);
    assert_eq!(&r[..2], &[0x10, 0x01]);
    // Two questions: FORMERR.
    let mut two = vec![0x10, 0x02, 0x01, 0x00, 0, 2, 0, 0, 0, 0, 0, 0];
    for _ in 0..2 {
        two.extend_from_slice(b"\x03api\x04ocp4\x07example\x03com\x00\x00\x01\x00\x01");
    }
    assert_eq!(rcode(&raw_exchange(&sock, addr, &two).unwrap()), 1);
    // Compression loop: FORMERR.
    let looped = [
        0x10, 0x03, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1,
    ];
    assert_eq!(rcode(&raw_exchange(&sock, addr, &looped).unwrap()), 1);
    // Name over 255 bytes: FORMERR.
    let mut long = vec![0x10, 0x04, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for _ in 0..5 {
        long.push(63);
        long.extend(std::iter::repeat_n(b'x', 63));
    }
    long.extend_from_slice(&[0, 0, 1, 0, 1]);
    assert_eq!(rcode(&raw_exchange(&sock, addr, &long).unwrap()), 1);
    // Truncated question: FORMERR.
    let cut = [
        0x10, 0x05, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'p',
    ];
    assert_eq!(rcode(&raw_exchange(&sock, addr, &cut).unwrap()), 1);
    // Unknown opcode (STATUS): NOTIMP.
    let mut status_op = vec![0x10, 0x06, 0x10, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    status_op.extend_from_slice(b"\x03api\x04ocp4\x07example\x03com\x00\x00\x01\x00\x01");
    assert_eq!(rcode(&raw_exchange(&sock, addr, &status_op).unwrap()), 4);
    // Random junk, a lot of it.
    for i in 0..200u32 {
        let junk: Vec<u8> = (0..(i % 90 + 12))
            .map(|j| (i * 31 + j * 7) as u8 & 0x7f)
            .collect();
        sock.send_to(&junk, addr).unwrap();
    }
    // Still answering.
    assert_api(addr, "+notcp");
    assert_api(addr, "+tcp");
}

#[test]
fn tcp_connection_limit_protects_the_server() {
    if !require("dig") {
        return;
    }
    let dir = tmpdir();
    let (_dns, addr) = start_dns(dir.path(), &members_json(), &[]);
    // 256 idle clients hold every TCP slot.
    let idle: Vec<std::net::TcpStream> = (0..256)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let out = dig(
        addr,
        &["+tcp", "+time=2", "+tries=1", "api.ocp4.example.com", "A"],
    );
    assert!(
        answers(&out).is_empty(),
        "the 257th connection is closed: {out}"
    );
    // UDP is unaffected.
    assert_api(addr, "+notcp");
    // Slots come back when the idle clients go.
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    assert_api(addr, "+tcp");
}
