//! Where the kernel and its modules come from: `--kernel`/`--modules`, or the Debian
//! `linux-image-cloud-amd64` package `make setup` unpacked into `.cache/kernel/`.

use std::path::{Path, PathBuf};

use crate::ImageError;

/// A kernel and its modules tree.
#[derive(Debug, Clone)]
pub struct KernelSource {
    /// The bzImage.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<version>`.
    pub modules_dir: PathBuf,
    /// The kernel version (the modules directory's name).
    pub version: String,
    /// Debian package facts from `package.txt` (`package`, `version`, `sha256` of the .deb).
    pub package: Option<PackageInfo>,
}

/// What `make setup` recorded about the kernel package.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PackageInfo {
    /// Package name.
    pub package: String,
    /// Package version.
    pub version: String,
    /// sha256 of the .deb.
    pub sha256: String,
}

/// The environment variable naming an unpacked kernel root (with `boot/` and `lib/modules/`).
pub const KERNEL_DIR_ENV: &str = "KEELSON_KERNEL_DIR";

impl KernelSource {
    /// Resolves the kernel: explicit paths first, else `$KEELSON_KERNEL_DIR`, else
    /// `.cache/kernel/root` found upwards from the working directory or the executable.
    pub fn locate(kernel: Option<&Path>, modules: Option<&Path>) -> Result<Self, ImageError> {
        if let (Some(vmlinuz), Some(modules_dir)) = (kernel, modules) {
            return Self::from_paths(vmlinuz, modules_dir, None);
        }
        let root = std::env::var_os(KERNEL_DIR_ENV)
            .map(PathBuf::from)
            .or_else(find_cache_root)
            .ok_or_else(|| {
                ImageError::Kernel(
                    "no kernel given: pass --kernel and --modules, set KEELSON_KERNEL_DIR, or \
                     run `make setup` (unpacks linux-image-cloud-amd64 into .cache/kernel)"
                        .into(),
                )
            })?;
        let modules_root = root.join("lib/modules");
        let version = single_entry(&modules_root)?;
        let modules_dir = modules
            .map(Path::to_path_buf)
            .unwrap_or_else(|| modules_root.join(&version));
        let vmlinuz = kernel
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.join(format!("boot/vmlinuz-{version}")));
        let package = root
            .parent()
            .map(|p| p.join("package.txt"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| parse_package_txt(&text));
        Self::from_paths(&vmlinuz, &modules_dir, package)
    }

    fn from_paths(
        vmlinuz: &Path,
        modules_dir: &Path,
        package: Option<PackageInfo>,
    ) -> Result<Self, ImageError> {
        if !vmlinuz.is_file() {
            return Err(ImageError::Kernel(format!(
                "kernel {}: no such file",
                vmlinuz.display()
            )));
        }
        if !modules_dir.join("modules.dep").is_file() {
            return Err(ImageError::Kernel(format!(
                "modules {}: expected a lib/modules/<version> directory with modules.dep \
                 (run depmod)",
                modules_dir.display()
            )));
        }
        let version = modules_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(KernelSource {
            vmlinuz: vmlinuz.to_path_buf(),
            modules_dir: modules_dir.to_path_buf(),
            version,
            package,
        })
    }
}

/// `.cache/kernel/root` in the working directory or any parent, or above the executable.
fn find_cache_root() -> Option<PathBuf> {
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    starts.iter().find_map(|start| {
        start
            .ancestors()
            .map(|dir| dir.join(".cache/kernel/root"))
            .find(|candidate| candidate.join("lib/modules").is_dir())
    })
}

fn single_entry(dir: &Path) -> Result<String, ImageError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| ImageError::Kernel(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(ImageError::Kernel(format!(
            "{}: no kernel version directory",
            dir.display()
        ))),
        many => Err(ImageError::Kernel(format!(
            "{}: several kernel versions ({}); pass --kernel and --modules",
            dir.display(),
            many.join(", ")
        ))),
    }
}

/// `key=value` lines as `make setup` writes them.
pub fn parse_package_txt(text: &str) -> Option<PackageInfo> {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    Some(PackageInfo {
        package: get("package")?,
        version: get("version")?,
        sha256: get("sha256")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_txt() {
        let info = parse_package_txt("package=linux-image-x\nversion=6.1-2\nsha256=ab\n").unwrap();
        assert_eq!(info.version, "6.1-2");
        assert!(parse_package_txt("package=x\n").is_none());
    }

    #[test]
    fn explicit_paths_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let err = KernelSource::locate(Some(&dir.path().join("vmlinuz")), Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such file"), "{err}");
        std::fs::write(dir.path().join("vmlinuz"), b"k").unwrap();
        let err = KernelSource::locate(Some(&dir.path().join("vmlinuz")), Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("modules.dep"), "{err}");
    }
}
