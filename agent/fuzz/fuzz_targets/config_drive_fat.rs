//! VFAT config-drive images (FAT12/16/32, label `config-2`) into
//! `metadata::config_drive::read`, the function init runs on the drive, through a real
//! file as on a node: the boot-sector probe, the FAT reader (`metadata/fat.rs`), then
//! meta_data.json, network_data.json and user_data. Checks as for the ISO target
//! (`check_config_drive`): failures are `Invalid` naming the drive, nothing panics or hangs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = keelson_agent_fuzz::scratch_file("drive.img");
    std::fs::write(&path, data).expect("scratch image");
    keelson_agent_fuzz::check_config_drive(&path);
});
