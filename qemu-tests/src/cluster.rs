//! The example cluster under QEMU: which VMs, with which addresses, and how they are booted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::configdrive::NodeDrive;
use crate::netns::Netns;
use crate::segment::{Segment, TapBridge};
use crate::standin::{self, BootSpec, NodeNetwork, StandinImage};
use crate::vm::{Boot, Vm, VmSpec};

/// The machine network of `examples/install-config.yaml`.
pub const PREFIX: u8 = 16;
/// API VIP of the example.
pub const API_VIP: &str = "10.0.0.5";
/// Ingress VIP of the example.
pub const INGRESS_VIP: &str = "10.0.0.7";
/// The host-side participant's address on the segment.
pub const HOST_ADDRESS: &str = "10.0.0.250";

/// One VM of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// Name (host name, node name).
    pub name: String,
    /// `bootstrap`, `master` or `worker`.
    pub role: &'static str,
    /// Static address on the segment.
    pub address: Ipv4Addr,
    /// NIC MAC address.
    pub mac: String,
    /// What it boots.
    pub image: ImageKind,
}

/// What a node boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// `keelson.qcow2`: the agent is PID 1 and applies the Ignition subset itself.
    Appliance,
    /// The RHCOS stand-in (`crate::standin`): upstream Ignition in the initramfs applies the
    /// config, systemd runs the agent, NetworkManager owns the network.
    Standin,
}

impl ImageKind {
    /// `appliance` or `standin` (the `QEMU_CLUSTER_MASTERS` values).
    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::Appliance => "appliance",
            ImageKind::Standin => "standin",
        }
    }
}

/// What the masters boot: the stand-in unless `QEMU_CLUSTER_MASTERS=appliance`.
pub fn master_image() -> Result<ImageKind> {
    match std::env::var("QEMU_CLUSTER_MASTERS").as_deref() {
        Err(_) | Ok("") | Ok("standin") => Ok(ImageKind::Standin),
        Ok("appliance") => Ok(ImageKind::Appliance),
        Ok(other) => bail!("QEMU_CLUSTER_MASTERS={other:?}: expected standin or appliance"),
    }
}

/// Bootstrap 10.0.0.10, masters .11-.13, workers .21-.22; the bootstrap and the workers
/// boot the appliance, the masters `masters`.
pub fn plan(masters: ImageKind) -> Vec<NodePlan> {
    let node = |name: String, role, host: u8| NodePlan {
        mac: format!("52:54:00:0a:00:{host:02x}"),
        address: Ipv4Addr::new(10, 0, 0, host),
        image: if role == "master" {
            masters
        } else {
            ImageKind::Appliance
        },
        name,
        role,
    };
    let mut nodes = vec![node("bootstrap".into(), "bootstrap", 10)];
    nodes.extend((0..3).map(|i| node(format!("master-{i}"), "master", 11 + i)));
    nodes.extend((0..2).map(|i| node(format!("worker-{i}"), "worker", 21 + i)));
    nodes
}

/// The running cluster: VMs, the segment and the host-side namespace bridged onto it.
#[derive(Debug)]
pub struct Cluster {
    /// Working directory (consoles, overlays, config drives, `out/`).
    pub work: PathBuf,
    /// The image every VM boots.
    pub image: PathBuf,
    /// The build output (`keelson build`).
    pub out: PathBuf,
    /// The segment.
    pub segment: Segment,
    /// Running VMs by name.
    pub vms: BTreeMap<String, Vm>,
    /// The nodes.
    pub plan: Vec<NodePlan>,
    /// The host-side participant (dropped after the bridge).
    pub bridge: Option<TapBridge>,
    /// Its namespace.
    pub netns: Netns,
    /// The RHCOS stand-in, when a node boots it.
    pub standin: Option<StandinImage>,
    /// Nodes booted at least once: a stand-in node's later boots keep its disk and run no
    /// Ignition.
    pub booted: std::collections::BTreeSet<String>,
}

impl Cluster {
    /// Creates the namespace and bridges it onto a fresh segment; `plan` says who boots
    /// what, `standin` is the stand-in image if anyone boots it.
    pub fn new(
        work: &Path,
        out: &Path,
        image: &Path,
        plan: Vec<NodePlan>,
        standin: Option<StandinImage>,
    ) -> Result<Self> {
        if plan.iter().any(|n| n.image == ImageKind::Standin) && standin.is_none() {
            bail!("the plan boots the RHCOS stand-in but no stand-in image was given");
        }
        let segment = Segment::for_this_process();
        let netns = Netns::create(&format!("kqc{}", std::process::id() % 100_000))?;
        let bridge = TapBridge::start(segment, &netns.name, "kqtap0")?;
        netns.ip(&[
            "addr",
            "add",
            &format!("{HOST_ADDRESS}/{PREFIX}"),
            "dev",
            "kqtap0",
        ])?;
        netns.ip(&["link", "set", "kqtap0", "up"])?;
        Ok(Cluster {
            work: work.to_path_buf(),
            image: image.to_path_buf(),
            out: out.to_path_buf(),
            segment,
            vms: BTreeMap::new(),
            plan,
            bridge: Some(bridge),
            netns,
            standin,
            booted: Default::default(),
        })
    }

    /// The node's plan entry.
    pub fn node(&self, name: &str) -> Result<&NodePlan> {
        self.plan
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// The user_data for a role: the bootstrap's full config, pointer configs for the rest.
    fn user_data(&self, role: &str) -> Result<Vec<u8>> {
        let path = self.out.join(format!("{role}.ign"));
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Boots (or reboots) one node.
    pub fn boot(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        let drive = NodeDrive {
            name: node.name.clone(),
            uuid: format!("00000000-0000-4000-8000-{:012x}", u32::from(node.address)),
            mac: node.mac.clone(),
            address: node.address,
            prefix: PREFIX,
            user_data: self.user_data(node.role)?,
            meta: BTreeMap::new(),
        };
        let iso = self.work.join(format!("{name}-config.iso"));
        drive.write_iso(&self.work, &iso)?;
        self.vms.remove(name);
        let first_boot = !self.booted.contains(name);
        let spec = match node.image {
            ImageKind::Appliance => VmSpec {
                name: node.name.clone(),
                image: self.image.clone(),
                config_drive: iso,
                mac: node.mac,
                memory_mib: 384,
                uefi: false,
                boot: Boot::Disk,
                keep_disk: false,
                guest_agent: false,
            },
            ImageKind::Standin => {
                let image = self.standin.as_ref().context("no stand-in image")?;
                let cmdline = standin::recipe::cmdline(&BootSpec {
                    hostname: node.name.clone(),
                    network: NodeNetwork::Static {
                        address: node.address,
                        prefix: PREFIX,
                        gateway: None,
                    },
                    first_boot,
                });
                VmSpec {
                    name: node.name.clone(),
                    image: image.root.clone(),
                    config_drive: iso,
                    mac: node.mac,
                    // systemd, NetworkManager and a 35 MiB initramfs unpacked in memory.
                    memory_mib: 768,
                    uefi: false,
                    boot: Boot::Kernel {
                        kernel: image.kernel.clone(),
                        initrd: image.initrd.clone(),
                        cmdline,
                    },
                    // A reboot keeps the disk Ignition wrote on the first boot.
                    keep_disk: !first_boot,
                    guest_agent: true,
                }
            }
        };
        let vm = Vm::start(spec, self.segment, &self.work)?;
        self.vms.insert(name.to_owned(), vm);
        self.booted.insert(name.to_owned());
        Ok(())
    }

    /// Whether `name` boots the RHCOS stand-in.
    pub fn is_standin(&self, name: &str) -> bool {
        self.node(name).is_ok_and(|n| n.image == ImageKind::Standin)
    }

    /// Waits until every named VM printed its ready line; returns when the last one did.
    pub fn wait_ready(&mut self, names: &[String], timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        for name in names {
            let left = timeout.saturating_sub(start.elapsed());
            let vm = self
                .vms
                .get_mut(name)
                .with_context(|| format!("{name} is not running"))?;
            vm.wait_for_console("keelson-agent ready:", left)?;
        }
        Ok(start.elapsed())
    }

    /// Which node's MAC the host sees for `vip` right now (after a fresh ARP).
    pub fn holder_of(&self, vip: &str) -> Option<String> {
        self.netns.flush_neighbour(vip);
        let _ = self
            .netns
            .command("ping")
            .args(["-c", "1", "-W", "1", vip])
            .output();
        let mac = self.netns.neighbour_mac(vip)?;
        self.plan
            .iter()
            .find(|n| n.mac == mac)
            .map(|n| n.name.clone())
    }

    /// Waits until `vip` is held by a node `accept` approves; returns the holder.
    pub fn wait_holder(
        &self,
        vip: &str,
        timeout: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < timeout {
            last = self.holder_of(vip);
            if let Some(holder) = &last
                && accept(holder)
            {
                return Ok(holder.clone());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("{vip}: held by {last:?} after {timeout:?}, not by an expected node")
    }

    /// The last console lines of the named nodes (for a failed scenario); for stand-in
    /// nodes also the journal of `keelson-agent.service` and Ignition's log (journald
    /// forwards every entry to the serial console, `systemd.journald.forward_to_console`).
    pub fn consoles(&self, names: &[&str], lines: usize) -> String {
        let mut text = String::new();
        for name in names {
            let Some(vm) = self.vms.get(*name) else {
                continue;
            };
            text.push_str(&format!(
                "---- {name} (last {lines} lines)\n{}\n",
                vm.console_tail(lines)
            ));
            if self.is_standin(name) {
                let console = vm.console_text();
                for (what, tag, argv) in [
                    (
                        "journal of keelson-agent.service",
                        "keelson-agent[",
                        [
                            "journalctl",
                            "--no-pager",
                            "-q",
                            "-u",
                            "keelson-agent.service",
                        ],
                    ),
                    (
                        "Ignition's log",
                        "ignition[",
                        ["journalctl", "--no-pager", "-q", "-t", "ignition"],
                    ),
                ] {
                    // From the node's journal (every level, every boot) when its guest agent
                    // answers; else the entries journald forwarded to the console.
                    if let Some(journal) = vm
                        .guest
                        .as_ref()
                        .and_then(|g| g.output(&argv, Duration::from_secs(10)).ok())
                    {
                        let entries: Vec<&str> = journal.lines().collect();
                        let shown = &entries[entries.len().saturating_sub(lines)..];
                        text.push_str(&format!(
                            "---- {name}: {what} (`{}`, last {} of {} entries)\n{}\n",
                            argv.join(" "),
                            shown.len(),
                            entries.len(),
                            shown.join("\n")
                        ));
                        continue;
                    }
                    let entries = journal_entries(&console, tag);
                    let shown = &entries[entries.len().saturating_sub(lines)..];
                    text.push_str(&format!(
                        "---- {name}: {what} (from the console, last {} of {} entries)\n{}\n",
                        shown.len(),
                        entries.len(),
                        shown.join("\n")
                    ));
                }
            }
        }
        text
    }
}

/// The journal entries of one syslog identifier (`tag` is `name[`) among the console's
/// lines, as journald forwards them (`[  12.345678] name[pid]: message`).
pub fn journal_entries<'a>(console: &'a str, tag: &str) -> Vec<&'a str> {
    console
        .lines()
        .filter(|l| {
            l.find(tag).is_some_and(|i| {
                // The identifier starts the entry: after the timestamp or the line start.
                l[..i].trim_end().is_empty() || l[..i].trim_end().ends_with(']')
            })
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // VMs first (their Drop kills QEMU), then the bridge, then the namespace.
        self.vms.clear();
        self.bridge.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_entries_by_identifier() {
        let console = "[    3.1] ignition[312]: fetch: fetched referenced config\n\
                       [    3.2] systemd[1]: Started ignition-files.service\n\
                       [   20.0] keelson-agent[640]: keelson-agent ready: node=master-0\n\
                       some keelson-agent[ in the middle\n\
                       ignition[1]: at the start";
        assert_eq!(
            journal_entries(console, "keelson-agent["),
            ["[   20.0] keelson-agent[640]: keelson-agent ready: node=master-0"]
        );
        assert_eq!(journal_entries(console, "ignition[").len(), 2);
    }

    #[test]
    fn masters_boot_what_they_are_told() {
        let p = plan(ImageKind::Standin);
        for n in &p {
            let want = if n.role == "master" {
                ImageKind::Standin
            } else {
                ImageKind::Appliance
            };
            assert_eq!(n.image, want, "{}", n.name);
        }
        assert!(
            plan(ImageKind::Appliance)
                .iter()
                .all(|n| n.image == ImageKind::Appliance)
        );
    }
}
