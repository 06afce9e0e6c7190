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

/// The last line a child printed on stdout that parsed as JSON (`Null` before the first):
/// the agent's one-shot subcommands print their state as a JSON line on every change.
#[derive(Debug, Clone, Default)]
pub struct JsonLines(Arc<Mutex<serde_json::Value>>);

impl JsonLines {
    /// The latest JSON line.
    pub fn latest(&self) -> serde_json::Value {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Spawns `cmd` with stdout piped into a [`JsonLines`] (stderr as the caller set it).
pub fn spawn_json_lines(cmd: &mut Command) -> (Proc, JsonLines) {
    let mut proc = Proc::spawn(cmd.stdout(Stdio::piped()));
    let stdout = proc.0.stdout.take().expect("piped");
    let lines = JsonLines::default();
    let latest = lines.0.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                *latest.lock().unwrap_or_else(|p| p.into_inner()) = v;
            }
        }
    });
    (proc, lines)
}
