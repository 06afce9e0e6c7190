//! `network_data.json` (OpenStack's network metadata): links, networks and services.
//!
//! Parsed fully (docs/architecture.md, "Metadata"): phy/vlan/bond links, static and DHCP IPv4/IPv6 networks with
//! routes and DNS servers, and services. Unknown link and network types are kept as
//! [`LinkKind::Other`] / [`NetworkKind::Other`] so a newer cloud never breaks the parse.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The whole document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkData {
    /// Layer-2 links.
    #[serde(default)]
    pub links: Vec<Link>,
    /// Layer-3 networks on those links.
    #[serde(default)]
    pub networks: Vec<Network>,
    /// Services (DNS servers).
    #[serde(default)]
    pub services: Vec<Service>,
}

/// One link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Link id, referenced by networks and by vlan/bond links.
    pub id: String,
    /// Link type.
    #[serde(rename = "type")]
    pub kind: LinkKind,
    /// Interface name suggested by the cloud (often absent or `tap...`; match on MAC).
    #[serde(default)]
    pub name: Option<String>,
    /// MAC address.
    #[serde(default)]
    pub ethernet_mac_address: Option<String>,
    /// MTU.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// VLAN id (vlan links).
    #[serde(default)]
    pub vlan_id: Option<u16>,
    /// Parent link id (vlan links).
    #[serde(default)]
    pub vlan_link: Option<String>,
    /// Member link ids (bond links).
    #[serde(default)]
    pub bond_links: Vec<String>,
    /// Bond mode (bond links), e.g. `802.3ad`, `active-backup`.
    #[serde(default)]
    pub bond_mode: Option<String>,
}

/// Link types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// A physical (or virtio) NIC. OpenStack also writes `ovs`, `bridge`, `tap`, `vif`... for
    /// the same thing; those deserialise as `Other` and are treated as physical.
    Phy,
    /// 802.1Q VLAN on `vlan_link`.
    Vlan,
    /// Bond over `bond_links`.
    Bond,
    /// Any other type string.
    #[serde(untagged)]
    Other(String),
}

/// One network (an address configuration on a link).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Network id.
    pub id: String,
    /// Address configuration type.
    #[serde(rename = "type")]
    pub kind: NetworkKind,
    /// The link id it sits on.
    pub link: String,
    /// Neutron network id.
    #[serde(default)]
    pub network_id: Option<String>,
    /// Static address (ipv4/ipv6). IPv6 may carry a `/prefix`.
    #[serde(default)]
    pub ip_address: Option<String>,
    /// Netmask for static addresses (dotted for IPv4; IPv6 may give a mask or use a prefix).
    #[serde(default)]
    pub netmask: Option<String>,
    /// Static routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Per-network DNS servers (some clouds put them here instead of `services`).
    #[serde(default)]
    pub dns_nameservers: Vec<IpAddr>,
    /// Per-network services.
    #[serde(default)]
    pub services: Vec<Service>,
}

/// Network types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkKind {
    /// Static IPv4.
    Ipv4,
    /// DHCPv4.
    Ipv4Dhcp,
    /// Static IPv6.
    Ipv6,
    /// DHCPv6 (stateful).
    Ipv6Dhcp,
    /// SLAAC.
    Ipv6Slaac,
    /// DHCPv6 stateless.
    #[serde(rename = "ipv6_dhcpv6-stateless")]
    Ipv6Dhcpv6Stateless,
    /// DHCPv6 stateful.
    #[serde(rename = "ipv6_dhcpv6-stateful")]
    Ipv6Dhcpv6Stateful,
    /// Any other type string.
    #[serde(untagged)]
    Other(String),
}

/// A static route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// Destination network address.
    pub network: String,
    /// Destination netmask (dotted or prefix form).
    pub netmask: String,
    /// Next hop.
    pub gateway: String,
}

/// A service entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Service {
    /// Service type (`dns`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Address.
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        /// Any JSON-ish text gives a value or an error, never a panic; valid documents
        /// round-trip through serialisation.
        #[test]
        fn parse_never_panics(text in "[\\[\\]{}\":,a-z0-9_. -]{0,200}") {
            let _ = serde_json::from_str::<NetworkData>(&text);
            let _ = serde_json::from_str::<crate::metadata::MetaData>(&text);
        }

        #[test]
        fn round_trip(mac in "[0-9a-f]{2}(:[0-9a-f]{2}){5}", ip in proptest::array::uniform4(0u8..), mtu in proptest::option::of(576u32..9000)) {
            let data = NetworkData {
                links: vec![Link { id: "l0".into(), kind: LinkKind::Phy, name: None, ethernet_mac_address: Some(mac), mtu, vlan_id: None, vlan_link: None, bond_links: vec![], bond_mode: None }],
                networks: vec![Network { id: "n0".into(), kind: NetworkKind::Ipv4, link: "l0".into(), network_id: None, ip_address: Some(std::net::Ipv4Addr::from(ip).to_string()), netmask: Some("255.255.255.0".into()), routes: vec![], dns_nameservers: vec![], services: vec![] }],
                services: vec![],
            };
            let text = serde_json::to_string(&data).unwrap();
            proptest::prop_assert_eq!(serde_json::from_str::<NetworkData>(&text).unwrap(), data);
        }
    }

    #[test]
    fn unknown_types_are_kept() {
        let data: NetworkData = serde_json::from_str(
            r#"{"links":[{"id":"a","type":"ovs"},{"id":"b","type":"vlan","vlan_id":7,"vlan_link":"a"}],
                "networks":[{"id":"n","type":"ipv6_slaac","link":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(data.links[0].kind, LinkKind::Other("ovs".into()));
        assert_eq!(data.links[1].vlan_id, Some(7));
        assert_eq!(data.networks[0].kind, NetworkKind::Ipv6Slaac);
        let err = serde_json::from_str::<NetworkData>(r#"{"links":[{"type":"phy"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `id`"), "{err}");
    }
}
