//! ISO 9660 config-drive images into `metadata::config_drive::read`, the function init
//! runs on the drive (probe, label check, ISO reader with Joliet and Rock Ridge names,
//! meta_data.json, network_data.json, user_data), through a real file as on a node.
//!
//! The input is the image from sector 16 on: the 32 KiB system area before it is never
//! read, so it is prepended as zeros rather than left for the fuzzer to mutate. Checks:
//! every failure is `Invalid` naming the drive (nothing panics, nothing hangs); a success
//! carries the source and a label-checked drive's contents.
#![no_main]

use libfuzzer_sys::fuzz_target;

const SYSTEM_AREA: usize = 16 * 2048;

fuzz_target!(|data: &[u8]| {
    let path = keelson_agent_fuzz::scratch_file("drive.iso");
    let mut image = vec![0u8; SYSTEM_AREA];
    image.extend_from_slice(data);
    std::fs::write(&path, &image).expect("scratch image");
    keelson_agent_fuzz::check_config_drive(&path);
});
