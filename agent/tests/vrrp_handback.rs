//! Connections across a clean hand-over (docs/vrrp.md, `vrrp::handback`). Two masters in
//! namespaces on a bridge run `keelson-agent run` (members, vrrp, proxy, ignition: the
//! members registry) with the
//! `cluster.json` `keelson build` writes, `handbackSecs` 30 as it writes for bare metal
//! (the example install-config is OpenStack's, where it is off), the member timers
//! shortened and the proxy's backend check a TCP connect; beside each agent a plain
//! HTTP/1.1 keep-alive server on `*:6443` (so the proxy redirects VIP:6443 past it with
//! nftables, as on RHCOS). A client namespace on the same bridge:
//!
//! 1. opens one keep-alive connection through VIP:6443 and is answered on it;
//! 2. the holder's agent is stopped (SIGTERM): it says goodbye, the other master takes the
//!    VIP over, and the old holder retires the VIP (off its interface, a policy rule still
//!    delivering what arrives for it);
//! 3. the client sends its next request on the same connection, now that hosts send to the
//!    new holder: it must be answered. Without the hand-back the new holder, which has no
//!    socket for that connection, resets it (checked by hand with `handbackSecs` 0: the
//!    read fails with "connection reset by peer");
//! 4. the client forgets the VIP's MAC and asks again: only the new holder answers ARP
//!    (the old one's retirement rule names TCP, so ARP does not take the VIP for local
//!    there); a new connection is answered by the new holder; once the old holder's agent
//!    has exited, no retirement is left in its namespace.
//!
//! The second test takes the same steps for an IPv6 VIP with the agent's own parts and no
//! agent (the `RunNet` harness is IPv4): the old holder's retirement
//! (`VipManager::retire`) and the new holder's forwarding (`Handback::forward_to`), so the
//! kernel paths IPv6 takes (`ip -6 rule ... ipproto tcp`, a `local` route in the retired
//! table, `fwd ip6`, neighbour discovery instead of ARP) are proven too.
//!
//! Needs root (namespaces) and nftables.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use keelson_testkit::agent::RunNet;
use keelson_testkit::netns::{bind_tcp_in, in_netns};
use keelson_testkit::{Segment, require, require_root};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const VIP: &str = "10.0.0.5";

/// `keelson build`'s cluster.json for examples/install-config.yaml with hand-backs on (as
/// for bare metal), a TCP backend check and member timers of a test.
fn cluster_json() -> serde_json::Value {
    let text = include_str!("../../examples/install-config.yaml");
    let ic = keelson_cluster::install_config::InstallConfig::parse(text).unwrap();
    assert_eq!(ic.platform, "openstack");
    assert_eq!(ic.handback_secs(), 0, "off on OpenStack (port security)");
    let mut c = serde_json::to_value(ic.cluster_config()).unwrap();
    let api = &mut c["vrrp"]["instances"][0];
    assert_eq!(api["name"], "api");
    assert!(api.get("handbackSecs").is_none(), "{api}");
    api["handbackSecs"] = 30.into();
    // Only the proxy's check moves the priority: the servers here speak plain HTTP.
    let proxy_check: Vec<serde_json::Value> = api["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["check"]["type"] == "proxyHealthyBackend")
        .cloned()
        .collect();
    assert_eq!(proxy_check.len(), 1, "{api}");
    api["checks"] = proxy_check.into();
    c["api"]["check"] = "tcp".into();
    c["members"]["renewIntervalSecs"] = 1.into();
    c["members"]["expirySecs"] = 10.into();
    c
}

/// A keep-alive HTTP/1.1 server on `*:6443` in namespace `ns` answering every request
/// with `name`.
fn serve(ns: &str, name: &'static str) {
    serve_on(ns, "0.0.0.0:6443".parse().unwrap(), name);
}

/// A keep-alive HTTP/1.1 server on `addr` in namespace `ns` answering every request with
/// `name`.
fn serve_on(ns: &str, addr: SocketAddr, name: &'static str) {
    let listener = bind_tcp_in(ns, addr);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    // One request: lines up to the empty one.
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
                        name.len()
                    );
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// One request on `conn`; the body of the answer.
fn request(conn: &mut TcpStream) -> std::io::Result<String> {
    conn.write_all(b"GET / HTTP/1.1\r\nHost: api\r\n\r\n")?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&head)),
            ));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {head:?}"));
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// A connection to VIP:6443 from namespace `ns`.
fn connect(ns: &str) -> TcpStream {
    connect_to(ns, format!("{VIP}:6443").parse().unwrap())
}

/// A connection to `addr` from namespace `ns`.
fn connect_to(ns: &str, addr: SocketAddr) -> TcpStream {
    let conn = in_netns(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    })
    .join()
    .unwrap()
    .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn
}

/// Whether namespace `ns` has the VIP retired: its policy rule (`to VIP lookup 27493`,
/// the agent's table of retired VIPs) is there.
fn retired(ns: &str) -> bool {
    retired_vip(ns, VIP.parse().unwrap())
}

/// Whether namespace `ns` has `vip` retired (its family's rule).
fn retired_vip(ns: &str, vip: std::net::IpAddr) -> bool {
    let family = if vip.is_ipv6() { "-6" } else { "-4" };
    keelson_testkit::sh(&["ip", "-n", ns, family, "rule", "show"])
        .lines()
        .any(|l| l.contains(&format!("to {vip} ")) && l.contains("lookup 27493"))
}

/// Counts, in namespace `ns`, the ARP replies the node sends for `VIP`.
fn count_arp_replies(ns: &str) {
    keelson_testkit::segment::nft(
        ns,
        &format!(
            "table arp keelson_test {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  arp operation reply arp saddr ip {VIP} counter\n }}\n}}\n"
        ),
    );
}

/// The ARP replies for `VIP` namespace `ns` sent since [`count_arp_replies`].
fn arp_replies(ns: &str) -> u64 {
    let text = keelson_testkit::sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "nft",
        "list",
        "table",
        "arp",
        "keelson_test",
    ]);
    text.split("counter packets ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {text:?}"))
}

#[test]
fn a_clean_hand_over_keeps_the_old_holders_connections() {
    if !require_root() || !require("nft") {
        return;
    }
    let seg = Segment::ipv4_only("khb", 3, 0);
    let client = seg.nodes[2].clone();
    serve(&seg.nodes[0], "master-0");
    serve(&seg.nodes[1], "master-1");
    let nodes = [
        ("master-0", "master"),
        ("master-1", "master"),
        ("client", "worker"),
    ];
    let mut net = RunNet::new(
        AGENT,
        seg,
        cluster_json(),
        &nodes,
        "members,vrrp,proxy,ignition",
    );
    net.start(0);
    net.start(1);
    net.wait_ready(&[0, 1]);
    let old = net
        .seg
        .wait_sole_holder_among(VIP, &[0, 1], Duration::from_secs(30));
    let new = 1 - old;
    // Both proxies see both backends up before the test goes on.
    net.wait(
        "each proxy with 2 backends up",
        Duration::from_secs(30),
        || {
            [0, 1].iter().all(|&i| {
                net.status(i)["proxy"]["backends"]
                    .as_array()
                    .is_some_and(|b| b.iter().filter(|b| b["state"] == "up").count() == 2)
            })
        },
    );

    // 1. One keep-alive connection through the holder.
    let mut conn = connect(&client);
    let first = request(&mut conn).expect("the first request");
    assert!(first.starts_with("master-"), "{first}");

    // 2. The holder stops cleanly; the other takes the VIP over.
    net.nodes[old].as_mut().unwrap().proc.signal_term();
    net.seg.wait_sole_holder(new, VIP, Duration::from_secs(15));
    if !retired(&net.seg.nodes[old]) {
        net.dump();
        panic!("the old holder retired {VIP}");
    }

    // 3. The next request on the old holder's connection, now that hosts send to the new
    // holder, is answered.
    let second = request(&mut conn).unwrap_or_else(|e| {
        net.dump();
        panic!("the request on the old holder's connection after the hand-over: {e}")
    });
    assert_eq!(second, first, "the same connection, the same backend");
    let log = std::fs::read_to_string(&net.nodes[new].as_ref().unwrap().log).unwrap();
    assert!(
        log.contains(&format!("go to {} (the holder leaving)", net.seg.ip4(old))),
        "the new holder forwarded to the old one:\n{log}"
    );

    // 4. New connections go to the new holder, and only it answers ARP for the VIP: the
    // client forgets the VIP's MAC and asks again while the old holder is retired.
    count_arp_replies(&net.seg.nodes[old]);
    count_arp_replies(&net.seg.nodes[new]);
    keelson_testkit::cmd::sh(&["ip", "-n", &client, "neigh", "flush", "to", VIP]);
    let mut fresh = connect(&client);
    request(&mut fresh).expect("a new connection after the hand-over");
    assert!(retired(&net.seg.nodes[old]), "still retired while asked");
    assert!(
        arp_replies(&net.seg.nodes[new]) >= 1,
        "the new holder answered ARP"
    );
    assert_eq!(
        arp_replies(&net.seg.nodes[old]),
        0,
        "the old holder answered ARP for its retired VIP"
    );
    drop(conn);
    let node = net.nodes[old].as_mut().unwrap();
    net_wait_exit(node);
    assert!(
        !retired(&net.seg.nodes[old]),
        "no retired VIP left once the old holder's agent exited"
    );
}

/// Waits (up to 15 s: the agent's 10 s stop deadline and slack) for a stopped agent to exit.
fn net_wait_exit(node: &mut keelson_testkit::agent::RunNode) {
    keelson_testkit::wait_for_ok(
        "the stopped agent's exit",
        Duration::from_secs(15),
        || match node.proc.0.try_wait().unwrap() {
            Some(_) => Ok(()),
            None => Err(format!("still running:\n{}", node.log_tail(30))),
        },
    );
}

/// The retirement and the forwarding for an IPv6 VIP, step by step as the VRRP runner takes
/// them (the old holder's, the new holder's), on three IPv6-only namespaces: a keep-alive
/// connection the old holder opened survives hosts switching to the new holder, only the
/// new holder answers neighbour solicitations for the VIP, new connections go to it, and
/// its own connections from the VIP are not forwarded.
/// Twice: forwarding to the old holder's global address (unicast VRRP's adverts come from
/// it) and to its link-local one (multicast IPv6 adverts do).
#[test]
fn an_ipv6_vip_hands_back_the_same_way() {
    if !require_root() || !require("nft") || !require("curl") {
        return;
    }
    ipv6_hand_back(false);
    ipv6_hand_back(true);
}

/// [`an_ipv6_vip_hands_back_the_same_way`], forwarding to the old holder's `link_local`
/// address or its global one.
fn ipv6_hand_back(link_local: bool) {
    use keelson_agent::net::vip::VipManager;
    use keelson_agent::vrrp::handback::Handback;
    use keelson_testkit::netns::block_on_in;

    let seg = Segment::ipv6_only("khb6", 3, 0x36);
    let (old, new, client) = (0, 1, 2);
    let vip: std::net::IpAddr = format!("fd{:02x}::5", 0x36).parse().unwrap();
    let at: SocketAddr = SocketAddr::new(vip, 6443);
    let any6: SocketAddr = "[::]:6443".parse().unwrap();
    serve_on(&seg.nodes[old], any6, "old");
    serve_on(&seg.nodes[new], any6, "new");
    serve_on(&seg.nodes[client], "[::]:7000".parse().unwrap(), "client");
    let vip_op = |ns: &str, op: &'static str| {
        block_on_in(ns, move || async move {
            let m = VipManager::new("eth0", vip).await.unwrap();
            match op {
                "add" => m.add().await,
                "retire" => m.retire().await,
                "end_retirement" => m.end_retirement().await.map(|_| ()),
                _ => m.remove().await.map(|_| ()),
            }
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        })
        .join()
        .unwrap();
    };
    let mac = |i: usize| {
        keelson_testkit::sh(&["ip", "-n", &seg.nodes[i], "-br", "link", "show", "eth0"])
            .split_whitespace()
            .nth(2)
            .unwrap()
            .to_owned()
    };
    // `ip neigh show|flush to VIP` in the client.
    let client_neigh = |op: &str| {
        let (ns, vip) = (seg.nodes[client].as_str(), vip.to_string());
        keelson_testkit::sh(&["ip", "-n", ns, "-6", "neigh", op, "to", &vip])
    };

    // The old holder holds the VIP; a keep-alive connection through it.
    vip_op(&seg.nodes[old], "add");
    let mut conn = connect_to(&seg.nodes[client], at);
    assert_eq!(request(&mut conn).expect("the first request"), "old");
    let neigh = client_neigh("show");
    assert!(neigh.contains(&mac(old)), "{neigh}");

    // The hand-over: the new holder forwards flows it did not open to the old one, then
    // takes the VIP; the old one retires it. The client forgets the VIP's MAC and asks again.
    let old_addr: std::net::IpAddr = if link_local {
        let ns = seg.nodes[old].clone();
        keelson_testkit::in_netns(&ns, || keelson_agent::net::vip::link_local("eth0"))
            .join()
            .unwrap()
            .expect("the old holder's link-local address")
            .into()
    } else {
        seg.v6(old).parse().unwrap()
    };
    let window = Duration::from_secs(30);
    block_on_in(&seg.nodes[new], move || async move {
        Handback::new("api-v6", "eth0", vip, window)
            .forward_to(old_addr)
            .await
            .unwrap_or_else(|e| panic!("forward_to: {e}"));
    })
    .join()
    .unwrap();
    vip_op(&seg.nodes[new], "add");
    vip_op(&seg.nodes[old], "retire");
    assert!(
        retired_vip(&seg.nodes[old], vip),
        "the old holder's retirement rule"
    );
    client_neigh("flush");

    // The old connection's next request reaches the new holder (the only one that answers
    // neighbour solicitations for the VIP now), which forwards it to the old one.
    let second = request(&mut conn).unwrap_or_else(|e| {
        panic!("the request on the old holder's connection (forwarded to {old_addr}): {e}")
    });
    assert_eq!(second, "old", "the same connection, the same server");
    let neigh = client_neigh("show");
    assert!(
        neigh.contains(&mac(new)) && !neigh.contains(&mac(old)),
        "the client resolved the VIP to the new holder ({}), not the retired one ({}): {neigh}",
        mac(new),
        mac(old)
    );
    // A new connection is the new holder's.
    let mut fresh = connect_to(&seg.nodes[client], at);
    assert_eq!(request(&mut fresh).expect("a new connection"), "new");
    // The new holder's own connections from the VIP (the port check's) are not forwarded:
    // their answers come to a port of its ephemeral range.
    let url = format!("http://[{}]:7000/", seg.v6(client));
    let from_vip = keelson_testkit::netns::exec_in(&seg.nodes[new], "curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "--interface",
            &vip.to_string(),
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&from_vip.stdout),
        "client",
        "a connection from the VIP during the hand-back: {}",
        String::from_utf8_lossy(&from_vip.stderr)
    );
    // Once the forwarding ends, the old connection's segments are the new holder's, which
    // has no socket for them and resets it: the forwarding was what carried it.
    block_on_in(&seg.nodes[new], move || async move {
        Handback::new("api-v6", "eth0", vip, window).end().await;
    })
    .join()
    .unwrap();
    let after = request(&mut conn);
    assert!(
        after.is_err(),
        "the old connection answered without the forwarding: {after:?}"
    );
    // The old holder is master again before its window ends (the new one left at once):
    // the VIP goes back on, and at the window's end the retirement alone goes.
    vip_op(&seg.nodes[new], "remove");
    vip_op(&seg.nodes[old], "add");
    vip_op(&seg.nodes[old], "end_retirement");
    assert!(
        !retired_vip(&seg.nodes[old], vip),
        "end_retirement removes the rule"
    );
    let addrs = keelson_testkit::sh(&["ip", "-n", &seg.nodes[old], "-6", "addr", "show", "eth0"]);
    assert!(
        addrs.contains(&format!("{vip}/128")),
        "end_retirement left the VIP on the interface: {addrs}"
    );
    client_neigh("flush");
    let mut again = connect_to(&seg.nodes[client], at);
    assert_eq!(
        request(&mut again).expect("a connection to the old holder again"),
        "old"
    );
    // Retired once more, so that the last check still proves that remove undoes one.
    vip_op(&seg.nodes[old], "retire");
    vip_op(&seg.nodes[old], "remove");
    assert!(
        !retired_vip(&seg.nodes[old], vip),
        "remove undoes the retirement"
    );
}
