//! Moving bytes between a client and a backend. Each direction starts with a small buffered
//! copy and, once a read fills the buffer (bulk data), moves on to `splice(2)` through a
//! pooled pipe (the bytes never enter user space); where the kernel refuses to splice, or
//! when splicing is off, it copies with a large buffer. Each direction runs on its own; when
//! one side sends FIN the other side's write half is shut down and the other direction keeps
//! flowing (TCP half-close), as haproxy does.

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
/// nothing moves for `idle`. `splice` selects zero-copy forwarding.
pub async fn forward(
    client: &TcpStream,
    server: &TcpStream,
    idle: Duration,
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
            tokio::time::sleep(idle - since).await;
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
        let mut buf = vec![0u8; SMALL];
        if let Copied::Bulk =
            copy_loop(src, dst, &mut buf, true, &touch, &mut total, up, meter).await?
        {
            drop(buf);
            splice_or_copy(src, dst, &touch, &mut total, up, meter).await?;
        }
    } else {
        let mut buf = vec![0u8; CHUNK];
        copy_loop(src, dst, &mut buf, false, &touch, &mut total, up, meter).await?;
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
    let mut buf = vec![0u8; CHUNK];
    copy_loop(src, dst, &mut buf, false, touch, total, up, meter).await?;
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

/// Reads what `src` has. A read shorter than the buffer emptied the socket: its readiness is
/// cleared at once, so the next read waits for the next epoll event instead of trying a
/// `recv` that would only say `EAGAIN` (one system call per request and answer saved).
/// tokio clears only if no new event arrived since it was observed, and keeps "read
/// closed" set, so neither new data nor a FIN can be missed.
async fn read_drained(src: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        src.readable().await?;
        let len = buf.len();
        let mut short = None;
        let r = src.try_io(Interest::READABLE, || {
            let n = recv(src.as_raw_fd(), buf, MsgFlags::empty()).map_err(io::Error::from)?;
            if n > 0 && n < len {
                short = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match (r, short) {
            (_, Some(n)) => return Ok(n),
            (Ok(n), None) => return Ok(n),
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
    buf: &mut [u8],
    stop_on_full: bool,
    touch: &(dyn Fn() + Sync),
    total: &mut u64,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<Copied> {
    loop {
        let n = read_drained(src, buf).await?;
        if n == 0 {
            return Ok(Copied::Eof);
        }
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
        if stop_on_full && n == buf.len() {
            return Ok(Copied::Bulk);
        }
    }
}
