//! The example cluster under QEMU: which VMs, with which addresses, and how they are booted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::configdrive::{NetworkMode, NodeDrive};
use crate::guest::GuestAgent;
use crate::netns::Netns;
use crate::neutron::{Dhcp, DhcpHost, DhcpSettings, Instance, MetadataService};
pub use crate::node_plan::{ImageKind, MetadataSource, NodePlan, ServiceFault};
use crate::segment::{BridgeSegment, NicLink, Segment, TapBridge};
use crate::standin::{self, BootSpec, NodeNetwork, StandinImage};
use crate::testbed::{Outside, Testbed};
use crate::vm::{Boot, Vm, VmSpec};

/// The machine network of `examples/install-config.yaml`.
pub const PREFIX: u8 = 16;
/// API VIP of the example.
pub const API_VIP: &str = "10.0.0.5";
/// Ingress VIP of the example.
pub const INGRESS_VIP: &str = "10.0.0.7";
/// The host-side participant's address on the segment.
pub const HOST_ADDRESS: &str = "10.0.0.250";
/// The segment's MTU, as a VXLAN-backed Neutron network has it: handed out by DHCP (option
/// 26) and in `network_data.json`.
pub const MTU: u16 = 1450;
/// The DHCP lease time: dnsmasq's shortest, so every node renews (T1 = 60 s) during a run.
pub const LEASE_SECS: u32 = 120;

/// Which configuration runs, on which segment (docs/qemu-cluster.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// `cluster.json` as `keelson build` writes it: unicast VRRP and unicast members, on a
    /// bridge that drops every multicast frame (the default).
    Unicast,
    /// VRRP multicast and mDNS members, on QEMU's multicast socket segment.
    Multicast,
    /// Both address families: `keelson build`'s unicast defaults for a dual-stack
    /// install-config (each role's IPv6 VIP follows its IPv4 one), every node with a static
    /// IPv6 address beside its IPv4 one, on a learning bridge where multicast passes
    /// (IPv6 neighbour discovery is multicast): [`crate::dual_stack`].
    DualStack,
}

impl std::str::FromStr for Config {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unicast" => Ok(Config::Unicast),
            "multicast" => Ok(Config::Multicast),
            "dualstack" => Ok(Config::DualStack),
            other => bail!("configuration {other:?}: expected unicast, multicast or dualstack"),
        }
    }
}

impl Config {
    /// The name on the command line and in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Config::Unicast => "unicast",
            Config::Multicast => "multicast",
            Config::DualStack => "dualstack",
        }
    }
}

/// What the multicast configuration's segment is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MulticastSegment {
    /// QEMU's multicast socket segment: a hub, every frame to every VM's QEMU (and to the
    /// harness's frame copier, the host-side participant).
    Hub,
    /// A learning bridge of taps where multicast passes (`BridgeSegment::create_switch`):
    /// unicast only to its destination, as on a real switch.
    Switch,
}

impl std::str::FromStr for MulticastSegment {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hub" => Ok(MulticastSegment::Hub),
            "switch" => Ok(MulticastSegment::Switch),
            other => bail!("segment {other:?}: expected hub or switch"),
        }
    }
}

/// What the cluster's payloads are (docs/qemu-cluster.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// `keelson build` of the example install-config alone: keelson's pointers, keelson's
    /// Ignition server on :22623.
    Keelson,
    /// Beside openshift-install (`platform: none`): OpenShift's pointers with keelson's as a
    /// second source, a machine-config-server stand-in on :22623 of the bootstrap and the
    /// masters, keelson's server on :22626, the operator's own configs merged
    /// (`keelson build --openshift-install-dir ... --merge ...`), the network's DNS the API
    /// VIP so the initramfs resolves `api-int`.
    OpenShift,
}

impl Payload {
    /// `QEMU_CLUSTER_PAYLOAD` (`keelson` or `openshift`), else the configuration's default:
    /// the unicast cluster (`keelson build`'s defaults) beside OpenShift, the multicast one
    /// keelson's alone.
    pub fn for_config(config: Config) -> Result<Self> {
        match std::env::var("QEMU_CLUSTER_PAYLOAD").as_deref() {
            Ok("keelson") => Ok(Payload::Keelson),
            Ok("openshift") => Ok(Payload::OpenShift),
            Err(_) | Ok("") => Ok(match config {
                Config::Unicast => Payload::OpenShift,
                Config::Multicast | Config::DualStack => Payload::Keelson,
            }),
            Ok(other) => bail!("QEMU_CLUSTER_PAYLOAD={other:?}: expected keelson or openshift"),
        }
    }

    /// The name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Payload::Keelson => "keelson",
            Payload::OpenShift => "openshift",
        }
    }

    /// The port keelson's Ignition server listens on.
    pub fn keelson_ignition_port(self) -> u16 {
        match self {
            Payload::Keelson => 22623,
            Payload::OpenShift => 22626,
        }
    }

    /// The DNS servers the network hands out: beside OpenShift the API VIP, where keelson's
    /// DNS answers for `api-int` (the pointers name it); else the namespace (no server: the
    /// agents' upstreams fail, which the DNS scenario expects).
    pub fn network_dns(self) -> Vec<Ipv4Addr> {
        match self {
            Payload::Keelson => vec![],
            Payload::OpenShift => vec![API_VIP.parse().expect("API_VIP is an address")],
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

/// Bootstrap 10.0.0.10, masters .11-.13, workers .21-.22; the bootstrap and the workers boot
/// the appliance, the masters `masters`. Half the nodes boot as most clouds
/// boot instances (no config drive: DHCP and the metadata service, with the service's usual
/// faults), the rest from a config drive, static or DHCP.
pub fn plan(masters: ImageKind) -> Vec<NodePlan> {
    use MetadataSource::{ConfigDrive, Service};
    let node = |name: &str, role, host: u8, source| NodePlan {
        mac: format!("52:54:00:0a:00:{host:02x}"),
        address: Ipv4Addr::new(10, 0, 0, host),
        name: name.to_owned(),
        role,
        source,
        image: if role == "master" {
            masters
        } else {
            ImageKind::Appliance
        },
    };
    vec![
        node(
            "bootstrap",
            "bootstrap",
            10,
            ConfigDrive(NetworkMode::Static),
        ),
        node("master-0", "master", 11, ConfigDrive(NetworkMode::Dhcp)),
        node(
            "master-1",
            "master",
            12,
            Service(
                NetworkMode::Dhcp,
                ServiceFault::Slow(Duration::from_secs(2)),
            ),
        ),
        node("master-2", "master", 13, ConfigDrive(NetworkMode::Static)),
        node(
            "worker-0",
            "worker",
            21,
            Service(
                NetworkMode::Static,
                ServiceFault::UnreachableFor(Duration::from_secs(15)),
            ),
        ),
        node(
            "worker-1",
            "worker",
            22,
            Service(NetworkMode::Absent, ServiceFault::None),
        ),
    ]
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
    /// The bridge: one that drops multicast (unicast configuration), or the switch of the
    /// multicast configuration on [`MulticastSegment::Switch`].
    pub bridge_segment: Option<BridgeSegment>,
    /// The host-side participant's interface in [`Cluster::netns`].
    pub host_iface: String,
    /// The VMs by name, from their boot until the next (a killed or powered-off node's
    /// stays, for its console).
    pub vms: BTreeMap<String, Vm>,
    /// The nodes.
    pub plan: Vec<NodePlan>,
    /// The host-side participant (dropped after the bridge).
    pub bridge: Option<TapBridge>,
    /// The segment's DHCP server (in the namespace).
    pub dhcp: Option<Dhcp>,
    /// The metadata service (in the namespace).
    pub metadata: Option<MetadataService>,
    /// Its namespace.
    pub netns: Netns,
    /// The RHCOS stand-in, when a node boots it.
    pub standin: Option<StandinImage>,
    /// Nodes booted at least once: a stand-in node's later boots keep its disk and run no
    /// Ignition.
    pub booted: std::collections::BTreeSet<String>,
    /// What the payloads are.
    pub payload: Payload,
}

impl Cluster {
    /// Creates the namespace and the segment of `config`, with the host-side participant on
    /// it, and starts the segment's DHCP server and metadata service there; `plan` says who
    /// boots what, `standin` is the stand-in image if anyone boots it. The multicast
    /// configuration runs on QEMU's multicast socket segment ([`MulticastSegment::Hub`]).
    pub fn new(
        work: &Path,
        out: &Path,
        image: &Path,
        config: Config,
        payload: Payload,
        plan: Vec<NodePlan>,
        standin: Option<StandinImage>,
    ) -> Result<Self> {
        Self::with_segment(
            work,
            out,
            image,
            config,
            MulticastSegment::Hub,
            payload,
            plan,
            standin,
        )
    }

    /// [`Cluster::new`], the multicast configuration on `multicast` (the unicast one always
    /// runs on its multicast-dropping bridge).
    #[allow(clippy::too_many_arguments)]
    pub fn with_segment(
        work: &Path,
        out: &Path,
        image: &Path,
        config: Config,
        multicast: MulticastSegment,
        payload: Payload,
        plan: Vec<NodePlan>,
        standin: Option<StandinImage>,
    ) -> Result<Self> {
        crate::tools::require_all()?;
        if plan.iter().any(|n| n.image == ImageKind::Standin) && standin.is_none() {
            bail!("the plan boots the RHCOS stand-in but no stand-in image was given");
        }
        let segment = Segment::for_this_process();
        let netns = Netns::try_named(&format!("kqc{}", std::process::id() % 100_000))?;
        let (bridge, bridge_segment, host_iface) = match config {
            Config::Multicast if multicast == MulticastSegment::Switch => (
                None,
                Some(BridgeSegment::create_switch(netns.name(), "kqbr0")?),
                "kqbr0",
            ),
            Config::Multicast => (
                Some(TapBridge::start(segment, netns.name(), "kqtap0")?),
                None,
                "kqtap0",
            ),
            Config::Unicast => (
                None,
                Some(BridgeSegment::create(netns.name(), "kqbr0")?),
                "kqbr0",
            ),
            Config::DualStack => (
                None,
                Some(BridgeSegment::create_switch(netns.name(), "kqbr0")?),
                "kqbr0",
            ),
        };
        if config == Config::DualStack {
            crate::dual_stack::add_host_address(&netns, host_iface)?;
        }
        netns.try_ip(&[
            "addr",
            "add",
            &format!("{HOST_ADDRESS}/{PREFIX}"),
            "dev",
            host_iface,
        ])?;
        netns.try_ip(&["link", "set", host_iface, "mtu", &MTU.to_string(), "up"])?;
        let mut cluster = Cluster {
            config,
            work: work.to_path_buf(),
            image: image.to_path_buf(),
            out: out.to_path_buf(),
            segment,
            bridge_segment,
            host_iface: host_iface.to_string(),
            vms: BTreeMap::new(),
            plan,
            bridge,
            dhcp: None,
            metadata: None,
            netns,
            standin,
            booted: Default::default(),
            payload,
        };
        let hosts: Vec<DhcpHost> = cluster
            .plan
            .iter()
            .map(|n| DhcpHost {
                mac: n.mac.clone(),
                address: n.address,
                name: n.name.clone(),
            })
            .collect();
        let settings = DhcpSettings {
            interface: cluster.host_iface.clone(),
            server: HOST_ADDRESS.parse()?,
            prefix: PREFIX,
            mtu: MTU,
            lease_secs: LEASE_SECS,
            dns: payload.network_dns(),
        };
        cluster.dhcp = Some(Dhcp::start(&cluster.netns, &settings, &hosts, work)?);
        let mut instances = BTreeMap::new();
        for node in cluster.plan.clone() {
            if let MetadataSource::Service(_, fault) = node.source {
                let drive = cluster.drive(&node)?;
                instances.insert(
                    node.address,
                    Instance {
                        meta_data: serde_json::to_vec(&drive.meta_data())?,
                        network_data: drive
                            .network_data()
                            .map(|d| serde_json::to_vec(&d))
                            .transpose()?,
                        user_data: drive.user_data.clone(),
                        delay: match fault {
                            ServiceFault::Slow(d) => d,
                            _ => Duration::ZERO,
                        },
                    },
                );
            }
        }
        cluster.metadata = Some(MetadataService::start(
            &cluster.netns,
            &cluster.host_iface,
            instances,
        )?);
        Ok(cluster)
    }

    /// What the node's config drive (or the metadata service) says about it.
    fn drive(&self, node: &NodePlan) -> Result<NodeDrive> {
        let network = match node.source {
            MetadataSource::ConfigDrive(m) | MetadataSource::Service(m, _) => m,
        };
        Ok(NodeDrive {
            name: node.name.clone(),
            uuid: format!("00000000-0000-4000-8000-{:012x}", u32::from(node.address)),
            mac: node.mac.clone(),
            address: node.address,
            prefix: PREFIX,
            network,
            mtu: MTU,
            user_data: self.user_data(node.role)?,
            meta: BTreeMap::new(),
            dns: self.payload.network_dns(),
            address6: (self.config == Config::DualStack)
                .then(|| crate::dual_stack::node_address(node.address)),
        })
    }

    /// Multicast frames the unicast configuration's bridge dropped so far.
    pub fn multicast_dropped(&self) -> Result<Option<u64>> {
        self.bridge_segment
            .as_ref()
            .filter(|b| b.drops_multicast())
            .map(BridgeSegment::multicast_dropped)
            .transpose()
    }

    /// Frames of the segment each running VM's NIC never received because the host could
    /// not queue them towards its QEMU, so far: on the hub, the drops at its QEMU's UDP
    /// socket (a full receive buffer); on a bridge, its tap's TX drops. By node name; on the
    /// hub also `copier`, the drops at the harness's own sockets (the frame copier's).
    pub fn segment_drops(&self) -> BTreeMap<String, u64> {
        let mut drops: BTreeMap<String, u64> = self
            .vms
            .iter()
            .filter_map(|(name, vm)| {
                let dropped = match &self.bridge_segment {
                    Some(b) => b.tap_drops(&format!("kqt-{name}")).ok(),
                    None => vm.pid().and_then(crate::segment::udp_drops_of),
                };
                dropped.map(|d| (name.clone(), d))
            })
            .collect();
        if self.bridge.is_some()
            && let Some(d) = crate::segment::udp_drops_of(std::process::id())
        {
            drops.insert("copier".into(), d);
        }
        drops
    }

    /// What the segment is, for the report.
    pub fn segment_text(&self) -> String {
        match (&self.bridge_segment, self.config) {
            (Some(b), Config::Unicast) => format!(
                "bridge {} of taps in {}, every multicast frame dropped (checked)",
                b.bridge,
                self.netns.name()
            ),
            (Some(b), Config::Multicast | Config::DualStack) => format!(
                "bridge {} of taps in {}, a learning switch where multicast passes",
                b.bridge,
                self.netns.name()
            ),
            (None, _) => format!(
                "QEMU multicast socket {}:{} (a hub)",
                self.segment.group, self.segment.port
            ),
        }
    }

    /// The user_data for a role: the bootstrap's full config, pointer configs for the rest.
    fn user_data(&self, role: &str) -> Result<Vec<u8>> {
        let path = self.out.join(format!("{role}.ign"));
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Boots (or reboots) one node: with its config drive, or without one (then its metadata
    /// comes from the service, with the fault its plan names on the first boot); the
    /// appliance, or the RHCOS stand-in (a reboot keeps the disk Ignition wrote).
    pub fn boot(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        let drive = self.drive(&node)?;
        let config_drive = match node.source {
            MetadataSource::ConfigDrive(_) => {
                let iso = self.work.join(format!("{name}-config.iso"));
                drive.write_iso(&self.work, &iso)?;
                Some(iso)
            }
            MetadataSource::Service(..) => None,
        };
        let first_boot = !self.booted.contains(name);
        // The old VM (and with it its tap) goes first.
        self.vms.remove(name);
        if first_boot
            && let MetadataSource::Service(_, ServiceFault::UnreachableFor(d)) = node.source
        {
            self.drop_metadata_for(node.address, &node.mac, d)?;
        }
        let link: NicLink = match &self.bridge_segment {
            Some(b) => b.tap(&format!("kqt-{name}"))?,
            None => self.segment.into(),
        };
        let spec = match node.image {
            ImageKind::Appliance => VmSpec {
                name: node.name.clone(),
                image: self.image.clone(),
                config_drive,
                mac: node.mac,
                memory_mib: 384,
                uefi: false,
                boot: Boot::Disk,
                keep_disk: false,
                guest_agent: false,
            },
            ImageKind::Standin => {
                let image = self.standin.as_ref().context("no stand-in image")?;
                // As RHCOS on OpenStack: DHCP, unless the network has no DHCP (a static
                // network_data.json), where static addressing is `ip=` kernel arguments.
                let network = match drive.network {
                    NetworkMode::Static => NodeNetwork::Static {
                        address: node.address,
                        prefix: PREFIX,
                        gateway: None,
                    },
                    NetworkMode::Dhcp | NetworkMode::Absent => NodeNetwork::Dhcp,
                };
                let cmdline = standin::recipe::cmdline(&BootSpec {
                    hostname: node.name.clone(),
                    network,
                    first_boot,
                    nameservers: self.payload.network_dns(),
                });
                VmSpec {
                    name: node.name.clone(),
                    image: image.root.clone(),
                    config_drive,
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
        let vm = Vm::start(spec, link, &self.work)?;
        self.vms.insert(name.to_owned(), vm);
        self.booted.insert(name.to_owned());
        Ok(())
    }

    /// Drops `address`'s packets to the metadata service (an nftables rule in the namespace)
    /// until `duration` after the node got its DHCP lease, so the node really meets the
    /// outage however long its boot took (a timer thread removes the rule).
    fn drop_metadata_for(&self, address: Ipv4Addr, mac: &str, duration: Duration) -> Result<()> {
        let table = format!("kqfault{}", u32::from(address) & 0xff);
        let rules = format!(
            "table inet {table} {{ chain input {{ type filter hook input priority 0; \
             ip saddr {address} ip daddr {} tcp dport 80 drop; }}; }}",
            crate::neutron::METADATA_ADDRESS
        );
        let nft = crate::tools::require("nft")?;
        let out = crate::netns::output_with_stdin(self.netns.exec(&nft).args(["-f", "-"]), &rules)?;
        if !out.status.success() {
            bail!(
                "nft (metadata fault for {address}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut delete = self.netns.exec(&nft);
        delete.args(["delete", "table", "inet", &table]);
        let log = self.dhcp.as_ref().context("no DHCP server")?.log.clone();
        let mac = mac.to_owned();
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(600)
                && !std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.contains("DHCPACK") && l.contains(&mac))
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            std::thread::sleep(duration);
            let _ = delete.output();
        });
        Ok(())
    }

    /// Which source each node's agent says its metadata came from (its console's
    /// `metadata from ...` line), for the report.
    pub fn metadata_sources(&self) -> Vec<(String, String)> {
        self.plan
            .iter()
            .map(|n| {
                let said = self
                    .vms
                    .get(&n.name)
                    .and_then(|vm| {
                        vm.console_text()
                            .lines()
                            .find_map(|l| l.split("metadata from ").nth(1).map(str::to_owned))
                    })
                    .unwrap_or_else(|| "(not booted)".into());
                (n.name.clone(), said)
            })
            .collect()
    }
}

impl Testbed for Cluster {
    fn plan(&self) -> &[NodePlan] {
        &self.plan
    }

    fn out_dir(&self) -> &std::path::Path {
        &self.out
    }

    fn outside(&self) -> Outside<'_> {
        Outside {
            netns: &self.netns,
            iface: &self.host_iface,
            address: HOST_ADDRESS.parse().expect("HOST_ADDRESS is an address"),
        }
    }

    fn start_all(&mut self) -> Result<()> {
        for node in self.plan.clone() {
            self.boot(&node.name)?;
        }
        Ok(())
    }

    fn restart(&mut self, name: &str) -> Result<()> {
        self.boot(name)
    }

    /// ACPI power button (QEMU's `system_powerdown`), then waits for QEMU to exit.
    fn power_off(&mut self, name: &str) -> Result<()> {
        self.vms
            .get_mut(name)
            .with_context(|| format!("{name} not running"))?
            .power_off(Duration::from_secs(60))?;
        Ok(())
    }

    /// QEMU's `quit`: the node dies without a goodbye.
    fn kill(&mut self, name: &str) -> Result<Instant> {
        let vm = self
            .vms
            .get_mut(name)
            .with_context(|| format!("{name} not running"))?;
        // QEMU's `quit` stops the guest at once.
        let at = Instant::now();
        vm.kill()?;
        Ok(at)
    }

    /// A killed or powered-off node's QEMU was reaped: it has no process any more, though
    /// its `Vm` stays (for its console) until the next boot.
    fn is_running(&self, name: &str) -> bool {
        self.vms.get(name).is_some_and(|vm| vm.pid().is_some())
    }

    fn console_text(&self, name: &str) -> String {
        self.vms
            .get(name)
            .map(|vm| vm.console_text())
            .unwrap_or_default()
    }

    fn wait_console(&mut self, name: &str, needle: &str, timeout: Duration) -> Result<String> {
        self.vms
            .get_mut(name)
            .with_context(|| format!("{name} is not running"))?
            .wait_for_console(needle, timeout)
    }

    fn guest(&self, name: &str) -> Option<GuestAgent> {
        self.vms.get(name).and_then(|vm| vm.guest.clone())
    }

    fn payload(&self) -> Payload {
        self.payload
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // VMs first (their Drop kills QEMU), then the services, the bridge, the namespace.
        self.vms.clear();
        self.metadata.take();
        self.dhcp.take();
        self.bridge.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
