//! Backend health checks against a scripted TLS `/readyz`: rise and fall counted check by
//! check, and backends that answer garbage, stall or reset marked down.

use super::*;

// ---------------------------------------------------------------------------------------
// Health checks against a scripted TLS /readyz

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    Error500,
    Garbage,
    Stall,
    Reset,
}

/// One check as the backend saw it: what it answered, and the proxy's view of this backend
/// when the check connected (i.e. after every earlier check was recorded).
#[derive(Debug, Clone, Copy)]
struct Seen {
    answer: Answer,
    up: bool,
    failures: u32,
    successes: u32,
}

struct Script {
    answer: Mutex<Answer>,
    log: Mutex<Vec<Seen>>,
    backend: Mutex<Option<Arc<Backend>>>,
    stalled: Mutex<Vec<TcpStream>>,
}

impl Script {
    fn set(&self, a: Answer) {
        *self.answer.lock().unwrap() = a;
    }
    fn log(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

/// A TLS server answering `GET /readyz` as its script says.
async fn readyz_backend(first: Answer) -> (SocketAddr, Arc<Script>) {
    let l = TcpListener::bind(lo0()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let script = Arc::new(Script {
        answer: Mutex::new(first),
        log: Mutex::new(Vec::new()),
        backend: Mutex::new(None),
        stalled: Mutex::new(Vec::new()),
    });
    let acc = keelson_testkit::tls::self_signed_acceptor();
    let sc = script.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let answer = *sc.answer.lock().unwrap();
            if let Some(b) = sc.backend.lock().unwrap().as_ref() {
                let h = b.health();
                sc.log.lock().unwrap().push(Seen {
                    answer,
                    up: h.up,
                    failures: h.failures,
                    successes: h.successes,
                });
            }
            match answer {
                Answer::Stall => {
                    sc.stalled.lock().unwrap().push(s);
                    continue;
                }
                Answer::Reset => {
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(s);
                    continue;
                }
                _ => {}
            }
            let acc = acc.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acc.accept(s).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 512];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                assert!(head.starts_with(b"GET /readyz HTTP/1.1\r\n"), "{head:?}");
                let reply: &[u8] = match answer {
                    Answer::Ok => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                    Answer::Error500 => {
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
                    }
                    _ => b"SSH-2.0-OpenSSH_9.2 not http at all\r\n",
                };
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, script)
}

fn tls_config() -> ProxyConfig {
    ProxyConfig {
        check: BackendCheck::TlsReadyz,
        ..config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_readyz_falls_after_exactly_three_and_rises_after_one() {
    let (a, script) = readyz_backend(Answer::Ok).await;
    let p = start(tls_config(), &[a]);
    *script.backend.lock().unwrap() = Some(p.backend(a));
    let pool = p.proxy.pool();
    wait_until("backend up on the first 200", || pool.is_healthy()).await;
    wait_until("a 200 seen by the backend log", || {
        script.log().iter().any(|s| s.answer == Answer::Ok)
    })
    .await;

    script.set(Answer::Error500);
    wait_until("backend down after 500s", || !pool.is_healthy()).await;
    let down_at = script.log().len();
    // One more check, so the log holds the state after the third failure.
    wait_until("one check after going down", || {
        script.log().len() > down_at
    })
    .await;
    script.set(Answer::Ok);
    wait_until("backend up again", || pool.is_healthy()).await;
    let up_at = script.log().len();
    wait_until("one check after coming up", || script.log().len() > up_at).await;

    let log = script.log();
    let first_500 = log
        .iter()
        .position(|s| s.answer == Answer::Error500)
        .unwrap();
    let fails: Vec<(bool, u32)> = log[first_500..]
        .iter()
        .take(4)
        .map(|s| (s.up, s.failures))
        .collect();
    // The state when check k connects is the result of checks 1..k-1.
    assert_eq!(
        fails,
        vec![(true, 0), (true, 1), (true, 2), (false, 3)],
        "up after two failures, down after exactly three: {log:?}"
    );
    let first_ok = first_500
        + log[first_500..]
            .iter()
            .position(|s| s.answer == Answer::Ok)
            .unwrap();
    let after = log[first_ok + 1];
    assert!(!log[first_ok].up, "{log:?}");
    assert!(
        after.up && after.successes == 1,
        "up after exactly one success: {log:?}"
    );
    let h = p.backend(a).health();
    assert!(h.up && h.last_error.is_none());
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_stalling_and_resetting_backends_are_marked_down() {
    let cases = [
        (Answer::Garbage, "invalid HTTP"),
        (Answer::Stall, "timed out"),
        (Answer::Reset, "reset"),
    ];
    let mut backends = Vec::new();
    for (answer, _) in cases {
        let (a, script) = readyz_backend(Answer::Ok).await;
        backends.push((a, script, answer));
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.0).collect();
    let p = start(tls_config(), &addrs);
    wait_until("all up", || {
        addrs.iter().all(|a| p.snapshot(*a).state == "up")
    })
    .await;
    for (_, script, answer) in &backends {
        script.set(*answer);
    }
    for ((a, _, _), (answer, why)) in backends.iter().zip(cases) {
        wait_until(&format!("{answer:?} backend down"), || {
            p.snapshot(*a).state == "down"
        })
        .await;
        let err = p.snapshot(*a).last_error.unwrap_or_default();
        assert!(
            err.to_lowercase().contains(&why.to_lowercase()),
            "{answer:?}: last error {err:?} should mention {why:?}"
        );
    }
    assert!(!p.proxy.pool().is_healthy());
    // No backend up: a client is closed at once rather than sent to a down backend.
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(SOON, c.read(&mut buf))
        .await
        .expect("closed, not left hanging")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(addrs.iter().all(|a| p.snapshot(*a).total == 0));
    p.shutdown().await;
}
