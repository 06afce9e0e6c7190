//! Moving bytes between a client and a backend. Each direction starts with a small buffered
//! copy and, once a read fills the buffer (bulk data), moves on to `splice(2)` through a
//! pooled pipe (the bytes never enter user space); where the kernel refuses to splice, or
//! when splicing is off, it copies with a large buffer. The two directions go on
//! independently (in one hand-written future, [`Forward`]); when one side sends FIN the
//! other side's write half is shut down and the other direction keeps flowing (TCP
//! half-close), as haproxy does.
//!
//! A buffer is taken from a per-thread pool when a socket has data and goes back once that
//! data is written, as haproxy allocates its buffers: an open connection that is quiet (a
//! watch, a kubelet between heartbeats) holds no buffer, and a short one allocates none.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{MsgFlags, recv, send};
use tokio::io::Interest;
use tokio::net::TcpStream;

use tokio::time::Instant;

use super::lazy_timer::{LazyDeadline, Ticker};

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
///
/// Each direction starts with a small buffered copy (requests and answers of an API call are
/// small, and for them `read`/`write` is cheaper than two splices through a pipe); the first
/// read that fills the buffer shows bulk data and switches it to `splice(2)` (haproxy's
/// `splice-auto`), or to a copy with a large buffer where the kernel refuses to splice this
/// pair. Without `splice` it copies with a large buffer throughout. When one direction reads
/// EOF its destination's write half is shut down, unless the other direction is finished
/// too: then both sockets are about to be closed, which sends the FIN.
///
/// `first` is what the client sent before the backend was connected ([`First::read`]); it
/// goes to the server before anything else.
pub fn forward<'a>(
    client: &'a TcpStream,
    server: &'a TcpStream,
    idle: Duration,
    ticker: &'a Ticker,
    splice: bool,
    meter: &'a dyn Meter,
    first: First,
) -> Forward<'a> {
    let mut up = Dir::new(splice);
    up.quickack_after_send = first.delayed_ack;
    match first.data {
        FirstData::Nothing => up.quickack_after_send = false,
        FirstData::Bytes(buf, len) => {
            up.buf = Some(buf);
            up.len = len;
        }
        FirstData::Eof => {
            // An empty buffer followed by EOF: the first poll shuts the server's side.
            up.buf = Some(PooledBuf(Box::default()));
            up.eof_next = true;
        }
    }
    Forward {
        client,
        server,
        meter,
        idle,
        last: Instant::now(),
        up,
        down: Dir::new(splice),
        idle_wait: LazyDeadline::new(ticker),
    }
}

/// What a client sent before its backend was connected: read at accept, so that the
/// backend connect can carry its handshake's last ACK on the first data segment instead of
/// sending it alone (haproxy's `option tcp-smart-connect`, which OpenShift's TCP-mode haproxy
/// does not use): one segment less per connection, and the backend's server accepts the
/// connection with its request already there (one wake-up instead of two).
#[derive(Debug, Default)]
pub struct First {
    data: FirstData,
    /// The backend socket was connected with `TCP_QUICKACK` off (see [`First::delays_ack`]):
    /// switch quick ACKs back on after the first send.
    delayed_ack: bool,
}

#[derive(Default)]
enum FirstData {
    /// Nothing was waiting (or nothing was read).
    #[default]
    Nothing,
    /// `len` bytes in the buffer.
    Bytes(PooledBuf, usize),
    /// The client had already sent FIN, without data.
    Eof,
}

impl First {
    /// One non-blocking `recv` on a just-accepted client, before it is registered with the
    /// runtime (so a socket emptied here raises no readiness event for nothing). Clients of
    /// the API (TLS) speak first, and their first bytes are usually there by the time the
    /// connection is accepted; when they are not, the connect goes ahead as before (a
    /// server that speaks first is never kept waiting for the client).
    pub fn read(client: std::os::fd::BorrowedFd<'_>) -> io::Result<Self> {
        let mut buf = PooledBuf::take(SMALL);
        let data = match recv(client.as_raw_fd(), &mut buf.0, MsgFlags::empty()) {
            Ok(0) => FirstData::Eof,
            Ok(n) => FirstData::Bytes(buf, n),
            Err(nix::errno::Errno::EAGAIN) => FirstData::Nothing,
            Err(e) => return Err(e.into()),
        };
        Ok(Self {
            data,
            delayed_ack: false,
        })
    }

    /// Whether the backend socket should be connected with its handshake's ACK held back
    /// (`TCP_QUICKACK` off before `connect`): only with data to carry it, which
    /// [`forward`] sends as soon as the connect completes. The caller says whether it did
    /// so ([`First::set_delayed_ack`]).
    pub fn delays_ack(&self) -> bool {
        matches!(self.data, FirstData::Bytes(..))
    }

    /// The backend socket was connected with `TCP_QUICKACK` off.
    pub fn set_delayed_ack(&mut self, delayed: bool) {
        self.delayed_ack = delayed;
    }
}

pin_project_lite::pin_project! {
    /// The future of [`forward`], written by hand rather than as async functions: it lives in
    /// every open connection's task for the connection's life, and as a state machine it
    /// holds only what it needs (a few hundred bytes) where nested async functions held
    /// every await point's readiness futures and locals side by side. Each socket's two
    /// waker slots fit the two directions exactly: up reads the client and writes the
    /// server, down reads the server and writes the client.
    pub struct Forward<'a> {
        client: &'a TcpStream,
        server: &'a TcpStream,
        meter: &'a dyn Meter,
        idle: Duration,
        // When a byte last moved either way.
        last: Instant,
        // Client -> backend.
        up: Dir,
        // Backend -> client.
        down: Dir,
        #[pin]
        idle_wait: LazyDeadline<'a>,
    }
}

impl Future for Forward<'_> {
    type Output = io::Result<(End, Moved)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (client, server, meter) = (*this.client, *this.server, *this.meter);
        let mut moved = false;
        if !this.up.done()
            && let Poll::Ready(r) = this
                .up
                .poll_move(cx, client, server, true, meter, &mut moved)
        {
            r?;
            if !this.down.done() {
                let _ = socket2::SockRef::from(server).shutdown(Shutdown::Write);
            }
        }
        if !this.down.done()
            && let Poll::Ready(r) = this
                .down
                .poll_move(cx, server, client, false, meter, &mut moved)
        {
            r?;
            if !this.up.done() {
                let _ = socket2::SockRef::from(client).shutdown(Shutdown::Write);
            }
        }
        if this.up.done() && this.down.done() {
            let moved = Moved {
                up: this.up.total,
                down: this.down.total,
            };
            return Poll::Ready(Ok((End::Closed, moved)));
        }
        if moved {
            *this.last = Instant::now();
        }
        ready!(this.idle_wait.poll_deadline(cx, *this.last + *this.idle));
        Poll::Ready(Ok((End::Idle, Moved::default())))
    }
}

/// What one direction is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Copying with a [`SMALL`] buffer; a full read switches to [`Mode::Splice`].
    Small,
    /// Copying with a [`CHUNK`] buffer (no splice, or the kernel refused it).
    Copy,
    /// Splicing through `Dir::pipe`.
    Splice,
    /// EOF read and everything written.
    Done,
}

/// One direction's state: `src` -> `dst`.
struct Dir {
    mode: Mode,
    /// EOF follows the data in `buf`: skip the `recv` that could only return 0 (see
    /// [`fin_seen`]).
    eof_next: bool,
    /// A byte went into the pipe: an `EINVAL` after that is an error, not "cannot splice".
    spliced: bool,
    /// Read and not yet written: `buf[off..len]`. A buffer is held only meanwhile.
    buf: Option<PooledBuf>,
    off: usize,
    len: usize,
    /// Only in [`Mode::Splice`].
    pipe: Option<Pipe>,
    /// Bytes in `pipe`, not yet written.
    in_pipe: usize,
    /// Bytes written to `dst`.
    total: u64,
    /// `dst` was connected with `TCP_QUICKACK` off, to put the handshake's ACK on the first
    /// data: turn quick ACKs back on after that send. Left off, the kernel would go on
    /// delaying the ACKs of the answer, and a server that sends its answer and waits for
    /// the ACK would retransmit it (tail loss probe) after a few milliseconds.
    quickack_after_send: bool,
}

fn write_zero(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::WriteZero, format!("{what} wrote 0"))
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Dir {
    fn new(splice: bool) -> Self {
        Self {
            mode: if splice { Mode::Small } else { Mode::Copy },
            eof_next: false,
            spliced: false,
            buf: None,
            off: 0,
            len: 0,
            pipe: None,
            in_pipe: 0,
            total: 0,
            quickack_after_send: false,
        }
    }

    fn done(&self) -> bool {
        self.mode == Mode::Done
    }

    /// `src` sent FIN and all it sent is written: the direction is done.
    fn eof(&mut self) -> Poll<io::Result<()>> {
        self.mode = Mode::Done;
        self.buf = None;
        if let Some(p) = self.pipe.take() {
            // Drained: reusable.
            p.put();
        }
        Poll::Ready(Ok(()))
    }

    /// Moves bytes until `src` or `dst` has to wait (Pending, with the waker in that
    /// socket's reader or writer slot) or `src` sent FIN and everything is written (Ready).
    /// Sets `moved` when a byte was read or written.
    fn poll_move(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        up: bool,
        meter: &dyn Meter,
        moved: &mut bool,
    ) -> Poll<io::Result<()>> {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        loop {
            // What was read goes out first.
            if let Some(buf) = &self.buf {
                // When EOF follows this data, MSG_MORE holds it back until the FIN
                // (shutdown or close, right after it is written) joins it: data and FIN
                // leave as one segment, and the peer answers both with one ACK.
                let flags = if self.eof_next {
                    MsgFlags::from_bits_retain(libc::MSG_NOSIGNAL | libc::MSG_MORE)
                } else {
                    MsgFlags::MSG_NOSIGNAL
                };
                while self.off < self.len {
                    ready!(dst.poll_write_ready(cx))?;
                    let data = &buf.0[self.off..self.len];
                    let r = dst.try_io(Interest::WRITABLE, || {
                        send(dst.as_raw_fd(), data, flags).map_err(io::Error::from)
                    });
                    match r {
                        Ok(0) => return Poll::Ready(Err(write_zero("send"))),
                        Ok(m) => {
                            self.off += m;
                            self.total += m as u64;
                            meter.add(up, m as u64);
                            *moved = true;
                            if std::mem::take(&mut self.quickack_after_send) {
                                let _ = socket2::SockRef::from(dst).set_tcp_quickack(true);
                            }
                        }
                        Err(e) if would_block(&e) => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                let full = self.len == buf.0.len();
                // Written: the buffer goes back to the pool.
                self.buf = None;
                if self.eof_next {
                    return self.eof();
                }
                if full && self.mode == Mode::Small {
                    // Bulk data: splice from now on (copy where no pipe can be had).
                    match Pipe::get() {
                        Ok(p) => {
                            self.pipe = Some(p);
                            self.mode = Mode::Splice;
                        }
                        Err(_) => self.mode = Mode::Copy,
                    }
                }
            }
            if let Some(pipe) = &self.pipe {
                while self.in_pipe > 0 {
                    ready!(dst.poll_write_ready(cx))?;
                    let left = self.in_pipe;
                    let r = dst.try_io(Interest::WRITABLE, || {
                        nix::fcntl::splice(&pipe.r, None, dst, None, left, flags)
                            .map_err(io::Error::from)
                    });
                    match r {
                        Ok(0) => return Poll::Ready(Err(write_zero("splice"))),
                        Ok(m) => {
                            self.in_pipe -= m;
                            self.total += m as u64;
                            meter.add(up, m as u64);
                            *moved = true;
                        }
                        Err(e) if would_block(&e) => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
            let size = match self.mode {
                Mode::Done => return Poll::Ready(Ok(())),
                Mode::Small => SMALL,
                Mode::Copy => CHUNK,
                Mode::Splice => {
                    ready!(src.poll_read_ready(cx))?;
                    let Some(pipe) = &self.pipe else {
                        self.mode = Mode::Copy;
                        continue;
                    };
                    let r = src.try_io(Interest::READABLE, || {
                        nix::fcntl::splice(src, None, &pipe.w, None, CHUNK, flags)
                            .map_err(io::Error::from)
                    });
                    match r {
                        Ok(0) => return self.eof(),
                        Ok(n) => {
                            self.in_pipe = n;
                            self.spliced = true;
                            *moved = true;
                        }
                        Err(e) if would_block(&e) => {}
                        // Before any byte entered the pipe: this pair cannot splice; the
                        // pipe is empty and reusable, and the direction copies instead.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !self.spliced => {
                            if let Some(p) = self.pipe.take() {
                                p.put();
                            }
                            self.mode = Mode::Copy;
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                    continue;
                }
            };
            // A buffered read: wait until `src` has data (or EOF), and take a buffer only then.
            ready!(src.poll_read_ready(cx))?;
            let fin_seen = fin_seen(src, cx);
            let mut buf = PooledBuf::take(size);
            let b = &mut buf.0[..];
            let len = b.len();
            let mut short = None;
            // A read shorter than the buffer emptied the socket: its readiness is cleared at
            // once (the closure says WouldBlock), so the next read waits for the next epoll
            // event instead of trying a `recv` that would only say EAGAIN (one system call
            // per request and answer saved). tokio clears only if no new event arrived since
            // it was observed, and keeps "read closed" set, so neither new data nor a FIN
            // can be missed.
            let r = src.try_io(Interest::READABLE, || {
                let n = recv(src.as_raw_fd(), b, MsgFlags::empty()).map_err(io::Error::from)?;
                if n > 0 && n < len {
                    short = Some(n);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            let (n, eof_next) = match (r, short) {
                (_, Some(n)) => (n, fin_seen),
                (Ok(0), None) => return self.eof(),
                (Ok(n), None) => (n, false),
                (Err(e), None) if would_block(&e) => continue,
                (Err(e), None) => return Poll::Ready(Err(e)),
            };
            self.buf = Some(buf);
            self.off = 0;
            self.len = n;
            self.eof_next = eof_next;
            *moved = true;
        }
    }
}

/// Whether epoll had reported the peer's FIN (`EPOLLRDHUP`, without an error) on `src`,
/// which is read-ready, before the read that follows. A short read then took every byte sent
/// before the FIN and the next `recv` could only return 0: the direction skips it (one
/// system call per direction of a connection whose last data and FIN arrive together, as
/// an answer followed by `Connection: close` does).
///
/// `poll_read_ready` does not say which readiness it saw; `ready()` does, and on a socket
/// that is ready it returns at once without registering anything. It is dropped right
/// away: were it pending (it cannot be: only this direction clears the read readiness), the
/// answer is just "not seen", which costs the skipped call and nothing else.
fn fin_seen(src: &TcpStream, cx: &mut Context<'_>) -> bool {
    // ERROR too: a reset also reports "read closed", and must still surface as an error.
    let ready = std::pin::pin!(src.ready(Interest::READABLE | Interest::ERROR));
    match ready.poll(cx) {
        Poll::Ready(Ok(r)) => r.is_read_closed() && !r.is_error(),
        _ => false,
    }
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

/// Bytes of spare buffers kept per thread and size ([`SMALL`] and [`CHUNK`]): 32 small
/// ones, two large ones.
const SPARE_BYTES: usize = 512 * 1024;

thread_local! {
    static SPARE_SMALL: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
    static SPARE_CHUNK: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer from the current thread's pool; back to the pool of whatever thread drops
/// it (tasks move between threads; the pools only need to stay bounded, not balanced).
struct PooledBuf(Box<[u8]>);

impl std::fmt::Debug for FirstData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Nothing => f.write_str("Nothing"),
            Self::Bytes(_, n) => write!(f, "Bytes({n})"),
            Self::Eof => f.write_str("Eof"),
        }
    }
}

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
        Self(b.unwrap_or_else(|| vec![0u8; size].into_boxed_slice()))
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        // An empty boxed slice allocates nothing.
        let b = std::mem::take(&mut self.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_and_the_pool_stays_bounded() {
        let first = PooledBuf::take(SMALL);
        let ptr = first.0.as_ptr();
        drop(first);
        let again = PooledBuf::take(SMALL);
        assert_eq!(again.0.as_ptr(), ptr, "spare reused");
        assert_eq!(again.0.len(), SMALL);
        drop(again);

        let many: Vec<_> = (0..100).map(|_| PooledBuf::take(CHUNK)).collect();
        drop(many);
        let kept = SPARE_CHUNK.with(|p| p.borrow().len());
        assert_eq!(kept, SPARE_BYTES / CHUNK);
        let kept = SPARE_SMALL.with(|p| p.borrow().len());
        assert!(kept <= SPARE_BYTES / SMALL);
    }

    /// A client whose socket is accepted only once it has spoken (and maybe closed its
    /// write half): what `First::read` takes at accept must reach the backend first, an
    /// EOF taken there must still shut the backend's side, and the answer must come back
    /// through the backend socket connected with its handshake ACK held back.
    #[tokio::test]
    async fn the_first_bytes_read_at_accept_go_first_and_an_eof_there_is_forwarded() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (sent, close) in [(&b"hello"[..], true), (b"", true), (b"req", false)] {
            let front = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = std::net::TcpStream::connect(front.local_addr().unwrap()).unwrap();
            std::io::Write::write_all(&mut c, sent).unwrap();
            if close {
                c.shutdown(Shutdown::Write).unwrap();
            }
            // On loopback the bytes and the FIN are queued at the accepted socket by the
            // time write/shutdown return.
            let (accepted, _) = front.accept().unwrap();
            accepted.set_nonblocking(true).unwrap();
            let mut first = First::read(std::os::fd::AsFd::as_fd(&accepted)).unwrap();
            match (&first.data, sent.len(), close) {
                (FirstData::Bytes(_, n), len, _) if len > 0 => assert_eq!(*n, len),
                (FirstData::Eof, 0, true) => {}
                (other, ..) => panic!("sent {sent:?} (FIN: {close}), read {other:?}"),
            }
            let back = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let backend_addr = back.local_addr().unwrap();
            let backend = tokio::spawn(async move {
                let (mut s, _) = back.accept().await.unwrap();
                let mut got = vec![0u8; sent.len()];
                s.read_exact(&mut got).await.unwrap();
                if close {
                    let mut rest = Vec::new();
                    s.read_to_end(&mut rest).await.unwrap();
                    assert!(rest.is_empty(), "nothing after the client's bytes");
                }
                s.write_all(b"answer").await.unwrap();
                s.shutdown().await.unwrap();
                got
            });
            let delay = first.delays_ack();
            assert_eq!(delay, !sent.is_empty());
            let server = super::super::connect::dial(backend_addr, delay)
                .await
                .unwrap();
            first.set_delayed_ack(delay);
            let client = TcpStream::from_std(accepted).unwrap();
            let ticker = Ticker::default();
            let fwd = forward(
                &client,
                &server,
                Duration::from_secs(3600),
                &ticker,
                true,
                &(),
                first,
            );
            let user = tokio::task::spawn_blocking(move || {
                let mut answer = Vec::new();
                if !close {
                    // The client closes only after the answer, as an HTTP client does.
                    let mut buf = [0u8; 6];
                    std::io::Read::read_exact(&mut c, &mut buf).unwrap();
                    c.shutdown(Shutdown::Write).unwrap();
                    answer.extend_from_slice(&buf);
                }
                std::io::Read::read_to_end(&mut c, &mut answer).unwrap();
                answer
            });
            let (end, moved) = tokio::time::timeout(Duration::from_secs(20), fwd)
                .await
                .expect("forwarding ends")
                .unwrap();
            assert_eq!(end, End::Closed);
            assert_eq!(moved.up, sent.len() as u64);
            assert_eq!(moved.down, 6);
            drop((client, server));
            assert_eq!(backend.await.unwrap(), sent);
            assert_eq!(user.await.unwrap(), b"answer");
        }
    }
}
