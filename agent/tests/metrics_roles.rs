//! `/metrics` as an operator's Prometheus sees it: whole agents (`keelson-agent run`) as
//! bootstrap, master and worker in network namespaces on one bridge, real traffic from a
//! client namespace (HTTP through the API proxy, `dig` at the cluster DNS, Ignition config
//! fetches), then every agent scraped with `curl` and checked with Debian's `promtool check
//! metrics` (the real parser). The counters must have moved by what the client did, a
//! client outside `ignition.allowedNetworks` must get 403, and `keelson-agent status` must
//! tell the same facts.
//!
//! Needs root (namespaces), curl, dig and promtool. Namespaces `kmt-*`, addresses
//! 10.84.0.0/24.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keelson_testkit::http::{HttpServer, curl_in};
use keelson_testkit::netns::{bind_tcp_in, exec_in};
use keelson_testkit::{Proc, Segment, require, require_root, sh, wait_for_ok};

const BIN: &str = env!("CARGO_BIN_EXE_keelson-agent");
const ZONE: &str = "kmt.example.com";
const VIP: &str = "10.84.0.5";

fn cluster() -> serde_json::Value {
    serde_json::json!({
        "version": 1, "name": "kmt", "baseDomain": "example.com",
        "machineNetworks": ["10.84.0.0/24"],
        "apiVips": [VIP], "ingressVips": ["10.84.0.7"],
        "vrrp": {"instances": [
            {"name": "api", "vip": VIP, "vrid": 84, "version": "3", "advertIntervalMs": 100,
             "transport": "multicast", "preempt": true, "garpRefreshSecs": 60,
             "priorities": {"bootstrap": 70, "master": 40},
             "checks": [{"name": "proxy", "check": {"type": "proxyHealthyBackend"},
                         "intervalMs": 200, "rise": 1, "fall": 2, "weight": 50}]},
            {"name": "ingress", "vip": "10.84.0.7", "vrid": 85, "version": "3",
             "advertIntervalMs": 100, "transport": "multicast", "preempt": true,
             "garpRefreshSecs": 60, "priorities": {"worker": 20}}
        ]},
        "api": {"frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
                "check": "tcp", "checkIntervalMs": 500, "fall": 2, "rise": 1,
                "connectTimeoutMs": 1000, "idleTimeoutSecs": 60, "maxConnections": 1000},
        "dns": {"port": 53, "ttl": 60, "manageResolvConf": false},
        // The client at .13 is inside, its second address .200 outside.
        "ignition": {"tlsPort": 22623, "plainPort": 22624,
                     "allowedNetworks": ["10.84.0.0/25"], "spec": "3.2.0"},
        "members": {"transport": "mdns", "renewIntervalSecs": 1, "expirySecs": 5},
        "metrics": {"port": 22625}
    })
}

fn in_ns(ns: &str, args: &[&str]) -> std::process::Output {
    exec_in(ns, args[0]).args(&args[1..]).output().unwrap()
}

/// GET the metrics of the node at `node_ip` from namespace `client`: (status, body).
fn scrape(client: &str, node_ip: &str, extra: &[&str]) -> (u16, String) {
    let url = format!("http://{node_ip}:22625/metrics");
    let mut args = vec!["--max-time", "5"];
    args.extend_from_slice(extra);
    args.push(&url);
    let reply = curl_in(client, &args);
    (reply.status, reply.text())
}

/// The value of the sample `name{labels}` (exact match of the part before the value).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn promtool(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/setup.sh installs it)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- scrape ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start(seg: &Segment, dir: &Path, i: usize, name: &str, role: &str) -> Proc {
    let node = serde_json::json!({"name": name, "role": role, "interface": "eth0",
                                  "addresses": [seg.v4(i)]});
    let node_path = dir.join(format!("node-{name}.json"));
    std::fs::write(&node_path, node.to_string()).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Proc::spawn(
        Command::new("ip")
            .args(["netns", "exec", &seg.nodes[i], BIN, "run", "--cluster"])
            .arg(dir.join("cluster.json"))
            .arg("--node")
            .arg(&node_path)
            .arg("--status-socket")
            .arg(dir.join(format!("{name}.sock")))
            .arg("--tls-dir")
            .arg(dir.join("tls"))
            .arg("--state-dir")
            .arg(dir.join(format!("state-{name}")))
            .env("RUST_LOG", "info")
            .stderr(log),
    )
}

fn wait_ready(dir: &Path, name: &str, limit: Duration) {
    let t = Instant::now();
    let log = dir.join(format!("{name}.log"));
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("keelson-agent ready:") {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "{name} not ready in {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_role_serves_metrics_that_promtool_accepts_and_that_move_with_traffic() {
    if !require_root() || !require("curl") || !require("dig") || !require("promtool") {
        return;
    }
    let seg = Segment::new("kmt", 4, 84);
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster();
    std::fs::write(dir.path().join("cluster.json"), cluster.to_string()).unwrap();
    let parsed = keelson_cluster::ClusterConfig::from_json(cluster.to_string().as_bytes())
        .expect("test cluster.json");
    keelson_cluster::pki::load_or_create(&dir.path().join("tls"), &parsed, Some(0))
        .unwrap()
        .write(&dir.path().join("tls"))
        .unwrap();
    let ip = |i: usize| seg.ip4(i).to_string();
    let (bootstrap_ip, master_ip, worker_ip) = (ip(0), ip(1), ip(2));
    let client = seg.nodes[3].clone();
    // The master's "kube-apiserver": a plain HTTP server on :6443 (the proxy checks TCP).
    let _apiserver = HttpServer::start(
        bind_tcp_in(&seg.nodes[1], ([0, 0, 0, 0], 6443).into()),
        [("/cluster.json", cluster.to_string())],
    );
    let _agents = [
        start(&seg, dir.path(), 0, "bootstrap", "bootstrap"),
        start(&seg, dir.path(), 1, "master-0", "master"),
        start(&seg, dir.path(), 2, "worker-0", "worker"),
    ];
    for name in ["bootstrap", "master-0", "worker-0"] {
        wait_ready(dir.path(), name, Duration::from_secs(30));
    }
    // The client's second address, outside the allowed /25.
    sh(&[
        "ip",
        "-n",
        &client,
        "addr",
        "add",
        "10.84.0.200/24",
        "dev",
        "eth0",
    ]);

    // Wait for the steady state, which every node reaches some time after its ready line
    // (VRRP elections, the proxy's first checks, mDNS discovery): the bootstrap holds the
    // API VIP and its proxy has the master as a backend that is up, the master is the API
    // backup, the worker holds the ingress VIP, and every node knows the master.
    let up = format!("keelson_proxy_backend_up{{backend=\"{master_ip}:6443\"}}");
    let state = |instance: &str, state: &str| {
        format!("keelson_vrrp_state{{vrrp_instance=\"{instance}\",state=\"{state}\"}}")
    };
    let knows_master = |text: &str| {
        let series = |source: &str| {
            let s = format!("keelson_members{{role=\"master\",source=\"{source}\"}}");
            value(text, &s).unwrap_or(0.0)
        };
        series("mdns") + series("self") == 1.0
    };
    let nodes = [
        (
            "bootstrap",
            &bootstrap_ip,
            vec![up.clone(), state("api", "master")],
        ),
        ("master-0", &master_ip, vec![state("api", "backup")]),
        ("worker-0", &worker_ip, vec![state("ingress", "master")]),
    ];
    let took = wait_for_ok("the steady state", Duration::from_secs(30), || {
        for (name, ip, series) in &nodes {
            let (code, text) = scrape(&client, ip, &[]);
            if code != 200 {
                return Err(format!("{name}: /metrics answered {code}: {text}"));
            }
            if let Some(s) = series.iter().find(|s| value(&text, s) != Some(1.0)) {
                return Err(format!("{name}: {s} is not 1:\n{text}"));
            }
            if !knows_master(&text) {
                return Err(format!("{name} does not know the master:\n{text}"));
            }
        }
        Ok(())
    });
    eprintln!("steady state {took:?} after the ready lines");

    let before: Vec<String> = [&bootstrap_ip, &master_ip, &worker_ip]
        .iter()
        .map(|ip| scrape(&client, ip, &[]).1)
        .collect();
    // Traffic: 5 requests through the bootstrap's proxy (and 3 through the VIP), 7
    // queries at the worker's DNS (4 A, 3 AAAA), 2 config fetches from the bootstrap.
    for i in 0..8 {
        let url = if i < 5 {
            format!("http://{bootstrap_ip}:9445/cluster.json")
        } else {
            format!("http://{VIP}:6443/cluster.json")
        };
        let out = in_ns(
            &client,
            &["curl", "-sf", "--max-time", "5", "-o", "/dev/null", &url],
        );
        assert!(out.status.success(), "GET {url}: {out:?}");
    }
    for (n, t) in [(4, "A"), (3, "AAAA")] {
        for _ in 0..n {
            let name = format!("api.{ZONE}");
            let at = format!("@{worker_ip}");
            let out = in_ns(
                &client,
                &["dig", "+short", "+tries=1", "+time=2", &at, &name, t],
            );
            assert!(out.status.success());
        }
    }
    for _ in 0..2 {
        let url = format!("http://{bootstrap_ip}:22624/config/master");
        let out = in_ns(
            &client,
            &[
                "curl",
                "-sf",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-H",
                "Accept: application/vnd.coreos.ignition+json;version=3.2.0",
                &url,
            ],
        );
        assert!(out.status.success(), "GET {url}");
    }

    let after: Vec<String> = [&bootstrap_ip, &master_ip, &worker_ip]
        .iter()
        .map(|ip| {
            let (code, text) = scrape(&client, ip, &[]);
            assert_eq!(code, 200, "{ip}: {text}");
            promtool(&text);
            text
        })
        .collect();
    let moved = |node: usize, series: &str| {
        let b = value(&before[node], series).unwrap_or(0.0);
        let a = value(&after[node], series)
            .unwrap_or_else(|| panic!("no {series} in\n{}", after[node]));
        a - b
    };
    let backend = format!("{master_ip}:6443");
    assert_eq!(
        moved(
            0,
            &format!("keelson_proxy_backend_connections_total{{backend=\"{backend}\"}}")
        ),
        8.0
    );
    assert_eq!(
        moved(
            0,
            "keelson_proxy_frontend_accepted_total{frontend=\"[::]:9445\",kind=\"node\"}"
        ),
        5.0
    );
    assert_eq!(
        moved(
            0,
            &format!(
                "keelson_proxy_frontend_accepted_total{{frontend=\"{VIP}:6443\",kind=\"vip\"}}"
            )
        ),
        3.0
    );
    assert!(
        moved(
            0,
            &format!(
                "keelson_proxy_backend_bytes_total{{backend=\"{backend}\",direction=\"to_client\"}}"
            )
        ) > 8.0 * 100.0,
        "bytes from the backend"
    );
    assert_eq!(moved(2, "keelson_dns_queries_total{qtype=\"A\"}"), 4.0);
    assert_eq!(moved(2, "keelson_dns_queries_total{qtype=\"AAAA\"}"), 3.0);
    assert_eq!(
        moved(2, "keelson_dns_responses_total{rcode=\"NOERROR\"}"),
        7.0
    );
    assert_eq!(moved(2, "keelson_dns_authoritative_total"), 7.0);
    assert_eq!(
        moved(
            0,
            "keelson_cluster_requests_total{route=\"config\",pool=\"master\",spec=\"3.2.0\",code=\"200\"}"
        ),
        2.0
    );
    // Each role exports what it runs.
    assert!(
        value(
            &after[1],
            "keelson_vrrp_state{vrrp_instance=\"api\",state=\"backup\"}"
        ) == Some(1.0)
    );
    assert!(
        value(
            &after[2],
            "keelson_vrrp_state{vrrp_instance=\"ingress\",state=\"master\"}"
        ) == Some(1.0)
    );
    assert!(!after[2].contains("keelson_proxy_"), "workers run no proxy");
    for (i, role) in ["bootstrap", "master", "worker"].iter().enumerate() {
        assert!(
            after[i].contains(&format!("role=\"{role}\"")),
            "keelson_node_info of {role}"
        );
        assert_eq!(
            value(
                &after[i],
                "keelson_members{role=\"master\",source=\"mdns\"}"
            )
            .map(|v| v + value(
                &after[i],
                "keelson_members{role=\"master\",source=\"self\"}"
            )
            .unwrap_or(0.0)),
            Some(1.0),
            "{role} knows the master"
        );
    }

    // OpenMetrics on request.
    let (code, om) = scrape(
        &client,
        &worker_ip,
        &["-H", "Accept: application/openmetrics-text;version=1.0.0"],
    );
    assert_eq!(code, 200);
    assert!(
        om.ends_with("# EOF\n") && om.contains("# TYPE keelson_dns_queries counter"),
        "{om}"
    );
    // Outside the allowed networks: refused, as :22623 refuses it.
    let (code, body) = scrape(&client, &worker_ip, &["--interface", "10.84.0.200"]);
    assert_eq!(code, 403, "{body}");

    // `keelson-agent status` tells the same facts (a later moment: at least as many).
    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(dir.path().join("worker-0.sock"))
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let a_queries = value(&after[2], "keelson_dns_queries_total{qtype=\"A\"}").unwrap();
    assert!(
        screen.contains(&format!("A {a_queries}"))
            && screen.contains("vrrp ingress 10.84.0.7")
            && screen.contains("MASTER"),
        "{screen}"
    );
    let json = Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(dir.path().join("bootstrap.sock"))
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let backends = doc["proxy"]["backends"].as_array().unwrap();
    let total = backends
        .iter()
        .find(|b| b["addr"] == backend.as_str())
        .unwrap()["total"]
        .as_f64()
        .unwrap();
    assert_eq!(
        Some(total),
        value(
            &after[0],
            &format!("keelson_proxy_backend_connections_total{{backend=\"{backend}\"}}")
        )
    );
}
