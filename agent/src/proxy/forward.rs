//! Moving bytes between a client and a backend. Each direction starts with a small buffered
//! copy and, once a read fills the buffer (bulk data), moves on to `splice(2)` through a
//! pooled pipe (the bytes never enter user space); where the kernel refuses to splice, or
//! when splicing is off, it copies with a large buffer. Each direction runs on its own; when
//! one side sends FIN the other side's write half is shut down and the other direction keeps
//! flowing (TCP half-close), as haproxy does.
//!
//! A buffer is taken from a per-thread pool when a socket has data and goes back once that
//! data is written, as haproxy allocates its buffers: an open connection that is quiet (a
//! watch, a kubelet between heartbeats) holds no buffer, and a short one allocates none.

use std::cell::RefCell;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{MsgFlags, recv, send};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::lazy_timer::Ticker;

/// Bytes moved per `splice` call / buffer size of the copy without splice.
const CHUNK: usize = 256 * 1024;
/// Buffer of the copy a spliced direction starts with; a read that fills it means bulk.
const SMALL: usize = 16 * 1024;

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides closed cleanly.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
}

/// Byte counts of a finished connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Client → backend.
    pub up: u64,
    /// Backend → client.
    pub down: u64,
}

/// Counters the forwarder bumps as it goes, so `/stats` sees live connections.
pub trait Meter: Sync {
    /// `n` bytes went client → backend (`up`) or backend → client.
    fn add(&self, up: bool, n: u64);
}

impl Meter for () {
    fn add(&self, _: bool, _: u64) {}
}

/// Proxies between `client` and `server` until both directions are closed, one fails, or
/// nothing moves for `idle` (timed with `ticker`). `splice` selects zero-copy forwarding.
pub async fn forward(
    client: &TcpStream,
    server: &TcpStream,
    idle: Duration,
    ticker: &Ticker,
    splice: bool,
    meter: &dyn Meter,
) -> io::Result<(End, Moved)> {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let done = AtomicU8::new(0);
    let up = one_way(client, server, splice, &last, &done, start, true, meter);
    let down = one_way(server, client, splice, &last, &done, start, false, meter);
    let idle_watch = async {
        loop {
            let since = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if since >= idle {
                return;
            }
            ticker.sleep(idle - since).await;
        }
    };
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => {
            let (u, d) = r?;
            Ok((End::Closed, Moved { up: u, down: d }))
        }
        () = idle_watch => Ok((End::Idle, Moved::default())),
    }
}

/// One direction: `src` → `dst`, then shut down `dst`'s write half on EOF (unless the other
/// direction is finished too: then both sockets are about to be closed, which sends the FIN).
///
/// With `splice` the direction starts with a small buffered copy (requests and answers of an
/// API call are small, and for them `read`/`write` is cheaper than two splices through a
/// pipe); the first read that fills the buffer shows bulk data and switches to `splice(2)`
/// (haproxy's `splice-auto`). Without `splice` it copies with a large buffer throughout.
#[allow(clippy::too_many_arguments)]
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    splice: bool,
    last: &AtomicU64,
    done: &AtomicU8,
    start: Instant,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<u64> {
    let touch = || last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut total = 0u64;
    if splice {
        if let Copied::Bulk =
            copy_loop(src, dst, SMALL, true, &touch, &mut total, up, meter).await?
        {
            // Boxed: its state (pipe, splice loop, fallback copy) exists only once a
            // direction carries bulk data, not in every open connection's task.
            Box::pin(splice_or_copy(src, dst, &touch, &mut total, up, meter)).await?;
        }
    } else {
        copy_loop(src, dst, CHUNK, false, &touch, &mut total, up, meter).await?;
    }
    // Both directions have read EOF when this is the second: nothing is left unread, so
    // closing (right after) sends a FIN, not a reset, and the shutdown would be a wasted call.
    if done.fetch_add(1, Ordering::AcqRel) == 0 {
        let _ = socket2::SockRef::from(dst).shutdown(Shutdown::Write);
    }
    Ok(total)
}

/// Splices until EOF; copies instead where this socket pair cannot splice.
async fn splice_or_copy(
    src: &TcpStream,
    dst: &TcpStream,
    touch: &(dyn Fn() + Sync),
    total: &mut u64,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<()> {
    if let Ok(mut pipe) = Pipe::get() {
        let before = *total;
        match splice_loop(src, dst, &mut pipe, touch, total, up, meter).await {
            Ok(()) => {
                // Drained: reusable.
                pipe.put();
                return Ok(());
            }
            // EINVAL before any byte moved: the pipe is empty and this pair cannot splice.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && *total == before => pipe.put(),
            Err(e) => return Err(e),
        }
    }
    copy_loop(src, dst, CHUNK, false, touch, total, up, meter).await?;
    Ok(())
}

/// A non-blocking pipe used as the splice buffer.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

/// Empty pipes kept for later connections: creating, sizing and closing a pipe costs five
/// system calls per direction, more than a short connection moves. haproxy pools them too.
static SPARE_PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());
/// At most this many spare pipes (two descriptors each).
const MAX_SPARE_PIPES: usize = 64;

/// Closes every spare pipe (the accept loop calls this when descriptors run out).
pub fn release_spare_pipes() {
    let spare = std::mem::take(&mut *SPARE_PIPES.lock().unwrap_or_else(|p| p.into_inner()));
    drop(spare);
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A bigger pipe means fewer syscalls per byte; the kernel may cap it
        // (fs.pipe-max-size), in which case the default 64 KiB stays.
        let _ = nix::fcntl::fcntl(&w, FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
        Ok(Self { r, w })
    }

    /// A spare pipe, or a new one.
    fn get() -> io::Result<Self> {
        let spare = SPARE_PIPES.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            Some(p) => Ok(p),
            None => Self::new(),
        }
    }

    /// Returns an empty pipe to the spares (or closes it when there are enough).
    fn put(self) {
        let mut spare = SPARE_PIPES.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < MAX_SPARE_PIPES {
            spare.push(self);
        }
    }
}

async fn splice_loop(
    src: &TcpStream,
    dst: &TcpStream,
    pipe: &mut Pipe,
    touch: &(dyn Fn() + Sync),
    total: &mut u64,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<()> {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    loop {
        let n = src
            .async_io(Interest::READABLE, || {
                nix::fcntl::splice(src, None, &pipe.w, None, CHUNK, flags).map_err(io::Error::from)
            })
            .await?;
        if n == 0 {
            return Ok(());
        }
        touch();
        let mut left = n;
        while left > 0 {
            let m = dst
                .async_io(Interest::WRITABLE, || {
                    nix::fcntl::splice(&pipe.r, None, dst, None, left, flags)
                        .map_err(io::Error::from)
                })
                .await?;
            if m == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "splice wrote 0"));
            }
            left -= m;
            *total += m as u64;
            meter.add(up, m as u64);
            touch();
        }
    }
}

/// Bytes of spare buffers kept per thread and size ([`SMALL`] and [`CHUNK`]): 32 small
/// ones, two large ones.
const SPARE_BYTES: usize = 512 * 1024;

thread_local! {
    static SPARE_SMALL: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
    static SPARE_CHUNK: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer from the current thread's pool; back to the pool of whatever thread drops
/// it (tasks move between threads; the pools only need to stay bounded, not balanced).
struct PooledBuf(Option<Box<[u8]>>);

impl PooledBuf {
    fn take(size: usize) -> Self {
        let spare = |pool: &'static std::thread::LocalKey<RefCell<Vec<Box<[u8]>>>>| {
            pool.try_with(|p| p.borrow_mut().pop()).ok().flatten()
        };
        let b = match size {
            SMALL => spare(&SPARE_SMALL),
            CHUNK => spare(&SPARE_CHUNK),
            _ => None,
        };
        Self(Some(
            b.unwrap_or_else(|| vec![0u8; size].into_boxed_slice()),
        ))
    }

    fn get(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let Some(b) = self.0.take() else { return };
        let pool = match b.len() {
            SMALL => &SPARE_SMALL,
            CHUNK => &SPARE_CHUNK,
            _ => return,
        };
        let _ = pool.try_with(|p| {
            let mut p = p.borrow_mut();
            if (p.len() + 1) * b.len() <= SPARE_BYTES {
                p.push(b);
            }
        });
    }
}

/// Waits until `src` has data (or EOF) and reads it into a buffer of `size` taken only then.
/// A read shorter than the buffer emptied the socket: its readiness is cleared at once, so
/// the next read waits for the next epoll event instead of trying a `recv` that would only
/// say `EAGAIN` (one system call per request and answer saved). tokio clears only if no new
/// event arrived since it was observed, and keeps "read closed" set, so neither new data
/// nor a FIN can be missed.
///
/// Returns the buffer, the count (0: EOF) and whether EOF is known to follow: epoll had
/// already reported the peer's FIN (`EPOLLRDHUP`, without an error) when the read began and
/// the read was short, so it took every byte sent before the FIN and the next `recv` could
/// only return 0 — the caller skips it (one system call per direction of a connection whose
/// last data and FIN arrive together, as an answer followed by `Connection: close` does).
async fn read_drained(src: &TcpStream, size: usize) -> io::Result<(PooledBuf, usize, bool)> {
    loop {
        // ERROR too: a reset also reports "read closed", and must still surface as an error.
        let ready = src.ready(Interest::READABLE | Interest::ERROR).await?;
        let fin_seen = ready.is_read_closed() && !ready.is_error();
        let mut buf = PooledBuf::take(size);
        let b = buf.get();
        let len = b.len();
        let mut short = None;
        let r = src.try_io(Interest::READABLE, || {
            let n = recv(src.as_raw_fd(), b, MsgFlags::empty()).map_err(io::Error::from)?;
            if n > 0 && n < len {
                short = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match (r, short) {
            (_, Some(n)) => return Ok((buf, n, fin_seen)),
            (Ok(n), None) => return Ok((buf, n, false)),
            (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => continue,
            (Err(e), None) => return Err(e),
        }
    }
}

/// How a buffered copy ended.
enum Copied {
    /// `src` sent FIN.
    Eof,
    /// A read filled the whole buffer (only with `stop_on_full`): bulk data, worth splicing.
    Bulk,
}

#[allow(clippy::too_many_arguments)]
async fn copy_loop(
    src: &TcpStream,
    dst: &TcpStream,
    size: usize,
    stop_on_full: bool,
    touch: &(dyn Fn() + Sync),
    total: &mut u64,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<Copied> {
    loop {
        let (mut buf, n, eof_next) = read_drained(src, size).await?;
        if n == 0 {
            return Ok(Copied::Eof);
        }
        let buf = buf.get();
        touch();
        let mut off = 0;
        while off < n {
            let m = dst
                .async_io(Interest::WRITABLE, || {
                    send(dst.as_raw_fd(), &buf[off..n], MsgFlags::MSG_NOSIGNAL)
                        .map_err(io::Error::from)
                })
                .await?;
            if m == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0"));
            }
            off += m;
            *total += m as u64;
            meter.add(up, m as u64);
            touch();
        }
        if eof_next {
            return Ok(Copied::Eof);
        }
        if stop_on_full && n == size {
            return Ok(Copied::Bulk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_and_the_pool_stays_bounded() {
        let first = PooledBuf::take(SMALL);
        let ptr = first.0.as_ref().map(|b| b.as_ptr());
        drop(first);
        let again = PooledBuf::take(SMALL);
        assert_eq!(again.0.as_ref().map(|b| b.as_ptr()), ptr, "spare reused");
        assert_eq!(again.0.as_ref().map(|b| b.len()), Some(SMALL));
        drop(again);

        let many: Vec<_> = (0..100).map(|_| PooledBuf::take(CHUNK)).collect();
        drop(many);
        let kept = SPARE_CHUNK.with(|p| p.borrow().len());
        assert_eq!(kept, SPARE_BYTES / CHUNK);
        let kept = SPARE_SMALL.with(|p| p.borrow().len());
        assert!(kept <= SPARE_BYTES / SMALL);
    }
}
