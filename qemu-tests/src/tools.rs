//! The external commands the harness runs, found before anything starts: a missing tool is an
//! error that names it and its package, never a wrong answer later (a `ping` that is not
//! installed must not look like a VIP nobody holds).

use std::path::PathBuf;

use anyhow::{Result, bail};

/// Every command the harness and its tests run, with the Debian package providing it
/// (`scripts/setup.sh` installs them).
pub const COMMANDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("nft", "nftables"),
    ("ping", "iputils-ping"),
    ("curl", "curl"),
    ("dig", "bind9-dnsutils"),
    ("dnsmasq", "dnsmasq-base"),
    ("xorriso", "xorriso"),
    ("qemu-img", "qemu-utils"),
    ("qemu-system-x86_64", "qemu-system-x86"),
];

/// Where `program` is on `PATH` (plus the sbin directories a non-root `PATH` may lack).
pub fn find(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `program`'s path, or an error naming it and its package.
pub fn require(program: &str) -> Result<PathBuf> {
    if let Some(p) = find(program) {
        return Ok(p);
    }
    let package = COMMANDS
        .iter()
        .find(|(c, _)| *c == program)
        .map(|(_, p)| *p)
        .unwrap_or("see scripts/setup.sh");
    bail!("{program}: not found (apt package {package}; `scripts/setup.sh` installs it)")
}

/// Checks every command in [`COMMANDS`]; the error lists each missing one on its own line.
pub fn require_all() -> Result<()> {
    let missing: Vec<String> = COMMANDS
        .iter()
        .filter_map(|(c, _)| require(c).err().map(|e| e.to_string()))
        .collect();
    if !missing.is_empty() {
        bail!("{}", missing.join("\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_command_is_named_with_its_package() {
        let err = require("no-such-command-keelson").unwrap_err().to_string();
        assert!(
            err.starts_with("no-such-command-keelson: not found"),
            "{err}"
        );
        assert!(find("sh").is_some());
    }
}
