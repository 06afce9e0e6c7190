//! Helpers shared by the tests that build network namespaces: the root check, running a
//! command that must succeed, and namespaces removed on drop.

#![allow(dead_code)] // each test crate uses its own subset

use std::process::Command;

/// True when running as root; otherwise says why the test is skipped (and fails under CI,
/// which runs every test as root).
pub fn root_or_skip() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "CI runs these tests as root");
    eprintln!("skipping: needs root for network namespaces");
    false
}

/// Runs `args` and returns its stdout; panics with its stderr when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Namespaces removed on drop (also on a failed assertion).
pub struct Namespaces(Vec<String>);

impl Namespaces {
    /// Creates `names`, replacing any left over from an earlier run.
    pub fn new(names: &[&str]) -> Self {
        for n in names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
            sh(&["ip", "netns", "add", n]);
        }
        Namespaces(names.iter().map(|s| s.to_string()).collect())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Runs `f` on a thread inside network namespace `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}

/// A single-threaded runtime for a namespace thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
