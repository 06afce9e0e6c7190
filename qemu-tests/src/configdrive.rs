//! OpenStack config drives for the test VMs: an ISO 9660 image labelled `config-2` holding
//! `openstack/latest/{meta_data.json,network_data.json,user_data}`, as Nova writes them.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

/// What `network_data.json` says about the instance's network, as Nova writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// A static IPv4 network (`"type": "ipv4"`): a subnet without DHCP.
    Static,
    /// `"type": "ipv4_dhcp"`: a subnet with DHCP enabled, the common case.
    Dhcp,
    /// No `network_data.json` at all (older clouds, the EC2 tree).
    Absent,
}

/// What one VM's config drive (or the metadata service) says about it.
#[derive(Debug, Clone)]
pub struct NodeDrive {
    /// Host name (also the node name).
    pub name: String,
    /// Stable UUID for the instance.
    pub uuid: String,
    /// The NIC's MAC address.
    pub mac: String,
    /// Static IPv4 address on the segment.
    pub address: Ipv4Addr,
    /// Prefix length of the segment.
    pub prefix: u8,
    /// How `network_data.json` describes the network.
    pub network: NetworkMode,
    /// The link MTU it states.
    pub mtu: u16,
    /// The Ignition config given as user_data.
    pub user_data: Vec<u8>,
    /// Instance properties (`openstack server create --property k=v`), `meta` in meta_data.
    pub meta: std::collections::BTreeMap<String, String>,
    /// The network's DNS servers (`services` of type `dns`, as Nova writes a subnet's).
    pub dns: Vec<Ipv4Addr>,
    /// A static IPv6 address in a /64 on the same link (a dual-stack network: a second
    /// subnet, of type `ipv6`, as Nova writes one without DHCPv6 or SLAAC).
    pub address6: Option<Ipv6Addr>,
}

impl NodeDrive {
    /// `meta_data.json` as Nova writes it (the fields the agent reads, and a few more).
    pub fn meta_data(&self) -> serde_json::Value {
        json!({
            "uuid": self.uuid,
            "name": self.name,
            "hostname": format!("{}.novalocal", self.name),
            "launch_index": 0,
            "availability_zone": "nova",
            "project_id": "6f70656e737461636b20697320636f6f6c",
            "meta": self.meta,
            "devices": [],
        })
    }

    /// `network_data.json` with one physical link and an IPv4 network on it (static or
    /// DHCP); `None` for [`NetworkMode::Absent`].
    pub fn network_data(&self) -> Option<serde_json::Value> {
        let netmask = Ipv4Addr::from(u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0));
        let network = match self.network {
            NetworkMode::Absent => return None,
            NetworkMode::Static => json!({
                "id": "network0",
                "type": "ipv4",
                "link": "tap-keelson0",
                "ip_address": self.address.to_string(),
                "netmask": netmask.to_string(),
                "routes": [],
                "network_id": "00000000-0000-0000-0000-00000000cafe",
            }),
            NetworkMode::Dhcp => json!({
                "id": "network0",
                "type": "ipv4_dhcp",
                "link": "tap-keelson0",
                "network_id": "00000000-0000-0000-0000-00000000cafe",
            }),
        };
        let mut networks = vec![network];
        if let Some(address6) = self.address6 {
            networks.push(json!({
                "id": "network1",
                "type": "ipv6",
                "link": "tap-keelson0",
                "ip_address": address6.to_string(),
                "netmask": "ffff:ffff:ffff:ffff::",
                "routes": [],
                "network_id": "00000000-0000-0000-0000-00000000cafe",
            }));
        }
        Some(json!({
            "links": [{
                "id": "tap-keelson0",
                "type": "phy",
                "ethernet_mac_address": self.mac,
                "mtu": self.mtu,
                "vif_id": self.uuid,
            }],
            "networks": networks,
            "services": self
                .dns
                .iter()
                .map(|a| json!({"type": "dns", "address": a.to_string()}))
                .collect::<Vec<_>>(),
        }))
    }

    /// Writes the config drive ISO to `iso` (xorriso, Rock Ridge + Joliet as genisoimage does).
    pub fn write_iso(&self, work: &Path, iso: &Path) -> Result<()> {
        let root = work.join(format!("{}-drive", self.name));
        let latest = root.join("openstack/latest");
        std::fs::create_dir_all(&latest)
            .with_context(|| format!("creating {}", latest.display()))?;
        std::fs::write(
            latest.join("meta_data.json"),
            serde_json::to_vec_pretty(&self.meta_data())?,
        )?;
        if let Some(network_data) = self.network_data() {
            std::fs::write(
                latest.join("network_data.json"),
                serde_json::to_vec_pretty(&network_data)?,
            )?;
        }
        std::fs::write(latest.join("user_data"), &self.user_data)?;
        let out = Command::new(crate::tools::require("xorriso")?)
            .args([
                "-as", "mkisofs", "-quiet", "-R", "-J", "-V", "config-2", "-o",
            ])
            .arg(iso)
            .arg(&root)
            .output()
            .context("running xorriso")?;
        if !out.status.success() {
            bail!(
                "xorriso failed for {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmask_from_prefix() {
        let drive = NodeDrive {
            name: "master-0".into(),
            uuid: "u".into(),
            mac: "52:54:00:00:00:01".into(),
            address: Ipv4Addr::new(10, 0, 0, 11),
            prefix: 16,
            network: NetworkMode::Static,
            mtu: 1500,
            user_data: vec![],
            meta: Default::default(),
            dns: vec![Ipv4Addr::new(10, 0, 0, 5)],
            address6: None,
        };
        assert_eq!(
            drive.network_data().unwrap()["networks"][0]["netmask"],
            "255.255.0.0"
        );
        let drive = NodeDrive {
            prefix: 24,
            ..drive
        };
        assert_eq!(
            drive.network_data().unwrap()["networks"][0]["netmask"],
            "255.255.255.0"
        );
        let dhcp = NodeDrive {
            network: NetworkMode::Dhcp,
            ..drive.clone()
        };
        let data = dhcp.network_data().unwrap();
        assert_eq!(data["networks"][0]["type"], "ipv4_dhcp");
        assert!(data["networks"][0].get("ip_address").is_none());
        let absent = NodeDrive {
            network: NetworkMode::Absent,
            ..drive.clone()
        };
        assert!(absent.network_data().is_none());
        let dual = NodeDrive {
            network: NetworkMode::Dhcp,
            address6: Some("fd00::11".parse().unwrap()),
            ..drive
        };
        let data = dual.network_data().unwrap();
        assert_eq!(data["networks"][0]["type"], "ipv4_dhcp");
        assert_eq!(data["networks"][1]["type"], "ipv6");
        assert_eq!(data["networks"][1]["ip_address"], "fd00::11");
        assert_eq!(data["networks"][1]["link"], data["links"][0]["id"]);
    }
}
