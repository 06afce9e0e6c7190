//! Loading the image's kernel modules: the list `keelson image` writes
//! (`/lib/modules/<release>/modules.keelson`, dependencies first) via `finit_module`.

use std::ffi::CString;
use std::path::Path;

use anyhow::Context;

/// The module list file name (written by `keelson-image`).
pub const MODULE_LIST: &str = "modules.keelson";

/// The paths in a module list, skipping blanks and comments.
pub fn parse_list(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Loads every module listed for the running kernel; returns how many were loaded now.
/// A module already loaded (or built in) is fine; one that fails is logged and skipped.
pub fn load_image_modules(root: &Path) -> anyhow::Result<usize> {
    let release = nix::sys::utsname::uname()
        .context("uname")?
        .release()
        .to_string_lossy()
        .into_owned();
    let dir = root.join(&release);
    let list = std::fs::read_to_string(dir.join(MODULE_LIST))
        .with_context(|| format!("{}/{MODULE_LIST}", dir.display()))?;
    let mut loaded = 0;
    let params = CString::default();
    for rel in parse_list(&list) {
        let path = dir.join(rel);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                super::log(&format!("module {}: {e}", path.display()));
                continue;
            }
        };
        match nix::kmod::finit_module(&file, &params, nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) => loaded += 1,
            Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => super::log(&format!("module {rel}: {e}")),
        }
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_skips_blanks_and_comments() {
        assert_eq!(
            parse_list("# order matters\nkernel/a.ko\n\n  kernel/b.ko \n"),
            ["kernel/a.ko", "kernel/b.ko"]
        );
    }
}
