//! keelson-image: the appliance image (docs/image.md): a reproducible initramfs whose
//! `/init` is the static agent, the kernel modules it needs, and a GPT disk that boots with
//! SeaBIOS (syslinux) and UEFI (systemd-boot), converted to `keelson.qcow2`.
//!
//! The pure parts (module closure, cpio, boot loader configs) are separate modules tested
//! without a kernel; [`build`] puts them together with the files on this machine.

pub mod bootcfg;
pub mod daemon;
pub mod disk;
pub mod initramfs;
pub mod kernel;
pub mod modules;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use initramfs::{Initramfs, ManifestEntry, Node};
use kernel::{KernelSource, PackageInfo};
use modules::{DepTable, ModuleSet};

/// The image file name.
pub const QCOW2: &str = "keelson.qcow2";
/// The manifest file name.
pub const MANIFEST: &str = "image-manifest.json";
/// The module list the agent loads at boot, in order, inside `/lib/modules/<version>/`.
pub const MODULE_LIST: &str = "modules.keelson";

/// What to build the image from.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// Directory the image files are written to (`keelson.qcow2`, `image-manifest.json`).
    pub out: PathBuf,
    /// The static agent binary, which becomes `/init`.
    pub agent: PathBuf,
    /// The kernel (`vmlinuz`); default: the one `make setup` unpacked into `.cache/kernel`.
    pub kernel: Option<PathBuf>,
    /// The kernel's modules directory (`lib/modules/<version>`); default as for `kernel`.
    pub modules: Option<PathBuf>,
    /// Timestamp written into every entry (`SOURCE_DATE_EPOCH`).
    pub source_date_epoch: u64,
    /// Extra kernel command-line words.
    pub cmdline_extra: String,
    /// Extra files for the initramfs: (absolute path in the image, file on this machine).
    /// Executables keep their permission bits. The QEMU cluster ships its stand-in
    /// kube-apiserver this way; operators can add their own tools.
    pub extra_files: Vec<(String, PathBuf)>,
}

impl ImageOptions {
    /// Options with defaults: kernel from `.cache/kernel`, `SOURCE_DATE_EPOCH` from the
    /// environment (0 when unset).
    pub fn new(out: impl Into<PathBuf>, agent: impl Into<PathBuf>) -> Self {
        ImageOptions {
            out: out.into(),
            agent: agent.into(),
            kernel: None,
            modules: None,
            source_date_epoch: source_date_epoch(),
            cmdline_extra: String::new(),
            extra_files: Vec::new(),
        }
    }
}

/// `SOURCE_DATE_EPOCH` from the environment, 0 when unset or not a number.
pub fn source_date_epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Errors building the image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The kernel or its modules could not be found or used.
    #[error("kernel: {0}")]
    Kernel(String),
    /// `modules.dep` is unusable.
    #[error(transparent)]
    Modules(#[from] modules::ModulesError),
    /// The initramfs could not be assembled.
    #[error(transparent)]
    Initramfs(#[from] initramfs::InitramfsError),
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(String),
    /// Laying out the disk failed.
    #[error("disk image: {0}")]
    Disk(String),
    /// An external tool (syslinux, qemu-img) is missing or failed.
    #[error("{0}")]
    Tool(String),
}

/// What was built; written as `image-manifest.json`. No host paths or times.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageManifest {
    /// Path of the qcow2 image (not serialised: the manifest names the file only).
    #[serde(skip)]
    pub qcow2: PathBuf,
    /// The image file name.
    pub file: String,
    /// Its sha256, hex.
    pub qcow2_sha256: String,
    /// Its size in bytes.
    pub qcow2_bytes: u64,
    /// The disk's virtual size in bytes.
    pub virtual_bytes: u64,
    /// The kernel.
    pub kernel: KernelManifest,
    /// The initramfs.
    pub initramfs: InitramfsManifest,
    /// The kernel command line.
    pub cmdline: String,
    /// The timestamp used for every entry.
    pub source_date_epoch: u64,
}

/// The kernel part of the manifest.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelManifest {
    /// Kernel version.
    pub version: String,
    /// sha256 of the bzImage.
    pub vmlinuz_sha256: String,
    /// The Debian package it came from, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<PackageInfo>,
    /// The modules in the image.
    pub modules: ModuleSet,
}

/// The initramfs part of the manifest.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InitramfsManifest {
    /// sha256 of the compressed initramfs.
    pub sha256: String,
    /// Compressed size.
    pub bytes: u64,
    /// Uncompressed (cpio) size.
    pub cpio_bytes: u64,
    /// sha256 of `/init` (the agent).
    pub agent_sha256: String,
    /// Every entry.
    pub entries: Vec<ManifestEntry>,
}

/// The initramfs and what the disk needs besides it.
#[derive(Debug, Clone)]
pub struct BuiltInitramfs {
    /// gzip-compressed newc archive.
    pub gzip: Vec<u8>,
    /// Uncompressed size.
    pub cpio_bytes: u64,
    /// The modules it holds.
    pub modules: ModuleSet,
    /// Entries.
    pub entries: Vec<ManifestEntry>,
}

/// Assembles the initramfs: `/init` (the agent), `/dev/console`, the mount points, the module
/// closure with its own `modules.dep` and the load-order list [`MODULE_LIST`].
pub fn build_initramfs(
    agent: &[u8],
    kernel: &KernelSource,
    extra_files: &[(String, PathBuf)],
    source_date_epoch: u64,
) -> Result<BuiltInitramfs, ImageError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| ImageError::Io(format!("reading {}: {e}", path.display())))
    };
    let dep_text =
        String::from_utf8_lossy(&read(&kernel.modules_dir.join("modules.dep"))?).into_owned();
    let builtin =
        std::fs::read_to_string(kernel.modules_dir.join("modules.builtin")).unwrap_or_default();
    let table = DepTable::parse(&dep_text)?;
    let set = table.closure(modules::WANTED, &builtin)?;

    let mut fs = Initramfs::new();
    fs.add(
        "/init",
        Node::File {
            data: agent.to_vec(),
            mode: 0o755,
        },
    )?;
    fs.add("/dev/console", Node::CharDevice { major: 5, minor: 1 })?;
    fs.add("/dev/null", Node::CharDevice { major: 1, minor: 3 })?;
    for dir in [
        "/proc",
        "/sys",
        "/run",
        "/tmp",
        "/etc/keelson",
        "/var/lib/keelson",
        "/root",
    ] {
        fs.add(dir, Node::Dir)?;
    }
    fs.add(
        "/etc/os-release",
        Node::File {
            data: format!(
                "NAME=keelson\nID=keelson\nPRETTY_NAME=\"keelson appliance {}\"\nVERSION_ID={}\n",
                env!("CARGO_PKG_VERSION"),
                env!("CARGO_PKG_VERSION")
            )
            .into_bytes(),
            mode: 0o644,
        },
    )?;
    let base = format!("/lib/modules/{}", kernel.version);
    for rel in &set.load_order {
        fs.add(
            &format!("{base}/{rel}"),
            Node::File {
                data: read(&kernel.modules_dir.join(rel))?,
                mode: 0o644,
            },
        )?;
    }
    fs.add(
        &format!("{base}/modules.dep"),
        Node::File {
            data: table.render_subset(&set.load_order).into_bytes(),
            mode: 0o644,
        },
    )?;
    let mut list = set.load_order.join("\n");
    list.push('\n');
    fs.add(
        &format!("{base}/{MODULE_LIST}"),
        Node::File {
            data: list.into_bytes(),
            mode: 0o644,
        },
    )?;
    for (path, source) in extra_files {
        let mode = std::fs::metadata(source)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o755)
            .map_err(|e| ImageError::Io(format!("extra file {}: {e}", source.display())))?;
        fs.add(
            path,
            Node::File {
                data: read(source)?,
                mode: mode | 0o644,
            },
        )?;
    }
    let mtime = u32::try_from(source_date_epoch).unwrap_or(u32::MAX);
    let cpio_bytes = fs.to_cpio(mtime)?.len() as u64;
    Ok(BuiltInitramfs {
        gzip: fs.to_gzip(mtime)?,
        cpio_bytes,
        modules: set,
        entries: fs.manifest(),
    })
}

/// Builds `keelson.qcow2` and `image-manifest.json` into `opts.out`.
pub fn build(opts: &ImageOptions) -> Result<ImageManifest, ImageError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| ImageError::Io(format!("reading {}: {e}", path.display())))
    };
    let kernel = KernelSource::locate(opts.kernel.as_deref(), opts.modules.as_deref())?;
    let agent = read(&opts.agent)?;
    let initramfs = build_initramfs(&agent, &kernel, &opts.extra_files, opts.source_date_epoch)?;
    let vmlinuz = read(&kernel.vmlinuz)?;
    let cmdline = bootcfg::cmdline(&opts.cmdline_extra);

    let files = vec![
        (format!("/{}", bootcfg::KERNEL), vmlinuz.clone()),
        (format!("/{}", bootcfg::INITRD), initramfs.gzip.clone()),
        (
            "/syslinux.cfg".to_owned(),
            bootcfg::syslinux_cfg(&cmdline).into_bytes(),
        ),
        (
            "/EFI/BOOT/BOOTX64.EFI".to_owned(),
            read(Path::new(disk::SYSTEMD_BOOT))?,
        ),
        (
            "/loader/loader.conf".to_owned(),
            bootcfg::loader_conf().into_bytes(),
        ),
        (
            "/loader/entries/keelson.conf".to_owned(),
            bootcfg::loader_entry(&cmdline).into_bytes(),
        ),
    ];
    let mut seed_hash = Sha256::new();
    for (path, data) in &files {
        seed_hash.update(path.as_bytes());
        seed_hash.update(Sha256::digest(data));
    }
    let seed: [u8; 16] = seed_hash.finalize()[..16].try_into().unwrap_or_default();
    let layout = disk::DiskLayout {
        files,
        gptmbr: read(Path::new(disk::GPTMBR))?,
        source_date_epoch: opts.source_date_epoch,
        seed,
    };

    std::fs::create_dir_all(&opts.out)
        .map_err(|e| ImageError::Io(format!("creating {}: {e}", opts.out.display())))?;
    let raw = disk::raw_path(&opts.out);
    let qcow2 = opts.out.join(QCOW2);
    disk::write_raw(&layout, &raw)?;
    let virtual_bytes = std::fs::metadata(&raw).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&qcow2);
    let converted = disk::convert_to_qcow2(&raw, &qcow2);
    let _ = std::fs::remove_file(&raw);
    converted?;
    let image = read(&qcow2)?;

    let manifest = ImageManifest {
        qcow2: qcow2.clone(),
        file: QCOW2.into(),
        qcow2_sha256: hex::encode(Sha256::digest(&image)),
        qcow2_bytes: image.len() as u64,
        virtual_bytes,
        kernel: KernelManifest {
            version: kernel.version.clone(),
            vmlinuz_sha256: hex::encode(Sha256::digest(&vmlinuz)),
            package: kernel.package.clone(),
            modules: initramfs.modules.clone(),
        },
        initramfs: InitramfsManifest {
            sha256: hex::encode(Sha256::digest(&initramfs.gzip)),
            bytes: initramfs.gzip.len() as u64,
            cpio_bytes: initramfs.cpio_bytes,
            agent_sha256: hex::encode(Sha256::digest(&agent)),
            entries: initramfs.entries.clone(),
        },
        cmdline,
        source_date_epoch: opts.source_date_epoch,
    };
    let mut json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| ImageError::Io(format!("encoding the manifest: {e}")))?;
    json.push(b'\n');
    let path = opts.out.join(MANIFEST);
    std::fs::write(&path, json)
        .map_err(|e| ImageError::Io(format!("writing {}: {e}", path.display())))?;
    Ok(manifest)
}
