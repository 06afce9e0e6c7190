//! The image as a whole: built twice it is byte-identical, and its disk has the layout both
//! firmwares boot from (checked by reading it back; booting is `qemu-tests/tests/image_boot.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use keelson_image::{ImageOptions, MANIFEST, QCOW2, build, kernel::KernelSource};

/// The kernel `make setup` unpacks.
fn kernel_or_skip() -> bool {
    let found = KernelSource::locate(None, None);
    let what = match &found {
        Ok(_) => String::new(),
        Err(e) => format!("the appliance kernel from `make setup` ({e})"),
    };
    keelson_testkit::need::need(found.is_ok(), &what)
}

/// A stand-in for the agent: its bytes only need to be stable and recognisable.
fn fake_agent(dir: &Path) -> PathBuf {
    let path = dir.join("keelson-agent");
    let body: Vec<u8> = (0..200_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    std::fs::write(&path, body).unwrap();
    path
}

fn options(out: &Path, agent: &Path) -> ImageOptions {
    // An operator's extra tool, shipped next to the agent (the QEMU cluster's stand-in API
    // server travels this way).
    let tool = agent.with_file_name("hello-tool");
    std::fs::write(&tool, b"#!/bin/true\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    ImageOptions {
        source_date_epoch: 1_700_000_000,
        extra_files: vec![("/usr/local/bin/hello-tool".into(), tool)],
        ..ImageOptions::new(out, agent)
    }
}

#[test]
fn two_builds_give_the_same_bytes_and_a_disk_both_firmwares_boot_from() {
    if !kernel_or_skip()
        || !keelson_testkit::require("qemu-img")
        || !keelson_testkit::require_file(keelson_image::disk::GPTMBR, "syslinux's GPT MBR")
    {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let first = build(&options(&work.path().join("a"), &agent)).unwrap();
    let second = build(&options(&work.path().join("b"), &agent)).unwrap();
    assert_eq!(
        first.qcow2_sha256, second.qcow2_sha256,
        "same inputs, same qcow2"
    );
    let manifest_a = std::fs::read(work.path().join("a").join(MANIFEST)).unwrap();
    let manifest_b = std::fs::read(work.path().join("b").join(MANIFEST)).unwrap();
    assert_eq!(manifest_a, manifest_b, "same inputs, same manifest");
    let text = String::from_utf8(manifest_a).unwrap();
    assert!(
        !text.contains(&*work.path().to_string_lossy()),
        "no host paths in the manifest"
    );
    assert!(
        first.qcow2_bytes <= 40 << 20,
        "qcow2 is {} bytes",
        first.qcow2_bytes
    );

    // A different timestamp changes the bytes (it really is in there).
    let later = build(&ImageOptions {
        source_date_epoch: 1_700_000_001,
        ..options(&work.path().join("c"), &agent)
    })
    .unwrap();
    assert_ne!(first.qcow2_sha256, later.qcow2_sha256);

    check_layout(&work.path().join("a").join(QCOW2), &agent, work.path());
}

/// Reads the disk back: GPT with one legacy-BIOS-bootable ESP at 2048, syslinux's MBR code,
/// and on the FAT: kernel, initramfs (whose /init is the agent), both loaders' files.
fn check_layout(qcow2: &Path, agent: &Path, work: &Path) {
    let raw = work.join("check.raw");
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "qcow2", "-O", "raw"])
        .arg(qcow2)
        .arg(&raw)
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::read(&raw).unwrap();
    let gptmbr = std::fs::read(keelson_image::disk::GPTMBR).unwrap();
    assert_eq!(
        &bytes[..440],
        &gptmbr[..440],
        "syslinux gptmbr.bin in the MBR"
    );
    assert_eq!(&bytes[510..512], &[0x55, 0xaa]);

    let disk = gpt::GptConfig::new().writable(false).open(&raw).unwrap();
    let parts: Vec<_> = disk.partitions().values().filter(|p| p.is_used()).collect();
    assert_eq!(parts.len(), 1);
    let esp = parts[0];
    assert_eq!(esp.part_type_guid, gpt::partition_types::EFI);
    assert_eq!(esp.first_lba, 2048);
    assert_ne!(esp.flags & (1 << 2), 0, "LegacyBIOSBootable attribute");

    let start = (esp.first_lba * 512) as usize;
    let end = ((esp.last_lba + 1) * 512) as usize;
    let fs = fatfs::FileSystem::new(
        std::io::Cursor::new(bytes[start..end].to_vec()),
        fatfs::FsOptions::new(),
    )
    .unwrap();
    let read = |path: &str| {
        let mut file = fs
            .root_dir()
            .open_file(path)
            .unwrap_or_else(|e| panic!("{path} on the ESP: {e}"));
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut data).unwrap();
        data
    };
    for path in ["ldlinux.sys", "ldlinux.c32", "EFI/BOOT/BOOTX64.EFI"] {
        assert!(!read(path).is_empty(), "{path}");
    }
    let cfg = String::from_utf8(read("syslinux.cfg")).unwrap();
    let entry = String::from_utf8(read("loader/entries/keelson.conf")).unwrap();
    assert!(cfg.contains("console=ttyS0") && entry.contains("console=ttyS0"));
    let kernel = KernelSource::locate(None, None).unwrap();
    assert_eq!(read("vmlinuz"), std::fs::read(&kernel.vmlinuz).unwrap());

    // The initramfs: /init is the agent, and the module list loads virtio_net's dependencies
    // before it.
    let gz = read("initrd.img");
    let mut cpio = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut cpio).unwrap();
    let mut files = std::collections::BTreeMap::new();
    let mut reader = cpio::newc::Reader::new(&cpio[..]).unwrap();
    while !reader.entry().is_trailer() {
        let name = reader.entry().name().to_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut data).unwrap();
        files.insert(name, data);
        reader = cpio::newc::Reader::new(reader.finish().unwrap()).unwrap();
    }
    assert_eq!(files["init"], std::fs::read(agent).unwrap());
    assert!(files.contains_key("dev/console"));
    assert_eq!(files["usr/local/bin/hello-tool"], b"#!/bin/true\n");
    let list = String::from_utf8(
        files[&format!("lib/modules/{}/modules.keelson", kernel.version)].clone(),
    )
    .unwrap();
    let position = |m: &str| list.lines().position(|l| l.ends_with(&format!("/{m}.ko")));
    let virtio_net = position("virtio_net").expect("virtio_net in the image");
    assert!(position("virtio_ring").unwrap() < virtio_net);
    assert!(position("virtio").unwrap() < virtio_net);
    for name in [
        "sr_mod",
        "cdrom",
        "virtio_blk",
        "virtio_pci",
        "ata_piix",
        "button",
    ] {
        let pos = position(name).unwrap_or_else(|| panic!("{name} missing from\n{list}"));
        let path = list.lines().nth(pos).unwrap();
        assert!(
            files.contains_key(&format!("lib/modules/{}/{path}", kernel.version)),
            "{path} listed but not in the archive"
        );
    }
}

#[test]
fn missing_kernel_is_a_clear_error() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let opts = ImageOptions {
        kernel: Some(work.path().join("no-such-vmlinuz")),
        modules: Some(work.path().to_path_buf()),
        ..options(work.path(), &agent)
    };
    let err = build(&opts).unwrap_err().to_string();
    assert!(
        err.contains("no-such-vmlinuz") && err.contains("no such file"),
        "{err}"
    );
}
