//! Moving bytes between a client and a backend: `splice(2)` through a pipe (the bytes never
//! enter user space) or, where the kernel refuses, a buffered copy. Each direction runs on
//! its own; when one side sends FIN the other side's write half is shut down and the other
//! direction keeps flowing (TCP half-close), as haproxy does.

use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes moved per `splice` call / buffer size of the fallback copy.
const CHUNK: usize = 256 * 1024;

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
    let up = one_way(client, server, splice, &last, start, true, meter);
    let down = one_way(server, client, splice, &last, start, false, meter);
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

/// One direction: `src` → `dst`, then shut down `dst`'s write half on EOF.
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    splice: bool,
    last: &AtomicU64,
    start: Instant,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<u64> {
    let touch = || last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut total = 0u64;
    let mut pipe = if splice { Pipe::new().ok() } else { None };
    if let Some(p) = pipe.as_mut() {
        match splice_loop(src, dst, p, &touch, &mut total, up, meter).await {
            Ok(()) => {
                let _ = socket2::SockRef::from(dst).shutdown(Shutdown::Write);
                return Ok(total);
            }
            // EINVAL before any byte moved: this socket pair cannot splice; copy instead.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && total == 0 => {}
            Err(e) => return Err(e),
        }
    }
    copy_loop(src, dst, &touch, &mut total, up, meter).await?;
    let _ = socket2::SockRef::from(dst).shutdown(Shutdown::Write);
    Ok(total)
}

/// A non-blocking pipe used as the splice buffer.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A bigger pipe means fewer syscalls per byte; the kernel may cap it
        // (fs.pipe-max-size), in which case the default 64 KiB stays.
        let _ = nix::fcntl::fcntl(&w, FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
        Ok(Self { r, w })
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

async fn copy_loop(
    src: &TcpStream,
    dst: &TcpStream,
    touch: &(dyn Fn() + Sync),
    total: &mut u64,
    up: bool,
    meter: &dyn Meter,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        src.readable().await?;
        let n = match src.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        touch();
        let mut off = 0;
        while off < n {
            dst.writable().await?;
            match dst.try_write(&buf[off..n]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0")),
                Ok(m) => {
                    off += m;
                    *total += m as u64;
                    meter.add(up, m as u64);
                    touch();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
