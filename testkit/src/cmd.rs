//! Commands: one that must succeed, and child processes that are stopped when dropped.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs `args` (program first) and returns its stdout; panics with its stderr when it
/// cannot start or fails.
pub fn sh(args: &[&str]) -> String {
    let out = output_ok(Command::new(args[0]).args(&args[1..]));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd`, which must succeed; its output. Panics with its stderr otherwise.
pub fn output_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd` with `input` on its standard input; its output, whatever its exit status.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    // A program that exits without reading its input is its own business.
    let _ = child.stdin.take().expect("piped").write_all(input);
    child.wait_with_output().unwrap()
}

/// A child process: SIGTERM, then SIGKILL after 5 s, when dropped (also when a test
/// fails), so nothing a test started outlives it.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Proc {
    /// Spawns `cmd`; panics naming it when it cannot start.
    pub fn spawn(cmd: &mut Command) -> Self {
        Proc(cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}")))
    }

    /// Its process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Sends SIGTERM only (the test then watches what the process does on its way out);
    /// nothing once it has been reaped (its pid may be another process's by then).
    pub fn signal_term(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// SIGTERM, and waits up to 5 s for it to exit (then SIGKILL).
    pub fn term(&mut self) {
        self.signal_term();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.term();
    }
}

/// Why the child `pid` of this process is no longer running ("exited with status 1",
/// "killed by SIGKILL", ...), or `None` while it runs (a stopped one, SIGSTOP, runs). The
/// exit is peeked at, not reaped (`WNOWAIT`): the [`Proc`] that owns the child still reaps
/// it. A child already reaped is reported as such: its pid may be another process's now.
pub fn exited(pid: nix::unistd::Pid) -> Option<String> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(pid), flags) {
        Ok(WaitStatus::StillAlive) => None,
        Ok(WaitStatus::Exited(_, code)) => Some(format!("exited with status {code}")),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(format!("killed by {sig}")),
        Ok(other) => Some(format!("ended ({other:?})")),
        Err(nix::errno::Errno::ECHILD) => Some("ended and was reaped".into()),
        Err(e) => Some(format!("cannot be waited for ({e})")),
    }
}

/// How many lines a [`JsonLines`] keeps with their arrival times.
const HISTORY: usize = 4096;

/// The JSON lines a child prints on stdout (the agent's one-shot subcommands print their
/// state as one on every change), read as they come. Every read checks that the child
/// still runs and still prints: the last line of a process that died says nothing of the
/// present, so reading it panics, naming the process and how it ended.
#[derive(Debug, Clone)]
pub struct JsonLines {
    lines: Arc<Mutex<Lines>>,
    pid: nix::unistd::Pid,
    what: Arc<str>,
}

#[derive(Debug, Default)]
struct Lines {
    /// The recent lines that parsed as JSON, with when each was read.
    history: std::collections::VecDeque<(Instant, serde_json::Value)>,
    /// Whether its stdout has closed (it exited, or stopped printing for good).
    closed: bool,
}

impl JsonLines {
    /// The latest JSON line (`Null` before the first). Panics when the process has ended
    /// or closed its stdout.
    pub fn latest(&self) -> serde_json::Value {
        let lines = self.alive_lines();
        lines
            .history
            .back()
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// When the first line read at or after `since` for which `matches` holds arrived, if
    /// one has (among the last few thousand lines). Panics as [`JsonLines::latest`] does.
    pub fn first_since(
        &self,
        since: Instant,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<Instant> {
        let lines = self.alive_lines();
        lines
            .history
            .iter()
            .find(|(at, v)| *at >= since && matches(v))
            .map(|(at, _)| *at)
    }

    /// The lines, once the process is known to run and print; panics naming it otherwise.
    fn alive_lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let ended = exited(self.pid).or_else(|| lines.closed.then(|| "closed its stdout".into()));
        if let Some(how) = ended {
            let last = lines.history.back().map(|(_, v)| v.to_string());
            panic!(
                "{} (pid {}) {how}: its output says nothing of the present (last line: {})",
                self.what,
                self.pid,
                last.as_deref().unwrap_or("none")
            );
        }
        lines
    }
}

/// Spawns `cmd` with stdout piped into a [`JsonLines`] (stderr as the caller set it).
pub fn spawn_json_lines(cmd: &mut Command) -> (Proc, JsonLines) {
    let what: Arc<str> = describe(cmd).into();
    let mut proc = Proc::spawn(cmd.stdout(Stdio::piped()));
    let stdout = proc.0.stdout.take().expect("piped");
    let lines = JsonLines {
        lines: Arc::default(),
        pid: proc.pid(),
        what,
    };
    let shared = lines.lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                let mut l = shared.lock().unwrap_or_else(|p| p.into_inner());
                if l.history.len() == HISTORY {
                    l.history.pop_front();
                }
                l.history.push_back((Instant::now(), v));
            }
        }
        shared.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
    });
    (proc, lines)
}

/// A command as a reader would type it: the program and its arguments, no environment.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Checks what `<binary> --version` printed: `<binary> <version> (<commit>)`, the commit a
/// git hash or `unknown` (a build outside a checkout). Returns the commit.
pub fn check_version_line(stdout: &str, binary: &str, version: &str) -> String {
    let expected = format!("{binary} {version} (");
    let commit = stdout
        .trim_end()
        .strip_prefix(&expected)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| {
            panic!("`{binary} --version` printed {stdout:?}, not `{expected}<commit>)`")
        });
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "`{binary} --version`: commit {commit:?} is neither a git hash nor `unknown`"
    );
    commit.to_string()
}
