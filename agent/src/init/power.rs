//! What makes the appliance stop: SIGTERM, SIGPWR, ctrl-alt-del (SIGINT once the kernel is
//! told to hand it to PID 1), and the ACPI power button (QEMU's `system_powerdown`, Nova's
//! soft shutdown), which the kernel's `button` driver reports as `KEY_POWER` on an evdev
//! device: there is no acpid, so the agent reads `/dev/input/event*` itself.

use std::io::Read;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// `EV_KEY` and `KEY_POWER` from linux/input-event-codes.h.
const EV_KEY: u16 = 1;
const KEY_POWER: u16 = 116;
/// `struct input_event` on 64-bit: timeval (16) + type (2) + code (2) + value (4).
const EVENT_SIZE: usize = 24;

/// Whether a raw `input_event` is the power key being pressed.
pub fn is_power_press(event: &[u8]) -> bool {
    if event.len() < EVENT_SIZE {
        return false;
    }
    let kind = u16::from_ne_bytes([event[16], event[17]]);
    let code = u16::from_ne_bytes([event[18], event[19]]);
    let value = i32::from_ne_bytes([event[20], event[21], event[22], event[23]]);
    kind == EV_KEY && code == KEY_POWER && value == 1
}

/// Cancels `stop` on any power-off request.
pub fn watch(stop: CancellationToken) {
    // ctrl-alt-del: SIGINT to PID 1 instead of an immediate reboot.
    let _ = nix::sys::reboot::set_cad_enabled(false);
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int), Ok(mut pwr)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::from_raw(libc::SIGPWR)),
            ) else {
                super::log("cannot install signal handlers");
                return;
            };
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "ctrl-alt-del",
                _ = pwr.recv() => "SIGPWR",
            };
            super::log(&format!("{which}: stopping"));
            stop.cancel();
        });
    }
    // Input devices appear once `button`/`evdev` are loaded; look for new ones for a while.
    std::thread::spawn(move || {
        let mut watched = std::collections::BTreeSet::new();
        loop {
            if let Ok(entries) = std::fs::read_dir("/dev/input") {
                for entry in entries.flatten() {
                    let path = entry.path();
                    let is_event = path
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("event"));
                    if is_event && watched.insert(path.clone()) {
                        let stop = stop.clone();
                        std::thread::spawn(move || read_device(&path, stop));
                    }
                }
            }
            if stop.is_cancelled() {
                return;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
}

fn read_device(path: &std::path::Path, stop: CancellationToken) {
    let mut device = match std::fs::File::open(path) {
        Ok(d) => d,
        Err(e) => {
            super::log(&format!("input {}: {e}", path.display()));
            return;
        }
    };
    tracing::debug!("watching {} for the power button", path.display());
    let mut event = [0u8; EVENT_SIZE];
    while device.read_exact(&mut event).is_ok() {
        if is_power_press(&event) {
            super::log(&format!("power button ({}): stopping", path.display()));
            stop.cancel();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_key_press_only() {
        let event = |kind: u16, code: u16, value: i32| {
            let mut e = [0u8; EVENT_SIZE];
            e[16..18].copy_from_slice(&kind.to_ne_bytes());
            e[18..20].copy_from_slice(&code.to_ne_bytes());
            e[20..24].copy_from_slice(&value.to_ne_bytes());
            e
        };
        assert!(is_power_press(&event(1, 116, 1)));
        assert!(!is_power_press(&event(1, 116, 0)), "release");
        assert!(!is_power_press(&event(1, 28, 1)), "enter key");
        assert!(!is_power_press(&event(0, 116, 1)), "EV_SYN");
        assert!(!is_power_press(&[0u8; 8]), "short read");
    }
}
