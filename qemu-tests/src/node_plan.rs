//! What a test cluster is made of, whoever runs it (QEMU and our Neutron stand-in, or a real
//! OpenStack): its nodes, what each boots and where its metadata comes from.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::configdrive::NetworkMode;

/// Where a node's metadata comes from: the ways clouds give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataSource {
    /// A config drive (ISO 9660, `config-2`) whose `network_data.json` says this.
    ConfigDrive(NetworkMode),
    /// No config drive (most clouds' default): DHCP, then the metadata service at
    /// 169.254.169.254 with this `network_data.json`, showing this fault.
    Service(NetworkMode, ServiceFault),
}

/// A metadata-service fault a node meets on its first boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceFault {
    /// Answers at once.
    None,
    /// Every answer takes this long.
    Slow(Duration),
    /// Unreachable (its packets dropped) for this long after the VM starts.
    UnreachableFor(Duration),
}

impl MetadataSource {
    /// For the report: `config drive (ipv4_dhcp)`, `metadata service (no network_data, slow)`.
    pub fn describe(&self) -> String {
        let net = |m: &NetworkMode| match m {
            NetworkMode::Static => "static ipv4",
            NetworkMode::Dhcp => "ipv4_dhcp",
            NetworkMode::Absent => "no network_data.json",
        };
        match self {
            MetadataSource::ConfigDrive(m) => format!("config drive ({})", net(m)),
            MetadataSource::Service(m, f) => format!(
                "DHCP + metadata service ({}{})",
                net(m),
                match f {
                    ServiceFault::None => String::new(),
                    ServiceFault::Slow(d) => format!(", {} s per answer", d.as_secs()),
                    ServiceFault::UnreachableFor(d) =>
                        format!(", unreachable for {} s after the lease", d.as_secs()),
                }
            ),
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
    /// Where its metadata comes from.
    pub source: MetadataSource,
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
