//! A reproducible initramfs: newc cpio, entries sorted by path, every mtime the same
//! (`SOURCE_DATE_EPOCH`), owner root, inode numbers in path order, gzip with no name or time
//! in its header.

use std::collections::BTreeMap;
use std::io::Write;

use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

/// One entry's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A regular file with its permission bits.
    File {
        /// Contents.
        data: Vec<u8>,
        /// Permission bits (e.g. 0o755).
        mode: u32,
    },
    /// A character device (`/dev/console` must exist before devtmpfs is mounted, or the
    /// kernel starts `/init` without stdin/stdout).
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// A symbolic link to the given target.
    Symlink(String),
}

/// One line of the manifest: what is inside the initramfs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ManifestEntry {
    /// Absolute path inside the initramfs.
    pub path: String,
    /// `dir`, `file`, `char` or `symlink`.
    pub kind: &'static str,
    /// Permission bits, octal text.
    pub mode: String,
    /// File size in bytes (files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// sha256 of file contents, or the link target (files and symlinks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// Errors building the archive.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitramfsError {
    /// Paths must be absolute, normalised and not the root itself.
    #[error("initramfs path {0:?}: expected an absolute path without `.`/`..` components")]
    BadPath(String),
    /// The same path added twice with different contents.
    #[error("initramfs path {0} added twice")]
    Duplicate(String),
    /// A file is larger than newc's 4 GiB limit.
    #[error("initramfs path {0}: larger than the 4 GiB newc limit")]
    TooLarge(String),
    /// Writing the archive failed.
    #[error("writing the initramfs: {0}")]
    Io(#[from] std::io::Error),
}

/// The initramfs under construction.
#[derive(Debug, Clone, Default)]
pub struct Initramfs {
    entries: BTreeMap<String, Node>,
}

impl Initramfs {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an entry; missing parent directories are added too.
    pub fn add(&mut self, path: &str, node: Node) -> Result<(), InitramfsError> {
        let path = normalise(path)?;
        // Parents first, so "a/b" also creates "a".
        let mut parent = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            match self.entries.get(&parent) {
                None => {
                    self.entries.insert(parent.clone(), Node::Dir);
                }
                Some(Node::Dir) => {}
                Some(_) => return Err(InitramfsError::Duplicate(format!("/{parent}"))),
            }
        }
        match self.entries.get(&path) {
            Some(existing) if *existing == node => Ok(()),
            Some(Node::Dir) if node == Node::Dir => Ok(()),
            Some(_) => Err(InitramfsError::Duplicate(format!("/{path}"))),
            None => {
                if let Node::File { data, .. } = &node
                    && u32::try_from(data.len()).is_err()
                {
                    return Err(InitramfsError::TooLarge(format!("/{path}")));
                }
                self.entries.insert(path, node);
                Ok(())
            }
        }
    }

    /// What the archive holds, in archive order.
    pub fn manifest(&self) -> Vec<ManifestEntry> {
        self.entries
            .iter()
            .map(|(path, node)| {
                let (kind, mode, size, sha256) = match node {
                    Node::Dir => ("dir", 0o755, None, None),
                    Node::File { data, mode } => (
                        "file",
                        *mode,
                        Some(data.len() as u64),
                        Some(hex::encode(Sha256::digest(data))),
                    ),
                    Node::CharDevice { .. } => ("char", 0o600, None, None),
                    Node::Symlink(target) => (
                        "symlink",
                        0o777,
                        None,
                        Some(hex::encode(Sha256::digest(target.as_bytes()))),
                    ),
                };
                ManifestEntry {
                    path: format!("/{path}"),
                    kind,
                    mode: format!("{mode:o}"),
                    size,
                    sha256,
                }
            })
            .collect()
    }

    /// The uncompressed newc archive; every entry gets `mtime`.
    pub fn to_cpio(&self, mtime: u32) -> Result<Vec<u8>, InitramfsError> {
        let mut out = Vec::new();
        // Inode numbers follow path order so the same tree always gives the same bytes.
        for (ino, (path, node)) in (1u32..).zip(&self.entries) {
            let builder = cpio::newc::Builder::new(path)
                .ino(ino)
                .uid(0)
                .gid(0)
                .mtime(mtime);
            let (builder, data): (_, &[u8]) = match node {
                Node::Dir => (builder.mode(0o040_755).nlink(2), &[]),
                Node::File { data, mode } => {
                    (builder.mode(0o100_000 | (mode & 0o7777)).nlink(1), data)
                }
                Node::CharDevice { major, minor } => (
                    builder
                        .mode(0o020_600)
                        .nlink(1)
                        .rdev_major(*major)
                        .rdev_minor(*minor),
                    &[],
                ),
                Node::Symlink(target) => (builder.mode(0o120_777).nlink(1), target.as_bytes()),
            };
            let size = u32::try_from(data.len())
                .map_err(|_| InitramfsError::TooLarge(format!("/{path}")))?;
            let mut writer = builder.write(&mut out, size);
            writer.write_all(data)?;
            writer.finish()?;
        }
        cpio::newc::trailer(&mut out)?;
        Ok(out)
    }

    /// The gzip-compressed archive (what the kernel loads).
    pub fn to_gzip(&self, mtime: u32) -> Result<Vec<u8>, InitramfsError> {
        let cpio = self.to_cpio(mtime)?;
        // No file name and a zero time in the gzip header: the bytes depend on content only.
        let mut encoder = GzBuilder::new()
            .mtime(0)
            .operating_system(3)
            .write(Vec::new(), Compression::best());
        encoder.write_all(&cpio)?;
        Ok(encoder.finish()?)
    }
}

/// `/a/b/` -> `a/b`; rejects relative paths, `.`/`..`, empty components and the root.
fn normalise(path: &str) -> Result<String, InitramfsError> {
    let bad = || InitramfsError::BadPath(path.to_owned());
    let rest = path.strip_prefix('/').ok_or_else(bad)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty()
        || rest
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    Ok(rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Initramfs {
        let mut fs = Initramfs::new();
        fs.add(
            "/init",
            Node::File {
                data: b"#!agent".to_vec(),
                mode: 0o755,
            },
        )
        .unwrap();
        fs.add("/dev/console", Node::CharDevice { major: 5, minor: 1 })
            .unwrap();
        fs.add(
            "/lib/modules/6.1/kernel/a.ko",
            Node::File {
                data: vec![7; 1000],
                mode: 0o644,
            },
        )
        .unwrap();
        fs.add("/proc", Node::Dir).unwrap();
        fs
    }

    #[test]
    fn archive_reads_back_sorted_with_fixed_metadata() {
        let cpio = sample().to_cpio(1_700_000_000).unwrap();
        let mut names = Vec::new();
        let mut reader = cpio::newc::Reader::new(&cpio[..]).unwrap();
        loop {
            let entry = reader.entry();
            if entry.is_trailer() {
                break;
            }
            assert_eq!(entry.mtime(), 1_700_000_000);
            assert_eq!((entry.uid(), entry.gid()), (0, 0));
            names.push((entry.name().to_owned(), entry.mode(), entry.file_size()));
            reader = cpio::newc::Reader::new(reader.finish().unwrap()).unwrap();
        }
        assert_eq!(
            names,
            [
                ("dev".to_owned(), 0o040_755, 0),
                ("dev/console".to_owned(), 0o020_600, 0),
                ("init".to_owned(), 0o100_755, 7),
                ("lib".to_owned(), 0o040_755, 0),
                ("lib/modules".to_owned(), 0o040_755, 0),
                ("lib/modules/6.1".to_owned(), 0o040_755, 0),
                ("lib/modules/6.1/kernel".to_owned(), 0o040_755, 0),
                ("lib/modules/6.1/kernel/a.ko".to_owned(), 0o100_644, 1000),
                ("proc".to_owned(), 0o040_755, 0),
            ]
        );
    }

    #[test]
    fn same_tree_same_bytes_whatever_the_insertion_order() {
        let a = sample().to_gzip(1).unwrap();
        let mut b = Initramfs::new();
        b.add("/proc", Node::Dir).unwrap();
        b.add(
            "/lib/modules/6.1/kernel/a.ko",
            Node::File {
                data: vec![7; 1000],
                mode: 0o644,
            },
        )
        .unwrap();
        b.add("/dev/console", Node::CharDevice { major: 5, minor: 1 })
            .unwrap();
        b.add(
            "/init",
            Node::File {
                data: b"#!agent".to_vec(),
                mode: 0o755,
            },
        )
        .unwrap();
        assert_eq!(a, b.to_gzip(1).unwrap());
        assert_ne!(
            a,
            sample().to_gzip(2).unwrap(),
            "mtime must be in the bytes"
        );
        // gzip header: magic, deflate, no flags (no name), zero mtime.
        assert_eq!(&a[..8], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn bad_paths_and_conflicts_are_errors() {
        let mut fs = sample();
        for bad in ["init", "/", "/a/../b", "/a//b", "/./a"] {
            assert!(
                matches!(fs.add(bad, Node::Dir), Err(InitramfsError::BadPath(_))),
                "{bad}"
            );
        }
        let err = fs.add("/init", Node::Dir).unwrap_err().to_string();
        assert!(err.contains("/init added twice"), "{err}");
        // A file cannot become a parent directory.
        assert!(fs.add("/init/x", Node::Dir).is_err());
        let manifest = fs.manifest();
        let init = manifest.iter().find(|e| e.path == "/init").unwrap();
        assert_eq!(
            (init.kind, init.mode.as_str(), init.size),
            ("file", "755", Some(7))
        );
    }
}
