//! HTTP from the test's side: `curl` on the host or in a namespace, a tiny server with a
//! route table, and a server whose answer never ends.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::exec_in;

/// What `curl` got: the status (0 when no HTTP answer came), the response headers, the
/// body, and curl's own exit status and complaint on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// curl's exit status (0: a response came; 7: refused; 28: timed out; 60: untrusted
    /// certificate; `None`: killed).
    pub exit: Option<i32>,
    /// The HTTP status, 0 when none (refused, timed out, TLS failed).
    pub status: u16,
    /// The header block(s) as received (`-D`).
    pub headers: String,
    /// The body.
    pub body: Vec<u8>,
    /// curl's stderr (why there was no answer).
    pub error: String,
}

impl Reply {
    /// The value of header `name` (case-insensitive), from the last header block.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().rev().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `curl ARGS` on the host (`-sS`, no proxy, 10 s unless `args` say otherwise).
pub fn curl(args: &[&str]) -> Reply {
    run(Command::new("curl"), args)
}

/// `curl ARGS` inside namespace `ns`.
pub fn curl_in(ns: &str, args: &[&str]) -> Reply {
    run(exec_in(ns, "curl"), args)
}

fn run(mut cmd: Command, args: &[&str]) -> Reply {
    let dir = tempfile::tempdir().unwrap();
    let (headers, body) = (dir.path().join("headers"), dir.path().join("body"));
    let out = cmd
        .args(["-sS", "--noproxy", "*", "--path-as-is", "--max-time", "10"])
        .arg("-D")
        .arg(&headers)
        .arg("-o")
        .arg(&body)
        .args(["-w", "%{http_code}"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl {args:?}: {e}"));
    Reply {
        exit: out.status.code(),
        status: String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0),
        headers: std::fs::read_to_string(&headers).unwrap_or_default(),
        body: std::fs::read(&body).unwrap_or_default(),
        error: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One route of an [`HttpServer`]: a path and the body answered with 200.
type Route = (String, Vec<u8>);

/// A plain HTTP/1.1 server on a listener the caller bound (on loopback or inside a
/// namespace): `GET <path>` of a route answers 200 and its body, anything else 404. It
/// records the paths asked for; dropped, it closes the listener.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `routes` (path, body) on `listener` until dropped.
    pub fn start<P: Into<String>, B: Into<Vec<u8>>>(
        listener: TcpListener,
        routes: impl IntoIterator<Item = (P, B)>,
    ) -> Self {
        let routes: Vec<Route> = routes
            .into_iter()
            .map(|(p, b)| (p.into(), b.into()))
            .collect();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let thread = {
            let (stop, requests) = (stop.clone(), requests.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (routes, requests) = (routes.clone(), requests.clone());
                            std::thread::spawn(move || answer(conn, &routes, &requests));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        HttpServer {
            addr,
            stop,
            requests,
            thread: Some(thread),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The paths asked for so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head (up to 16 KiB) and answers it from `routes`.
fn answer(mut conn: TcpStream, routes: &[Route], requests: &Mutex<Vec<String>>) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let found = routes.iter().find(|(p, _)| *p == path);
    requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(path);
    let (status, body): (&str, &[u8]) = match found {
        Some((_, body)) => ("200 OK", body),
        None => ("404 Not Found", b""),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(body);
}

/// A plain-HTTP server on loopback answering any request with an endless chunked body (the
/// tests of every bounded reader point at it); its address. It runs on the caller's runtime.
pub async fn endless_http_server() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .await;
                let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, "x".repeat(1 << 16));
                while conn.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    addr
}
