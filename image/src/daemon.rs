//! A dynamically linked program and everything it needs at run time, for the image: the
//! program, its ELF interpreter and the closure of its `DT_NEEDED` libraries, found under a
//! root directory the way the dynamic loader finds them (Debian's multiarch directories).
//! The appliance carries BIRD this way when the cluster announces VIPs by BGP
//! (`docs/bgp.md`, `docs/image.md`); the agent itself stays static.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::read::elf::{Dyn, ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, elf};

use crate::ImageError;

/// Where the loader looks, in order (glibc's built-in list on Debian amd64).
pub const LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// What an ELF file asks of the loader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// `PT_INTERP`: the loader's absolute path.
    pub interpreter: Option<String>,
    /// `DT_NEEDED` sonames.
    pub libraries: Vec<String>,
}

fn elf_error(path: &Path, e: impl std::fmt::Display) -> ImageError {
    ImageError::Io(format!("{}: not a usable ELF64 file: {e}", path.display()))
}

/// Reads the interpreter and needed libraries of the ELF64 file `data` (`path` names it in
/// errors). A static program needs nothing.
pub fn needs(path: &Path, data: &[u8]) -> Result<Needs, ImageError> {
    let file = ElfFile64::<Endianness>::parse(data).map_err(|e| elf_error(path, e))?;
    let endian = file.endian();
    let header = file.elf_header();
    let mut out = Needs::default();
    for seg in header
        .program_headers(endian, data)
        .map_err(|e| elf_error(path, e))?
    {
        if seg.p_type(endian) == elf::PT_INTERP {
            let bytes = seg
                .data(endian, data)
                .map_err(|()| elf_error(path, "PT_INTERP out of the file"))?;
            let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
            out.interpreter = Some(String::from_utf8_lossy(text).into_owned());
        }
    }
    let sections = header
        .sections(endian, data)
        .map_err(|e| elf_error(path, e))?;
    if let Some((dyns, link)) = sections
        .dynamic(endian, data)
        .map_err(|e| elf_error(path, e))?
    {
        let strings = sections
            .strings(endian, data, link)
            .map_err(|e| elf_error(path, e))?;
        for d in dyns {
            if d.tag32(endian) == Some(elf::DT_NEEDED) {
                let name = d.string(endian, strings).map_err(|e| elf_error(path, e))?;
                out.libraries
                    .push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    Ok(out)
}

/// `path` (absolute, as the loader sees it) inside `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The program at `program` (an absolute path under `root`) and its run-time closure:
/// `(path in the image, file on this machine)` pairs, sorted by path, symlinks followed
/// (the image holds each library under the name the loader asks for).
pub fn closure(root: &Path, program: &str) -> Result<Vec<(String, PathBuf)>, ImageError> {
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut todo: Vec<(String, PathBuf)> = vec![(program.to_owned(), under(root, program))];
    while let Some((inside, host)) = todo.pop() {
        if found.contains_key(&inside) {
            continue;
        }
        let data = std::fs::read(&host)
            .map_err(|e| ImageError::Io(format!("reading {}: {e}", host.display())))?;
        let need = needs(&host, &data)?;
        found.insert(inside.clone(), host.clone());
        if let Some(interp) = need.interpreter {
            todo.push((interp.clone(), under(root, &interp)));
        }
        for lib in need.libraries {
            if found
                .keys()
                .any(|k| k.rsplit('/').next() == Some(lib.as_str()))
            {
                continue;
            }
            let hit = LIBRARY_DIRS
                .iter()
                .map(|d| format!("{d}/{lib}"))
                .find(|p| under(root, p).is_file())
                .ok_or_else(|| {
                    ImageError::Io(format!(
                        "{inside} needs {lib}, which is in none of {} under {}",
                        LIBRARY_DIRS.join(", "),
                        root.display()
                    ))
                })?;
            let host = under(root, &hit);
            todo.push((hit, host));
        }
    }
    Ok(found
        .into_iter()
        .map(|(inside, host)| {
            let real = std::fs::canonicalize(&host).unwrap_or(host);
            (inside, real)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let e = needs(Path::new("/x/bird"), b"not an elf")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/x/bird"), "{e}");
    }

    #[test]
    fn a_dynamic_program_needs_libc_and_the_loader() {
        // Any dynamically linked program of this (Debian) machine does.
        let path = Path::new("/bin/sh");
        let data = std::fs::canonicalize(path)
            .and_then(std::fs::read)
            .expect("/bin/sh");
        let n = needs(path, &data).unwrap();
        assert_eq!(
            n.interpreter.as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert!(n.libraries.iter().any(|l| l == "libc.so.6"), "{n:?}");
        let all = closure(Path::new("/"), "/bin/sh").unwrap();
        let names: Vec<&str> = all.iter().map(|(p, _)| p.as_str()).collect();
        assert!(names.contains(&"/bin/sh"), "{names:?}");
        assert!(names.contains(&"/lib64/ld-linux-x86-64.so.2"), "{names:?}");
        assert!(names.iter().any(|n| n.ends_with("/libc.so.6")), "{names:?}");
        assert!(all.iter().all(|(_, h)| h.is_file()));
    }

    #[test]
    fn a_missing_library_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy(std::fs::canonicalize("/bin/sh").unwrap(), bin.join("sh")).unwrap();
        let e = closure(dir.path(), "/usr/bin/sh").unwrap_err().to_string();
        assert!(e.contains("needs libc.so.6"), "{e}");
    }

    /// The closure is everything BIRD needs: copied alone into an empty root, it runs.
    #[test]
    fn bird_runs_from_its_closure_alone() {
        // chroot needs root.
        if !keelson_testkit::require_root() || !keelson_testkit::require("bird") {
            return;
        }
        let files = closure(Path::new("/"), "/usr/sbin/bird").unwrap();
        let root = tempfile::tempdir().unwrap();
        for (inside, host) in &files {
            let to = under(root.path(), inside);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(host, &to).unwrap();
        }
        let out = std::process::Command::new("chroot")
            .arg(root.path())
            .args(["/usr/sbin/bird", "--version"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("BIRD version 2"),
            "{text}"
        );
    }
}
