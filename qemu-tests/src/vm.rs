//! One QEMU virtual machine: its own copy-on-write overlay of the image it boots
//! (`keelson.qcow2`, or the RHCOS stand-in's root), a config drive, a NIC on the test
//! segment, the serial console captured to a file, and the human monitor on a unix socket
//! (`system_powerdown`, `quit`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::guest::{self, GuestAgent};
use crate::segment::NicLink;

/// How to start one VM.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Name (files are named after it).
    pub name: String,
    /// The base image.
    pub image: PathBuf,
    /// The config drive ISO; `None` boots without one (metadata from the service).
    pub config_drive: Option<PathBuf>,
    /// The NIC's MAC address.
    pub mac: String,
    /// Memory in MiB.
    pub memory_mib: u32,
    /// Boot with UEFI (OVMF) instead of SeaBIOS.
    pub uefi: bool,
    /// What starts the VM: the boot loader on the image, or a kernel QEMU loads itself.
    pub boot: Boot,
    /// Keep the overlay of an earlier run of this VM (a reboot keeps the node's disk);
    /// otherwise every start begins from a fresh overlay of `image`.
    pub keep_disk: bool,
    /// Give the VM a QEMU guest agent port (`<name>.qga`; the image runs `qemu-ga`).
    pub guest_agent: bool,
}

/// How a VM boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boot {
    /// From the image's own boot loader (the appliance: syslinux or systemd-boot).
    Disk,
    /// `-kernel`/`-initrd`/`-append`: QEMU loads the kernel and passes this command line
    /// (the RHCOS stand-in, whose command line differs per node and per boot).
    Kernel {
        /// The kernel.
        kernel: PathBuf,
        /// The initramfs.
        initrd: PathBuf,
        /// The kernel command line.
        cmdline: String,
    },
}

/// A running VM.
#[derive(Debug)]
pub struct Vm {
    /// What it was started with.
    pub spec: VmSpec,
    /// The serial console log.
    pub console: PathBuf,
    monitor: PathBuf,
    /// The guest agent, when the VM has one.
    pub guest: Option<GuestAgent>,
    child: Option<Child>,
    /// When QEMU was started.
    pub started: Instant,
}

/// `tcg` unless `ACCEL` says otherwise (`ACCEL=kvm` where KVM works).
pub fn accel() -> String {
    std::env::var("ACCEL").unwrap_or_else(|_| "tcg".into())
}

impl Vm {
    /// Starts the VM with its NIC on `link` and its files in `work`.
    pub fn start(spec: VmSpec, link: impl Into<NicLink>, work: &Path) -> Result<Self> {
        let link = link.into();
        let overlay = work.join(format!("{}.qcow2", spec.name));
        if !(spec.keep_disk && overlay.exists()) {
            let _ = std::fs::remove_file(&overlay);
            let status = Command::new(crate::tools::require("qemu-img")?)
                .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
                .arg(&spec.image)
                .arg(&overlay)
                .status()
                .context("running qemu-img")?;
            if !status.success() {
                bail!("qemu-img create failed for {}", spec.name);
            }
        }
        let console = work.join(format!("{}.console", spec.name));
        let monitor = work.join(format!("{}.monitor", spec.name));
        if spec.keep_disk && console.exists() {
            // The earlier boot's console stays readable beside the new one.
            let _ = std::fs::rename(&console, work.join(format!("{}.console.prev", spec.name)));
        }
        let _ = std::fs::remove_file(&console);
        let _ = std::fs::remove_file(&monitor);
        let mut cmd = Command::new(crate::tools::require("qemu-system-x86_64")?);
        cmd.args(["-accel", &accel(), "-m", &spec.memory_mib.to_string()])
            .args(["-nodefaults", "-display", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()))
            .arg("-drive")
            .arg(format!("file={},if=virtio,format=qcow2", overlay.display()))
            .arg("-netdev")
            .arg(link.qemu_netdev("n0"))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=n0,mac={}", spec.mac));
        if let Some(drive) = &spec.config_drive {
            cmd.arg("-drive")
                .arg(format!("file={},media=cdrom,readonly=on", drive.display()));
        }
        if spec.uefi {
            cmd.args(["-bios", "/usr/share/ovmf/OVMF.fd"]);
        }
        if let Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } = &spec.boot
        {
            cmd.arg("-kernel")
                .arg(kernel)
                .arg("-initrd")
                .arg(initrd)
                .arg("-append")
                .arg(cmdline);
        }
        let guest = spec.guest_agent.then(|| {
            let socket = work.join(format!("{}.qga", spec.name));
            let _ = std::fs::remove_file(&socket);
            cmd.args(guest::qemu_args(&socket));
            GuestAgent {
                channel: guest::GuestChannel::Socket(socket),
            }
        });
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let NicLink::Tap(tap) = &link {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = tap.as_raw_fd();
            // SAFETY: between fork and exec the closure only calls dup2 and fcntl, which are
            // async-signal-safe, on a descriptor the parent keeps open until spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if fd == NicLink::TAP_FD {
                        // dup2 onto itself keeps close-on-exec: clear it.
                        if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    } else if libc::dup2(fd, NicLink::TAP_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().context("starting qemu-system-x86_64")?;
        // QEMU holds its own copy of a tap now; ours closes here.
        drop(link);
        Ok(Vm {
            spec,
            console,
            monitor,
            guest,
            child: Some(child),
            started: Instant::now(),
        })
    }

    /// The console so far.
    pub fn console_text(&self) -> String {
        std::fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `n` lines of the console.
    pub fn console_tail(&self, n: usize) -> String {
        let text = self.console_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until the console holds a line containing `needle`; returns that line.
    pub fn wait_for_console(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            // Complete lines only: the guest may be half-way through writing the one that
            // matches (a ready line cut after `role=wor` failed image_boot once).
            if let Some(line) = self
                .console_text()
                .split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .find(|l| l.contains(needle))
                .map(|l| l.trim_end_matches(['\r', '\n']).to_string())
            {
                return Ok(line);
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "{} exited ({status}) before printing {needle:?}; console:\n{}",
                    self.spec.name,
                    self.console_tail(30)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: no {needle:?} on the console after {timeout:?}; last lines:\n{}",
                    self.spec.name,
                    self.console_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends one human-monitor command and waits (up to 3 s) until QEMU has taken it: the
    /// prompt appears once on connect and again after the command ran. Hanging up before
    /// that can lose the command.
    pub fn monitor(&self, command: &str) -> Result<()> {
        let mut stream = UnixStream::connect(&self.monitor)
            .with_context(|| format!("connecting to {}'s monitor", self.spec.name))?;
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        writeln!(stream, "{command}")?;
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while Instant::now() < deadline {
            match std::io::Read::read(&mut stream, &mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
            if String::from_utf8_lossy(&seen).matches("(qemu)").count() >= 2 {
                break;
            }
        }
        Ok(())
    }

    /// ACPI power button; waits up to `timeout` for QEMU to exit.
    pub fn power_off(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        self.monitor("system_powerdown")?;
        self.wait_exit(timeout)
    }

    /// QEMU's process ID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether QEMU still runs (not killed, powered off or reaped).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Stops the VM at once, without a goodbye (`quit`: the node just dies).
    pub fn kill(&mut self) -> Result<()> {
        if self.monitor("quit").is_err()
            && let Some(child) = self.child.as_mut()
        {
            let _ = child.kill();
        }
        self.wait_exit(Duration::from_secs(10)).map(|_| ())
    }

    /// Waits for QEMU to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().context("the VM was already reaped")?;
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not exit within {timeout:?}; console:\n{}",
                    self.spec.name,
                    self.console_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
