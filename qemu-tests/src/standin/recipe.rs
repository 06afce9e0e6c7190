//! What the RHCOS stand-in is made of, as data: the Debian packages, the files the recipe
//! writes into the root, the `mmdebstrap` invocation, the cache keys and the kernel command
//! line a node boots with. Pure: the builder ([`super::build`]) runs it, the tests read it.

use std::net::Ipv4Addr;

use sha2::{Digest, Sha256};

/// Bump when the recipe changes in a way the text below does not show (it keys the cache).
pub const RECIPE_VERSION: u32 = 1;

/// The Debian release the stand-in is built from (the machine's own).
pub const SUITE: &str = "bookworm";

/// What makes the node "RHCOS" for keelson (docs/rhcos.md), plus what those need at run time.
/// `dracut` replaces `initramfs-tools` (both provide `linux-initramfs-tool`, so asking for
/// `dracut` in the same transaction keeps the other out).
pub const PACKAGES: &[&str] = &[
    // The Debian cloud kernel, the one the appliance boots too.
    "linux-image-cloud-amd64",
    // The init system and what a systemd root needs.
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    // The initramfs: dracut with its network modules (NetworkManager in the initrd) and the
    // upstream Ignition 2.14 with its dracut module `30ignition`.
    "dracut",
    "dracut-network",
    "ignition",
    // dracut's `url-lib` (which `30ignition` depends on) installs curl into the initramfs.
    "curl",
    // Networking on the real root: NetworkManager owns the NIC and the resolver; `nft` is what
    // the agent's VIP:6443 redirect runs (agent/src/proxy/frontend.rs).
    "network-manager",
    "nftables",
    "iproute2",
    // Ignition's `files` stage creates the `core` user with useradd (`passwd`) and may make
    // file systems (`e2fsprogs`).
    "passwd",
    "e2fsprogs",
    // Debian's Ignition is built with SELinux relabeling on: its `files` stage reads
    // `/etc/selinux/config` and runs `setfiles` (which dracut copies into the initramfs) on
    // what it wrote. The reference policy gives it real file contexts; the kernel never loads
    // it (Debian's kernel starts AppArmor, `SELINUX=disabled`): labels on disk, no
    // enforcement (docs/rhcos.md, "SELinux").
    "policycoreutils",
    "selinux-policy-default",
    // How the harness looks inside a node (`getent`, `nmcli`, `nft`, `journalctl` through
    // `guest-exec` on a virtio-serial port): no SSH, no network path of its own.
    "qemu-guest-agent",
];

/// `/etc/dracut.conf.d/10-standin.conf`: a generic (not host-only) initramfs with Ignition
/// and NetworkManager, the drivers a QEMU node boots from (virtio disk and NIC, the IDE
/// CD-ROM holding the config drive, ISO 9660 to mount it) and nothing for hardware it never
/// has. `reproducible` makes dracut clamp times and sort the archive.
pub const DRACUT_CONF: &str = "\
hostonly=no
reproducible=yes
add_dracutmodules+=\" ignition network-manager \"
omit_dracutmodules+=\" kernel-modules-extra crypt dm nvdimm resume lunmask overlay-root virtiofs ifcfg \"
add_drivers+=\" virtio_pci virtio_blk virtio_net ata_piix sr_mod isofs \"
";

/// The label of the root file system (`root=LABEL=root`, as RHCOS labels its root).
pub const ROOT_LABEL: &str = "root";

/// The stand-in kube-apiserver's unit: bound to `*:6443` as the real one is (a static pod
/// with host networking), started by systemd, not by keelson. On RHCOS kubelet runs it; here
/// it plays the API for the scenarios (`/readyz`, `/version` naming the node).
pub const APISERVER_UNIT: &str = "\
[Unit]
Description=kube-apiserver stand-in (keelson QEMU tests): HTTPS on *:6443 like the real one
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/local/libexec/kube-standin --listen 0.0.0.0:6443
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
";

/// Where the stand-in apiserver's binary lands on the root.
pub const APISERVER_BIN: &str = "usr/local/libexec/kube-standin";
/// Its unit, and the link that enables it.
pub const APISERVER_UNIT_PATH: &str = "etc/systemd/system/kube-apiserver.service";
/// The `multi-user.target.wants` link enabling it.
pub const APISERVER_WANTS: &str =
    "etc/systemd/system/multi-user.target.wants/kube-apiserver.service";

/// The label of the boot partition of the stand-in's cloud disk ([`super::build::disk`]).
pub const BOOT_LABEL: &str = "STANDINBOOT";

/// The unit that ends the first boot on the cloud disk, as RHCOS's
/// `coreos-ignition-firstboot-complete` does: RHCOS's GRUB adds `ignition.firstboot` while
/// `/boot/ignition.firstboot` exists and the unit removes that file once the real root is
/// up (Ignition succeeded, or the boot would have stopped in the initramfs). The stand-in
/// boots with syslinux, which tests no files, so the flag is the argument in
/// `syslinux.cfg` on the boot partition and the unit removes it there. Booted by QEMU
/// directly (no boot partition) it has nothing to do.
pub const FIRSTBOOT_UNIT: &str = "\
[Unit]
Description=Ends the first boot: ignition.firstboot off the boot loader (RHCOS: coreos-ignition-firstboot-complete)
ConditionKernelCommandLine=ignition.firstboot
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'd=/dev/disk/by-label/STANDINBOOT; [ -e $d ] || exit 0; mkdir -p /run/standin-boot && mount -t vfat $d /run/standin-boot && sed -i \"s/ ignition.firstboot//\" /run/standin-boot/syslinux.cfg; umount /run/standin-boot'

[Install]
WantedBy=multi-user.target
";

/// Where the first-boot unit lands on the root.
pub const FIRSTBOOT_UNIT_PATH: &str = "etc/systemd/system/standin-firstboot-complete.service";
/// The `multi-user.target.wants` link enabling it.
pub const FIRSTBOOT_WANTS: &str =
    "etc/systemd/system/multi-user.target.wants/standin-firstboot-complete.service";

/// The kernel command line of the cloud disk's first boot, as RHCOS boots on OpenStack:
/// DHCP (the host name comes with the lease: Neutron hands out each port's DNS name), the
/// machine ID from the VM's SMBIOS UUID (Nova sets it to the instance's), both consoles with
/// the serial one last (what `openstack console log show` returns), the journal forwarded
/// to it; `ignition.firstboot` until [`FIRSTBOOT_UNIT`] removes it.
pub fn cloud_cmdline() -> String {
    [
        "console=tty0",
        "console=ttyS0,115200n8",
        &format!("root=LABEL={ROOT_LABEL}"),
        "rw",
        "no_timer_check",
        "panic=10",
        "ignition.platform.id=openstack",
        "rd.neednet=1",
        "ip=dhcp",
        "systemd.journald.forward_to_console=1",
        "ignition.firstboot",
    ]
    .join(" ")
}

/// `syslinux.cfg` of the cloud disk's boot partition: boot at once with `cmdline`.
pub fn syslinux_cfg(cmdline: &str) -> String {
    format!(
        "DEFAULT standin\nPROMPT 0\nTIMEOUT 0\nSERIAL 0 115200\n\nLABEL standin\n  LINUX /vmlinuz\n  INITRD /initrd.img\n  APPEND {cmdline}\n"
    )
}

/// Directories the image layer adds to the base root. `/var/log/journal` makes the journal
/// persistent, as on RHCOS: Ignition's log from the first boot (flushed from the
/// initramfs) is still there on the next boot.
pub const IMAGE_DIRS: &[&str] = &["var/log/journal"];

/// Units of Debian's packages a cluster node has no use for, masked in the image layer so a
/// first boot under TCG does not spend minutes on them (RHCOS ships none of them either).
pub const MASKED_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    // Debian's systemd presets enable systemd-networkd, which the first boot's preset-all
    // would start beside NetworkManager; its wait-online then holds network-online.target
    // (and so the agent) for its full 120 s timeout. RHCOS has no networkd.
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
];

/// `/etc/machine-id` of the image: "uninitialized", so systemd treats a node's first boot as
/// its first boot (`ConditionFirstBoot`) and applies the presets, among them the one
/// Ignition writes for the units it enables (`keelson-agent.service`), as on RHCOS. An empty
/// file (what mmdebstrap leaves) gets a machine ID but no first boot, and the agent never
/// starts.
pub const MACHINE_ID: &str = "uninitialized\n";

/// The `mmdebstrap` arguments that build the root into `dir` from the apt `sources` file.
/// `--mode=root` (the harness runs as root, and maintainer scripts need real chroot mounts);
/// no recommends; no documentation, manuals or translations (a test root nobody reads).
/// The setup hook writes the dracut configuration before the kernel's postinst runs dracut,
/// so the one initramfs built is already the Ignition one. The customize hook leaves what
/// must differ per node to the node's first boot: no host name (the kernel command line
/// gives it), no `resolv.conf` (NetworkManager writes it). `machine-id` is the image
/// layer's ([`MACHINE_ID`]): mmdebstrap empties it after the hooks.
pub fn mmdebstrap_args(dir: &str, sources: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--mode=root",
        "--variant=minbase",
        "--aptopt=Apt::Install-Recommends \"false\"",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--setup-hook=mkdir -p \"$1/etc/dracut.conf.d\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!(
        "--setup-hook=printf '%s' '{}' > \"$1/etc/dracut.conf.d/10-standin.conf\"",
        DRACUT_CONF
    ));
    args.push(format!("--include={}", PACKAGES.join(",")));
    args.push(
        "--customize-hook=rm -f \"$1/etc/hostname\" \"$1/etc/resolv.conf\"; \
         printf 'LABEL=root / ext4 rw,relatime 0 1\\n' > \"$1/etc/fstab\"; \
         printf 'SELINUX=disabled\\nSELINUXTYPE=default\\n' > \"$1/etc/selinux/config\""
            .into(),
    );
    args.push(SUITE.into());
    args.push(dir.into());
    args.push(sources.into());
    args
}

/// The key of the base root (packages, kernel, initramfs): everything that decides what
/// `mmdebstrap` produces and that can be seen before running it — this recipe, the apt
/// sources it reads and the `mmdebstrap` version. The mirror's content at build time is
/// the one input it cannot see: `packages.txt` beside the cache records what was installed.
pub fn base_key(sources: &[u8], mmdebstrap_version: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("recipe {RECIPE_VERSION}\n"));
    h.update(format!("suite {SUITE}\n"));
    for arg in mmdebstrap_args("DIR", "SOURCES") {
        h.update(arg.as_bytes());
        h.update(b"\n");
    }
    h.update(b"sources\n");
    h.update(sources);
    h.update(format!("mmdebstrap {mmdebstrap_version}\n"));
    hex::encode(&h.finalize()[..8])
}

/// The key of the bootable image: the base plus what the harness adds (the stand-in
/// apiserver's binary and unit).
pub fn image_key(base_key: &str, apiserver: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(base_key.as_bytes());
    h.update(APISERVER_UNIT.as_bytes());
    h.update(FIRSTBOOT_UNIT.as_bytes());
    h.update(MACHINE_ID.as_bytes());
    h.update(b"times clamped to SOURCE_DATE_EPOCH\n");
    for u in MASKED_UNITS {
        h.update(format!("mask {u}\n"));
    }
    for d in IMAGE_DIRS {
        h.update(d.as_bytes());
        h.update(b"\n");
    }
    h.update(Sha256::digest(apiserver));
    hex::encode(&h.finalize()[..8])
}

/// How a stand-in node gets its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeNetwork {
    /// A static address, as the config drive's `network_data.json` gives it; on RHCOS,
    /// static addressing is `ip=` kernel arguments (`coreos-installer --append-karg`).
    Static {
        /// The node's address.
        address: Ipv4Addr,
        /// Prefix length.
        prefix: u8,
        /// Default gateway, if the network has one.
        gateway: Option<Ipv4Addr>,
    },
    /// DHCPv4 (what RHCOS does on OpenStack by default).
    Dhcp,
}

/// One boot of a stand-in node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSpec {
    /// The node's host name (`systemd.hostname=`; on OpenStack RHCOS sets it from the
    /// metadata with afterburn).
    pub hostname: String,
    /// Its network.
    pub network: NodeNetwork,
    /// First boot: Ignition runs (RHCOS's GRUB adds `ignition.firstboot` while
    /// `/boot/ignition.firstboot` exists; QEMU boots the stand-in's kernel directly, so the
    /// harness plays GRUB and adds it only for a fresh disk).
    pub first_boot: bool,
    /// DNS servers for a static network (`nameserver=`, as the bare-metal installs of
    /// OpenShift give them): the initramfs resolves what pointers name through them.
    pub nameservers: Vec<Ipv4Addr>,
}

/// The kernel command line of one boot. Permanent arguments, as on RHCOS: the root, the
/// platform (`ignition.platform.id=openstack`), the network (`rd.neednet=1` and `ip=`, so
/// NetworkManager in the initramfs brings the NIC up for Ignition and hands the profile to
/// the real root's NetworkManager). First boot only: `ignition.firstboot`. The journal goes
/// to the serial console too, so the harness sees Ignition's and the agent's log lines.
pub fn cmdline(boot: &BootSpec) -> String {
    let mut args = vec![
        "console=ttyS0,115200n8".to_owned(),
        format!("root=LABEL={ROOT_LABEL}"),
        "rw".into(),
        // As the appliance (image/src/bootcfg.rs): the IO-APIC timer check panics on a busy host.
        "no_timer_check".into(),
        "panic=10".into(),
        "ignition.platform.id=openstack".into(),
        "rd.neednet=1".into(),
        format!("systemd.hostname={}", boot.hostname),
        // One machine ID for the initramfs and the real root (and every boot), so the
        // journal the initramfs wrote (Ignition's log) is flushed into the root's persistent
        // journal with the rest, and `journalctl -t ignition` finds it after switch-root.
        format!("systemd.machine_id={}", machine_id(&boot.hostname)),
        "systemd.journald.forward_to_console=1".into(),
    ];
    args.push(match &boot.network {
        NodeNetwork::Static {
            address,
            prefix,
            gateway,
        } => {
            let mask = Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0));
            let gw = gateway.map(|g| g.to_string()).unwrap_or_default();
            format!("ip={address}::{gw}:{mask}:{}::none", boot.hostname)
        }
        NodeNetwork::Dhcp => "ip=dhcp".into(),
    });
    if matches!(boot.network, NodeNetwork::Static { .. }) {
        for ns in &boot.nameservers {
            args.push(format!("nameserver={ns}"));
        }
    }
    if boot.first_boot {
        args.push("ignition.firstboot".into());
    }
    args.join(" ")
}

/// The node's machine ID: 32 hex digits derived from its host name.
pub fn machine_id(hostname: &str) -> String {
    hex::encode(&Sha256::digest(format!("keelson-standin {hostname}").as_bytes())[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(first_boot: bool, network: NodeNetwork) -> BootSpec {
        BootSpec {
            hostname: "master-0".into(),
            network,
            first_boot,
            nameservers: vec![Ipv4Addr::new(10, 0, 0, 5)],
        }
    }

    #[test]
    fn first_boot_runs_ignition_for_openstack_later_boots_do_not() {
        let net = NodeNetwork::Static {
            address: Ipv4Addr::new(10, 0, 0, 11),
            prefix: 16,
            gateway: None,
        };
        let first = cmdline(&boot(true, net.clone()));
        let words: Vec<&str> = first.split(' ').collect();
        assert!(words.contains(&"ignition.firstboot"));
        assert!(words.contains(&"ignition.platform.id=openstack"));
        assert!(words.contains(&"ip=10.0.0.11:::255.255.0.0:master-0::none"));
        assert!(words.contains(&"systemd.hostname=master-0"));
        let id = machine_id("master-0");
        assert_eq!(id.len(), 32);
        assert!(first.contains(&format!("systemd.machine_id={id}")));
        let later = cmdline(&boot(false, net));
        assert!(!later.split(' ').any(|w| w == "ignition.firstboot"));
        // The platform and the network are permanent arguments.
        assert!(later.contains("ignition.platform.id=openstack"));
        assert!(later.contains("ip=10.0.0.11:"));
    }

    #[test]
    fn dhcp_and_gateway() {
        assert!(cmdline(&boot(true, NodeNetwork::Dhcp)).contains(" ip=dhcp"));
        let net = NodeNetwork::Static {
            address: Ipv4Addr::new(192, 168, 1, 5),
            prefix: 24,
            gateway: Some(Ipv4Addr::new(192, 168, 1, 1)),
        };
        assert!(
            cmdline(&boot(true, net))
                .contains("ip=192.168.1.5::192.168.1.1:255.255.255.0:master-0::none")
        );
    }

    #[test]
    fn the_cloud_disk_boots_ignition_once() {
        let line = cloud_cmdline();
        assert!(line.ends_with(" ignition.firstboot"), "{line}");
        assert!(line.contains(" ip=dhcp ") && line.contains("ignition.platform.id=openstack"));
        // The unit removes exactly the argument the config carries.
        let cfg = syslinux_cfg(&line);
        assert!(cfg.contains(&format!("APPEND {line}\n")));
        assert!(FIRSTBOOT_UNIT.contains(r#"s/ ignition.firstboot//"#));
        assert!(FIRSTBOOT_UNIT.contains(BOOT_LABEL));
        assert!(FIRSTBOOT_UNIT.contains("ConditionKernelCommandLine=ignition.firstboot"));
    }

    #[test]
    fn keys_follow_their_inputs() {
        let a = base_key(b"Types: deb\n", "1.3.5");
        assert_eq!(
            a,
            base_key(b"Types: deb\n", "1.3.5"),
            "same inputs, same key"
        );
        assert_ne!(a, base_key(b"Types: deb-src\n", "1.3.5"));
        assert_ne!(a, base_key(b"Types: deb\n", "1.4.0"));
        assert_ne!(image_key(&a, b"one"), image_key(&a, b"two"));
    }

    #[test]
    fn dracut_gets_ignition_and_the_packages_are_the_rhcos_parts() {
        for p in [
            "ignition",
            "dracut",
            "network-manager",
            "nftables",
            "systemd",
        ] {
            assert!(PACKAGES.contains(&p), "{p}");
        }
        assert!(DRACUT_CONF.contains("ignition"));
        let args = mmdebstrap_args("/d", "/s");
        assert_eq!(&args[args.len() - 3..], ["bookworm", "/d", "/s"]);
        assert!(args.iter().any(|a| a.contains("10-standin.conf")));
    }
}
