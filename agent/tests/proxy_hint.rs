//! The VRRP peer-down hint (docs/proxy.md, "The VRRP hint") as the agent runs the proxy
//! (`proxy::run` on the bus): when VRRP says a master's adverts stopped, the proxy marks that
//! node's backend down at once, closes the client sessions to it, and sends new clients to
//! the live master without the connect stagger — seconds before anything else notices.
//!
//! In a namespace (the proxy binds its fixed frontend and monitor ports there): two
//! masters' "apiservers" on addresses of the namespace, each answering its name and holding
//! the connection. Master A then dies as a powered-off host does (nftables drops everything
//! to it) and the hint comes. The backend checks are 30 s apart and A's sessions carry no
//! traffic, so within the second this test allows, only the hint can close them or keep new
//! clients off A: remove the hint and this test fails.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keelson_agent::context::AgentContext;
use keelson_agent::member::Member;
use keelson_agent::node::NodeIdentity;
use keelson_cluster::{ClusterConfig, Role};
use keelson_testkit::segment::nft;
use keelson_testkit::{Netns, require, require_root, wait_for_async};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");
const A: &str = "10.41.0.11";
const B: &str = "10.41.0.12";

/// The test's cluster.json: machine network 10.41.0.0/24, TCP checks 30 s apart.
fn cluster() -> ClusterConfig {
    let mut c: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    c["machineNetworks"] = serde_json::json!(["10.41.0.0/24"]);
    c["apiVips"] = serde_json::json!(["10.41.0.5"]);
    c["ingressVips"] = serde_json::json!(["10.41.0.7"]);
    c["ignition"]["allowedNetworks"] = serde_json::json!(["10.41.0.0/24"]);
    let api = &mut c["api"];
    api["checkIntervalMs"] = 30_000.into();
    api["fastCheckIntervalMs"] = 30_000.into();
    api["rise"] = 1.into();
    api["fall"] = 3.into();
    api["connectTimeoutMs"] = 3000.into();
    ClusterConfig::from_json(c.to_string().as_bytes()).expect("the test's cluster.json")
}

/// An apiserver at `ip:6443` that sends `name` to every client and holds the connection.
async fn apiserver(ip: &str, name: &'static [u8]) {
    let l = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 6443))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(name).await;
                let mut buf = [0u8; 64];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
}

/// A client of the proxy's frontend: the connection and the name of who answered.
async fn client(frontend: SocketAddr) -> (TcpStream, String) {
    let mut s = TcpStream::connect(frontend).await.unwrap();
    let mut tag = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut tag))
        .await
        .expect("an answer through the proxy")
        .unwrap();
    (s, String::from_utf8_lossy(&tag).into_owned())
}

fn backend(ctx: &AgentContext, ip: &str) -> keelson_agent::status::model::BackendSnapshot {
    ctx.bus
        .views
        .proxy
        .read()
        .expect("the proxy's view")
        .backends
        .into_iter()
        .find(|b| b.addr.ip().to_string() == ip)
        .expect("backend listed")
}

#[test]
fn the_vrrp_hint_takes_a_dead_master_out_at_once() {
    if !require_root() || !require("nft") {
        return;
    }
    let ns = Netns::new("kph");
    for ip in [A, B, "10.41.0.10"] {
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    }
    let name = ns.name().to_owned();
    ns.block_on(move || async move {
        apiserver(A, b"A").await;
        apiserver(B, b"B").await;
        let node: NodeIdentity = serde_json::from_value(serde_json::json!({
            "name": "bootstrap", "role": "bootstrap", "interface": "lo",
            "addresses": ["10.41.0.10/32"]
        }))
        .unwrap();
        let ctx = AgentContext::new(cluster(), node);
        let master = |n: &str, ip: &str| Member {
            name: n.parse().unwrap(),
            role: Role::Master,
            addresses: vec![ip.parse().unwrap()],
            version: "test".into(),
        };
        ctx.bus
            .members
            .send_replace(Arc::new(vec![master("master-0", A), master("master-1", B)]));
        let stop = CancellationToken::new();
        let proxy = tokio::spawn(keelson_agent::proxy::run(ctx.clone(), stop.clone()));
        let frontend: SocketAddr = "127.0.0.1:9445".parse().unwrap();
        wait_for_async("both backends up", Duration::from_secs(10), || {
            ctx.bus.views.proxy.read().is_some_and(|p| {
                p.backends.len() == 2 && p.backends.iter().all(|b| b.state == "up")
            })
        })
        .await;
        // Clients on both masters; keep the ones A serves.
        let mut on_a = Vec::new();
        let mut answered = Vec::new();
        while on_a.len() < 2 {
            let (s, who) = client(frontend).await;
            answered.push(who.clone());
            assert!(answered.len() < 20, "A never chosen: {answered:?}");
            if who == "A" {
                on_a.push(s);
            }
        }

        // A dies (silently, as a powered-off host), and VRRP says so.
        nft(
            &name,
            &format!(
                "table inet kph {{\n chain out {{\n  type filter hook output priority 0;\n  ip daddr {A} drop\n }}\n}}\n"
            ),
        );
        let hint = Instant::now();
        ctx.bus.vrrp_peer_down.send_replace(Some(A.parse().unwrap()));

        // The sessions on A are closed at once: their clients reconnect.
        for mut s in on_a {
            let mut buf = [0u8; 8];
            let closed = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await;
            assert!(
                matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
                "a session on the dead master still open {:?} after the hint: {closed:?}",
                hint.elapsed()
            );
        }
        // New clients all go to B, none waiting out the stagger on A.
        for i in 0..6 {
            let t = Instant::now();
            let (_s, who) = client(frontend).await;
            assert_eq!(who, "B", "client {i}");
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "client {i} took {:?}",
                t.elapsed()
            );
        }
        let a = backend(&ctx, A);
        assert_eq!(a.state, "down", "{a:?}");
        assert!(
            a.last_error.as_deref().is_some_and(|e| e.contains("VRRP")),
            "{a:?}"
        );
        assert!(a.sessions_shut_down >= 2, "{a:?}");
        assert_eq!(a.staggers, 0, "{a:?}");
        eprintln!("after the hint ({:?}): {a:?}", hint.elapsed());

        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), proxy)
            .await
            .expect("the proxy stops")
            .unwrap()
            .unwrap();
    })
    .join()
    .unwrap();
}
