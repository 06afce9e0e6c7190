//! Another cluster's virtual router on our VRID: two `keelson-agent run` nodes of one
//! cluster (members and VRRP, multicast, 100 ms adverts) hold the API VIP; a real
//! keepalived on the same segment, a router of no member, advertises another VIP under the
//! same VRID at a priority above both. Each agent names it once in its log (source, VRID,
//! the fix), counts its adverts in `status` and in `/metrics` (scraped over the segment),
//! shows it as a finding, and our VIP's holder does not change.
//!
//! Needs root (namespaces), keepalived and curl.

use std::time::Duration;

use keelson_testkit::agent::RunNet;
use keelson_testkit::http::curl_in;
use keelson_testkit::timing::WAIT_MARGIN;
use keelson_testkit::{Segment, require, require_root, wait_for_ok};

const AGENT: &str = env!("CARGO_BIN_EXE_keelson-agent");
const VRID: u8 = 51;

fn ip(cidr: &str) -> String {
    cidr.split('/').next().unwrap().to_owned()
}

/// The API instance's status on node `i`.
fn api(net: &RunNet, i: usize) -> serde_json::Value {
    net.status(i)["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "api").cloned())
        .unwrap_or_else(|| panic!("node {i} has no api instance"))
}

/// `keelson_vrrp_foreign_adverts_total` of node `node`, scraped from namespace `client`.
fn foreign_metric(net: &RunNet, client: usize, node: usize) -> f64 {
    let url = format!("http://{}:22625/metrics", ip(&net.seg.v4(node)));
    let reply = curl_in(&net.seg.nodes[client], &["--max-time", "5", &url]);
    assert_eq!(reply.status, 200, "{url}: {}", reply.text());
    let series = "keelson_vrrp_foreign_adverts_total{vrrp_instance=\"api\"} ";
    reply
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.parse().ok())
        .unwrap_or_else(|| panic!("{url}: no {series}in\n{}", reply.text()))
}

fn keepalived_conf(vip: &str) -> String {
    format!(
        "global_defs {{\n    router_id other-cluster\n}}\n\
         vrrp_instance other_api {{\n    state BACKUP\n    interface eth0\n    version 3\n    \
         virtual_router_id {VRID}\n    priority 200\n    advert_int 0.1\n    \
         virtual_ipaddress {{\n        {vip}/32 dev eth0\n    }}\n}}\n"
    )
}

#[test]
fn another_clusters_router_on_our_vrid_is_named_once_counted_and_moves_nothing() {
    if !require_root() || !require("keepalived") || !require("curl") {
        return;
    }
    let seg = Segment::ipv4_only("kvf", 3, 0);
    let vip = seg.vip4(100);
    let other_vip = seg.vip4(200);
    let mut cluster = keelson_testkit::agent::vrrp_cluster_json(serde_json::json!([
        keelson_testkit::agent::vrrp_instance("api", &vip, VRID)
    ]));
    cluster["metrics"] = serde_json::json!({"port": 22625});
    let mut net = RunNet::new(
        AGENT,
        seg,
        cluster,
        &[
            ("bootstrap", "bootstrap"),
            ("master-1", "master"),
            ("other", "worker"),
        ],
        "members,vrrp",
    );
    net.start(0);
    net.start(1);
    net.wait_ready(&[0, 1]);
    net.seg.wait_sole_holder(0, &vip, Duration::from_secs(10));
    net.wait("both list both", Duration::from_secs(20), || {
        (0..2).all(|i| net.member_names(i).len() == 2)
    });
    let transitions: Vec<serde_json::Value> = (0..2)
        .map(|i| api(&net, i)["transitions"].clone())
        .collect();
    let watch = net.seg.watch_holders(&vip, &[0, 1, 2]);

    // The other cluster's router: keepalived in the third namespace, priority 200.
    let dir = tempfile::tempdir().unwrap();
    let _ka = keelson_testkit::agent::start_keepalived(
        &net.seg,
        dir.path(),
        2,
        &keepalived_conf(&other_vip),
    );
    let stranger = ip(&net.seg.v4(2));
    wait_for_ok(
        "both agents to count the stranger's adverts",
        Duration::from_secs(5) + WAIT_MARGIN,
        || {
            let counts: Vec<u64> = (0..2)
                .map(|i| api(&net, i)["foreignAdverts"].as_u64().unwrap_or(0))
                .collect();
            if counts.iter().all(|&n| n >= 5) {
                Ok(())
            } else {
                Err(format!("foreignAdverts {counts:?}: {}", api(&net, 0)))
            }
        },
    );
    assert!(net.seg.holds(2, &other_vip), "keepalived holds its own VIP");
    let before: Vec<u64> = (0..2)
        .map(|i| api(&net, i)["foreignAdverts"].as_u64().unwrap())
        .collect();
    // Three more seconds of its adverts: nothing of ours moves. (keepalived, master, sends
    // its adverts irregularly here, one to a few a second: it hears ours on its VRID too.)
    net.seg.assert_stable(0, &vip, Duration::from_secs(3));
    assert_eq!(watch.stop(), vec![0], "only node 0 ever held {vip}");

    for i in 0..2 {
        let st = api(&net, i);
        assert_eq!(st["transitions"], transitions[i], "node {i}: {st}");
        // The finding: the stranger alone (the other member is no stranger), our VRID, its VIP.
        let found = st["foreignRouters"].as_array().cloned().unwrap_or_default();
        assert_eq!(found.len(), 1, "node {i}: {st}");
        assert_eq!(found[0]["source"], stranger.as_str(), "node {i}: {st}");
        assert_eq!(found[0]["vrid"], VRID, "node {i}: {st}");
        assert_eq!(
            found[0]["addresses"],
            serde_json::json!([other_vip]),
            "{st}"
        );
        let counted = st["foreignAdverts"].as_u64().unwrap();
        assert!(counted > before[i], "node {i}: still counting: {st}");
        assert!(
            st["drops"]["address"].as_u64().unwrap_or(0) >= counted,
            "dropped as ever: {st}"
        );
        // The metric counts at least what the status counted before the scrape.
        let scraped = foreign_metric(&net, 1 - i, i);
        assert!(scraped >= counted as f64, "node {i}: {scraped} < {counted}");
        // Named once, with the source, the VRID and what to do.
        let log = std::fs::read_to_string(&net.nodes[i].as_ref().unwrap().log).unwrap();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("VRID collision"))
            .collect();
        assert_eq!(lines.len(), 1, "node {i}: {lines:#?}");
        for needed in [
            stranger.as_str(),
            &format!("VRID {VRID}"),
            &other_vip,
            "--vrid",
        ] {
            assert!(
                lines[0].contains(needed),
                "node {i}: {needed} in {}",
                lines[0]
            );
        }
    }
    // The one-screen status says it too.
    let out = std::process::Command::new(AGENT)
        .args(["status", "--socket"])
        .arg(net.files.socket(0))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("VRID COLLISION: {stranger}")),
        "{text}"
    );
}
