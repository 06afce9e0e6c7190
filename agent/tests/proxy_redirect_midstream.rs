//! The VIP redirect must not reset connections opened before it. A node that has
//! just taken the API VIP over serves `VIP:6443` from the wildcard listener (kube-apiserver
//! on an RHCOS master) until the proxy's nftables redirect lands. In a namespace where
//! nothing made the kernel track connections before, conntrack starts with that table and
//! takes the next segment of a connection opened in the moment up mid-stream as a new one:
//! a rule that redirected every packet sent it to the proxy, which knows no such
//! connection and reset it (`bench/api_outage.sh` case `stop`: a request lost at the
//! takeover). The rules the agent writes ([`nft_script`]) are loaded with the real `nft`;
//! real sockets on both sides, in namespaces on a bridge.
//!
//! Needs root (namespaces) and nftables.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use keelson_agent::proxy::frontend::nft_script;
use keelson_testkit::netns::{bind_tcp_in, in_netns};
use keelson_testkit::segment::nft;
use keelson_testkit::{Segment, require, require_root, sh};

/// Answers each line a client sends with `tag` and the line, on every connection.
fn echo(listener: std::net::TcpListener, tag: &'static str) {
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf) {
                    let line = String::from_utf8_lossy(&buf[..n]);
                    if n == 0 || s.write_all(format!("{tag}:{line}").as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// Sends `line` on `s` and reads the answer.
fn ask(s: &mut TcpStream, line: &str) -> std::io::Result<String> {
    s.write_all(line.as_bytes())?;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn the_redirect_leaves_connections_opened_before_it_alone() {
    if !require_root() || !require("nft") {
        return;
    }
    let seg = Segment::ipv4_only("krm", 2, 0);
    let vip = "10.0.0.5";
    let node = seg.nodes[0].clone();
    sh(&[
        "ip",
        "-n",
        &node,
        "addr",
        "add",
        &format!("{vip}/24"),
        "dev",
        "eth0",
    ]);
    // The apiserver's wildcard listener and the proxy's frontend port on the VIP's node.
    echo(bind_tcp_in(&node, ([0, 0, 0, 0], 6443).into()), "apiserver");
    echo(bind_tcp_in(&node, ([0, 0, 0, 0], 9445).into()), "proxy");
    let count = sh(&[
        "ip",
        "netns",
        "exec",
        &node,
        "sysctl",
        "-n",
        "net.netfilter.nf_conntrack_count",
    ]);
    assert_eq!(
        count.trim(),
        "0",
        "nothing tracked before the redirect (the case tested)"
    );
    let target: SocketAddr = format!("{vip}:6443").parse().unwrap();
    let client = seg.nodes[1].clone();
    let result = in_netns(&client, move || {
        let connect = || {
            let s = TcpStream::connect_timeout(&target, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        };
        // Opened before the redirect: the apiserver serves it.
        let mut early = connect();
        let first = ask(&mut early, "one").unwrap();
        // The proxy takes the VIP's port over, as the agent does.
        let want: BTreeSet<SocketAddr> = [target].into_iter().collect();
        nft(&node, &nft_script(&want, 9445));
        // The connection opened before goes on with the apiserver, not reset.
        let second = ask(&mut early, "two");
        // A connection opened now reaches the proxy.
        let mut late = connect();
        let third = ask(&mut late, "three").unwrap();
        (first, second.map_err(|e| e.to_string()), third)
    })
    .join()
    .unwrap();
    assert_eq!(result.0, "apiserver:one");
    assert_eq!(
        result.1,
        Ok("apiserver:two".to_owned()),
        "a connection opened before the redirect must stay with the apiserver that accepted it"
    );
    assert_eq!(result.2, "proxy:three", "new connections are redirected");
}
