//! The accept loops of the frontends, and serving one client: its backend chosen
//! (`connect`), then bytes moved (`forward`) until either side ends, the backend is marked
//! down or the drain deadline passes.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{FrontendStats, Shared, connect, forward};

/// Accept errors that mean "out of a resource for now": wait and retry; the pending client
/// stays in the backlog and is accepted once descriptors or memory are free again.
pub(crate) fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

pub(super) async fn accept_loop(
    sh: Arc<Shared>,
    listener: TcpListener,
    stats: Arc<FrontendStats>,
    stop: CancellationToken,
) {
    // Clients are accepted raw (not registered with the runtime by the accept) so that a
    // client's first bytes can be read before it is registered: `forward::First`.
    let listener = match listener.into_std().and_then(|l| {
        // SAFETY: the std listener owns its descriptor, which stays open and the same until
        // the AsyncFd (which owns the listener) is dropped.
        unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))
    }) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "frontend: cannot watch the listening socket");
            return;
        }
    };
    let mut pressure = 0u32;
    // One wait for the stop for the loop's life: a new one per client would take the
    // token's lock to join and leave its wait list each time.
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut stopped => return,
            p = sh.limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            () = &mut stopped => return,
            r = accept(&listener) => r,
        };
        let (client, peer) = match accepted {
            Ok(x) => {
                if pressure > 0 {
                    tracing::info!(retries = pressure, "accept works again");
                    pressure = 0;
                }
                x
            }
            Err(e) if is_resource_error(&e) => {
                forward::release_spare_pipes();
                if pressure == 0 {
                    tracing::warn!(error = %e, "accept: out of resources; retrying");
                }
                pressure += 1;
                tokio::select! {
                    () = &mut stopped => return,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                continue;
            }
            // The listener was shut down (a removed frontend).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => {
                // ECONNABORTED and friends: that client is gone; the next one is fine.
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.active.fetch_add(1, Ordering::Relaxed);
        let sh2 = sh.clone();
        let stats = stats.clone();
        sh.conns.spawn(async move {
            if !handle(&sh2, client, peer).await {
                stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            stats.active.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// The next client of `listener`: a non-blocking socket, not registered with the runtime.
async fn accept(
    listener: &AsyncFd<std::net::TcpListener>,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    loop {
        let mut ready = listener.readable().await?;
        let r = ready.try_io(|l| {
            // SAFETY: accept4 writes at most `len` bytes of address into the storage
            // try_init provides, and returns a new descriptor we then own.
            let (fd, addr) = unsafe {
                socket2::SockAddr::try_init(|storage, len| {
                    let fd = libc::accept4(
                        l.as_raw_fd(),
                        storage.cast(),
                        len,
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    );
                    if fd < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(fd)
                    }
                })
            }?;
            // SAFETY: a descriptor accept4 just returned, owned by nothing else.
            let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
            let peer = addr
                .as_socket()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            Ok((stream, peer))
        });
        match r {
            Ok(r) => return r,
            // Nothing to accept after all: readiness cleared, wait for the next.
            Err(_would_block) => continue,
        }
    }
}

/// Serves one client; false when no backend could be reached (the client is closed).
pub(super) async fn handle(sh: &Shared, client: std::net::TcpStream, peer: SocketAddr) -> bool {
    // The client's first bytes, if they are there already: the backend connect then
    // carries its last handshake ACK on them.
    let mut first = match forward::First::read(client.as_fd()) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "client gone before its backend was chosen");
            return true;
        }
    };
    let client = match TcpStream::from_std(client) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "cannot register the client");
            return true;
        }
    };
    let delay_ack = first.delays_ack();
    // Not boxed: the connect state and the forwarding state never live at once, so they
    // share the task's memory (the task is as big as the larger, forwarding).
    let Some((b, server)) = connect::connect(sh, delay_ack).await else {
        tracing::debug!(%peer, "no backend reachable; closing client");
        return false;
    };
    first.set_delayed_ack(delay_ack);
    // The client inherited TCP_NODELAY from the listener; `connect::dial` set the server's.
    b.stats.active.fetch_add(1, Ordering::Relaxed);
    b.stats.total.fetch_add(1, Ordering::Relaxed);
    let mut downs = b.subscribe_downs();
    let marked_down = async {
        if sh.cfg.shutdown_sessions {
            let _ = downs.changed().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = forward::forward(&client, &server, sh.cfg.idle_timeout, &sh.ticker, sh.cfg.splice, &*b, first) => match r {
            Ok((forward::End::Idle, _)) => tracing::debug!(%peer, "idle timeout"),
            Ok(_) => {}
            Err(e) => tracing::debug!(%peer, backend = %b.addr, error = %e, "connection ended"),
        },
        () = marked_down => {
            // Dropping both sockets closes them: the client sees the connection end and
            // reconnects, and gets a backend that is up.
            b.stats.sessions_shut_down.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, backend = %b.addr, "backend marked down; closing the session");
        }
        () = sh.conn_kill.cancelled() => {}
    }
    b.stats.active.fetch_sub(1, Ordering::Relaxed);
    true
}
