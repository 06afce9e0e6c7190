//! OpenStack config drives for tests: an ISO 9660 volume labelled `config-2`, made by
//! `xorriso -as mkisofs` as Nova makes it (Rock Ridge and Joliet unless told otherwise).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Packs directory `tree` (holding `openstack/latest/...`) into `iso` with `flags` (for
/// example `["-R", "-J"]`); panics when xorriso fails. Call [`crate::require`]`("xorriso")`
/// first.
pub fn iso(tree: &Path, iso: &Path, flags: &[&str]) {
    let out = Command::new("xorriso")
        .args(["-as", "mkisofs", "-quiet", "-V", "config-2", "-o"])
        .arg(iso)
        .args(flags)
        .arg(tree)
        .output()
        .unwrap_or_else(|e| panic!("xorriso: {e}"));
    assert!(
        out.status.success(),
        "xorriso: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `files` (path under the tree, contents) into a fresh tree in `dir` and packs it
/// into `dir/config-drive.iso` (Rock Ridge and Joliet); the image's path.
pub fn iso_of(dir: &Path, files: &[(&str, &[u8])]) -> PathBuf {
    let tree = dir.join("config-drive-tree");
    for (path, contents) in files {
        let p = tree.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, contents).unwrap();
    }
    let out = dir.join("config-drive.iso");
    iso(&tree, &out, &["-R", "-J"]);
    out
}
