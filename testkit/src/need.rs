//! What a test needs from the machine, and the one rule for when it is missing.
//!
//! `make test` exports `CI=1`, and CI runs it as root on a machine `scripts/setup.sh` set
//! up: there, a test that cannot run **fails** (it would otherwise pass by skipping). Set
//! to anything at all, `CI` means this; unset, a test that lacks something prints one line
//! that libtest does not capture,
//!
//! ```text
//! SKIPPED dns_dig::forwards_with_cache_and_truncation: needs dnsmasq (apt package dnsmasq-base; scripts/setup.sh installs it)
//! ```
//!
//! and returns early. Use it at the top of the test:
//!
//! ```no_run
//! # fn test() {
//! if !keelson_testkit::require_root() || !keelson_testkit::require("dig") {
//!     return;
//! }
//! # }
//! ```
//!
//! Every command passed to [`require`] must be in `scripts/setup.sh`'s `REQUIRED` table
//! (the one list of what the machine needs): one that is not is a failure everywhere.

use std::io::Write;
use std::path::{Path, PathBuf};

/// `scripts/setup.sh`: its `REQUIRED`, `REQUIRED_FILES` and `REQUIRED_CARGO` tables name
/// every command and file the build and tests use, with the package providing it.
const SETUP_SH: &str = include_str!("../../scripts/setup.sh");

/// True when `CI` is set (to anything): a test that cannot run must fail.
pub fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The rule itself: true when `available`; otherwise panics under CI, or prints one
/// `SKIPPED <test>: needs <what>` line (past libtest's capture) and returns false.
pub fn need(available: bool, what: &str) -> bool {
    if available {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    assert!(
        !ci(),
        "{test}: needs {what}; CI is set, so a test that cannot run fails instead of skipping"
    );
    // Straight to the stream, not through eprintln!: libtest captures that, and shows it
    // only for failed tests. A skip must be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs {what} (with CI set this fails)"
    );
    false
}

/// Whether command `tool` is installed ([`which`]); see [`need`] for when it is not.
/// Panics when `tool` is missing from `scripts/setup.sh`'s `REQUIRED` table.
pub fn require(tool: &str) -> bool {
    let package = package(tool).unwrap_or_else(|| {
        panic!(
            "{tool}: not in scripts/setup.sh's REQUIRED table; add \"{tool} <package>\" there \
             (the one list of what tests run)"
        )
    });
    need(
        which(tool).is_some(),
        &format!("{tool} (apt package {package}; scripts/setup.sh installs it)"),
    )
}

/// Whether the test runs as root (network namespaces, raw sockets, nftables).
pub fn require_root() -> bool {
    need(
        nix::unistd::geteuid().is_root(),
        "root (network namespaces; CI runs the tests as root)",
    )
}

/// Whether `path` exists; `what` says what it is and where it comes from. For a path in
/// `scripts/setup.sh`'s `REQUIRED_FILES`, its package is named too.
pub fn require_file(path: impl AsRef<Path>, what: &str) -> bool {
    let path = path.as_ref();
    let origin = path
        .to_str()
        .and_then(package)
        .map(|p| format!(", apt package {p}"))
        .unwrap_or_default();
    need(
        path.exists(),
        &format!("{what} ({}{origin})", path.display()),
    )
}

/// The value of environment variable `var` (non-empty); see [`need`] for when it is unset.
/// `why` says who sets it (`make test` exports `KEELSON_AGENT_BIN`, for one).
pub fn require_env(var: &str, why: &str) -> Option<String> {
    let value = std::env::var(var).ok().filter(|v| !v.is_empty());
    need(value.is_some(), &format!("${var} ({why})")).then(|| value.unwrap_or_default())
}

/// Where command `tool` is: on `PATH`, or in the sbin directories a plain user's `PATH`
/// may lack (`scripts/setup.sh` looks there too).
pub fn which(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// The package `scripts/setup.sh` installs `name` (a command or a file) from.
pub fn package(name: &str) -> Option<&'static str> {
    required().find(|(n, _)| *n == name).map(|(_, p)| p)
}

/// Every `"name package"` entry of `scripts/setup.sh`'s tables.
fn required() -> impl Iterator<Item = (&'static str, &'static str)> {
    SETUP_SH.lines().filter_map(|line| {
        let entry = line.trim().strip_prefix('"')?.strip_suffix('"')?;
        let (name, package) = entry.split_once(' ')?;
        (!package.contains(' ')).then_some((name, package))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_tables_name_commands_and_files_with_their_packages() {
        assert_eq!(package("dig"), Some("bind9-dnsutils"));
        assert_eq!(package("keepalived"), Some("keepalived"));
        assert_eq!(package("/usr/share/ovmf/OVMF.fd"), Some("ovmf"));
        assert_eq!(package("cargo-machete"), Some("cargo-machete"));
        assert_eq!(package("no-such-command-keelson"), None);
        assert!(required().count() > 40);
    }

    #[test]
    fn which_finds_sh_and_not_a_made_up_name() {
        assert!(which("sh").is_some());
        assert!(which("no-such-command-keelson").is_none());
    }

    /// The rule, in a child process of this test binary: with `CI` set to anything a
    /// missing thing fails the test; without, it skips with one line on stderr.
    #[test]
    fn missing_things_fail_under_ci_and_skip_loudly_otherwise() {
        if std::env::var_os("KEELSON_TESTKIT_CHILD").is_some() {
            // The child: ask for something that is never there.
            assert!(!need(false, "a made-up thing"));
            return;
        }
        let me = std::env::current_exe().unwrap();
        let run = |ci: Option<&str>| {
            let mut cmd = std::process::Command::new(&me);
            cmd.args([
                "--exact",
                "need::tests::missing_things_fail_under_ci_and_skip_loudly_otherwise",
                "--test-threads=1",
            ])
            .env("KEELSON_TESTKIT_CHILD", "1")
            .env_remove("CI");
            if let Some(v) = ci {
                cmd.env("CI", v);
            }
            cmd.output().unwrap()
        };
        for value in ["1", "true", "", "no"] {
            let out = run(Some(value));
            assert!(!out.status.success(), "CI={value:?}: the test passed");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("needs a made-up thing"),
                "CI={value:?}: {text}"
            );
        }
        let out = run(None);
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let skipped: Vec<&str> = err.lines().filter(|l| l.starts_with("SKIPPED ")).collect();
        assert_eq!(skipped.len(), 1, "{err}");
        assert!(
            skipped[0].contains("missing_things_fail_under_ci")
                && skipped[0].contains("needs a made-up thing"),
            "{err}"
        );
    }
}
