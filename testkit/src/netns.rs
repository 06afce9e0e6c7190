//! Network namespaces the test creates: named uniquely for this process (concurrent runs
//! and concurrent tests never share one), with loopback up, deleted on drop. Traffic a
//! test sends goes only to addresses inside namespaces it made.

use std::ffi::OsStr;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use crate::cmd::sh;

/// A name no other namespace of this machine has: `<tag>-<pid>-<n>`.
pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{tag}-{}-{n}", std::process::id())
}

/// One network namespace, deleted on drop when this handle created it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    owned: bool,
}

impl Netns {
    /// Creates a namespace named after `tag` ([`unique_name`]) with loopback up.
    pub fn new(tag: &str) -> Self {
        Self::named(&unique_name(tag))
    }

    /// Creates namespace `name` (a stale one of that name is removed first).
    pub fn named(name: &str) -> Self {
        delete(name);
        sh(&["ip", "netns", "add", name]);
        let ns = Netns {
            name: name.into(),
            owned: true,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// [`Netns::named`] for a harness that reports errors instead of panicking: creates
    /// namespace `name` (a stale one of that name is removed first) with loopback up.
    pub fn try_named(name: &str) -> std::io::Result<Self> {
        delete(name);
        run_ok(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Netns {
            name: name.into(),
            owned: true,
        };
        ns.try_ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on a namespace someone else created and deletes (not deleted on drop).
    pub fn existing(name: &str) -> Self {
        Netns {
            name: name.into(),
            owned: false,
        }
    }

    /// Its name (`ip netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> ARGS`, which must succeed; its stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["ip", "-n", &self.name];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// `ip -n <name> ARGS`; its output, or an error naming the command and its stderr when
    /// it fails.
    pub fn try_ip(&self, args: &[&str]) -> std::io::Result<Output> {
        run_ok(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// `program` to run inside the namespace (`ip netns exec`).
    pub fn exec(&self, program: impl AsRef<OsStr>) -> Command {
        exec_in(&self.name, program)
    }

    /// `sysctl -qw key=value` inside the namespace.
    pub fn sysctl(&self, setting: &str) {
        sh(&["ip", "netns", "exec", &self.name, "sysctl", "-qw", setting]);
    }

    /// A veth pair: `here` in this namespace, `there` in `other`, both up.
    pub fn veth(&self, here: &str, other: &Netns, there: &str) {
        self.veth_pair(here, other, there);
        self.ip(&["link", "set", here, "up"]);
        other.ip(&["link", "set", there, "up"]);
    }

    /// A NIC for a program under test: a veth whose end `there` in `other` gets MAC `mac`
    /// and is left down (the program brings it up), and whose end `here` stays here, down
    /// too (the caller puts it on a bridge or gives it an address, then sets it up).
    pub fn nic(&self, here: &str, other: &Netns, there: &str, mac: &str) {
        self.veth_pair(here, other, there);
        other.ip(&["link", "set", there, "address", mac]);
    }

    fn veth_pair(&self, here: &str, other: &Netns, there: &str) {
        let peer = ["peer", "name", there, "netns", &other.name];
        let mut args = vec!["link", "add", here, "type", "veth"];
        args.extend_from_slice(&peer);
        self.ip(&args);
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        in_netns(&self.name, f)
    }

    /// Runs the future `f` makes inside the namespace, on a thread with its own runtime.
    pub fn block_on<T, F>(&self, f: impl FnOnce() -> F + Send + 'static) -> JoinHandle<T>
    where
        T: Send + 'static,
        F: Future<Output = T>,
    {
        block_on_in(&self.name, f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.owned {
            delete(&self.name);
        }
    }
}

/// Runs `cmd`; its output, or an error naming the command and its stderr when it fails.
fn run_ok(cmd: &mut Command) -> std::io::Result<Output> {
    let out = cmd
        .output()
        .map_err(|e| std::io::Error::new(e.kind(), format!("running {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out)
}

/// Deletes namespace `name` if it exists.
pub fn delete(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// `program` to run inside namespace `ns` (`ip netns exec`).
pub fn exec_in(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(program);
    cmd
}

/// A namespace's own resolver: `/etc/netns/<ns>/resolv.conf` naming `servers`, which
/// `ip netns exec` (so [`exec_in`]) mounts over `/etc/resolv.conf` for what it runs there.
/// The directory is removed on drop; the namespace's name is unique, so nothing else uses it.
#[derive(Debug)]
pub struct Resolver(PathBuf);

impl Resolver {
    /// Writes the file for namespace `ns`.
    pub fn new(ns: &str, servers: &[std::net::IpAddr]) -> Self {
        let dir = Path::new("/etc/netns").join(ns);
        std::fs::create_dir_all(&dir).unwrap();
        let text: String = servers
            .iter()
            .map(|s| format!("nameserver {s}\n"))
            .collect();
        std::fs::write(dir.join("resolv.conf"), text).unwrap();
        Resolver(dir)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Moves the calling thread into namespace `ns`; the error names the namespace. setns
/// moves only this thread, and threads it starts afterwards inherit the namespace.
pub fn enter(ns: &str) -> std::io::Result<()> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("opening {path}: {e}")))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| std::io::Error::other(format!("entering {path}: {e}")))
}

/// Runs `f` on a new thread inside namespace `ns`, leaving the caller's threads where they
/// are (a socket or tap made there stays there, whichever thread uses it later). The
/// thread's result is `f`'s, or the error entering the namespace.
pub fn try_in_netns<T, E>(
    ns: &str,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> JoinHandle<Result<T, E>>
where
    T: Send + 'static,
    E: From<std::io::Error> + Send + 'static,
{
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
}

/// Runs `f` on a thread inside namespace `ns`, as [`try_in_netns`], panicking when the
/// namespace cannot be entered.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns).unwrap_or_else(|e| panic!("{e}"));
        f()
    })
}

/// Runs the future `f` makes inside namespace `ns`, on a thread with its own runtime.
pub fn block_on_in<T, F>(ns: &str, f: impl FnOnce() -> F + Send + 'static) -> JoinHandle<T>
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    in_netns(ns, move || runtime().block_on(f()))
}

/// A single-threaded runtime (for a namespace thread).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A TCP listener bound to `addr` inside namespace `ns`.
pub fn bind_tcp_in(ns: &str, addr: std::net::SocketAddr) -> std::net::TcpListener {
    in_netns(ns, move || {
        std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding {addr}: {e}"))
    })
    .join()
    .expect("bind thread")
}

/// The index of interface `link` inside namespace `ns` (an IPv6 link-local address's
/// scope).
pub fn if_index_in(ns: &str, link: &str) -> u32 {
    let link = link.to_owned();
    in_netns(ns, move || {
        nix::net::if_::if_nametoindex(link.as_str()).unwrap_or_else(|e| panic!("{link}: {e}"))
    })
    .join()
    .expect("if_nametoindex thread")
}
