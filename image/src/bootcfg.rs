//! Boot loader configuration (pure text): syslinux for BIOS, systemd-boot for UEFI. Both boot
//! the same `/vmlinuz` and `/initrd.img` on the EFI system partition with the same command line.

/// Kernel file name on the ESP.
pub const KERNEL: &str = "vmlinuz";
/// Initramfs file name on the ESP.
pub const INITRD: &str = "initrd.img";

/// The kernel command line. Both consoles, serial last so `/dev/console` (the agent's log) is
/// the serial port OpenStack's console log and our tests read; `panic=10` reboots instead of
/// hanging should the kernel itself fail; `no_timer_check` skips the IO-APIC timer test,
/// which a virtual CPU starved by a busy host fails ("IO-APIC + timer doesn't work!", a
/// panic at 0.05 s; seen under TCG with six VMs on a loaded 2-core host), as cloud images do.
pub fn cmdline(extra: &str) -> String {
    let base = "console=tty0 console=ttyS0,115200n8 panic=10 no_timer_check";
    if extra.trim().is_empty() {
        base.to_owned()
    } else {
        format!("{base} {}", extra.trim())
    }
}

/// `/syslinux.cfg`: boot at once, no prompt.
pub fn syslinux_cfg(cmdline: &str) -> String {
    format!(
        "DEFAULT keelson\nPROMPT 0\nTIMEOUT 0\nSERIAL 0 115200\n\nLABEL keelson\n  LINUX /{KERNEL}\n  INITRD /{INITRD}\n  APPEND {cmdline}\n"
    )
}

/// `/loader/loader.conf` for systemd-boot: boot the one entry at once.
pub fn loader_conf() -> String {
    "default keelson.conf\ntimeout 0\nconsole-mode keep\neditor no\n".to_owned()
}

/// `/loader/entries/keelson.conf`.
pub fn loader_entry(cmdline: &str) -> String {
    format!("title keelson\nlinux /{KERNEL}\ninitrd /{INITRD}\noptions {cmdline}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_loaders_boot_the_same_files_with_the_same_cmdline() {
        let line = cmdline("keelson.debug=1");
        assert!(line.starts_with("console=tty0 console=ttyS0"));
        assert!(line.ends_with(" keelson.debug=1"));
        let bios = syslinux_cfg(&line);
        let uefi = loader_entry(&line);
        for text in [&bios, &uefi] {
            assert!(
                text.contains("/vmlinuz") && text.contains("/initrd.img"),
                "{text}"
            );
            assert!(text.contains(&line), "{text}");
        }
        assert!(bios.contains("TIMEOUT 0") && loader_conf().contains("timeout 0"));
        assert_eq!(
            cmdline("  "),
            "console=tty0 console=ttyS0,115200n8 panic=10 no_timer_check"
        );
    }
}
