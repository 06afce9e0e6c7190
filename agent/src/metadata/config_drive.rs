//! The OpenStack config drive: an ISO 9660 or VFAT volume labelled `config-2` (or `CONFIG-2`),
//! found by label among the block devices or given as a file, read in user space.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::fat::{Fat, FatError};
use super::iso9660::Iso;

/// Reads one file from the volume, refusing one larger than the limit: `Ok(None)` when it
/// does not exist.
type FileReader = Box<dyn FnMut(&str, usize) -> Result<Option<Vec<u8>>, String>>;
use super::{
    MAX_DOCUMENT_BYTES, MAX_USER_DATA_BYTES, MetaData, Metadata, MetadataError, NetworkData,
};

/// The labels Nova writes.
pub fn is_config_drive_label(label: &str) -> bool {
    label.eq_ignore_ascii_case("config-2")
}

/// Which file system a volume holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Volume {
    /// ISO 9660.
    Iso9660,
    /// FAT12/16/32.
    Vfat,
}

/// The file system and label of a volume, from its first sectors; `None` when neither.
pub fn probe(path: &Path) -> Option<(Volume, String)> {
    let mut file = File::open(path).ok()?;
    let mut boot = [0u8; 512];
    file.read_exact(&mut boot).ok()?;
    if boot[510..512] == [0x55, 0xaa]
        && (&boot[54..59] == b"FAT12" || &boot[54..59] == b"FAT16" || &boot[82..87] == b"FAT32")
    {
        let fat = Fat::open(file).ok()?;
        return Some((Volume::Vfat, fat.label));
    }
    file.seek(SeekFrom::Start(0)).ok()?;
    let iso = Iso::open(file).ok()?;
    Some((Volume::Iso9660, iso.label.clone()))
}

/// Block devices whose volume label says config drive (`/sys/class/block`, whole disks and
/// partitions; CD-ROMs appear as `sr0`).
pub fn find_devices() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/class/block") else {
        return found;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("loop") && !n.starts_with("ram"))
        .collect();
    names.sort();
    for name in names {
        let dev = Path::new("/dev").join(&name);
        if let Some((_, label)) = probe(&dev)
            && is_config_drive_label(&label)
        {
            found.push(dev);
        }
    }
    found
}

/// Reads the metadata from a config-drive volume (device or image file).
pub fn read(path: &Path) -> Result<Metadata, MetadataError> {
    let source = format!("config-drive:{}", path.display());
    let err = |what: String| MetadataError::Invalid {
        origin: source.clone(),
        message: what,
    };
    let (volume, label) =
        probe(path).ok_or_else(|| err("expected an ISO 9660 or VFAT volume".into()))?;
    if !is_config_drive_label(&label) {
        return Err(err(format!("volume label {label:?}, expected config-2")));
    }
    let mut reader: FileReader = match volume {
        Volume::Iso9660 => {
            let file = File::open(path).map_err(|e| err(e.to_string()))?;
            let mut iso = Iso::open(file).map_err(|e| err(e.to_string()))?;
            Box::new(
                move |p: &str, limit: usize| match iso.read_file_within(p, limit) {
                    Ok(d) => Ok(Some(d)),
                    Err(super::iso9660::IsoError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e.to_string()),
                },
            )
        }
        Volume::Vfat => {
            let file = File::open(path).map_err(|e| err(e.to_string()))?;
            let mut fat = Fat::open(file).map_err(|e| err(e.to_string()))?;
            Box::new(
                move |p: &str, limit: usize| match fat.read_file_within(p, limit) {
                    Ok(d) => Ok(Some(d)),
                    Err(FatError::NotFound(_)) => Ok(None),
                    Err(e @ FatError::TooLarge { .. }) => Err(e.to_string()),
                    Err(e) => Err(format!("{p}: {e}")),
                },
            )
        }
    };
    let version = ["openstack/latest/meta_data.json"]
        .iter()
        .find_map(|p| {
            reader(p, MAX_DOCUMENT_BYTES)
                .ok()
                .flatten()
                .map(|_| "latest".to_owned())
        })
        .ok_or_else(|| err("openstack/latest/meta_data.json: missing".into()))?;
    let base = format!("openstack/{version}");
    let meta_bytes = reader(&format!("{base}/meta_data.json"), MAX_DOCUMENT_BYTES)
        .map_err(err)?
        .ok_or_else(|| err(format!("{base}/meta_data.json: missing")))?;
    let meta_data: MetaData = serde_json::from_slice(&meta_bytes)
        .map_err(|e| err(format!("{base}/meta_data.json: {e}")))?;
    let network_data =
        match reader(&format!("{base}/network_data.json"), MAX_DOCUMENT_BYTES).map_err(err)? {
            Some(bytes) => Some(
                serde_json::from_slice::<NetworkData>(&bytes)
                    .map_err(|e| err(format!("{base}/network_data.json: {e}")))?,
            ),
            None => None,
        };
    let user_data = reader(&format!("{base}/user_data"), MAX_USER_DATA_BYTES).map_err(err)?;
    Ok(Metadata {
        source,
        meta_data,
        network_data,
        user_data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const FIXTURE_UUID: &str = "b3c7f4de-da0b-44ae-a42c-fa3806b61d7f";

    fn tree(dir: &Path) -> PathBuf {
        let latest = dir.join("tree/openstack/latest");
        std::fs::create_dir_all(&latest).unwrap();
        let fixtures = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/openstack-metadata"
        );
        std::fs::copy(
            format!("{fixtures}/openstack-config-drive_openstack_meta_data.json"),
            latest.join("meta_data.json"),
        )
        .unwrap();
        std::fs::copy(
            format!("{fixtures}/kubevirt_config_drive_openstack_latest_network_data.json"),
            latest.join("network_data.json"),
        )
        .unwrap();
        std::fs::write(
            latest.join("user_data"),
            b"{\"ignition\":{\"version\":\"3.2.0\"}}",
        )
        .unwrap();
        dir.join("tree")
    }

    /// Runs `cmd` (xorriso, mkfs.vfat, mcopy), which must succeed; false when its program
    /// is not installed (a skip, or a failure under CI).
    fn tool(cmd: &mut Command) -> bool {
        let program = cmd.get_program().to_string_lossy().into_owned();
        if !keelson_testkit::require(&program) {
            return false;
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        true
    }

    fn check(md: &Metadata) {
        assert_eq!(md.meta_data.uuid.as_deref(), Some(FIXTURE_UUID));
        let net = md.network_data.as_ref().unwrap();
        assert_eq!(
            net.links[0].ethernet_mac_address.as_deref(),
            Some("06:aa:bb:cc:dd:00")
        );
        assert_eq!(net.networks[0].ip_address.as_deref(), Some("192.168.1.10"));
        assert_eq!(
            md.user_data.as_deref(),
            Some(&b"{\"ignition\":{\"version\":\"3.2.0\"}}"[..])
        );
    }

    #[test]
    fn iso_config_drive() {
        let dir = tempfile::tempdir().unwrap();
        let root = tree(dir.path());
        let iso = dir.path().join("cd.iso");
        if !tool(
            Command::new("xorriso")
                .args([
                    "-as", "mkisofs", "-quiet", "-R", "-J", "-V", "config-2", "-o",
                ])
                .arg(&iso)
                .arg(&root),
        ) {
            return;
        }
        assert_eq!(probe(&iso), Some((Volume::Iso9660, "config-2".into())));
        let md = read(&iso).unwrap();
        assert_eq!(md.source, format!("config-drive:{}", iso.display()));
        check(&md);
    }

    #[test]
    fn vfat_config_drive() {
        let dir = tempfile::tempdir().unwrap();
        let root = tree(dir.path());
        let img = dir.path().join("drive.img");
        std::fs::write(&img, vec![0u8; 2 << 20]).unwrap();
        if !tool(Command::new("mkfs.vfat").args(["-n", "CONFIG-2"]).arg(&img)) {
            return;
        }
        if !tool(
            Command::new("mcopy")
                .args(["-s", "-i"])
                .arg(&img)
                .arg(root.join("openstack"))
                .arg("::"),
        ) {
            return;
        }
        assert_eq!(probe(&img), Some((Volume::Vfat, "CONFIG-2".into())));
        check(&read(&img).unwrap());
    }

    #[test]
    fn wrong_label_is_refused_with_the_label() {
        let dir = tempfile::tempdir().unwrap();
        let root = tree(dir.path());
        let iso = dir.path().join("cd.iso");
        if !tool(
            Command::new("xorriso")
                .args(["-as", "mkisofs", "-quiet", "-J", "-V", "DATA", "-o"])
                .arg(&iso)
                .arg(&root),
        ) {
            return;
        }
        let err = read(&iso).unwrap_err().to_string();
        assert!(
            err.contains("\"DATA\"") && err.contains("config-2"),
            "{err}"
        );
    }

    #[test]
    fn oversized_files_are_refused_naming_the_limit() {
        for fat in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let root = tree(dir.path());
            std::fs::write(
                root.join("openstack/latest/user_data"),
                vec![b'x'; MAX_USER_DATA_BYTES + 1],
            )
            .unwrap();
            let image = dir.path().join("drive");
            let made = if fat {
                std::fs::write(&image, vec![0u8; 8 << 20]).unwrap();
                tool(
                    Command::new("mkfs.vfat")
                        .args(["-n", "CONFIG-2"])
                        .arg(&image),
                ) && tool(
                    Command::new("mcopy")
                        .args(["-s", "-i"])
                        .arg(&image)
                        .arg(root.join("openstack"))
                        .arg("::"),
                )
            } else {
                tool(
                    Command::new("xorriso")
                        .args([
                            "-as", "mkisofs", "-quiet", "-R", "-J", "-V", "config-2", "-o",
                        ])
                        .arg(&image)
                        .arg(&root),
                )
            };
            if !made {
                return;
            }
            let err = read(&image).unwrap_err();
            assert!(matches!(err, MetadataError::Invalid { .. }));
            let text = err.to_string();
            assert!(
                text.contains("user_data") && text.contains(&MAX_USER_DATA_BYTES.to_string()),
                "fat={fat}: {text}"
            );
        }
    }
}
