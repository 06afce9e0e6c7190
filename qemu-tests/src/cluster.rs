//! The example cluster under QEMU: which VMs, with which addresses, and how they are booted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::configdrive::NodeDrive;
use crate::netns::Netns;
use crate::segment::{BridgeSegment, NicLink, Segment, TapBridge};
use crate::vm::{Vm, VmSpec};

/// The machine network of `examples/install-config.yaml`.
pub const PREFIX: u8 = 16;
/// API VIP of the example.
pub const API_VIP: &str = "10.0.0.5";
/// Ingress VIP of the example.
pub const INGRESS_VIP: &str = "10.0.0.7";
/// The host-side participant's address on the segment.
pub const HOST_ADDRESS: &str = "10.0.0.250";

/// Which configuration runs, on which segment (docs/qemu-cluster.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// `cluster.json` as `keelson build` writes it: unicast VRRP and unicast members, on a
    /// bridge that drops every multicast frame (the default).
    Unicast,
    /// VRRP multicast and mDNS members, on QEMU's multicast socket segment.
    Multicast,
}

impl std::str::FromStr for Config {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unicast" => Ok(Config::Unicast),
            "multicast" => Ok(Config::Multicast),
            other => bail!("configuration {other:?}: expected unicast or multicast"),
        }
    }
}

impl Config {
    /// The name on the command line and in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Config::Unicast => "unicast",
            Config::Multicast => "multicast",
        }
    }
}

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
}

/// Bootstrap 10.0.0.10, masters .11-.13, workers .21-.22.
pub fn plan() -> Vec<NodePlan> {
    let node = |name: String, role, host: u8| NodePlan {
        mac: format!("52:54:00:0a:00:{host:02x}"),
        address: Ipv4Addr::new(10, 0, 0, host),
        name,
        role,
    };
    let mut nodes = vec![node("bootstrap".into(), "bootstrap", 10)];
    nodes.extend((0..3).map(|i| node(format!("master-{i}"), "master", 11 + i)));
    nodes.extend((0..2).map(|i| node(format!("worker-{i}"), "worker", 21 + i)));
    nodes
}

/// The running cluster: VMs, the segment and the host-side namespace on it.
#[derive(Debug)]
pub struct Cluster {
    /// The configuration.
    pub config: Config,
    /// Working directory (consoles, overlays, config drives, `out/`).
    pub work: PathBuf,
    /// The image every VM boots.
    pub image: PathBuf,
    /// The build output (`keelson build`).
    pub out: PathBuf,
    /// The multicast segment (multicast configuration).
    pub segment: Segment,
    /// The bridge that drops multicast (unicast configuration).
    pub bridge_segment: Option<BridgeSegment>,
    /// The host-side participant's interface in [`Cluster::netns`].
    pub host_iface: String,
    /// Running VMs by name.
    pub vms: BTreeMap<String, Vm>,
    /// The nodes.
    pub plan: Vec<NodePlan>,
    /// The host-side participant (dropped after the bridge).
    pub bridge: Option<TapBridge>,
    /// Its namespace.
    pub netns: Netns,
}

impl Cluster {
    /// Creates the namespace and the segment of `config`, with the host-side participant
    /// on it.
    pub fn new(work: &Path, out: &Path, image: &Path, config: Config) -> Result<Self> {
        let segment = Segment::for_this_process();
        let netns = Netns::create(&format!("kqc{}", std::process::id() % 100_000))?;
        let (bridge, bridge_segment, host_iface) = match config {
            Config::Multicast => (
                Some(TapBridge::start(segment, &netns.name, "kqtap0")?),
                None,
                "kqtap0",
            ),
            Config::Unicast => (
                None,
                Some(BridgeSegment::create(&netns.name, "kqbr0")?),
                "kqbr0",
            ),
        };
        netns.ip(&[
            "addr",
            "add",
            &format!("{HOST_ADDRESS}/{PREFIX}"),
            "dev",
            host_iface,
        ])?;
        netns.ip(&["link", "set", host_iface, "up"])?;
        Ok(Cluster {
            config,
            work: work.to_path_buf(),
            image: image.to_path_buf(),
            out: out.to_path_buf(),
            segment,
            bridge_segment,
            host_iface: host_iface.to_string(),
            vms: BTreeMap::new(),
            plan: plan(),
            bridge,
            netns,
        })
    }

    /// Multicast frames the unicast configuration's bridge dropped so far.
    pub fn multicast_dropped(&self) -> Result<Option<u64>> {
        self.bridge_segment
            .as_ref()
            .map(BridgeSegment::multicast_dropped)
            .transpose()
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
        // The old VM (and with it its tap) goes first.
        self.vms.remove(name);
        let link: NicLink = match &self.bridge_segment {
            Some(b) => b.tap(&format!("kqt-{name}"))?,
            None => self.segment.into(),
        };
        let vm = Vm::start(
            VmSpec {
                name: node.name.clone(),
                image: self.image.clone(),
                config_drive: iso,
                mac: node.mac,
                memory_mib: 384,
                uefi: false,
            },
            link,
            &self.work,
        )?;
        self.vms.insert(name.to_owned(), vm);
        Ok(())
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

    /// Every node answering ARP for `vip` right now (by MAC; an unknown MAC as itself).
    pub fn holders_of(&self, vip: &str) -> Result<Vec<String>> {
        let macs = crate::probe::arp_answers(
            &self.netns,
            &self.host_iface,
            HOST_ADDRESS.parse()?,
            vip.parse()?,
            Duration::from_millis(500),
        )?;
        Ok(macs
            .into_iter()
            .map(|mac| {
                self.plan
                    .iter()
                    .find(|n| n.mac == mac)
                    .map(|n| n.name.clone())
                    .unwrap_or(mac)
            })
            .collect())
    }

    /// Waits (up to `timeout`) until exactly one node answers ARP for `vip`, twice in a row
    /// a second apart; returns it, or fails naming every holder (several holders is the
    /// failure of issue 22: every node holding the VIP).
    pub fn sole_holder(&self, vip: &str, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        let mut last = Vec::new();
        let mut seen: Option<String> = None;
        while start.elapsed() < timeout {
            last = self.holders_of(vip)?;
            match (last.as_slice(), &seen) {
                ([one], Some(prev)) if one == prev => return Ok(one.clone()),
                ([one], _) => seen = Some(one.clone()),
                _ => seen = None,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("{vip}: answered by {last:?} after {timeout:?}, expected exactly one node")
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

    /// The last console lines of the named nodes (for a failed scenario).
    pub fn consoles(&self, names: &[&str], lines: usize) -> String {
        let mut text = String::new();
        for name in names {
            if let Some(vm) = self.vms.get(*name) {
                text.push_str(&format!(
                    "---- {name} (last {lines} lines)\n{}\n",
                    vm.console_tail(lines)
                ));
            }
        }
        text
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // VMs first (their Drop kills QEMU), then the bridge, then the namespace.
        self.vms.clear();
        self.bridge.take();
    }
}
