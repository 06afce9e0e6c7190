//! The `VIP:6443` frontend against the real kernel, in network namespaces the test creates:
//! bound with `IP_FREEBIND` where the port is free, redirected with a real nftables rule
//! where a wildcard listener (kube-apiserver on RHCOS) owns it — seen from another namespace
//! (prerouting) and from the node itself (output) — and gone again when the VIP is.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use keelson_agent::proxy::frontend::{NFT_TABLE, VipFrontends, VipMode};
use keelson_agent::proxy::{Proxy, ProxyConfig};
use keelson_cluster::cluster::BackendCheck;
use keelson_testkit::netns::block_on_in;
use keelson_testkit::{Netns, require, require_root, sh};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server that sends `tag` to every client and closes.
async fn tagger(addr: SocketAddr, tag: &'static [u8]) {
    let l = TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(tag).await;
        }
    });
}

/// What a client connecting to `addr` reads.
async fn who_answers(addr: SocketAddr) -> String {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("answer in time")
        .expect("read");
    String::from_utf8_lossy(&got).into_owned()
}

const VIP: &str = "10.78.0.5:6443";
const NODE_BACKEND: &str = "10.78.0.1:16443";

/// Starts a proxy on `[::]:19445` → the node backend, and serves `VIP` with [`VipFrontends`]
/// in namespace `node`; `apiserver` adds a wildcard `*:6443` listener first. Checks from
/// inside `node` what answers, meets the caller at `ready`, drops the VIP on the caller's
/// word (`go`), meets it again, and stops on its next word. Returns the modes while the
/// VIP was wanted.
fn node_side(
    node: &str,
    apiserver: bool,
    ready: Arc<Barrier>,
    go: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Vec<(SocketAddr, VipMode)>> {
    block_on_in(node, move || async move {
        if apiserver {
            tagger("0.0.0.0:6443".parse().unwrap(), b"kube-apiserver").await;
        }
        tagger(NODE_BACKEND.parse().unwrap(), b"through the proxy").await;
        let proxy = Proxy::bind(
            ProxyConfig {
                frontends: vec!["[::]:19445".parse().unwrap()],
                monitor: None,
                check: BackendCheck::None,
                ..ProxyConfig::default()
            },
            &[NODE_BACKEND.parse().unwrap()],
        )
        .unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let serve = tokio::spawn({
            let p = proxy.clone();
            let s = stop.clone();
            async move { p.serve(s).await }
        });
        let mut vips = VipFrontends::new(19445);
        vips.remove_stale_redirects().await;
        let want: BTreeSet<SocketAddr> = [VIP.parse().unwrap()].into();
        vips.sync(&proxy, &want).await;
        let modes = vips.active();
        // From the node itself (the output hook, or the bound VIP).
        assert_eq!(who_answers(VIP.parse().unwrap()).await, "through the proxy");
        // Blocking waits are fine: this runtime runs nothing the other side needs but the
        // proxy's accept loops, which only the outside check uses, before `go`.
        let (ready, go) = tokio::task::spawn_blocking(move || {
            ready.wait();
            go.recv().unwrap();
            (ready, go)
        })
        .await
        .unwrap();
        vips.sync(&proxy, &BTreeSet::new()).await;
        assert!(vips.active().is_empty());
        tokio::task::spawn_blocking(move || {
            ready.wait();
            go.recv().unwrap();
        })
        .await
        .unwrap();
        stop.cancel();
        serve.await.unwrap().unwrap();
        modes
    })
}

fn vip_frontend(apiserver: bool) {
    if !require_root() || !require("nft") {
        return;
    }
    let (node_ns, client_ns) = (Netns::new("kvipn"), Netns::new("kvipc"));
    node_ns.veth("eth0", &client_ns, "eth0");
    for (ns, addrs) in [
        (&node_ns, &["10.78.0.1/24", "10.78.0.5/32"][..]),
        (&client_ns, &["10.78.0.2/24"][..]),
    ] {
        for a in addrs {
            ns.ip(&["addr", "add", a, "dev", "eth0"]);
        }
    }
    let (node, client) = (node_ns.name(), client_ns.name());

    let ready = Arc::new(Barrier::new(2));
    let (tx, go) = mpsc::channel();
    let node_thread = node_side(node, apiserver, ready.clone(), go);
    ready.wait();
    let from_outside = |c: &str| {
        block_on_in(c, || async { who_answers(VIP.parse().unwrap()).await })
            .join()
            .unwrap()
    };
    assert_eq!(from_outside(client), "through the proxy");
    if apiserver {
        let table = sh(&[
            "ip", "netns", "exec", node, "nft", "list", "table", "inet", NFT_TABLE,
        ]);
        assert!(table.contains("redirect to :19445"), "{table}");
    }
    tx.send(()).unwrap();
    ready.wait();
    // The VIP is no longer served by the proxy: the apiserver answers it directly, or nobody.
    if apiserver {
        assert_eq!(from_outside(client), "kube-apiserver");
        // The chains stay (connections redirected before keep their translation), empty
        // but for the rule that keeps conntrack on.
        let table = sh(&[
            "ip", "netns", "exec", node, "nft", "list", "table", "inet", NFT_TABLE,
        ]);
        assert!(!table.contains("redirect"), "redirects removed: {table}");
        assert!(table.contains("ct state new accept"), "{table}");
    } else {
        let refused = block_on_in(client, || async {
            TcpStream::connect(VIP.parse::<SocketAddr>().unwrap()).await
        })
        .join()
        .unwrap();
        assert!(refused.is_err(), "nothing listens on the VIP any more");
    }
    tx.send(()).unwrap();
    let modes = node_thread.join().unwrap();
    let want = if apiserver {
        VipMode::Redirected
    } else {
        VipMode::Bound
    };
    assert_eq!(modes, vec![(VIP.parse().unwrap(), want)]);
}

#[test]
fn vip_is_bound_where_the_port_is_free() {
    vip_frontend(false);
}

#[test]
fn vip_is_redirected_with_nftables_where_kube_apiserver_owns_the_port() {
    vip_frontend(true);
}
