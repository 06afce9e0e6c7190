//! Records the git commit the agent is built from, for `keelson_build_info` and `status`.
//! `KEELSON_COMMIT` in the environment wins (builds from a tarball, CI); outside a git
//! checkout it is `unknown`. Only the commit goes in, never a dirty flag or a time, so the
//! same source gives the same binary.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=KEELSON_COMMIT");
    let commit = std::env::var("KEELSON_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Rebuild when HEAD moves: HEAD itself (a branch switch), the ref it names and
    // packed-refs. Only files that exist: cargo reruns on every build for a missing one.
    let head_ref = git(&["rev-parse", "--symbolic-full-name", "HEAD"]);
    let watched = [
        Some("HEAD".to_string()),
        head_ref,
        Some("packed-refs".to_string()),
    ];
    for name in watched.into_iter().flatten() {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=KEELSON_COMMIT={commit}");
}
