//! The DNS service as the supervisor runs it: the zone follows the member list on the bus,
//! upstreams learned later are used, resolv.conf is written local-first, and `stop` ends it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keelson_agent::context::AgentContext;
use keelson_agent::dns::{RunOptions, run_with};
use keelson_agent::member::Member;
use keelson_agent::node::NodeIdentity;
use keelson_cluster::{ClusterConfig, Role};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");

fn dig(server: SocketAddr, name: &str, t: &str) -> String {
    keelson_testkit::dig::dig(server, &["+short", "+time=2", "+tries=1", name, t])
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_follows_members_and_resolv_conf_is_local_first() {
    if !keelson_testkit::require("dig") {
        return;
    }
    let mut v: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    v["dns"]["manageResolvConf"] = true.into();
    v["dns"]["upstreams"] = serde_json::json!(["192.0.2.53:53"]);
    let cluster = ClusterConfig::from_json(v.to_string().as_bytes()).unwrap();
    let node: NodeIdentity = serde_json::from_value(serde_json::json!({
        "name": "master-0", "role": "master", "interface": "lo", "addresses": ["127.0.0.1/8"]
    }))
    .unwrap();
    let ctx = AgentContext::new(cluster, node);
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    let opts = RunOptions {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        resolv_conf: resolv.clone(),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_with(ctx.clone(), stop.clone(), opts));

    // Ready once bound, resolv.conf written and the status view installed (in that order:
    // the view shows the address a moment before the service counts as ready).
    keelson_testkit::wait_for_async("dns ready", Duration::from_secs(5), || {
        ctx.bus.ready.borrow().contains("dns")
    })
    .await;
    let addr: SocketAddr = ctx
        .bus
        .views
        .dns
        .read()
        .and_then(|s| s.listen.first().copied())
        .expect("a ready dns service shows its bound address");
    let text = std::fs::read_to_string(&resolv).unwrap();
    let ns: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nameserver"))
        .collect();
    assert_eq!(
        ns,
        ["nameserver 127.0.0.1", "nameserver 192.0.2.53"],
        "{text}"
    );
    assert!(text.contains("search ocp4.example.com"), "{text}");

    let name = "late-node.ocp4.example.com";
    let a = addr;
    let out = tokio::task::spawn_blocking(move || dig(a, name, "A"))
        .await
        .unwrap();
    assert_eq!(out, "", "not a member yet");

    ctx.bus.members.send_replace(Arc::new(vec![Member {
        name: "late-node".parse().unwrap(),
        role: Role::Worker,
        addresses: vec!["10.0.0.99".parse().unwrap()],
        version: "x".into(),
    }]));
    let t = Instant::now();
    loop {
        let out = tokio::task::spawn_blocking(move || dig(a, name, "A"))
            .await
            .unwrap();
        if out == "10.0.0.99" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "zone not rebuilt: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Upstreams learned from DHCP/metadata come after cluster.json's.
    ctx.bus
        .dns_upstreams
        .send_replace(vec!["198.51.100.7".parse().unwrap()]);
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(&resolv).unwrap();
        if text.contains("nameserver 192.0.2.53\nnameserver 198.51.100.7\n") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "resolv.conf not updated: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("dns stops when asked")
        .unwrap()
        .unwrap();
}
