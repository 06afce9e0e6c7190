//! The appliance image boots under QEMU (TCG) with SeaBIOS and with OVMF: the agent starts as
//! PID 1, reads the config drive attached as a CD-ROM, prints its ready line on the serial
//! console, and powers the machine off on ACPI shutdown (`system_powerdown`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use keelson_qemu_tests::configdrive::NodeDrive;
use keelson_qemu_tests::segment::Segment;
use keelson_qemu_tests::vm::{Boot, Vm, VmSpec};

/// The static agent `make agent` built (the Makefile exports its path).
fn agent_or_skip() -> Option<PathBuf> {
    let agent = keelson_testkit::require_env(
        "KEELSON_AGENT_BIN",
        "`make test` builds the static agent and sets it",
    )?;
    keelson_testkit::require_file(&agent, "the static agent `make agent` builds")
        .then(|| agent.into())
}

/// A cluster.json for a one-node test segment 10.99.0.0/24.
fn cluster_json() -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "name": "imgtest",
        "baseDomain": "example.test",
        "machineNetworks": ["10.99.0.0/24"],
        "apiVips": ["10.99.0.5"],
        "ingressVips": ["10.99.0.7"],
        "vrrp": { "instances": [] },
        "api": {
            "frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
            "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 1,
            "connectTimeoutMs": 1000, "idleTimeoutSecs": 60, "maxConnections": 1000
        },
        "dns": { "port": 53, "ttl": 60, "manageResolvConf": true },
        "ignition": {
            "tlsPort": 22623, "plainPort": 22624,
            "allowedNetworks": ["10.99.0.0/24"], "spec": "3.2.0"
        },
        "members": { "transport": "mdns", "renewIntervalSecs": 2, "expirySecs": 6 }
    })
}

/// user_data: an Ignition 3.2 config that gives the appliance its cluster.json and role.
fn user_data() -> Vec<u8> {
    let data_url = |bytes: &[u8]| {
        format!(
            "data:;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    let cluster = serde_json::to_vec(&cluster_json()).unwrap();
    let config = serde_json::json!({
        "ignition": { "version": "3.2.0" },
        "storage": { "files": [
            { "path": "/etc/keelson/cluster.json", "mode": 420, "overwrite": true,
              "contents": { "source": data_url(&cluster) } },
            { "path": "/etc/keelson/role", "mode": 420, "overwrite": true,
              "contents": { "source": data_url(b"worker\n") } }
        ]}
    });
    serde_json::to_vec(&config).unwrap()
}

fn boot(image: &Path, work: &Path, segment: Segment, uefi: bool, host: u8) -> (Duration, String) {
    let name = if uefi { "uefi" } else { "bios" };
    let drive = NodeDrive {
        name: format!("img-{name}"),
        uuid: format!("00000000-0000-4000-8000-0000000000{host:02x}"),
        mac: format!("52:54:00:99:00:{host:02x}"),
        address: std::net::Ipv4Addr::new(10, 99, 0, host),
        prefix: 24,
        network: keelson_qemu_tests::configdrive::NetworkMode::Static,
        mtu: 1500,
        user_data: user_data(),
        meta: [("keelson-role".to_owned(), "worker".to_owned())].into(),
        dns: vec![],
        address6: None,
    };
    let iso = work.join(format!("{name}-config.iso"));
    drive.write_iso(work, &iso).unwrap();
    let mut vm = Vm::start(
        VmSpec {
            name: drive.name.clone(),
            image: image.to_path_buf(),
            config_drive: Some(iso),
            mac: drive.mac.clone(),
            memory_mib: 512,
            uefi,
            boot: Boot::Disk,
            keep_disk: false,
            guest_agent: false,
        },
        segment,
        work,
    )
    .unwrap();
    let ready = vm
        .wait_for_console("keelson-agent ready:", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let ready_after = vm.started.elapsed();
    assert!(
        ready.contains(&format!("node={}", drive.name)) && ready.contains("role=worker"),
        "{name}: the ready line names the node and role from the config drive: {ready}"
    );
    let console = vm.console_text();
    assert!(
        console.contains("Run /init as init process"),
        "{name}: the kernel ran our /init"
    );
    let stopping = Instant::now();
    let status = vm
        .power_off(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{name}: no power-off after system_powerdown: {e}"));
    let console = vm.console_text();
    assert!(
        console.contains("reboot: Power down"),
        "{name}: the kernel powered off (exit {status}); last lines:\n{}",
        vm.console_tail(20)
    );
    assert!(
        !console.contains("Kernel panic"),
        "{name}: PID 1 must never exit; console:\n{}",
        vm.console_tail(40)
    );
    eprintln!(
        "image boot ({name}): ready {:.1} s after QEMU start, powered off {:.1} s after system_powerdown",
        ready_after.as_secs_f64(),
        stopping.elapsed().as_secs_f64()
    );
    (ready_after, ready)
}

#[test]
fn boots_with_seabios_and_ovmf_reads_the_config_drive_and_powers_off() {
    let Some(agent) = agent_or_skip() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let manifest = keelson_image::build(&keelson_image::ImageOptions::new(
        work.path().join("out"),
        agent,
    ))
    .expect("building the image (run `make setup` first for the kernel)");
    let image = manifest.qcow2.clone();
    let segment = Segment::nth_for_this_process(7);
    // Both firmwares at once (each TCG guest is one host thread), or one after the other
    // when bench/image.sh measures boot times.
    let sequential = std::env::var_os("KEELSON_BOOT_SEQUENTIAL").is_some();
    let (bios, uefi) = std::thread::scope(|s| {
        let bios = s.spawn(|| boot(&image, work.path(), segment, false, 21));
        if sequential {
            let bios = bios.join();
            let uefi = s.spawn(|| boot(&image, work.path(), segment, true, 22));
            (bios, uefi.join())
        } else {
            let uefi = s.spawn(|| boot(&image, work.path(), segment, true, 22));
            (bios.join(), uefi.join())
        }
    });
    let (bios, uefi) = (
        bios.unwrap_or_else(|e| std::panic::resume_unwind(e)),
        uefi.unwrap_or_else(|e| std::panic::resume_unwind(e)),
    );
    eprintln!(
        "image: {} bytes qcow2, {} bytes initramfs; ready BIOS {:.1} s, UEFI {:.1} s",
        manifest.qcow2_bytes,
        manifest.initramfs.bytes,
        bios.0.as_secs_f64(),
        uefi.0.as_secs_f64()
    );
}
