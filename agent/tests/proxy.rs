//! The API proxy end to end on 127.0.0.1: data integrity (splice and buffered copy), TCP
//! half-close, failover on a refused connect and past a silent backend, TLS `/readyz` health with rise/fall counted
//! check by check, the monitor, drain on stop, idle and vanished clients, and a proxy run as
//! the `proxy` subcommand under a tiny `RLIMIT_NOFILE`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keelson_agent::proxy::backend::Backend;
use keelson_agent::proxy::{Proxy, ProxyConfig};
use keelson_agent::status::model::BackendSnapshot;
use keelson_cluster::cluster::BackendCheck;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// The sections that are long on their own, in files beside this one (a test crate's root
// looks for its modules next to it, hence the paths).
#[path = "proxy/data_path.rs"]
mod data_path;
#[path = "proxy/health_checks.rs"]
mod health_checks;

/// Generous bound for things that should happen "soon" (not a speed assertion).
const SOON: Duration = Duration::from_secs(10);

fn lo0() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn config() -> ProxyConfig {
    ProxyConfig {
        frontends: vec![lo0()],
        monitor: None,
        check: BackendCheck::None,
        check_interval: Duration::from_millis(100),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(120),
        drain_timeout: Duration::from_secs(20),
        ..ProxyConfig::default()
    }
}

struct Running {
    proxy: Proxy,
    addr: SocketAddr,
    stop: CancellationToken,
    serve: JoinHandle<anyhow::Result<()>>,
}

fn start(cfg: ProxyConfig, backends: &[SocketAddr]) -> Running {
    let proxy = Proxy::bind(cfg, backends).expect("bind");
    let addr = proxy.local_addrs()[0];
    let stop = CancellationToken::new();
    let serve = tokio::spawn({
        let p = proxy.clone();
        let s = stop.clone();
        async move { p.serve(s).await }
    });
    Running {
        proxy,
        addr,
        stop,
        serve,
    }
}

impl Running {
    async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(SOON, self.serve)
            .await
            .expect("serve returns after stop")
            .expect("serve task")
            .expect("serve result");
    }

    fn snapshot(&self, addr: SocketAddr) -> BackendSnapshot {
        self.proxy
            .pool()
            .snapshot()
            .into_iter()
            .find(|b| b.addr == addr)
            .expect("backend in pool")
    }

    fn backend(&self, addr: SocketAddr) -> Arc<Backend> {
        self.proxy
            .pool()
            .backends()
            .iter()
            .find(|b| b.addr == addr)
            .cloned()
            .expect("backend in pool")
    }
}

/// Waits until `f` holds; panics with `what` after [`SOON`].
async fn wait_until(what: &str, f: impl FnMut() -> bool) {
    keelson_testkit::wait_for_async(what, SOON, f).await;
}

/// A port nobody listens on.
async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind(lo0()).await.unwrap();
    l.local_addr().unwrap()
}

/// An echo server that counts its open connections; aborting `task` closes the listener.
struct Echo {
    addr: SocketAddr,
    live: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

async fn echo_backend() -> Echo {
    let l = TcpListener::bind(lo0()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn({
        let live = live.clone();
        async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let live = live.clone();
                live.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = w.shutdown().await;
                    drop((r, w));
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
    });
    Echo { addr, live, task }
}

/// Writes `b"x"`, expects it back.
async fn ping(c: &mut TcpStream) -> std::io::Result<()> {
    c.write_all(b"x").await?;
    let mut b = [0u8; 1];
    c.read_exact(&mut b).await?;
    assert_eq!(&b, b"x");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Failover

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connect_fails_over_to_the_next_backend() {
    let dead = closed_port().await;
    let echo = echo_backend().await;
    let p = start(config(), &[dead, echo.addr]);
    // Round robin: four of eight connections start on the dead backend and move on.
    for _ in 0..8 {
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        ping(&mut c)
            .await
            .expect("every connection lands on the live backend");
    }
    let d = p.snapshot(dead);
    let e = p.snapshot(echo.addr);
    assert_eq!((d.connect_failures, d.total), (4, 0));
    assert_eq!((e.connect_failures, e.total), (0, 8));
    // Unchecked backends stay in: nothing would ever bring them back.
    assert_eq!(d.state, "up");
    p.shutdown().await;

    // Without retries the two that start on the dead backend are closed.
    let p = start(
        ProxyConfig {
            retries: 0,
            ..config()
        },
        &[dead, echo.addr],
    );
    let mut served = 0;
    for _ in 0..4 {
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        if ping(&mut c).await.is_ok() {
            served += 1;
        }
    }
    assert_eq!(served, 2);
    assert_eq!(p.snapshot(dead).connect_failures, 2);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_client_connects_take_a_backend_out_between_checks() {
    let victim = echo_backend().await;
    let echo = echo_backend().await;
    // Checks once at start, then only when a client connect fails.
    let p = start(
        ProxyConfig {
            check: BackendCheck::Tcp,
            check_interval: Duration::from_secs(3600),
            ..config()
        },
        &[victim.addr, echo.addr],
    );
    let pool = p.proxy.pool();
    wait_until("both backends checked", || {
        pool.snapshot()
            .iter()
            .all(|b| b.last_check_unix_ms.is_some())
    })
    .await;
    victim.task.abort();
    let _ = victim.task.await;
    let mut clients = 0;
    while p.snapshot(victim.addr).state == "up" {
        assert!(clients < 20, "still up after {clients} clients");
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        ping(&mut c).await.expect("served by the live backend");
        clients += 1;
    }
    let failures = p.snapshot(victim.addr).connect_failures;
    assert!(
        failures <= 3,
        "down after {failures} failed connects, fall is 3"
    );
    for _ in 0..6 {
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        ping(&mut c).await.expect("served by the live backend");
    }
    let v = p.snapshot(victim.addr);
    assert_eq!(
        v.connect_failures, failures,
        "a down backend gets no clients"
    );
    assert!(v.last_error.is_some());
    assert_eq!(p.snapshot(echo.addr).state, "up");
    p.shutdown().await;
}

/// A listener whose accept queue is full and never drained: the kernel drops SYNs to it, so
/// a connect hangs as it does to a powered-off host. Keep the returned values alive.
fn silent_backend() -> (SocketAddr, socket2::Socket, Vec<std::net::TcpStream>) {
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&lo0().into()).unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let mut queued = Vec::new();
    while let Ok(c) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        queued.push(c);
        assert!(queued.len() < 16, "the accept queue never fills");
    }
    (addr, l, queued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_backend_costs_a_client_the_stagger_not_the_connect_timeout() {
    let (silent, _l, _q) = tokio::task::spawn_blocking(silent_backend).await.unwrap();
    let echo = echo_backend().await;
    // The product's stagger (250 ms): a client with a 1 s timeout is served in time.
    let staggered = ProxyConfig {
        connect_timeout: Duration::from_secs(60),
        ..config()
    };
    assert_eq!(staggered.connect_stagger, Duration::from_millis(250));
    let p = start(staggered.clone(), &[silent, echo.addr]);
    for _ in 0..4 {
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        tokio::time::timeout(SOON, ping(&mut c))
            .await
            .expect("served long before the 60 s connect timeout")
            .expect("served by the live backend");
    }
    let s = p.snapshot(silent);
    assert_eq!(s.total, 0);
    assert_eq!(
        s.connect_failures, 2,
        "each client that started on it blames it"
    );
    assert_eq!(p.snapshot(echo.addr).total, 4);
    assert_eq!(s.state, "up", "unchecked backends stay in");
    p.shutdown().await;

    // Checked: the blame is passive health, and after `fall` clients the silent backend is
    // out. It has to be up first: its one queue slot is free for the first check, whose
    // connection then fills it, so the backend goes silent right after passing.
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&lo0().into()).unwrap();
    l.listen(0).unwrap();
    let dying = l.local_addr().unwrap().as_socket().unwrap();
    let p = start(
        ProxyConfig {
            check: BackendCheck::Tcp,
            check_interval: Duration::from_secs(3600),
            ..staggered
        },
        &[dying, echo.addr],
    );
    wait_until("both backends up", || {
        p.snapshot(dying).state == "up" && p.snapshot(echo.addr).state == "up"
    })
    .await;
    let mut clients = 0;
    while p.snapshot(dying).state == "up" {
        assert!(clients < 20, "still up after {clients} clients");
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        tokio::time::timeout(SOON, ping(&mut c))
            .await
            .expect("served in time")
            .expect("served by the live backend");
        clients += 1;
    }
    let d = p.snapshot(dying);
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no answer")),
        "{d:?}"
    );
    assert!(d.connect_failures <= 3, "down after fall = 3 blames: {d:?}");
    p.shutdown().await;

    // Without the stagger a client that starts on the silent backend waits out the connect
    // timeout before it is sent on (what the stagger saves).
    let p = start(
        ProxyConfig {
            connect_timeout: Duration::from_millis(1500),
            connect_stagger: Duration::ZERO,
            ..config()
        },
        &[silent, echo.addr],
    );
    let t = Instant::now();
    for _ in 0..2 {
        let mut c = TcpStream::connect(p.addr).await.unwrap();
        ping(&mut c).await.expect("served by the live backend");
    }
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(p.snapshot(silent).connect_failures, 1);
    p.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Monitor

/// A bare HTTP/1.1 GET: (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut v = Vec::new();
    tokio::time::timeout(SOON, s.read_to_end(&mut v))
        .await
        .expect("monitor answers")
        .unwrap();
    let text = String::from_utf8(v).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

async fn stats(monitor: SocketAddr) -> serde_json::Value {
    let (status, body) = http_get(monitor, "/stats").await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

fn backend_json(v: &serde_json::Value, a: SocketAddr) -> serde_json::Value {
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["addr"] == a.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("{a} not in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_healthz_and_stats() {
    let echo = echo_backend().await;
    let dead = closed_port().await;
    let p = start(
        ProxyConfig {
            check: BackendCheck::Tcp,
            monitor: Some(lo0()),
            ..config()
        },
        &[echo.addr, dead],
    );
    let m = p.proxy.monitor_addr().unwrap();
    let deadline = Instant::now() + SOON;
    loop {
        let (status, _) = http_get(m, "/healthz").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "/healthz never 200");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = stats(m).await;
    assert_eq!(v["healthy"], true);
    assert_eq!(backend_json(&v, echo.addr)["state"], "up");
    assert_eq!(backend_json(&v, dead)["state"], "down");

    // One live connection moving 1000 bytes each way.
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    c.write_all(&[7u8; 1000]).await.unwrap();
    let mut back = [0u8; 1000];
    c.read_exact(&mut back).await.unwrap();
    // The counter is bumped right after the write that woke the client: wait for it.
    wait_until("bytes counted", || {
        let s = p.snapshot(echo.addr);
        s.bytes_in + s.bytes_out >= 2000
    })
    .await;
    let b = backend_json(&stats(m).await, echo.addr);
    assert_eq!(
        (&b["active"], &b["total"], &b["bytesIn"], &b["bytesOut"]),
        (&1.into(), &1.into(), &1000.into(), &1000.into()),
        "{b}"
    );
    drop(c);
    wait_until("connection closed", || p.snapshot(echo.addr).active == 0).await;
    let b = backend_json(&stats(m).await, echo.addr);
    assert_eq!((&b["active"], &b["total"]), (&0.into(), &1.into()));
    let d = backend_json(&stats(m).await, dead);
    assert!(d["lastError"].as_str().unwrap().contains("connect"), "{d}");

    // The only live backend goes away: down after three failed checks, /healthz 503.
    echo.task.abort();
    wait_until("echo backend down", || {
        p.snapshot(echo.addr).state == "down"
    })
    .await;
    let (status, body) = http_get(m, "/healthz").await;
    assert_eq!((status, body.as_str()), (503, "no backend is up\n"));
    let v = stats(m).await;
    assert_eq!(v["healthy"], false);
    assert_eq!(http_get(m, "/nope").await.0, 404);
    p.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Drain

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_drains_live_connections_and_refuses_new_ones() {
    let echo = echo_backend().await;
    let p = start(config(), &[echo.addr]);
    // A frontend added at run time (as the VIP's) stops accepting too.
    let added = p.proxy.add_frontend(lo0(), false).unwrap();
    let mut live = TcpStream::connect(p.addr).await.unwrap();
    ping(&mut live).await.unwrap();

    p.stop.cancel();
    for frontend in [p.addr, added] {
        let deadline = Instant::now() + SOON;
        loop {
            match TcpStream::connect(frontend).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                _ => {
                    assert!(
                        Instant::now() < deadline,
                        "frontend {frontend} still accepts after stop"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    for _ in 0..3 {
        ping(&mut live)
            .await
            .expect("live connection works while draining");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !p.serve.is_finished(),
        "serve returned with a live connection"
    );
    live.shutdown().await.unwrap();
    let mut rest = Vec::new();
    live.read_to_end(&mut rest).await.unwrap();
    tokio::time::timeout(SOON, p.serve)
        .await
        .expect("serve returns once the last connection closed")
        .unwrap()
        .unwrap();
    assert_eq!(echo.live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_cuts_a_stuck_connection() {
    let echo = echo_backend().await;
    let drain = Duration::from_millis(300);
    let p = start(
        ProxyConfig {
            drain_timeout: drain,
            ..config()
        },
        &[echo.addr],
    );
    let mut stuck = TcpStream::connect(p.addr).await.unwrap();
    ping(&mut stuck).await.unwrap();
    let t0 = Instant::now();
    p.stop.cancel();
    tokio::time::timeout(SOON, p.serve)
        .await
        .expect("serve returns after the drain timeout")
        .unwrap()
        .unwrap();
    assert!(t0.elapsed() >= drain, "cut before the drain timeout");
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(SOON, stuck.read(&mut buf))
        .await
        .expect("the client sees the cut")
        .unwrap_or(0);
    assert_eq!(n, 0);
    wait_until("backend side closed", || {
        echo.live.load(Ordering::SeqCst) == 0
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Idle and vanished clients

/// A proxy in front of `echo` with the idle timeout `idle`.
fn with_idle_timeout(idle: Duration, echo: &Echo) -> Running {
    let cfg = ProxyConfig {
        idle_timeout: idle,
        ..config()
    };
    start(cfg, &[echo.addr])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_vanished_clients_leak_nothing() {
    let echo = echo_backend().await;
    let p = with_idle_timeout(Duration::from_millis(300), &echo);
    // Connects and never sends: the idle timeout closes both sides.
    let mut silent = TcpStream::connect(p.addr).await.unwrap();
    wait_until("silent client proxied", || {
        p.proxy.active_connections() == 1 && echo.live.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(SOON, silent.read(&mut buf))
        .await
        .expect("idle client closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    wait_until("no connection left", || {
        p.proxy.active_connections() == 0
            && p.snapshot(echo.addr).active == 0
            && echo.live.load(Ordering::SeqCst) == 0
    })
    .await;
    p.shutdown().await;

    // With a long idle timeout: a client that resets, and one that closes without a word.
    let p = start(config(), &[echo.addr]);
    for reset in [true, false] {
        let c = TcpStream::connect(p.addr).await.unwrap();
        wait_until("client proxied", || {
            p.proxy.active_connections() == 1 && echo.live.load(Ordering::SeqCst) == 1
        })
        .await;
        if reset {
            socket2::SockRef::from(&c)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(c);
        wait_until("vanished client cleaned up", || {
            p.proxy.active_connections() == 0 && echo.live.load(Ordering::SeqCst) == 0
        })
        .await;
    }
    assert_eq!(p.snapshot(echo.addr).total, 2);
    p.shutdown().await;
}

/// Timeouts of two ticks or more wait for the proxy's shared tick before they arm a timer
/// (`proxy::lazy_timer`): they must still fire, and not before they are due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_connect_timeouts_past_the_shared_tick_still_fire_when_due() {
    use keelson_agent::proxy::lazy_timer::TICK;
    let idle = TICK * 3;
    let echo = echo_backend().await;
    let p = with_idle_timeout(idle, &echo);
    let mut quiet = TcpStream::connect(p.addr).await.unwrap();
    let since = Instant::now();
    ping(&mut quiet).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(SOON, quiet.read(&mut buf))
        .await
        .expect("quiet client closed by the idle timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        since.elapsed() >= idle,
        "closed after {:?}",
        since.elapsed()
    );
    p.shutdown().await;

    // A backend that never answers a SYN and no other to try: the client is closed once the
    // connect timeout passes.
    let (silent, _l, _q) = tokio::task::spawn_blocking(silent_backend).await.unwrap();
    let connect_timeout = TICK * 3;
    let p = start(
        ProxyConfig {
            connect_timeout,
            connect_stagger: Duration::ZERO,
            ..config()
        },
        &[silent],
    );
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    let since = Instant::now();
    let n = tokio::time::timeout(SOON, c.read(&mut buf))
        .await
        .expect("client closed after the connect timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        since.elapsed() >= connect_timeout - Duration::from_millis(20),
        "closed after {:?}",
        since.elapsed()
    );
    assert_eq!(p.snapshot(silent).connect_failures, 1);
    p.shutdown().await;
}

/// The idle timeout counts from the last byte moved (the connection's deadline moves on with
/// every byte; the timer armed for an earlier deadline is re-armed when it fires): a
/// connection that keeps talking stays open past it, and is closed once quiet that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_counts_from_the_last_byte_moved() {
    use keelson_agent::proxy::lazy_timer::TICK;
    // Long enough that a loaded machine's scheduling stalls between pings stay well inside.
    let idle = TICK * 12;
    let echo = echo_backend().await;
    let p = with_idle_timeout(idle, &echo);
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    let since = Instant::now();
    let quiet = loop {
        ping(&mut c)
            .await
            .expect("a talking connection stays open past the idle timeout");
        // About when the proxy last moved a byte (the echo's, just before this read it).
        let last = Instant::now();
        if since.elapsed() >= idle * 2 {
            break last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(SOON, c.read(&mut buf))
        .await
        .expect("closed once quiet for the idle timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Loose: the client reads a scheduling moment after the proxy wrote; what it rules out is
    // a timeout counted from anything earlier (the connection's start is two timeouts back).
    assert!(
        quiet.elapsed() >= idle / 2,
        "closed {:?} after the last byte",
        quiet.elapsed()
    );
    p.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Descriptor exhaustion, in a child process

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_waits_and_recovers() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let echo = echo_backend().await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keelson-agent"));
    cmd.args(["proxy", "--listen", "127.0.0.1:0", "--backend"])
        .arg(echo.addr.to_string())
        .args(["--check", "none", "--monitor", "none", "--drain-secs", "0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe and
    // touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 40,
                rlim_max: 40,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn keelson-agent proxy");
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let log = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(line.clone());
                }
                log.lock().unwrap().push_str(&line);
                log.lock().unwrap().push('\n');
            }
        });
    }
    let line = rx.recv_timeout(SOON).expect("proxy started");
    let addr: SocketAddr = line
        .split_once('[')
        .and_then(|(_, r)| r.split_once(']'))
        .map(|(a, _)| a)
        .unwrap()
        .parse()
        .unwrap();

    // Open connections until one is not served: the proxy ran out of descriptors.
    let mut served = Vec::new();
    let mut stuck = loop {
        assert!(served.len() < 100, "never ran out of descriptors");
        let mut c = TcpStream::connect(addr).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(1000), ping(&mut c)).await {
            Ok(Ok(())) => served.push(c),
            Ok(Err(e)) => panic!("client closed at the limit instead of waiting: {e}"),
            Err(_) => break c,
        }
    };
    assert!(
        served.len() >= 2,
        "only {} connections served",
        served.len()
    );
    // One more client: this accept fails with EMFILE and waits in the backlog.
    let mut waiting = TcpStream::connect(addr).await.unwrap();
    waiting.write_all(b"x").await.unwrap();
    let l = log.clone();
    wait_until("accept fails with EMFILE", || {
        l.lock().unwrap().contains("accept: out of resources")
    })
    .await;
    assert!(log.lock().unwrap().contains("Too many open files"));

    // Free descriptors: the waiting clients are served, and new ones too.
    drop(served);
    let mut b = [0u8; 1];
    tokio::time::timeout(SOON, stuck.read_exact(&mut b))
        .await
        .expect("stuck client served once descriptors are free")
        .unwrap();
    tokio::time::timeout(SOON, waiting.read_exact(&mut b))
        .await
        .expect("backlogged client served once descriptors are free")
        .unwrap();
    let mut fresh = TcpStream::connect(addr).await.unwrap();
    tokio::time::timeout(SOON, ping(&mut fresh))
        .await
        .expect("new connection served")
        .unwrap();
    ping(&mut stuck).await.unwrap();
    let l = log.clone();
    wait_until("accept recovers", || {
        l.lock().unwrap().contains("accept works again")
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
}
