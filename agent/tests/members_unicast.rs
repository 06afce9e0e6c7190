//! Unicast members end to end on loopback: three `keelson-agent members` processes register
//! over HTTPS (cluster CA) with an in-test Ignition-like server whose `/keelson/` routes are
//! the agent's `Registry`. They converge; after the "VIP moves" (server replaced by a fresh
//! one on the same address) the list is rebuilt within one renewal interval; a killed node
//! expires; a stopped one says goodbye.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keelson_agent::members::unicast::Registry;
use keelson_cluster::routes::ExtraRoutes;
use keelson_testkit::cmd::{JsonLines, spawn_json_lines};
use keelson_testkit::tls::ca_signed;
use keelson_testkit::{Proc, wait_for_async as wait_for};
use tokio::net::TcpListener;

const CLUSTER: &str = include_str!("../src/dns/testdata/cluster.json");
const RENEW: u64 = 1;
const EXPIRY: u64 = 4;

/// An HTTP body: whole, or a stream.
type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// How the test's server answers a request (method, path, peer, body).
type Responder =
    Arc<dyn Fn(&http::Method, &str, SocketAddr, Bytes) -> (http::StatusCode, Body) + Send + Sync>;

/// Answers as `registry`, the Ignition server's `/keelson/` routes, would.
fn registry_routes(registry: Arc<Registry>) -> Responder {
    Arc::new(move |method, path, peer, body| {
        let (status, body) = registry
            .handle(method, path, peer, body)
            .unwrap_or((http::StatusCode::NOT_FOUND, Bytes::new()));
        (status, Full::new(body).boxed())
    })
}

/// Serves `respond` over TLS; dropping the returned handle (abort) closes the listener and
/// every connection.
async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, respond: Responder) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let respond = respond.clone();
        conns.spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let respond = respond.clone();
                async move {
                    let method = req.method().clone();
                    let path = req.uri().path().to_string();
                    let body = req.into_body().collect().await?.to_bytes();
                    let (status, body) = respond(&method, &path, peer, body);
                    Ok::<_, hyper::Error>(
                        hyper::Response::builder()
                            .status(status)
                            .body(body)
                            .unwrap(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
        while conns.try_join_next().is_some() {}
    }
}

/// A `keelson-agent members` process; its stdout carries the member list.
struct Agent {
    proc: Proc,
    list: JsonLines,
}

impl Agent {
    fn names(&self) -> Vec<String> {
        self.list
            .latest()
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|m| m["name"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn start_agent(dir: &Path, cluster: &Path, ca: &Path, name: &str, addr: &str) -> Agent {
    start_agent_as(dir, cluster, ca, name, "master", addr)
}

fn start_agent_as(
    dir: &Path,
    cluster: &Path,
    ca: &Path,
    name: &str,
    role: &str,
    addr: &str,
) -> Agent {
    let node = dir.join(format!("{name}.json"));
    std::fs::write(
        &node,
        serde_json::json!({"name": name, "role": role, "interface": "lo", "addresses": [addr]})
            .to_string(),
    )
    .unwrap();
    let (proc, list) = spawn_json_lines(
        Command::new(env!("CARGO_BIN_EXE_keelson-agent"))
            .arg("members")
            .arg("--cluster")
            .arg(cluster)
            .arg("--node")
            .arg(&node)
            .arg("--ca")
            .arg(ca)
            .stderr(Stdio::inherit()),
    );
    Agent { proc, list }
}

fn names(registry: &Registry) -> Vec<String> {
    registry
        .list()
        .into_iter()
        .map(|m| m.name.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_converge_survive_vip_move_and_expire() {
    let tls = ca_signed(&["127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &tls.ca_pem).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let mut v: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    v["apiVips"] = serde_json::json!(["127.0.0.1"]);
    v["ignition"]["tlsPort"] = addr.port().into();
    v["members"] = serde_json::json!({"transport": "unicast", "renewIntervalSecs": RENEW, "expirySecs": EXPIRY});
    let cluster = dir.path().join("cluster.json");
    std::fs::write(&cluster, v.to_string()).unwrap();

    let zone = "ocp4.example.com";
    let reg_a = Arc::new(Registry::new(zone, Duration::from_secs(EXPIRY)));
    let server_a = tokio::spawn(serve(
        listener,
        tls.server.clone(),
        registry_routes(reg_a.clone()),
    ));

    let all = ["master-0", "master-1", "master-2"]
        .map(String::from)
        .to_vec();
    let mut agents: Vec<Agent> = all
        .iter()
        .enumerate()
        .map(|(i, n)| {
            start_agent(
                dir.path(),
                &cluster,
                &ca,
                n,
                &format!("127.0.0.{}/8", 10 + i),
            )
        })
        .collect();
    let took = wait_for("convergence", Duration::from_secs(10), || {
        names(&reg_a) == all && agents.iter().all(|a| a.names() == all)
    })
    .await;
    eprintln!("converged in {took:?}");

    // The VIP moves: the old holder's server goes away, a fresh one answers on the address.
    server_a.abort();
    let _ = server_a.await;
    let reg_b = Arc::new(Registry::new(zone, Duration::from_secs(EXPIRY)));
    let listener = TcpListener::bind(addr).await.unwrap();
    let server_b = tokio::spawn(serve(
        listener,
        tls.server.clone(),
        registry_routes(reg_b.clone()),
    ));
    let rebuilt = wait_for("rebuild after the VIP move", Duration::from_secs(5), || {
        names(&reg_b) == all
    })
    .await;
    eprintln!("rebuilt in {rebuilt:?} (renewal interval {RENEW}s)");
    assert!(
        rebuilt <= Duration::from_millis(RENEW * 1000 + 700),
        "rebuild took {rebuilt:?}"
    );
    for a in &agents {
        assert_eq!(a.names(), all, "no member lost across the move");
    }

    // SIGKILL master-2: no goodbye; it expires from the registry and from the others.
    agents.pop().unwrap().proc.kill9();
    let t = Instant::now();
    let two = all[..2].to_vec();
    wait_for(
        "expiry of master-2",
        Duration::from_secs(EXPIRY + RENEW + 2),
        || names(&reg_b) == two && agents.iter().all(|a| a.names() == two),
    )
    .await;
    let gone = t.elapsed();
    eprintln!("killed node expired after {gone:?} (expiry {EXPIRY}s)");
    assert!(
        gone >= Duration::from_secs(EXPIRY - 1),
        "expired too early: {gone:?}"
    );

    // A worker (which serves no registry) joins and sees both masters.
    let worker = start_agent_as(
        dir.path(),
        &cluster,
        &ca,
        "worker-0",
        "worker",
        "127.0.0.20/8",
    );
    wait_for("the worker's view", Duration::from_secs(5), || {
        worker.names() == ["master-0", "master-1", "worker-0"]
    })
    .await;

    // SIGTERM master-1: it deregisters at once, and the worker drops it at its next renewal,
    // before master-1's record could have expired there.
    let mut stopped = agents.pop().unwrap();
    stopped.proc.signal_term();
    let t = Instant::now();
    wait_for("goodbye of master-1", Duration::from_secs(2), || {
        names(&reg_b) == ["master-0", "worker-0"]
    })
    .await;
    eprintln!("stopped node deregistered after {:?}", t.elapsed());
    let left = wait_for(
        "master-1 gone from the worker",
        Duration::from_secs(EXPIRY + 2),
        || worker.names() == ["master-0", "worker-0"],
    )
    .await;
    eprintln!("the worker dropped master-1 after {:?}", t.elapsed());
    assert!(
        t.elapsed() < Duration::from_secs(EXPIRY - RENEW)
            && left < Duration::from_secs(EXPIRY - RENEW),
        "the worker kept master-1 until its expiry: {left:?}"
    );
    drop(worker);
    drop(stopped);
    server_b.abort();
}

#[tokio::test]
async fn untrusted_server_is_refused() {
    // The agent's client refuses a server whose certificate the cluster CA did not sign.
    let good = ca_signed(&["127.0.0.1"]);
    let other = ca_signed(&["127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &good.ca_pem).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reg = Arc::new(Registry::new("ocp4.example.com", Duration::from_secs(5)));
    let server = tokio::spawn(serve(listener, other.server.clone(), registry_routes(reg)));
    let client = keelson_agent::members::unicast::client_config(&ca).unwrap();
    let err = keelson_agent::members::unicast::exchange(
        client,
        addr,
        http::Method::GET,
        "/keelson/v1/members",
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, keelson_agent::net::http_client::HttpError::Tls { .. }),
        "{err:#}"
    );
    // A missing CA file is a clear error.
    let err =
        keelson_agent::members::unicast::client_config(&dir.path().join("none.crt")).unwrap_err();
    assert!(format!("{err:#}").contains("cluster CA"), "{err:#}");
    server.abort();
}

/// The agent's resident memory (kB), from /proc.
fn rss_kib(pid: nix::unistd::Pid) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A registry's answer as a bomb (docs/agent.md, "Limits"): a node registering with a
/// registry that answers without end, or with tens of thousands of members, keeps running
/// with bounded memory and holds at most `MAX_MEMBERS` of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_answer_bomb_is_held_to_the_limits() {
    use keelson_agent::members::table::MAX_MEMBERS;
    use keelson_agent::members::unicast::MAX_ANSWER_BYTES;
    let tls = ca_signed(&["127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut v: serde_json::Value = serde_json::from_str(CLUSTER).unwrap();
    v["apiVips"] = serde_json::json!(["127.0.0.1"]);
    v["ignition"]["tlsPort"] = addr.port().into();
    v["members"] =
        serde_json::json!({"transport": "unicast", "renewIntervalSecs": RENEW, "expirySecs": 30});
    let cluster = dir.path().join("cluster.json");
    std::fs::write(&cluster, v.to_string()).unwrap();

    // 1. An answer without end: a stream of JSON white space, 64 KiB a frame.
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let endless: Responder = {
        let asked = asked.clone();
        Arc::new(move |_, _, _, _| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let frames = futures::stream::repeat_with(|| {
                Ok(hyper::body::Frame::data(Bytes::from_static(
                    &[b' '; 1 << 16],
                )))
            });
            (
                http::StatusCode::OK,
                http_body_util::StreamBody::new(frames).boxed(),
            )
        })
    };
    let server = tokio::spawn(serve(listener, tls.server.clone(), endless));
    let agent = start_agent(dir.path(), &cluster, &ca, "master-0", "127.0.0.10/8");
    let rounds = wait_for(
        "three rounds against the endless answer",
        Duration::from_secs(20),
        || asked.load(std::sync::atomic::Ordering::SeqCst) >= 3,
    )
    .await;
    let rss = rss_kib(agent.proc.pid());
    eprintln!("3 endless answers in {rounds:?}; agent RSS {rss} kB");
    assert!(agent.proc.0.id() > 0 && rss > 0, "the agent is running");
    assert!(
        rss < 256 * 1024,
        "{rss} kB resident after endless answers (the limit is {MAX_ANSWER_BYTES} bytes an answer)"
    );
    assert_eq!(
        agent.names(),
        ["master-0"],
        "nothing taken from an endless answer"
    );
    server.abort();
    let _ = server.await;

    // 2. An answer under the byte limit listing far more members than a cluster has.
    let offered = 40_000;
    let entries: Vec<serde_json::Value> = (0..offered)
        .map(|i| {
            serde_json::json!({"member": {"name": format!("n{i}"), "role": "worker",
                "addresses": [format!("10.9.{}.{}", i / 250, i % 250 + 1)], "version": ""},
                "ageMs": 0})
        })
        .collect();
    let many = Bytes::from(serde_json::to_vec(&entries).unwrap());
    assert!(many.len() < MAX_ANSWER_BYTES, "{} bytes", many.len());
    let flood: Responder =
        Arc::new(move |_, _, _, _| (http::StatusCode::OK, Full::new(many.clone()).boxed()));
    let listener = TcpListener::bind(addr).await.unwrap();
    let server = tokio::spawn(serve(listener, tls.server.clone(), flood));
    wait_for("the flood taken in", Duration::from_secs(30), || {
        agent.names().len() > 1
    })
    .await;
    // A few more rounds: the list stays held.
    tokio::time::sleep(Duration::from_secs(3 * RENEW)).await;
    let listed = agent.names().len();
    let rss = rss_kib(agent.proc.pid());
    eprintln!("{offered} members offered, {listed} listed; agent RSS {rss} kB");
    assert!(
        (MAX_MEMBERS..=MAX_MEMBERS + 1).contains(&listed),
        "{listed} listed of {offered} offered (limit {MAX_MEMBERS}, and the node itself)"
    );
    assert!(rss < 256 * 1024, "{rss} kB resident");
    server.abort();
}
