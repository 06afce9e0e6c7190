//! Connecting a client to a backend: round-robin order, retries on failure (haproxy's
//! `retries` + `option redispatch`), the connect stagger, and passive health.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keelson_cluster::cluster::BackendCheck;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::accept::is_resource_error;
use super::backend::Backend;
use super::{Shared, forward};

/// The default connect stagger ([`connect`]): a quarter of the first SYN retransmission
/// (1 s). A client with a 1 s timeout that lands on a dead backend is still served by the
/// next one in time; at 1 s (the stagger's first value) it timed out first.
pub const DEFAULT_STAGGER: Duration = Duration::from_millis(250);

/// A backend silent past the stagger is blamed when another answered only if it has been
/// silent this many times as long as the winner took to answer: on a host so loaded that
/// live backends take a stagger to answer a SYN, the winner was slow too and nobody is
/// blamed; a dead one beside a live backend is (the winner answers in a millisecond).
const BLAME_FACTOR: u32 = 4;

/// How one backend connect attempt ended.
pub(crate) enum Attempt {
    Connected(TcpStream),
    /// The backend refused, reset, was unreachable or did not answer in time.
    Failed(String),
    /// No descriptors for the socket until the connect timeout: says nothing of the backend.
    Starved,
}

/// One connect to `b`, up to the connect timeout.
///
/// A connect that fails for lack of local resources (`EMFILE` and friends: the socket could
/// not even be created) says nothing about the backend: it is retried on the same backend
/// until the connect timeout, as the accept loop waits for descriptors.
async fn attempt(sh: &Shared, b: Arc<Backend>, delay_ack: bool) -> (Arc<Backend>, Attempt) {
    // Atomic only to keep the future `Send`; one task touches it.
    let starved = AtomicBool::new(false);
    let tries = async {
        loop {
            match dial(b.addr, delay_ack).await {
                Err(e) if is_resource_error(&e) => {
                    forward::release_spare_pipes();
                    if !starved.swap(true, Ordering::Relaxed) {
                        tracing::warn!(backend = %b.addr, error = %e, "connect: out of resources; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                r => return r,
            }
        }
    };
    let outcome = tokio::select! {
        r = tries => match r {
            Ok(s) => Attempt::Connected(s),
            Err(e) => Attempt::Failed(e.to_string()),
        },
        () = sh.ticker.sleep(sh.cfg.connect_timeout) => if starved.load(Ordering::Relaxed) {
            Attempt::Starved
        } else {
            Attempt::Failed(format!("timed out after {:?}", sh.cfg.connect_timeout))
        },
    };
    (b, outcome)
}

/// Opens a TCP connection to `addr`, with `TCP_NODELAY` (the proxy writes what it read at
/// once; Nagle would hold a request's tail for the previous segment's ACK).
///
/// `TcpStream::connect` less one system call per connection: tokio asks every connected
/// socket for its error (`getsockopt(SO_ERROR)`), while epoll already says whether the
/// connect failed — a refused, reset or unreachable connect is reported with `EPOLLERR`
/// (tokio's ERROR readiness) or `EPOLLHUP`, a successful one with `EPOLLOUT` alone. The
/// error is read only then (haproxy skips the same call when epoll reports no error).
///
/// `delay_ack`: the caller has data to send as soon as the connect completes; the
/// handshake's last ACK is held back (`TCP_QUICKACK` off) so that it leaves with that data
/// instead of alone (see [`super::forward::First`]). The kernel holds it for at most 200 ms.
pub(crate) async fn dial(addr: SocketAddr, delay_ack: bool) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        None,
    )?;
    s.set_tcp_nodelay(true)?;
    if delay_ack {
        s.set_tcp_quickack(false)?;
    }
    match s.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(s.into())?;
    let ready = stream.ready(Interest::WRITABLE | Interest::ERROR).await?;
    if ready.is_error() || ready.is_write_closed() {
        return Err(stream.take_error()?.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::ConnectionAborted, "connect: hung up")
        }));
    }
    Ok(stream)
}

/// Connects to the first backend that answers, trying up to `retries` others: the next one
/// when an attempt fails (haproxy's `retries` + `option redispatch`), and also — alongside
/// the pending one — when an attempt has had no answer for `connect_stagger`.
///
/// The stagger is keelson's addition. A master that died (powered off, partitioned) answers
/// nothing: its connects hang until ARP gives up or the 10 s connect timeout, and every
/// client sent there in the meantime waits that long. On a LAN a live backend answers a SYN
/// in well under a millisecond and the first SYN retransmission comes after 1 s, so an
/// attempt pending a quarter of that ([`DEFAULT_STAGGER`]) is most likely lost: the next
/// backend is tried alongside (the pending attempt stays, and wins if it answers first), so
/// a client with a 1 s timeout is served in time. The silent one, if another answered
/// [`BLAME_FACTOR`] times faster, is counted as failing (passive health), which takes it
/// out after `fall` such clients instead of `fall` check intervals.
///
/// `delay_ack`: see [`dial`].
pub(crate) async fn connect(sh: &Shared, delay_ack: bool) -> Option<(Arc<Backend>, TcpStream)> {
    use futures::StreamExt as _;
    let mut candidates = sh.pool.pick().into_iter().take(sh.cfg.retries + 1);
    let mut pending = futures::stream::FuturesUnordered::new();
    // (backend, when its attempt started), to blame the ones still silent when another wins.
    let mut started: Vec<(Arc<Backend>, tokio::time::Instant)> = Vec::new();
    let mut start_next =
        |pending: &mut futures::stream::FuturesUnordered<_>,
         started: &mut Vec<(Arc<Backend>, tokio::time::Instant)>| {
            let Some(b) = candidates.next() else {
                return false;
            };
            started.push((b.clone(), tokio::time::Instant::now()));
            pending.push(attempt(sh, b, delay_ack));
            true
        };
    let stagger = sh.cfg.connect_stagger;
    let mut more = start_next(&mut pending, &mut started);
    loop {
        // Not started (no timer, no tick) unless polled: only with backends left to try.
        let next_stagger = sh.ticker.sleep(stagger);
        tokio::select! {
            done = pending.next() => {
                let (b, outcome) = done?;
                let took = started
                    .iter()
                    .find(|(s, _)| Arc::ptr_eq(s, &b))
                    .map(|(_, since)| since.elapsed())
                    .unwrap_or_default();
                started.retain(|(s, _)| !Arc::ptr_eq(s, &b));
                match outcome {
                    Attempt::Connected(s) => {
                        observe(sh, &b, Ok(()));
                        let bar = stagger.max(took * BLAME_FACTOR);
                        for (silent, since) in started {
                            let waited = since.elapsed();
                            if waited >= bar {
                                connect_failed(sh, &silent, format!(
                                    "no answer in {waited:?} while another backend answered in {took:?}"
                                ));
                            }
                        }
                        return Some((b, s));
                    }
                    Attempt::Failed(error) => connect_failed(sh, &b, error),
                    Attempt::Starved => {
                        tracing::warn!("no descriptors for a backend connection; closing client");
                        return None;
                    }
                }
                if more {
                    more = start_next(&mut pending, &mut started);
                }
                if pending.is_empty() {
                    return None;
                }
            }
            () = next_stagger, if more && !stagger.is_zero() => {
                tracing::debug!(?stagger, "backend slow to answer; trying the next alongside");
                // Blame the attempt that has waited longest (the one the stagger was for).
                if let Some((slow, _)) = started.iter().min_by_key(|(_, since)| *since) {
                    slow.stats.staggers.fetch_add(1, Ordering::Relaxed);
                }
                more = start_next(&mut pending, &mut started);
            }
        }
    }
}

/// A client connect to `b` failed (or stayed silent while another backend answered): count
/// it and tell passive health.
pub(crate) fn connect_failed(sh: &Shared, b: &Backend, error: String) {
    b.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(backend = %b.addr, %error, "connect failed; next backend");
    observe(sh, b, Err(error));
}

/// Passive health: a client connect's outcome counts towards the backend's health when
/// backends are checked (without checks nothing would ever bring a backend back).
pub(crate) fn observe(sh: &Shared, b: &Backend, result: Result<(), String>) {
    if sh.cfg.check == BackendCheck::None {
        return;
    }
    if let Some(up) = b.record_connect(result, sh.pool.policy()) {
        if !up {
            let error = b.health().last_error.unwrap_or_default();
            tracing::warn!(backend = %b.addr, %error, "backend down");
        }
        sh.pool.refresh_healthy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dial_connects_with_nodelay_and_reports_a_refused_connect() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let s = dial(addr, false).await.unwrap();
        assert!(s.nodelay().unwrap());
        let (mut peer, _) = l.accept().await.unwrap();
        // The connection works both ways.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = s;
        s.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        peer.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");

        // Nothing listens there any more: refused, not "connected".
        drop(l);
        drop(peer);
        let e = dial(addr, true).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }
}
