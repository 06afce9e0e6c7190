//! A small read-only FAT12/16/32 reader for config drives: the volume label, and files by
//! path with long (VFAT) names, as `mkfs.vfat` + `mcopy` and Nova write them.
//!
//! Written by hand, as the ISO 9660 reader is, because the `fatfs` crate (0.3.6, its latest
//! release) trusts the image: a cluster number below 2 in a directory entry or in the FAT
//! overflows its arithmetic (a panic in debug builds, a wild offset in release ones), found
//! by the `config_drive_fat` fuzz target. Here every offset is computed with checked
//! arithmetic and bounds-checked, every cluster number is checked against the volume's
//! cluster count, a cluster chain is cut when it grows longer than the volume (a loop), and
//! files and directories over [`MAX_FILE`] are refused: a hostile drive gives errors, never
//! a panic or a hang.

use std::io::{Read, Seek, SeekFrom};

/// Config-drive files are small; refuse anything larger than this (as the ISO reader does).
pub const MAX_FILE: u32 = 64 * 1024 * 1024;
/// The largest FAT read into memory (a 64 MiB FAT16 drive has a 64 KiB FAT).
const MAX_FAT_BYTES: u64 = 16 * 1024 * 1024;
/// Size of a directory entry.
const ENTRY: usize = 32;
/// Attribute bits.
const ATTR_VOLUME_ID: u8 = 0x08;
const ATTR_DIRECTORY: u8 = 0x10;
const ATTR_LONG_NAME: u8 = 0x0f;

/// Errors reading a FAT volume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FatError {
    /// Reading the device failed.
    #[error("reading the FAT volume: {0}")]
    Io(#[from] std::io::Error),
    /// The boot sector does not describe a FAT volume.
    #[error("not a FAT volume: {0}")]
    NotFat(&'static str),
    /// A structure is malformed.
    #[error("malformed FAT volume: {what}")]
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// The path does not exist.
    #[error("{0}: no such file on the FAT volume")]
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

fn malformed(what: &'static str) -> FatError {
    FatError::Malformed { what }
}

/// FAT12, FAT16 or FAT32, decided by the cluster count as the specification says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatKind {
    /// Fewer than 4085 clusters.
    Fat12,
    /// Fewer than 65525 clusters.
    Fat16,
    /// The rest.
    Fat32,
}

/// Where a directory's entries are.
#[derive(Debug, Clone, Copy)]
enum DirAt {
    /// The fixed root directory region of FAT12/16.
    FixedRoot,
    /// A cluster chain.
    Chain(u32),
}

/// One directory entry.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    dir: bool,
    cluster: u32,
    size: u32,
}

/// An opened FAT volume.
#[derive(Debug)]
pub struct Fat<R> {
    reader: R,
    /// The volume label (root directory label entry, else the boot sector's), trimmed.
    pub label: String,
    /// Which FAT.
    pub kind: FatKind,
    /// Size of the image: nothing is read (or allocated for) past it.
    len: u64,
    cluster_bytes: u64,
    /// Byte offset of the fixed root directory (FAT12/16) and its size.
    root_at: u64,
    root_bytes: u64,
    root_cluster: u32,
    /// Byte offset of cluster 2.
    data_at: u64,
    /// Number of data clusters: valid cluster numbers are 2..clusters + 2.
    clusters: u32,
    /// The first FAT.
    fat: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Trims the space padding of an 11-byte label; ASCII is kept, other bytes become U+FFFD
/// (labels are in an OEM code page we do not know).
fn label_text(raw: &[u8]) -> String {
    let len = raw.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
    raw[..len]
        .iter()
        .map(|&b| if b.is_ascii() { b as char } else { '\u{fffd}' })
        .collect()
}

impl<R: Read + Seek> Fat<R> {
    /// Reads the boot sector, the first FAT and the volume label.
    // Over 100 lines on purpose: the boot sector and the FAT geometry checked one field after
    // another, each with its own error: bounds checks, not steps to share.
    pub fn open(mut reader: R) -> Result<Self, FatError> {
        let len = reader.seek(SeekFrom::End(0))?;
        let mut boot = [0u8; 512];
        reader.seek(SeekFrom::Start(0))?;
        reader.read_exact(&mut boot)?;
        if boot[510..512] != [0x55, 0xaa] {
            return Err(FatError::NotFat("no boot sector signature"));
        }
        let bytes_per_sector = u16_at(&boot, 11);
        if !matches!(bytes_per_sector, 512 | 1024 | 2048 | 4096) {
            return Err(FatError::NotFat(
                "bytes per sector not 512, 1024, 2048 or 4096",
            ));
        }
        let sectors_per_cluster = boot[13];
        if !sectors_per_cluster.is_power_of_two() {
            return Err(FatError::NotFat("sectors per cluster not a power of two"));
        }
        let reserved = u64::from(u16_at(&boot, 14));
        let fats = u64::from(boot[16]);
        if reserved == 0 || fats == 0 {
            return Err(FatError::NotFat("no reserved sector or no FAT"));
        }
        let root_entries = u64::from(u16_at(&boot, 17));
        let total = match u16_at(&boot, 19) {
            0 => u64::from(u32_at(&boot, 32)),
            n => u64::from(n),
        };
        let fat_sectors = match u16_at(&boot, 22) {
            0 => u64::from(u32_at(&boot, 36)),
            n => u64::from(n),
        };
        if fat_sectors == 0 {
            return Err(FatError::NotFat("FAT size 0"));
        }
        let bps = u64::from(bytes_per_sector);
        let spc = u64::from(sectors_per_cluster);
        let root_sectors = (root_entries * ENTRY as u64).div_ceil(bps);
        // All u64 products of u16/u32 fields with small factors: no overflow possible.
        let first_data = reserved + fats * fat_sectors + root_sectors;
        let data_sectors = total
            .checked_sub(first_data)
            .ok_or(FatError::NotFat("data region starts past the volume's end"))?;
        let clusters = data_sectors / spc;
        let kind = match clusters {
            0..4085 => FatKind::Fat12,
            4085..65525 => FatKind::Fat16,
            _ => FatKind::Fat32,
        };
        // FAT32 entries are 28 bits: no more clusters than that.
        let clusters = u32::try_from(clusters)
            .ok()
            .filter(|&c| c < 0x0fff_fff5)
            .ok_or(FatError::NotFat("more clusters than FAT32 can number"))?;
        if kind != FatKind::Fat32 && root_entries == 0 {
            return Err(FatError::NotFat("FAT12/16 without a root directory"));
        }
        let (root_cluster, bpb_label) = match kind {
            FatKind::Fat32 => (u32_at(&boot, 44), &boot[71..82]),
            _ => (0, &boot[43..54]),
        };
        let fat_bytes = fat_sectors * bps;
        // Only as much FAT as the clusters need (a FAT32 entry is 4 bytes, the widest).
        let needed = (u64::from(clusters) + 2) * 4;
        let fat_len = fat_bytes.min(needed).min(MAX_FAT_BYTES);
        if reserved * bps + fat_len > len {
            return Err(FatError::NotFat("FAT past the end of the volume"));
        }
        let mut fat = vec![0u8; fat_len as usize];
        reader.seek(SeekFrom::Start(reserved * bps))?;
        reader.read_exact(&mut fat)?;
        let mut volume = Fat {
            reader,
            label: label_text(bpb_label),
            kind,
            len,
            cluster_bytes: spc * bps,
            root_at: (reserved + fats * fat_sectors) * bps,
            root_bytes: root_sectors * bps,
            root_cluster,
            data_at: first_data * bps,
            clusters,
            fat,
        };
        if kind == FatKind::Fat32 && !volume.valid_cluster(root_cluster) {
            return Err(malformed("FAT32 root cluster out of range"));
        }
        // mkfs.vfat writes the label in both places; the root directory's is what tools
        // change (fatlabel), so it wins, as in the kernel and fatfs.
        let root = volume.read_dir_bytes(volume.root())?;
        if let Some(raw) = root
            .chunks_exact(ENTRY)
            .take_while(|e| e[0] != 0)
            .find(|e| {
                e[0] != 0xe5
                    && e[11] & ATTR_LONG_NAME != ATTR_LONG_NAME
                    && e[11] & ATTR_VOLUME_ID != 0
            })
        {
            volume.label = label_text(&raw[..11]);
        }
        Ok(volume)
    }

    fn root(&self) -> DirAt {
        match self.kind {
            FatKind::Fat32 => DirAt::Chain(self.root_cluster),
            _ => DirAt::FixedRoot,
        }
    }

    fn valid_cluster(&self, n: u32) -> bool {
        n >= 2 && n - 2 < self.clusters
    }

    /// The FAT entry of cluster `n`: `Ok(Some(next))`, `Ok(None)` at the end of the chain.
    fn next(&self, n: u32) -> Result<Option<u32>, FatError> {
        let n = n as usize;
        let read = |at: usize, len: usize| {
            self.fat
                .get(at..at + len)
                .ok_or_else(|| malformed("cluster beyond the FAT"))
        };
        let (value, end) = match self.kind {
            FatKind::Fat12 => {
                let b = read(n + n / 2, 2)?;
                let v = u32::from(u16::from_le_bytes([b[0], b[1]]));
                (if n % 2 == 1 { v >> 4 } else { v & 0xfff }, 0xff8)
            }
            FatKind::Fat16 => {
                let b = read(n * 2, 2)?;
                (u32::from(u16::from_le_bytes([b[0], b[1]])), 0xfff8)
            }
            FatKind::Fat32 => {
                let b = read(n * 4, 4)?;
                (u32_at(b, 0) & 0x0fff_ffff, 0x0fff_fff8)
            }
        };
        if value >= end {
            return Ok(None);
        }
        if !self.valid_cluster(value) {
            return Err(malformed(
                "cluster chain points at a free, bad or out-of-range cluster",
            ));
        }
        Ok(Some(value))
    }

    /// The clusters of the chain starting at `first`, at most `limit` of them.
    fn chain(&self, first: u32, limit: u64) -> Result<Vec<u32>, FatError> {
        if !self.valid_cluster(first) {
            return Err(malformed("first cluster out of range"));
        }
        let mut out = vec![first];
        let mut current = first;
        while let Some(next) = self.next(current)? {
            // Longer than the volume has clusters: the chain loops.
            if out.len() as u64 >= u64::from(self.clusters) {
                return Err(malformed("cluster chain loops"));
            }
            if out.len() as u64 >= limit {
                break;
            }
            out.push(next);
            current = next;
        }
        Ok(out)
    }

    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<(), FatError> {
        if at + buf.len() as u64 > self.len {
            return Err(malformed("data past the end of the volume"));
        }
        self.reader.seek(SeekFrom::Start(at))?;
        self.reader.read_exact(buf)?;
        Ok(())
    }

    /// Reads `clusters` into one buffer of `len` bytes.
    fn read_clusters(&mut self, clusters: &[u32], len: u64) -> Result<Vec<u8>, FatError> {
        // Check every cluster is inside the image before allocating for them.
        let end =
            |c: u32| self.data_at + u64::from(c - 2) * self.cluster_bytes + self.cluster_bytes;
        if clusters.iter().any(|&c| end(c) > self.len) {
            return Err(malformed("cluster past the end of the volume"));
        }
        let mut data = vec![0u8; len as usize];
        for (i, chunk) in data.chunks_mut(self.cluster_bytes as usize).enumerate() {
            let cluster = *clusters
                .get(i)
                .ok_or_else(|| malformed("cluster chain shorter than the file"))?;
            let at = self.data_at + u64::from(cluster - 2) * self.cluster_bytes;
            self.read_at(at, chunk)?;
        }
        Ok(data)
    }

    fn read_dir_bytes(&mut self, dir: DirAt) -> Result<Vec<u8>, FatError> {
        match dir {
            DirAt::FixedRoot => {
                if self.root_at + self.root_bytes > self.len {
                    return Err(malformed("root directory past the end of the volume"));
                }
                let mut data = vec![0u8; self.root_bytes as usize];
                self.read_at(self.root_at, &mut data)?;
                Ok(data)
            }
            DirAt::Chain(first) => {
                let limit = u64::from(MAX_FILE) / self.cluster_bytes;
                let clusters = self.chain(first, limit + 1)?;
                if clusters.len() as u64 > limit {
                    return Err(FatError::TooLarge {
                        path: "directory".into(),
                        limit: MAX_FILE as usize,
                    });
                }
                let len = clusters.len() as u64 * self.cluster_bytes;
                self.read_clusters(&clusters, len)
            }
        }
    }

    /// The entries of a directory, with long names where the VFAT entries before a short
    /// entry are complete and carry its checksum; `.`, `..`, deleted entries and labels left
    /// out.
    fn list(&mut self, dir: DirAt) -> Result<Vec<Entry>, FatError> {
        let data = self.read_dir_bytes(dir)?;
        let mut out = Vec::new();
        // Long-name parts by sequence number (1-based), and the checksum they carry.
        let mut long: Vec<Option<[u16; 13]>> = Vec::new();
        let mut long_sum = 0u8;
        for e in data.chunks_exact(ENTRY) {
            if e[0] == 0 {
                break;
            }
            if e[0] == 0xe5 {
                long.clear();
                continue;
            }
            let attr = e[11];
            if attr & ATTR_LONG_NAME == ATTR_LONG_NAME {
                let seq = usize::from(e[0] & 0x1f);
                if e[0] & 0x40 != 0 {
                    long = vec![None; seq];
                    long_sum = e[13];
                }
                if seq == 0 || seq > long.len() || e[13] != long_sum {
                    long.clear();
                    continue;
                }
                let mut part = [0u16; 13];
                for (i, at) in (1..11)
                    .step_by(2)
                    .chain((14..26).step_by(2))
                    .chain((28..32).step_by(2))
                    .enumerate()
                {
                    part[i] = u16_at(e, at);
                }
                long[seq - 1] = Some(part);
                continue;
            }
            let parts = std::mem::take(&mut long);
            if attr & ATTR_VOLUME_ID != 0 {
                continue;
            }
            let short = &e[..11];
            let name = if !parts.is_empty()
                && parts.iter().all(Option::is_some)
                && long_sum == short_checksum(short)
            {
                let units: Vec<u16> = parts
                    .into_iter()
                    .flatten()
                    .flatten()
                    .take_while(|&u| u != 0)
                    .collect();
                String::from_utf16_lossy(&units)
            } else {
                short_name(short, e[12])
            };
            if name == "." || name == ".." {
                continue;
            }
            let high = match self.kind {
                FatKind::Fat32 => u32::from(u16_at(e, 20)) << 16,
                _ => 0,
            };
            out.push(Entry {
                name,
                dir: attr & ATTR_DIRECTORY != 0,
                cluster: high | u32::from(u16_at(e, 26)),
                size: u32_at(e, 28),
            });
        }
        Ok(out)
    }

    fn find(&mut self, path: &str) -> Result<Entry, FatError> {
        let mut dir = self.root();
        let mut found = None;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if found.as_ref().is_some_and(|e: &Entry| !e.dir) {
                return Err(FatError::NotFound(path.into()));
            }
            let entry = self
                .list(dir)?
                .into_iter()
                // FAT names are case-insensitive.
                .find(|e| e.name.to_lowercase() == part.to_lowercase())
                .ok_or_else(|| FatError::NotFound(path.into()))?;
            dir = DirAt::Chain(entry.cluster);
            found = Some(entry);
        }
        found.ok_or_else(|| FatError::NotFound(path.into()))
    }

    /// Reads a file by `/`-separated path (case-insensitive, as FAT names are).
    pub fn read_file(&mut self, path: &str) -> Result<Vec<u8>, FatError> {
        self.read_file_within(path, MAX_FILE as usize)
    }

    /// [`Fat::read_file`], refusing a file larger than `limit` bytes before reading it.
    pub fn read_file_within(&mut self, path: &str, limit: usize) -> Result<Vec<u8>, FatError> {
        let entry = self.find(path)?;
        if entry.dir {
            return Err(FatError::NotFound(path.into()));
        }
        if entry.size > MAX_FILE || entry.size as usize > limit {
            return Err(FatError::TooLarge {
                path: path.into(),
                limit: limit.min(MAX_FILE as usize),
            });
        }
        if entry.size == 0 {
            return Ok(Vec::new());
        }
        let count = u64::from(entry.size).div_ceil(self.cluster_bytes);
        let clusters = self.chain(entry.cluster, count)?;
        self.read_clusters(&clusters, u64::from(entry.size))
    }

    /// Names in a directory (`/`-separated path; empty for the root).
    pub fn list_dir(&mut self, path: &str) -> Result<Vec<String>, FatError> {
        let dir = if path.split('/').all(str::is_empty) {
            self.root()
        } else {
            let entry = self.find(path)?;
            if !entry.dir {
                return Err(FatError::NotFound(path.into()));
            }
            DirAt::Chain(entry.cluster)
        };
        Ok(self.list(dir)?.into_iter().map(|e| e.name).collect())
    }
}

/// The checksum of an 8.3 name that its long-name entries carry.
fn short_checksum(short: &[u8]) -> u8 {
    short.iter().fold(0u8, |sum, &b| {
        ((sum & 1) << 7).wrapping_add(sum >> 1).wrapping_add(b)
    })
}

/// `NAME    EXT` as `NAME.EXT` (`NAME` without an extension); 0x05 stands for 0xE5.
/// `case` is the entry's reserved byte, where Windows NT and mtools mark an all-lower-case
/// base (0x08) or extension (0x10) instead of writing a long name.
fn short_name(short: &[u8], case: u8) -> String {
    let mut raw = short.to_vec();
    if raw[0] == 0x05 {
        raw[0] = 0xe5;
    }
    let lower = |text: String, flag: u8| {
        if case & flag != 0 {
            text.to_ascii_lowercase()
        } else {
            text
        }
    };
    let base = lower(label_text(&raw[..8]), 0x08);
    let ext = lower(label_text(&raw[8..11]), 0x10);
    if ext.is_empty() {
        base
    } else {
        format!("{base}.{ext}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::process::Command;

    /// A config-drive tree on a fresh FAT volume of `size_kib` made by mkfs.vfat with
    /// `flags`, filled by mcopy; `None` when the tools are missing (a skip, or a failure
    /// under CI).
    fn make_fat(size_kib: u32, flags: &[&str]) -> Option<Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("openstack/latest");
        std::fs::create_dir_all(&latest).unwrap();
        std::fs::create_dir_all(dir.path().join("openstack/2018-08-27")).unwrap();
        std::fs::write(latest.join("meta_data.json"), br#"{"name":"master-0"}"#).unwrap();
        std::fs::write(latest.join("network_data.json"), vec![b'x'; 5000]).unwrap();
        std::fs::write(latest.join("user_data"), b"{\"ignition\":{}}").unwrap();
        std::fs::write(dir.path().join("SHORT.TXT"), b"8.3").unwrap();
        let img = dir.path().join("drive.img");
        if !keelson_testkit::require("mkfs.vfat") || !keelson_testkit::require("mcopy") {
            return None;
        }
        let ok = Command::new("mkfs.vfat")
            .args(["-C", "-n", "CONFIG-2"])
            .args(flags)
            .arg(&img)
            .arg(size_kib.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("mcopy")
                .args(["-s", "-i"])
                .arg(&img)
                .arg(dir.path().join("openstack"))
                .arg(dir.path().join("SHORT.TXT"))
                .arg("::")
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "mkfs.vfat or mcopy failed");
        Some(std::fs::read(img).unwrap())
    }

    #[test]
    fn reads_fat12_fat16_and_fat32() {
        for (size, flags, kind) in [
            (1024, &[][..], FatKind::Fat12),
            (16 * 1024, &["-F", "16"][..], FatKind::Fat16),
            (40 * 1024, &["-F", "32"][..], FatKind::Fat32),
        ] {
            let Some(bytes) = make_fat(size, flags) else {
                return;
            };
            let mut fat = Fat::open(Cursor::new(bytes)).unwrap();
            assert_eq!((fat.kind, fat.label.as_str()), (kind, "CONFIG-2"));
            assert_eq!(
                fat.read_file("openstack/latest/meta_data.json").unwrap(),
                br#"{"name":"master-0"}"#,
                "{kind:?}"
            );
            assert_eq!(
                fat.read_file("/openstack/latest/network_data.json")
                    .unwrap(),
                vec![b'x'; 5000]
            );
            assert_eq!(
                fat.read_file("OPENSTACK/Latest/USER_DATA").unwrap(),
                b"{\"ignition\":{}}"
            );
            assert_eq!(fat.read_file("short.txt").unwrap(), b"8.3");
            let mut versions = fat.list_dir("openstack").unwrap();
            versions.sort();
            assert_eq!(versions, ["2018-08-27", "latest"], "{kind:?}");
            let err = fat
                .read_file("openstack/latest/vendor_data.json")
                .unwrap_err();
            assert!(err.to_string().contains("vendor_data.json"), "{err}");
            let err = fat
                .read_file_within("openstack/latest/network_data.json", 4999)
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "openstack/latest/network_data.json: larger than the limit of 4999 bytes"
            );
            assert_eq!(
                fat.read_file_within("openstack/latest/network_data.json", 5000)
                    .unwrap()
                    .len(),
                5000
            );
            assert!(matches!(
                fat.read_file("openstack"),
                Err(FatError::NotFound(_))
            ));
        }
    }

    #[test]
    fn not_fat_is_an_error() {
        let err = Fat::open(Cursor::new(vec![0u8; 4096])).unwrap_err();
        assert!(matches!(err, FatError::NotFat(_)), "{err}");
        assert!(matches!(
            Fat::open(Cursor::new(vec![0u8; 100])),
            Err(FatError::Io(_))
        ));
    }

    /// The chain of a directory made to point at itself: an error, not an endless read.
    #[test]
    fn looping_cluster_chain_is_an_error() {
        let Some(mut bytes) = make_fat(1024, &[]) else {
            return;
        };
        let fat = Fat::open(Cursor::new(bytes.clone())).unwrap();
        let mut probe = Fat::open(Cursor::new(bytes.clone())).unwrap();
        let openstack = probe
            .list(DirAt::FixedRoot)
            .unwrap()
            .into_iter()
            .find(|e| e.name == "openstack")
            .unwrap();
        // FAT12 entry of that cluster := the cluster itself.
        let n = openstack.cluster as usize;
        let at = 512 + n + n / 2;
        let old = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let new = if n % 2 == 1 {
            (old & 0x000f) | ((n as u16) << 4)
        } else {
            (old & 0xf000) | n as u16
        };
        bytes[at..at + 2].copy_from_slice(&new.to_le_bytes());
        drop(fat);
        let mut looping = Fat::open(Cursor::new(bytes)).unwrap();
        let err = looping
            .read_file("openstack/latest/meta_data.json")
            .unwrap_err();
        assert!(err.to_string().contains("loops"), "{err}");
    }

    /// Found by the `config_drive_fat` fuzz target: fatfs 0.3.6 panicked on this image
    /// (`attempt to subtract with overflow` turning a cluster number below 2 into a sector).
    #[test]
    fn fuzz_crash_cluster_below_2() {
        let image = include_bytes!("testdata/fuzz-fat-cluster-below-2.img");
        let mut fat = Fat::open(Cursor::new(&image[..])).unwrap();
        assert_eq!(fat.label, "CONFIG-2");
        for path in [
            "openstack/latest/meta_data.json",
            "openstack/latest/user_data",
        ] {
            let err = fat.read_file(path).unwrap_err();
            assert_eq!(
                err.to_string(),
                "malformed FAT volume: first cluster out of range"
            );
        }
        // Through the entry point init uses: an error naming the drive and the file.
        let dir = tempfile::tempdir().unwrap();
        let drive = dir.path().join("drive.img");
        std::fs::write(&drive, image).unwrap();
        let err = super::super::config_drive::read(&drive)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config-drive:") && err.contains("meta_data.json"),
            "{err}"
        );
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::with_cases(64))]
        /// Corrupting a valid image anywhere gives errors or data, never a panic.
        #[test]
        fn corrupted_images_never_panic(flips in proptest::collection::vec((0usize..40_000, proptest::prelude::any::<u8>()), 1..40)) {
            static IMAGE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
            let Some(base) = IMAGE.get_or_init(|| make_fat(64, &[])) else { return Ok(()) };
            let mut bytes = base.clone();
            for (at, value) in flips {
                if at < bytes.len() {
                    bytes[at] = value;
                }
            }
            if let Ok(mut fat) = Fat::open(Cursor::new(bytes)) {
                let _ = fat.read_file("openstack/latest/meta_data.json");
                let _ = fat.list_dir("openstack");
            }
        }
    }
}
