//! The bootable disk, written without root: a GPT disk with one FAT EFI system partition
//! (at sector 2048, `LegacyBIOSBootable`) holding the kernel, the initramfs, syslinux for BIOS
//! (`gptmbr.bin` in the MBR boot code, `ldlinux.sys` installed by Debian's mtools-based
//! `syslinux`) and systemd-boot for UEFI; then converted to qcow2 with `qemu-img`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use fatfs::{Date, DateTime, FileSystem, FormatVolumeOptions, FsOptions, Time, TimeProvider};

use crate::ImageError;

/// Sector size of the disk.
const SECTOR: u64 = 512;
/// First sector of the ESP (1 MiB alignment, as partitioning tools do).
const ESP_FIRST_LBA: u64 = 2048;
const MIB: u64 = 1024 * 1024;

/// The files of the EFI system partition and where to find the boot loaders.
#[derive(Debug, Clone)]
pub struct DiskLayout {
    /// Files to write, path on the ESP (`/EFI/BOOT/BOOTX64.EFI`) and contents.
    pub files: Vec<(String, Vec<u8>)>,
    /// syslinux's GPT MBR boot code (`gptmbr.bin`, 440 bytes).
    pub gptmbr: Vec<u8>,
    /// Timestamp for FAT entries and syslinux (`SOURCE_DATE_EPOCH`).
    pub source_date_epoch: u64,
    /// 16 bytes that seed the disk and partition GUIDs and the FAT volume id, so the same
    /// contents give the same disk.
    pub seed: [u8; 16],
}

/// Default location of Debian's syslinux GPT MBR.
pub const GPTMBR: &str = "/usr/lib/syslinux/mbr/gptmbr.bin";
/// Default location of Debian's systemd-boot EFI binary.
pub const SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

/// Writes the raw disk image at `raw`.
pub fn write_raw(layout: &DiskLayout, raw: &Path) -> Result<(), ImageError> {
    let payload: u64 = layout.files.iter().map(|(_, d)| d.len() as u64).sum();
    // Room for FAT overhead and ldlinux (~180 KiB); at least 32 MiB so FAT16/32 is chosen,
    // which syslinux wants.
    let esp_bytes = round_up(payload + payload / 16 + 4 * MIB, MIB).max(32 * MIB);
    let esp_sectors = esp_bytes / SECTOR;
    // 1 MiB in front (MBR, GPT, alignment), 1 MiB behind (backup GPT).
    let disk_bytes = ESP_FIRST_LBA * SECTOR + esp_bytes + MIB;

    let io = |what: &str, e: io::Error| ImageError::Io(format!("{what} {}: {e}", raw.display()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(raw)
        .map_err(|e| io("creating", e))?;
    file.set_len(disk_bytes).map_err(|e| io("sizing", e))?;

    write_gpt(&file, layout, disk_bytes, esp_sectors)?;
    write_fat(&file, layout, esp_bytes)?;
    file.sync_all().map_err(|e| io("syncing", e))?;
    drop(file);

    install_syslinux(raw, ESP_FIRST_LBA * SECTOR, layout.source_date_epoch)?;
    Ok(())
}

/// Protective MBR with syslinux's boot code, GPT with one ESP marked legacy-BIOS-bootable.
fn write_gpt(
    file: &File,
    layout: &DiskLayout,
    disk_bytes: u64,
    esp_sectors: u64,
) -> Result<(), ImageError> {
    let gpt_err = |e: gpt::GptError| ImageError::Disk(format!("writing the GPT: {e}"));
    let bootcode: [u8; 440] = layout.gptmbr.as_slice().try_into().map_err(|_| {
        ImageError::Disk(format!(
            "gptmbr.bin: expected 440 bytes of boot code, got {}",
            layout.gptmbr.len()
        ))
    })?;
    let mut mbr = gpt::mbr::ProtectiveMBR::with_lb_size(
        u32::try_from(disk_bytes / SECTOR - 1).unwrap_or(u32::MAX),
    );
    mbr.set_bootcode(bootcode);
    mbr.set_disk_signature(layout.seed[12..16].try_into().unwrap_or([0; 4]));
    let mut device = file
        .try_clone()
        .map_err(|e| ImageError::Io(e.to_string()))?;
    mbr.overwrite_lba0(&mut device)
        .map_err(|e| ImageError::Disk(format!("writing the protective MBR: {e}")))?;

    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .create_from_device(device, Some(guid(&layout.seed, 0)))
        .map_err(gpt_err)?;
    let bios_bootable = gpt::partition::PartitionAttributes::BOOTABLE.bits();
    disk.add_partition_at(
        "EFI System",
        1,
        ESP_FIRST_LBA,
        esp_sectors,
        gpt::partition_types::EFI,
        bios_bootable,
    )
    .map_err(gpt_err)?;
    // add_partition_at draws a random partition GUID; replace it with ours.
    let mut partitions = disk.partitions().clone();
    if let Some(esp) = partitions.get_mut(&1) {
        esp.part_guid = guid(&layout.seed, 1);
    }
    disk.update_partitions(partitions).map_err(gpt_err)?;
    disk.write().map_err(gpt_err)?;
    Ok(())
}

/// A version-4-shaped GUID derived from the seed (deterministic, distinct per `n`).
fn guid(seed: &[u8; 16], n: u8) -> uuid::Uuid {
    let mut bytes = *seed;
    bytes[0] ^= n;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(bytes)
}

/// Formats the ESP and copies the files in, every timestamp at `SOURCE_DATE_EPOCH`.
fn write_fat(file: &File, layout: &DiskLayout, esp_bytes: u64) -> Result<(), ImageError> {
    let fat_err = |what: &str, e: io::Error| ImageError::Disk(format!("{what}: {e}"));
    let start = ESP_FIRST_LBA * SECTOR;
    let mut slice = Slice {
        file: file
            .try_clone()
            .map_err(|e| ImageError::Io(e.to_string()))?,
        start,
        len: esp_bytes,
        pos: 0,
    };
    let volume_id = u32::from_le_bytes(layout.seed[..4].try_into().unwrap_or([0; 4]));
    fatfs::format_volume(
        &mut slice,
        FormatVolumeOptions::new()
            .volume_label(*b"KEELSON    ")
            .volume_id(volume_id),
    )
    .map_err(|e| fat_err("formatting the EFI system partition", e))?;
    slice.pos = 0;
    let clock: &'static FixedClock = Box::leak(Box::new(FixedClock::at(layout.source_date_epoch)));
    let fs = FileSystem::new(slice, FsOptions::new().time_provider(clock))
        .map_err(|e| fat_err("opening the EFI system partition", e))?;
    let mut files = layout.files.clone();
    files.sort();
    for (path, data) in &files {
        let root = fs.root_dir();
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (name, dirs) = parts
            .split_last()
            .ok_or_else(|| ImageError::Disk(format!("ESP path {path:?}: expected /dir/file")))?;
        let mut dir = root;
        for part in dirs {
            dir = dir
                .create_dir(part)
                .map_err(|e| fat_err(&format!("creating /{part} on the ESP"), e))?;
        }
        let mut out = dir
            .create_file(name)
            .map_err(|e| fat_err(&format!("creating {path} on the ESP"), e))?;
        out.truncate()
            .and_then(|_| out.write_all(data))
            .and_then(|_| out.flush())
            .map_err(|e| fat_err(&format!("writing {path} on the ESP"), e))?;
    }
    fs.unmount()
        .map_err(|e| fat_err("closing the EFI system partition", e))?;
    Ok(())
}

/// Installs syslinux's boot sector and `ldlinux.sys` on the FAT partition at `offset`.
/// Debian's `syslinux` works through mtools, so no mount and no root; with
/// `SOURCE_DATE_EPOCH` set its output is reproducible.
fn install_syslinux(raw: &Path, offset: u64, source_date_epoch: u64) -> Result<(), ImageError> {
    let out = Command::new("syslinux")
        .arg("--install")
        .arg("--offset")
        .arg(offset.to_string())
        .arg(raw)
        .env("SOURCE_DATE_EPOCH", source_date_epoch.to_string())
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .map_err(|e| {
            ImageError::Tool(format!(
                "running syslinux (apt-get install syslinux syslinux-common mtools): {e}"
            ))
        })?;
    if !out.status.success() {
        return Err(ImageError::Tool(format!(
            "syslinux --install failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Converts the raw disk to qcow2.
pub fn convert_to_qcow2(raw: &Path, qcow2: &Path) -> Result<(), ImageError> {
    let out = Command::new("qemu-img")
        .args([
            "convert",
            "-q",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            "compat=1.1",
        ])
        .arg(raw)
        .arg(qcow2)
        .output()
        .map_err(|e| {
            ImageError::Tool(format!(
                "running qemu-img (apt-get install qemu-utils): {e}"
            ))
        })?;
    if !out.status.success() {
        return Err(ImageError::Tool(format!(
            "qemu-img convert failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The raw image's path next to the qcow2 (removed after conversion).
pub fn raw_path(out: &Path) -> PathBuf {
    out.join("keelson.raw")
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// A window of a file: the partition, as fatfs sees it.
#[derive(Debug)]
struct Slice {
    file: File,
    start: u64,
    len: u64,
    pos: u64,
}

impl Read for Slice {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file.seek(SeekFrom::Start(self.start + self.pos))?;
        let read = self.file.read(&mut buf[..n])?;
        self.pos += read as u64;
        Ok(read)
    }
}

impl Write for Slice {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the partition",
            ));
        }
        self.file.seek(SeekFrom::Start(self.start + self.pos))?;
        let written = self.file.write(&buf[..n])?;
        self.pos += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Slice {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(n) if n <= self.len => {
                self.pos = n;
                Ok(n)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}

/// FAT timestamps from `SOURCE_DATE_EPOCH` instead of the wall clock.
#[derive(Debug)]
struct FixedClock {
    date: Date,
    time: Time,
}

impl FixedClock {
    fn at(epoch: u64) -> Self {
        // FAT dates run from 1980 to 2107.
        let epoch = epoch.clamp(315_532_800, 4_354_819_199);
        let days = (epoch / 86_400) as i64;
        let secs = epoch % 86_400;
        let (year, month, day) = civil_from_days(days);
        FixedClock {
            date: Date {
                year: year as u16,
                month: month as u16,
                day: day as u16,
            },
            time: Time {
                hour: (secs / 3600) as u16,
                min: (secs / 60 % 60) as u16,
                sec: (secs % 60) as u16,
                millis: 0,
            },
        }
    }
}

impl TimeProvider for FixedClock {
    fn get_current_date(&self) -> Date {
        self.date
    }
    fn get_current_date_time(&self) -> DateTime {
        DateTime {
            date: self.date,
            time: self.time,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let clock = FixedClock::at(1_700_000_000); // 2023-11-14 22:13:20 UTC
        assert_eq!(
            (clock.date.year, clock.date.month, clock.date.day),
            (2023, 11, 14)
        );
        assert_eq!(
            (clock.time.hour, clock.time.min, clock.time.sec),
            (22, 13, 20)
        );
        assert_eq!(FixedClock::at(0).date.year, 1980, "clamped to FAT's epoch");
    }

    #[test]
    fn guids_are_seeded_and_distinct() {
        let seed = [0xabu8; 16];
        assert_eq!(guid(&seed, 0), guid(&seed, 0));
        assert_ne!(guid(&seed, 0), guid(&seed, 1));
        assert_eq!(guid(&seed, 0).get_version_num(), 4);
    }
}
