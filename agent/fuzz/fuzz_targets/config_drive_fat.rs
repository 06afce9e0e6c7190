//! VFAT config-drive images (FAT12/16/32, label `config-2`) into
//! `metadata::config_drive::read`, the function init runs on the drive, through a real
//! file as on a node: the boot-sector probe, `fatfs`, then meta_data.json,
//! network_data.json and user_data. Checks as for the ISO target: failures are `Invalid`
//! naming the drive, nothing panics or hangs.
#![no_main]

use keelson_agent::metadata::{MetadataError, config_drive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = keelson_agent_fuzz::scratch_file("drive.img");
    std::fs::write(&path, data).expect("scratch image");
    let probed = config_drive::probe(&path);
    match config_drive::read(&path) {
        Ok(md) => {
            assert_eq!(md.source, format!("config-drive:{}", path.display()));
            let (_, label) = probed.expect("a drive that reads was probed");
            assert!(config_drive::is_config_drive_label(&label));
        }
        Err(MetadataError::Invalid { origin, message }) => {
            assert!(origin.starts_with("config-drive:"));
            assert!(!message.is_empty());
        }
        Err(other) => panic!("a read error must name the drive: {other}"),
    }
});
