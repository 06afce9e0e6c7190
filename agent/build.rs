//! Records the git commit the agent is built from, for `--version`, `keelson_build_info` and
//! `status`; `keelson` (build/) runs this same script for its own `--version`. Only the
//! commit goes in, never a dirty flag or a time, so the same source gives the same binary.
//!
//! Cargo rebuilds the agent whenever this script runs again, even when it prints the same
//! commit (the static LTO build takes minutes), so it asks to run again only when the commit
//! can have changed:
//! - `KEELSON_COMMIT` set and not empty (the Makefile sets it from `git rev-parse`; CI, a
//!   tarball's build): that value. Cargo compares it by value, so nothing else is watched and
//!   only a new commit reruns.
//! - Otherwise the commit HEAD resolves to, and the files it resolves through, found with
//!   `git rev-parse --git-path` (in a worktree `.git` is a file naming its own git directory,
//!   which holds its HEAD, while the branches live in the common one): HEAD (a branch switch,
//!   a detached commit) and the branch's loose ref, which git rewrites only when the branch
//!   moves. A branch with no loose ref is in `packed-refs`; a commit on it writes a new loose
//!   ref without touching `packed-refs`, and appends to the worktree's `logs/HEAD`, so both
//!   are watched then.
//! - No git, or no commit: `unknown`, and nothing but `KEELSON_COMMIT` is watched (a tree
//!   that becomes a checkout later keeps `unknown` until something else rebuilds it; `make`
//!   passes the commit, so its builds notice).
//!
//! Only files that exist are named: cargo reruns on every build for a missing one.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The path of `$GIT_DIR/<name>` (this worktree's, or the common directory's for refs).
fn git_path(name: &str) -> Option<String> {
    git(&["rev-parse", "--git-path", name])
}

/// The files whose change can change the commit HEAD resolves to.
fn watched() -> Vec<String> {
    let Some(head) = git_path("HEAD") else {
        return Vec::new();
    };
    let mut files = vec![head];
    // `HEAD` when detached: the commit is in HEAD itself.
    let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) else {
        return files;
    };
    match git_path(&branch) {
        Some(loose) if Path::new(&loose).is_file() => files.push(loose),
        _ => files.extend(
            ["packed-refs", "logs/HEAD"]
                .into_iter()
                .filter_map(git_path),
        ),
    }
    files
}

fn main() {
    println!("cargo:rerun-if-env-changed=KEELSON_COMMIT");
    let from_env = std::env::var("KEELSON_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let commit = match from_env {
        Some(commit) => commit,
        None => {
            let commit = git(&["rev-parse", "--short=12", "HEAD"]);
            if commit.is_some() {
                for path in watched() {
                    if Path::new(&path).exists() {
                        println!("cargo:rerun-if-changed={path}");
                    }
                }
            }
            commit.unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=KEELSON_COMMIT={commit}");
}
