//! The fabric's client: a new connection to the VIP every period, each in its own thread,
//! recording when it answered and which master did (so the ECMP spread and the outage are
//! both read from the same requests; `probe::ClientLoop` records only whether each answered).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::probe::Sample;

/// One `GET /version` over a new TCP connection; the node named in the answer, if it
/// answered 200 within `timeout`.
pub fn get_version(addr: SocketAddr, timeout: Duration) -> Option<String> {
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    let left = timeout.checked_sub(start.elapsed())?;
    s.set_read_timeout(Some(left)).ok()?;
    s.set_write_timeout(Some(left)).ok()?;
    s.write_all(b"GET /version HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body);
    if !text.starts_with("HTTP/1.1 200") {
        return None;
    }
    let node = text.split("\"node\":\"").nth(1)?.split('"').next()?;
    Some(node.to_owned())
}

/// A [`Sample`] with the node that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// When, and whether, it answered.
    pub sample: Sample,
    /// Who answered.
    pub node: Option<String>,
}

/// A client that opens a new connection every `period` from namespace `ns`, each in its own
/// thread, whatever the earlier ones are doing (a slow or lost one does not hold the next).
#[derive(Debug)]
pub struct Prober {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    /// Starts probing `addr` from namespace `ns`.
    pub fn start(ns: &str, addr: SocketAddr, period: Duration, timeout: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let ns = ns.to_owned();
        let thread = {
            let (stop, answers) = (stop.clone(), answers.clone());
            std::thread::spawn(move || {
                // Threads started from here inherit the namespace.
                if crate::netns::enter(&ns).is_err() {
                    return;
                }
                let mut next = Instant::now();
                let mut workers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let answers = answers.clone();
                    workers.push(std::thread::spawn(move || {
                        let sent = Instant::now();
                        let node = get_version(addr, timeout);
                        let done = Instant::now();
                        answers
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Answer {
                                sample: Sample {
                                    sent,
                                    done,
                                    ok: node.is_some(),
                                },
                                node,
                            });
                    }));
                    next += period;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    workers.retain(|w| !w.is_finished());
                }
                for w in workers {
                    let _ = w.join();
                }
            })
        };
        Prober {
            stop,
            answers,
            thread: Some(thread),
        }
    }

    /// Stops, waits for the requests under way, and returns every answer in send order.
    pub fn finish(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut a = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        a.sort_by_key(|a| a.sample.sent);
        a
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers per node, in node order.
pub fn count_by_node(answers: &[Answer]) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for a in answers {
        if let Some(n) = &a.node {
            *m.entry(n.clone()).or_default() += 1;
        }
    }
    m
}
