//! A small read-only ISO 9660 reader for config drives: volume label, and files by path with
//! Joliet (UCS-2) or Rock Ridge (`NM`) names, as `genisoimage -R -J` and `xorriso -as mkisofs
//! -R -J` write them.
//!
//! Written by hand because PID 1 must read the drive without the kernel's iso9660 driver (the
//! development kernel has none), and the crates.io readers either pull in a large dependency
//! tree or do not read Joliet names. It only needs single-extent files in a few directories;
//! every offset is bounds-checked, so hostile images give errors, never panics (proptest below).

use std::io::{Read, Seek, SeekFrom};

/// Logical sector size.
const SECTOR: u64 = 2048;
/// Config-drive files are small; refuse anything larger than this.
const MAX_FILE: u32 = 64 * 1024 * 1024;

/// Errors reading an ISO image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IsoError {
    /// Reading the device failed.
    #[error("reading the ISO image: {0}")]
    Io(#[from] std::io::Error),
    /// No primary volume descriptor.
    #[error("not an ISO 9660 image: {0}")]
    NotIso(&'static str),
    /// A structure is malformed.
    #[error("malformed ISO 9660 {what} at byte {offset}")]
    Malformed {
        /// Which structure.
        what: &'static str,
        /// Where.
        offset: u64,
    },
    /// The path does not exist.
    #[error("{0}: no such file on the ISO image")]
    NotFound(String),
    /// The file is larger than the reader's limit.
    #[error("{path}: larger than the limit of {limit} bytes")]
    TooLarge {
        /// The file (or `directory`).
        path: String,
        /// The limit.
        limit: usize,
    },
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    extent: u32,
    size: u32,
    dir: bool,
}

/// An opened ISO image.
#[derive(Debug)]
pub struct Iso<R> {
    reader: R,
    /// Volume identifier of the primary descriptor (trimmed), e.g. `config-2`.
    pub label: String,
    root: Entry,
    joliet: bool,
}

impl<R: Read + Seek> Iso<R> {
    /// Reads the volume descriptors; prefers the Joliet tree when there is one.
    pub fn open(mut reader: R) -> Result<Self, IsoError> {
        let mut label = None;
        let mut primary_root = None;
        let mut joliet_root = None;
        for index in 16..64u64 {
            let mut desc = [0u8; 2048];
            reader.seek(SeekFrom::Start(index * SECTOR))?;
            if reader.read_exact(&mut desc).is_err() {
                break;
            }
            if &desc[1..6] != b"CD001" {
                return Err(IsoError::NotIso("no CD001 volume descriptor"));
            }
            match desc[0] {
                1 => {
                    label = Some(
                        String::from_utf8_lossy(&desc[40..72])
                            .trim_end_matches([' ', '\0'])
                            .to_owned(),
                    );
                    primary_root =
                        Some(parse_record(&desc[156..190], false, index * SECTOR + 156)?.1);
                }
                // Supplementary descriptor with a UCS-2 escape sequence: Joliet.
                2 if desc[88] == 0x25
                    && desc[89] == 0x2f
                    && matches!(desc[90], 0x40 | 0x43 | 0x45) =>
                {
                    joliet_root =
                        Some(parse_record(&desc[156..190], true, index * SECTOR + 156)?.1);
                }
                255 => break,
                _ => {}
            }
        }
        let label = label.ok_or(IsoError::NotIso("no primary volume descriptor"))?;
        let (root, joliet) = match (joliet_root, primary_root) {
            (Some(root), _) => (root, true),
            (None, Some(root)) => (root, false),
            (None, None) => return Err(IsoError::NotIso("no root directory")),
        };
        Ok(Iso {
            reader,
            label,
            root,
            joliet,
        })
    }

    /// Reads a file by `/`-separated path (case-sensitive, as Joliet and Rock Ridge names are).
    pub fn read_file(&mut self, path: &str) -> Result<Vec<u8>, IsoError> {
        self.read_file_within(path, MAX_FILE as usize)
    }

    /// [`Iso::read_file`], refusing a file larger than `limit` bytes before reading it.
    pub fn read_file_within(&mut self, path: &str, limit: usize) -> Result<Vec<u8>, IsoError> {
        let mut current = self.root.clone();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !current.dir {
                return Err(IsoError::NotFound(path.into()));
            }
            let entries = self.list(&current)?;
            current = entries
                .into_iter()
                .find(|e| e.name == part)
                .ok_or_else(|| IsoError::NotFound(path.into()))?;
        }
        if current.dir {
            return Err(IsoError::NotFound(path.into()));
        }
        if current.size > MAX_FILE || current.size as usize > limit {
            return Err(IsoError::TooLarge {
                path: path.into(),
                limit: limit.min(MAX_FILE as usize),
            });
        }
        let mut data = vec![0u8; current.size as usize];
        self.reader
            .seek(SeekFrom::Start(u64::from(current.extent) * SECTOR))?;
        self.reader.read_exact(&mut data)?;
        Ok(data)
    }

    /// Names in a directory (`/`-separated path), for discovering dated metadata versions.
    pub fn list_dir(&mut self, path: &str) -> Result<Vec<String>, IsoError> {
        let mut current = self.root.clone();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let entries = self.list(&current)?;
            current = entries
                .into_iter()
                .find(|e| e.name == part && e.dir)
                .ok_or_else(|| IsoError::NotFound(path.into()))?;
        }
        Ok(self.list(&current)?.into_iter().map(|e| e.name).collect())
    }

    fn list(&mut self, dir: &Entry) -> Result<Vec<Entry>, IsoError> {
        if dir.size > MAX_FILE {
            return Err(IsoError::TooLarge {
                path: "directory".into(),
                limit: MAX_FILE as usize,
            });
        }
        let start = u64::from(dir.extent) * SECTOR;
        let mut data = vec![0u8; dir.size as usize];
        self.reader.seek(SeekFrom::Start(start))?;
        self.reader.read_exact(&mut data)?;
        let mut entries = Vec::new();
        let mut pos = 0usize;
        let mut first = true;
        while pos < data.len() {
            let len = data[pos] as usize;
            if len == 0 {
                // Records never cross a sector boundary; skip the padding to the next one.
                pos = (pos / SECTOR as usize + 1) * SECTOR as usize;
                continue;
            }
            let record = data.get(pos..pos + len).ok_or(IsoError::Malformed {
                what: "directory record",
                offset: start + pos as u64,
            })?;
            let (special, entry) = parse_record(record, self.joliet, start + pos as u64)?;
            // The first two records are "." and ".."; "." of the root carries SUSP "SP".
            if !special && !first {
                entries.push(entry);
            }
            first = false;
            pos += len;
        }
        Ok(entries)
    }
}

/// Parses one directory record; returns (is `.`/`..`, entry).
fn parse_record(record: &[u8], joliet: bool, offset: u64) -> Result<(bool, Entry), IsoError> {
    let bad = || IsoError::Malformed {
        what: "directory record",
        offset,
    };
    if record.len() < 34 {
        return Err(bad());
    }
    let extent = u32::from_le_bytes(record[2..6].try_into().map_err(|_| bad())?);
    let size = u32::from_le_bytes(record[10..14].try_into().map_err(|_| bad())?);
    let dir = record[25] & 0x02 != 0;
    let name_len = record[32] as usize;
    let raw_name = record.get(33..33 + name_len).ok_or_else(bad)?;
    let special = name_len == 1 && (raw_name[0] == 0 || raw_name[0] == 1);
    let mut name = if joliet {
        let units: Vec<u16> = raw_name
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16_lossy(&units)
    } else {
        String::from_utf8_lossy(raw_name).into_owned()
    };
    if !joliet {
        // System use area (after the name, padded to even length): Rock Ridge "NM" entries.
        let su_start = 33 + name_len + (1 - name_len % 2);
        if let Some(rr) = record.get(su_start..).and_then(rock_ridge_name) {
            name = rr;
        }
    }
    // ISO level names end in ";1" and may end in "." when there is no extension.
    if let Some(stripped) = name.rsplit_once(';').map(|(n, _)| n.to_owned()) {
        name = stripped;
    }
    if !joliet && name.ends_with('.') {
        name.pop();
    }
    Ok((
        special,
        Entry {
            name,
            extent,
            size,
            dir,
        },
    ))
}

/// The Rock Ridge alternate name in a system use area, if any.
fn rock_ridge_name(mut su: &[u8]) -> Option<String> {
    let mut name = Vec::new();
    while su.len() >= 4 {
        let len = su[2] as usize;
        if len < 4 || len > su.len() {
            break;
        }
        if &su[..2] == b"NM" && len >= 5 {
            name.extend_from_slice(&su[5..len]);
        }
        su = &su[len..];
    }
    (!name.is_empty()).then(|| String::from_utf8_lossy(&name).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// Writes a config-drive tree and packs it with `xorriso -as mkisofs` and the given
    /// flags; `None` when xorriso is missing (a skip, or a failure under CI).
    fn make_iso(flags: &[&str]) -> Option<Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("tree/openstack/latest");
        std::fs::create_dir_all(&latest).unwrap();
        std::fs::create_dir_all(dir.path().join("tree/openstack/2018-08-27")).unwrap();
        std::fs::write(latest.join("meta_data.json"), br#"{"name":"master-0"}"#).unwrap();
        std::fs::write(latest.join("network_data.json"), vec![b'x'; 5000]).unwrap();
        std::fs::write(latest.join("user_data"), b"{\"ignition\":{}}").unwrap();
        if !keelson_testkit::require("xorriso") {
            return None;
        }
        let iso = dir.path().join("cd.iso");
        keelson_testkit::config_drive::iso(&dir.path().join("tree"), &iso, flags);
        Some(std::fs::read(iso).unwrap())
    }

    #[test]
    fn reads_joliet_rock_ridge_and_both() {
        for flags in [&["-R", "-J"][..], &["-J"][..], &["-R"][..]] {
            let Some(bytes) = make_iso(flags) else { return };
            let mut iso = Iso::open(Cursor::new(bytes)).unwrap();
            assert_eq!(iso.label, "config-2", "{flags:?}");
            assert_eq!(
                iso.read_file("openstack/latest/meta_data.json").unwrap(),
                br#"{"name":"master-0"}"#,
                "{flags:?}"
            );
            assert_eq!(
                iso.read_file("/openstack/latest/network_data.json")
                    .unwrap()
                    .len(),
                5000
            );
            assert_eq!(
                iso.read_file("openstack/latest/user_data").unwrap(),
                b"{\"ignition\":{}}"
            );
            let mut versions = iso.list_dir("openstack").unwrap();
            versions.sort();
            assert_eq!(versions, ["2018-08-27", "latest"], "{flags:?}");
            let err = iso
                .read_file("openstack/latest/vendor_data.json")
                .unwrap_err();
            assert!(err.to_string().contains("vendor_data.json"), "{err}");
        }
    }

    #[test]
    fn not_an_iso_is_an_error() {
        let err = Iso::open(Cursor::new(vec![0u8; 40_000])).unwrap_err();
        assert!(
            matches!(err, IsoError::NotIso(_) | IsoError::Io(_)),
            "{err}"
        );
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::with_cases(64))]
        /// Corrupting a valid image anywhere gives errors or data, never a panic.
        #[test]
        fn corrupted_images_never_panic(flips in proptest::collection::vec((0usize..60_000, proptest::prelude::any::<u8>()), 1..40)) {
            static IMAGE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
            let Some(base) = IMAGE.get_or_init(|| make_iso(&["-R", "-J"])) else { return Ok(()) };
            let mut bytes = base.clone();
            for (at, value) in flips {
                if at < bytes.len() {
                    bytes[at] = value;
                }
            }
            if let Ok(mut iso) = Iso::open(Cursor::new(bytes)) {
                let _ = iso.read_file("openstack/latest/meta_data.json");
                let _ = iso.list_dir("openstack");
            }
        }
    }
}
