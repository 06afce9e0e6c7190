//! Health checks against real loopback servers: TCP connect, HTTP and HTTPS (self-signed,
//! not verified) GET with the expected status, the bus-fed checks, rise/fall through
//! `health::spawn`, and the local-apiserver check telling a slow `/readyz` from a dead one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use keelson_agent::context::Bus;
use keelson_agent::health::{self, CheckState};
use keelson_cluster::cluster::{HealthCheckConfig, HealthCheckKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(2);

/// A minimal HTTP/1.1 server answering every request with the status in `status`.
async fn http_server(status: Arc<AtomicU16>, tls: Option<tokio_rustls::TlsAcceptor>) -> u16 {
    slow_http_server(status, tls, Arc::new(AtomicU64::new(0))).await
}

/// [`http_server`] that reads the request, then waits `delay` ms before answering.
async fn slow_http_server(
    status: Arc<AtomicU16>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    delay: Arc<AtomicU64>,
) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let status = status.load(Ordering::SeqCst);
            let tls = tls.clone();
            let delay = Duration::from_millis(delay.load(Ordering::SeqCst));
            tokio::spawn(async move {
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let mut buf = [0u8; 1024];
                match tls {
                    Some(acc) => {
                        let Ok(mut s) = acc.accept(s).await else {
                            return;
                        };
                        let _ = s.read(&mut buf).await;
                        tokio::time::sleep(delay).await;
                        let _ = s.write_all(reply.as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    None => {
                        let mut s = s;
                        let _ = s.read(&mut buf).await;
                        tokio::time::sleep(delay).await;
                        let _ = s.write_all(reply.as_bytes()).await;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn tcp_connect_passes_and_fails() {
    let bus = Bus::default();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = l.local_addr().unwrap();
    assert!(health::probe(&HealthCheckKind::Tcp { address }, &bus, None, T).await);
    drop(l);
    assert!(!health::probe(&HealthCheckKind::Tcp { address }, &bus, None, T).await);
}

#[tokio::test]
async fn http_and_https_expect_the_status() {
    let bus = Bus::default();
    let status = Arc::new(AtomicU16::new(200));
    for (scheme, tls) in [
        ("http", None),
        ("https", Some(keelson_testkit::tls::self_signed_acceptor())),
    ] {
        status.store(200, Ordering::SeqCst);
        let port = http_server(status.clone(), tls).await;
        let kind = |expect_status| HealthCheckKind::Http {
            url: format!("{scheme}://127.0.0.1:{port}/readyz"),
            expect_status,
        };
        assert!(
            health::probe(&kind(200), &bus, None, T).await,
            "{scheme} 200"
        );
        assert!(
            !health::probe(&kind(204), &bus, None, T).await,
            "{scheme} wrong status"
        );
        status.store(503, Ordering::SeqCst);
        assert!(
            !health::probe(&kind(200), &bus, None, T).await,
            "{scheme} 503"
        );
    }
    // Nobody listening, and a malformed URL: failing, not panicking.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    for url in [
        format!("http://127.0.0.1:{port}/"),
        "ftp://127.0.0.1/".into(),
        "http://name.example/".into(),
        "::".into(),
    ] {
        let kind = HealthCheckKind::Http {
            url,
            expect_status: 200,
        };
        assert!(!health::probe(&kind, &bus, None, T).await);
    }
}

#[tokio::test]
async fn bus_checks_follow_the_bus() {
    let bus = Bus::default();
    assert!(!health::probe(&HealthCheckKind::ProxyHealthyBackend, &bus, None, T).await);
    assert!(!health::probe(&HealthCheckKind::IgnitionServer, &bus, None, T).await);
    bus.proxy_healthy.send_replace(true);
    assert!(health::probe(&HealthCheckKind::ProxyHealthyBackend, &bus, None, T).await);
    assert!(!health::probe(&HealthCheckKind::IgnitionServer, &bus, None, T).await);
    bus.ignition_running.send_replace(true);
    assert!(health::probe(&HealthCheckKind::IgnitionServer, &bus, None, T).await);
}

async fn wait_weight(rx: &mut tokio::sync::watch::Receiver<Vec<CheckState>>, want: i32) {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if health::weight(&rx.borrow_and_update()) == want {
                return;
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("weight never became {want}: {:?}", rx.borrow()));
}

#[tokio::test]
async fn spawned_checks_rise_and_fall_into_the_weight() {
    let bus = Arc::new(Bus::default());
    let status = Arc::new(AtomicU16::new(200));
    let port = http_server(status.clone(), None).await;
    let checks = vec![
        HealthCheckConfig {
            name: "api".into(),
            check: HealthCheckKind::Http {
                url: format!("http://127.0.0.1:{port}/"),
                expect_status: 200,
            },
            interval_ms: 20,
            rise: 3,
            fall: 2,
            weight: 50,
            timeout_ms: None,
        },
        HealthCheckConfig {
            name: "proxy".into(),
            check: HealthCheckKind::ProxyHealthyBackend,
            interval_ms: 20,
            rise: 1,
            fall: 1,
            weight: 7,
            timeout_ms: None,
        },
    ];
    let stop = CancellationToken::new();
    let mut rx = health::spawn(&checks, bus.clone(), None, stop.clone());
    assert_eq!(health::weight(&rx.borrow()), 0, "checks start failing");
    wait_weight(&mut rx, 50).await;
    bus.proxy_healthy.send_replace(true);
    wait_weight(&mut rx, 57).await;
    status.store(500, Ordering::SeqCst);
    wait_weight(&mut rx, 7).await;
    status.store(200, Ordering::SeqCst);
    wait_weight(&mut rx, 57).await;
    stop.cancel();
}

/// Slow is not dead: the local-apiserver check (TLS `GET /readyz`, the proxy's check) passes
/// an answer that takes 1.5 s within its 10 s timeout; the same answer fails the default
/// 1 s timeout; a 503, a refused connect and no address at all fail — the refusal at once.
#[tokio::test]
async fn local_apiserver_passes_slow_and_fails_dead() {
    let bus = Bus::default();
    let status = Arc::new(AtomicU16::new(200));
    let delay = Arc::new(AtomicU64::new(1500));
    let tls = Some(keelson_testkit::tls::self_signed_acceptor());
    let port = slow_http_server(status.clone(), tls, delay.clone()).await;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let kind = HealthCheckKind::LocalApiserver;
    let generous = Duration::from_secs(10);
    assert!(
        health::probe(&kind, &bus, Some(addr), generous).await,
        "a 1.5 s answer within 10 s passes"
    );
    delay.store(3000, Ordering::SeqCst);
    assert!(
        !health::probe(&kind, &bus, Some(addr), Duration::from_secs(1)).await,
        "a 3 s answer fails a 1 s timeout (the check a slow apiserver would flap)"
    );
    delay.store(0, Ordering::SeqCst);
    status.store(503, Ordering::SeqCst);
    assert!(
        !health::probe(&kind, &bus, Some(addr), generous).await,
        "503"
    );
    assert!(
        !health::probe(&kind, &bus, None, generous).await,
        "no address"
    );
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = free.local_addr().unwrap();
    drop(free);
    let t = std::time::Instant::now();
    assert!(!health::probe(&kind, &bus, Some(refused), generous).await);
    assert!(
        t.elapsed() < generous / 2,
        "a refused connect fails at once, not after the timeout: {:?}",
        t.elapsed()
    );
}
