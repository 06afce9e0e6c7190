//! The harness fails where it must: each test here, run as a child of this test binary
//! with `KEELSON_TESTKIT_CHILD` set, does one thing a broken product or machine would make a
//! test do, and must fail at once with a line naming the cause; run plainly, it runs that
//! child and checks so. `scripts/selftest.sh` runs the children itself too and checks their
//! lines (docs/testing.md, "The harness checks itself").

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cmd::{Proc, spawn_json_lines};

/// Longer than any child here may take: a child that fails only when a wait times out
/// (what these guard against) would take this long.
const WAIT: Duration = Duration::from_secs(60);
/// How soon a child must fail.
const SOON: Duration = Duration::from_secs(5);

/// In the child: true (the test does its failing thing). In the parent: runs the child
/// `test` and asserts it failed within [`SOON`], printing a line containing `cause`.
fn child_fails(test: &str, cause: &str) -> bool {
    if std::env::var_os("KEELSON_TESTKIT_CHILD").is_some() {
        return true;
    }
    let t = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1"])
        .env("KEELSON_TESTKIT_CHILD", "1")
        .output()
        .unwrap();
    let took = t.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{test} passed:\n{text}");
    assert!(
        text.contains(cause),
        "{test} did not name {cause:?}:\n{text}"
    );
    assert!(took < SOON, "{test} took {took:?} to fail");
    false
}

/// A process that prints one JSON status line and lives on, as an agent does.
fn printing_process() -> (Proc, crate::cmd::JsonLines) {
    let (proc, lines) = spawn_json_lines(
        Command::new("sh")
            .args(["-c", r#"echo '{"state":"backup"}'; exec sleep 120"#])
            .stderr(Stdio::inherit()),
    );
    crate::wait_for("the first status line", WAIT, || {
        lines.latest()["state"] == "backup"
    });
    (proc, lines)
}

/// An agent that dies (SIGKILL, as a crash) while a test waits on its status lines: the
/// wait fails at once, naming how it ended, instead of reading its last line forever.
#[test]
fn a_killed_agent_under_a_wait() {
    if !child_fails(
        "harness_fails::a_killed_agent_under_a_wait",
        "killed by SIGKILL: its output says nothing of the present",
    ) {
        return;
    }
    let (proc, lines) = printing_process();
    nix::sys::signal::kill(proc.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    crate::wait_for_ok("the agent a master", WAIT, || {
        let st = lines.latest();
        if st["state"] == "master" {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
}

/// A `run` node that dies while a test waits for it to get ready: the wait fails at once,
/// naming how it ended.
#[test]
fn a_dead_node_under_wait_ready() {
    if !child_fails(
        "harness_fails::a_dead_node_under_wait_ready",
        "exited with status 3",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node.log");
    let node = crate::agent::RunNode {
        proc: Proc::spawn(
            Command::new("sh")
                .args(["-c", "echo 'keelson-agent: starting' >&2; exit 3"])
                .stderr(std::fs::File::create(&log).unwrap()),
        ),
        log,
        agent: "sh".into(),
    };
    crate::wait_for("the node ready", WAIT, || node.is_ready());
}

/// `ip` failing (here: a namespace that is not there) under a VIP holder check: an error
/// naming `ip` and its message, never "does not hold it".
#[test]
fn ip_failing_under_a_holder_check() {
    if !child_fails(
        "harness_fails::ip_failing_under_a_holder_check",
        "Cannot open network namespace",
    ) {
        return;
    }
    let ns = crate::netns::unique_name("kh-none");
    crate::wait_for("nobody holding the VIP", WAIT, || {
        !crate::segment::ns_holds(&ns, "10.0.0.5")
    });
}

/// A status command that fails: an error naming it, never a `null` status that compares
/// equal to another failed one.
#[test]
fn a_failed_status_command() {
    if !child_fails(
        "harness_fails::a_failed_status_command",
        "status --json --socket /nonexistent/status.sock failed (exit status: 1)",
    ) {
        return;
    }
    let socket = std::path::Path::new("/nonexistent/status.sock");
    let before = crate::agent::status_at("false", socket);
    let after = crate::agent::status_at("false", socket);
    assert_eq!(before, after);
}
