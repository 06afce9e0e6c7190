//! Builds the stand-in from its recipe, or finds it in the cache.
//!
//! Two cached layers under the stand-in cache (`payload::standin_cache`), each keyed by its inputs
//! ([`recipe::base_key`], [`recipe::image_key`]):
//! - `base-<key>/rootfs`: the `mmdebstrap` root (packages, the kernel, the dracut
//!   initramfs with Ignition), minutes to build; `packages.txt` lists what it holds.
//! - `image-<key>/`: what QEMU boots: `vmlinuz`, `initrd.img` and `root.qcow2`, the root
//!   file system made by `mkfs.ext4 -d` (no mount, no loop device) from the base plus the
//!   stand-in apiserver; seconds to build.
//!
//! A layer is built in a directory of its own and renamed into place when complete, so an
//! interrupted build never looks finished and two concurrent builds do not mix.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::recipe;

/// The root file system's size (sparse: qcow2 stores what is used). Room for what Ignition
/// writes, the journal and a few reboots.
const ROOT_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// What the image directory holds, written as `manifest.json` beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The base layer's key.
    pub base_key: String,
    /// This image's key.
    pub image_key: String,
    /// The kernel release (`uname -r`).
    pub kernel_release: String,
    /// `ignition` package version inside.
    pub ignition_version: String,
    /// Number of Debian packages in the root.
    pub packages: usize,
    /// sha256 of `root.qcow2`'s raw file system, the kernel and the initramfs.
    pub sha256: Sha256Sums,
    /// Bytes: used by the root's files, the qcow2, the kernel, the initramfs.
    pub bytes: Sizes,
}

/// Checksums of the image's parts (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sha256Sums {
    /// The ext4 root file system (raw, before qcow2).
    pub root: String,
    /// The kernel.
    pub kernel: String,
    /// The initramfs.
    pub initrd: String,
}

/// Sizes of the image's parts in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sizes {
    /// Files in the root (`du`).
    pub root_files: u64,
    /// `root.qcow2` on disk.
    pub root_qcow2: u64,
    /// `vmlinuz`.
    pub kernel: u64,
    /// `initrd.img`.
    pub initrd: u64,
}

/// A built (or cached) stand-in image.
#[derive(Debug, Clone)]
pub struct StandinImage {
    /// The image directory.
    pub dir: PathBuf,
    /// The kernel QEMU boots (`-kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`-initrd`).
    pub initrd: PathBuf,
    /// The root disk every node gets an overlay of.
    pub root: PathBuf,
    /// What it holds.
    pub manifest: Manifest,
}

/// How [`ensure`] got the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildTimes {
    /// Time spent on the base layer (`None`: it was cached).
    pub base: Option<Duration>,
    /// Time spent on the image layer (`None`: it was cached).
    pub image: Option<Duration>,
    /// Total, including the cache checks.
    pub total: Duration,
}

/// The apt sources the base is built from: the machine's own (a CI machine with a local
/// mirror uses it), deb822 or one-line format.
fn apt_sources() -> Result<PathBuf> {
    for p in [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ] {
        let path = Path::new(p);
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return Ok(path.to_path_buf());
        }
    }
    bail!("no apt sources (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)")
}

/// `qemu-img convert` of a raw disk to qcow2 (v3): the appliance image's conversion.
fn raw_to_qcow2(raw: &Path, qcow2: &Path) -> Result<()> {
    Ok(keelson_image::disk::convert_to_qcow2(raw, qcow2)?)
}

fn tool_output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {what} (scripts/setup.sh installs it)"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `SOURCE_DATE_EPOCH` for the build: the environment's, else a fixed date, so the same
/// inputs give the same bytes.
fn source_date_epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_700_000_000)
}

/// Returns the stand-in image for `apiserver` (the static `kube-standin` binary), building
/// what the cache under `cache` lacks. Progress goes to stderr.
pub fn ensure(cache: &Path, apiserver: &Path) -> Result<(StandinImage, BuildTimes)> {
    let start = Instant::now();
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let sources = apt_sources()?;
    let sources_text = std::fs::read(&sources)?;
    let version = tool_output(Command::new("mmdebstrap").arg("--version"), "mmdebstrap")?;
    let base_key = recipe::base_key(&sources_text, version.trim());
    let base = cache.join(format!("base-{base_key}"));
    let mut times = BuildTimes {
        base: None,
        image: None,
        total: Duration::ZERO,
    };
    if !base.join(".done").exists() {
        let t = Instant::now();
        build_base(&base, &sources)?;
        times.base = Some(t.elapsed());
        prune(cache, "base", &base);
    }
    let apiserver_bytes = std::fs::read(apiserver)
        .with_context(|| format!("reading the stand-in apiserver {}", apiserver.display()))?;
    let image_key = recipe::image_key(&base_key, &apiserver_bytes);
    let dir = cache.join(format!("image-{image_key}"));
    if !dir.join("manifest.json").exists() {
        let t = Instant::now();
        build_image(&base, &dir, &base_key, &image_key, &apiserver_bytes)?;
        times.image = Some(t.elapsed());
        prune(cache, "image", &dir);
    }
    let manifest: Manifest = serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)
        .context("reading the stand-in's manifest.json")?;
    times.total = start.elapsed();
    Ok((
        StandinImage {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            root: dir.join("root.qcow2"),
            dir,
            manifest,
        },
        times,
    ))
}

/// A directory beside `dest` to build into, removed if the build fails.
struct Staging(PathBuf);

impl Staging {
    fn new(dest: &Path) -> Result<Self> {
        let name = dest.file_name().context("cache path")?.to_string_lossy();
        let path = dest.with_file_name(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Ok(Staging(path))
    }

    /// Renames the finished build into place (another build may have won the race: then
    /// its result stays and ours goes).
    fn finish(self, dest: &Path) -> Result<()> {
        if std::fs::rename(&self.0, dest).is_err() && !dest.exists() {
            bail!("moving {} to {}", self.0.display(), dest.display());
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        remove_unless_mounted(&self.0);
    }
}

/// Mount points at or under `dir` (`/proc/self/mountinfo`).
fn mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(str::to_owned)
        .collect()
}

/// Removes a build directory, unless something is still mounted inside it: mmdebstrap
/// mounts /proc, /sys and /dev into its chroot, and a tree walk through a live /dev mount
/// would delete the host's device nodes. Then it says so and leaves the directory.
fn remove_unless_mounted(dir: &Path) {
    let mounts = mounts_under(dir);
    if mounts.is_empty() {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        eprintln!(
            "standin: not removing {}: still mounted there: {}",
            dir.display(),
            mounts.join(", ")
        );
    }
}

/// Removes the cache's other layers of the same kind (`base-*` or `image-*`) once a new one
/// is in place: each is hundreds of MiB and no key ever comes back but by rebuilding.
fn prune(cache: &Path, kind: &str, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{kind}-")) && path != keep {
            eprintln!("standin: removing the stale {}", path.display());
            remove_unless_mounted(&path);
        }
    }
}

fn build_base(base: &Path, sources: &Path) -> Result<()> {
    eprintln!(
        "standin: building the base root with mmdebstrap into {} (minutes; cached afterwards)",
        base.display()
    );
    let staging = Staging::new(base)?;
    std::fs::create_dir_all(&staging.0)?;
    let rootfs = staging.0.join("rootfs");
    let log = staging.0.join("mmdebstrap.log");
    let log_file = std::fs::File::create(&log)?;
    let status = Command::new("mmdebstrap")
        .args(recipe::mmdebstrap_args(
            &rootfs.to_string_lossy(),
            &sources.to_string_lossy(),
        ))
        .env("SOURCE_DATE_EPOCH", source_date_epoch().to_string())
        .env("LC_ALL", "C.UTF-8")
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .status()
        .context("running mmdebstrap (apt-get install mmdebstrap)")?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        bail!(
            "mmdebstrap failed ({status}); last lines of its log:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let packages = tool_output(
        Command::new("dpkg-query")
            .arg(format!("--admindir={}/var/lib/dpkg", rootfs.display()))
            .args(["-W", "-f", "${Package} ${Version}\n"]),
        "dpkg-query",
    )?;
    std::fs::write(staging.0.join("packages.txt"), packages)?;
    std::fs::write(staging.0.join(".done"), b"")?;
    staging.finish(base)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// A UUID-shaped value from the key, for the file system's UUID and directory hash seed.
fn uuid_from(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    let h = hex::encode(&d[..16]);
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn build_image(
    base: &Path,
    dir: &Path,
    base_key: &str,
    image_key: &str,
    apiserver: &[u8],
) -> Result<()> {
    eprintln!("standin: making the root file system {}", dir.display());
    let staging = Staging::new(dir)?;
    std::fs::create_dir_all(&staging.0)?;
    let rootfs = base.join("rootfs");
    // The root to format: the cached base as hard links (nothing in it is changed, only
    // files added), plus the stand-in apiserver.
    let tree = staging.0.join("tree");
    tool_output(
        Command::new("cp").arg("-al").arg(&rootfs).arg(&tree),
        "cp -al",
    )?;
    // Files of the base are hard links: replace, never write through them.
    let machine_id = tree.join("etc/machine-id");
    let _ = std::fs::remove_file(&machine_id);
    std::fs::write(&machine_id, recipe::MACHINE_ID)?;
    for unit in recipe::MASKED_UNITS {
        let link = tree.join("etc/systemd/system").join(unit);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link)?;
    }
    for d in recipe::IMAGE_DIRS {
        std::fs::create_dir_all(tree.join(d))?;
    }
    let bin = tree.join(recipe::APISERVER_BIN);
    std::fs::create_dir_all(bin.parent().context("apiserver path")?)?;
    std::fs::write(&bin, apiserver)?;
    set_mode(&bin, 0o755)?;
    std::fs::write(
        tree.join(recipe::APISERVER_UNIT_PATH),
        recipe::APISERVER_UNIT,
    )?;
    let wants = tree.join(recipe::APISERVER_WANTS);
    std::fs::create_dir_all(wants.parent().context("wants path")?)?;
    std::os::unix::fs::symlink("/etc/systemd/system/kube-apiserver.service", &wants)?;
    std::fs::write(
        tree.join(recipe::FIRSTBOOT_UNIT_PATH),
        recipe::FIRSTBOOT_UNIT,
    )?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/standin-firstboot-complete.service",
        tree.join(recipe::FIRSTBOOT_WANTS),
    )?;

    // Every time in the tree at most SOURCE_DATE_EPOCH: maintainer scripts and this build
    // stamp files with the wall clock, and mkfs.ext4 -d copies the times into the inodes.
    // (The base's inodes are shared through the hard links: clamping is idempotent.)
    let epoch = source_date_epoch().to_string();
    tool_output(
        Command::new("find")
            .arg(&tree)
            .args([
                "-newermt",
                &format!("@{epoch}"),
                "-exec",
                "touch",
                "-h",
                "-d",
            ])
            .arg(format!("@{epoch}"))
            .args(["{}", "+"]),
        "find -exec touch (clamping times)",
    )?;
    let kernel_release = std::fs::read_dir(rootfs.join("usr/lib/modules"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .context("no kernel modules in the base root")?;
    let kernel = staging.0.join("vmlinuz");
    let initrd = staging.0.join("initrd.img");
    std::fs::copy(
        rootfs.join(format!("boot/vmlinuz-{kernel_release}")),
        &kernel,
    )
    .context("copying the kernel")?;
    std::fs::copy(
        rootfs.join(format!("boot/initrd.img-{kernel_release}")),
        &initrd,
    )
    .context("copying the initramfs (did dracut run?)")?;

    let raw = staging.0.join("root.raw");
    let uuid = uuid_from(image_key);
    tool_output(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", recipe::ROOT_LABEL, "-U", &uuid])
            .arg("-E")
            .arg(format!(
                "hash_seed={uuid},lazy_itable_init=0,lazy_journal_init=0"
            ))
            .arg("-d")
            .arg(&tree)
            .arg(&raw)
            .arg(format!("{}k", ROOT_BYTES / 1024))
            // e2fsprogs stamps the superblock and every inode it creates with this time.
            .env("E2FSPROGS_FAKE_TIME", &epoch)
            .env("SOURCE_DATE_EPOCH", &epoch),
        "mkfs.ext4 -d",
    )?;
    let root_sha = sha256_file(&raw)?;
    let qcow2 = staging.0.join("root.qcow2");
    raw_to_qcow2(&raw, &qcow2)?;
    let root_files: u64 = tool_output(Command::new("du").args(["-s", "-B1"]).arg(&tree), "du")?
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    std::fs::remove_file(&raw)?;
    std::fs::remove_dir_all(&tree)?;

    let packages = std::fs::read_to_string(base.join("packages.txt"))?;
    let ignition_version = packages
        .lines()
        .find_map(|l| l.strip_prefix("ignition "))
        .unwrap_or("")
        .to_owned();
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let manifest = Manifest {
        base_key: base_key.into(),
        image_key: image_key.into(),
        kernel_release,
        ignition_version,
        packages: packages.lines().count(),
        sha256: Sha256Sums {
            root: root_sha,
            kernel: sha256_file(&kernel)?,
            initrd: sha256_file(&initrd)?,
        },
        bytes: Sizes {
            root_files,
            root_qcow2: size(&qcow2),
            kernel: size(&kernel),
            initrd: size(&initrd),
        },
    };
    std::fs::write(
        staging.0.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest)?,
    )?;
    staging.finish(dir)
}

/// The boot partition of the cloud disk: FAT, 64 MiB.
const BOOT_BYTES: u64 = 64 * 1024 * 1024;
/// Where it starts (1 MiB alignment, as partitioning tools do).
const BOOT_OFFSET: u64 = 1024 * 1024;

/// The stand-in as a cloud image (`disk.qcow2` beside the rest, made on first use): the
/// same kernel, initramfs and root, bootable from the disk alone as RHCOS's OpenStack image
/// is. An MBR disk: a FAT boot partition (label [`recipe::BOOT_LABEL`], syslinux, the
/// kernel, the initramfs, `syslinux.cfg` with [`recipe::cloud_cmdline`]) and the root file
/// system. No mount and no root needed: `sfdisk` on a file, `mkfs.vfat` and mtools'
/// `mcopy` on the partition's own image, syslinux through mtools, `dd` into place.
pub fn disk(image: &StandinImage) -> Result<PathBuf> {
    let qcow2 = image.dir.join("disk.qcow2");
    if qcow2.exists() {
        return Ok(qcow2);
    }
    eprintln!("standin: making the cloud disk {}", qcow2.display());
    let work = image.dir.join(format!(".disk.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = disk_in(image, &work, &qcow2);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| qcow2)
}

fn disk_in(image: &StandinImage, work: &Path, qcow2: &Path) -> Result<()> {
    let epoch = source_date_epoch().to_string();
    // The boot partition, made as a file of its own.
    let boot = work.join("boot.img");
    std::fs::File::create(&boot)?.set_len(BOOT_BYTES)?;
    let volume_id = &image.manifest.image_key[..8];
    tool_output(
        Command::new("mkfs.vfat")
            .args([
                "-F",
                "16",
                "-n",
                recipe::BOOT_LABEL,
                "-i",
                volume_id,
                "--invariant",
            ])
            .arg(&boot),
        "mkfs.vfat",
    )?;
    let cfg = work.join("syslinux.cfg");
    std::fs::write(&cfg, recipe::syslinux_cfg(&recipe::cloud_cmdline()))?;
    for (file, name) in [
        (&image.kernel, "vmlinuz"),
        (&image.initrd, "initrd.img"),
        (&cfg, "syslinux.cfg"),
    ] {
        tool_output(
            Command::new("mcopy")
                .arg("-i")
                .arg(&boot)
                .arg(file)
                .arg(format!("::/{name}"))
                .env("MTOOLS_SKIP_CHECK", "1")
                .env("SOURCE_DATE_EPOCH", &epoch),
            "mcopy",
        )?;
    }
    tool_output(
        Command::new("syslinux")
            .arg("--install")
            .arg(&boot)
            .env("MTOOLS_SKIP_CHECK", "1")
            .env("SOURCE_DATE_EPOCH", &epoch),
        "syslinux --install",
    )?;
    // The root, back to raw.
    let root = work.join("root.raw");
    tool_output(
        Command::new("qemu-img")
            .args(["convert", "-q", "-f", "qcow2", "-O", "raw"])
            .arg(&image.root)
            .arg(&root),
        "qemu-img convert",
    )?;
    let root_bytes = std::fs::metadata(&root)?.len();
    // The disk: MBR, boot partition (active), root partition.
    let raw = work.join("disk.raw");
    let sector = 512;
    std::fs::File::create(&raw)?.set_len(BOOT_OFFSET + BOOT_BYTES + root_bytes)?;
    let table = format!(
        "label: dos\nlabel-id: 0x{volume_id}\nstart={}, size={}, type=6, bootable\nstart={}, size={}, type=83\n",
        BOOT_OFFSET / sector,
        BOOT_BYTES / sector,
        (BOOT_OFFSET + BOOT_BYTES) / sector,
        root_bytes / sector
    );
    let out = crate::netns::output_with_stdin(
        Command::new("sfdisk")
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(&raw),
        &table,
    )?;
    if !out.status.success() {
        bail!(
            "sfdisk failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let place = |src: &Path, offset: u64, count: Option<u64>| -> Result<()> {
        let mut cmd = Command::new("dd");
        cmd.arg(format!("if={}", src.display()))
            .arg(format!("of={}", raw.display()))
            .arg("conv=notrunc,sparse")
            .arg("status=none");
        match count {
            // The MBR's boot code only: 440 bytes, the partition table stays.
            Some(n) => cmd.args(["bs=1", &format!("count={n}")]),
            None => cmd.args(["bs=1M", &format!("seek={}", offset / (1024 * 1024))]),
        };
        tool_output(&mut cmd, "dd").map(|_| ())
    };
    place(Path::new("/usr/lib/syslinux/mbr/mbr.bin"), 0, Some(440))?;
    place(&boot, BOOT_OFFSET, None)?;
    place(&root, BOOT_OFFSET + BOOT_BYTES, None)?;
    let staging = qcow2.with_extension("qcow2.part");
    raw_to_qcow2(&raw, &staging)?;
    std::fs::rename(&staging, qcow2)?;
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_stable_and_uuid_shaped() {
        let u = uuid_from("abc");
        assert_eq!(u, uuid_from("abc"));
        assert_ne!(u, uuid_from("abd"));
        let parts: Vec<usize> = u.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&u[14..15], "4");
    }
}
