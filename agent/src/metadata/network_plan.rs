//! Pure: from `network_data.json` and the machine's links to what to configure where (the
//! [`NetworkPlan`] that `net::Netlink` applies).

use std::net::IpAddr;

use ipnet::IpNet;

use super::network::{LinkKind, NetworkData, NetworkKind};
use crate::net::plan::{InterfacePlan, LinkInfo, NetworkPlan, RoutePlan};

/// Errors in network_data that make it unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// A field is malformed; names it.
    #[error("network_data.json {field}: {message}")]
    Invalid {
        /// JSON path.
        field: String,
        /// What was expected.
        message: String,
    },
}

/// A netmask (`255.255.255.0`, `ffff:ffff::`) or prefix length (`24`) to a prefix length.
pub fn prefix_len(netmask: &str) -> Option<u8> {
    if let Ok(n) = netmask.parse::<u8>() {
        return Some(n);
    }
    let bits = match netmask.parse::<IpAddr>().ok()? {
        IpAddr::V4(m) => u128::from(u32::from(m)) << 96,
        IpAddr::V6(m) => u128::from(m),
    };
    let ones = bits.leading_ones();
    // A netmask is contiguous ones then zeros.
    (bits.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

/// The links a network can sit on, by MAC first (names in network_data are often `tap...`).
fn find_link<'a>(data: &NetworkData, link_id: &str, links: &'a [LinkInfo]) -> Option<&'a LinkInfo> {
    let link = data.links.iter().find(|l| l.id == link_id)?;
    if !matches!(link.kind, LinkKind::Phy | LinkKind::Other(_)) {
        return None;
    }
    if let Some(mac) = &link.ethernet_mac_address {
        let mac = mac.to_ascii_lowercase();
        if let Some(found) = links.iter().find(|l| l.mac == mac) {
            return Some(found);
        }
    }
    link.name
        .as_ref()
        .and_then(|name| links.iter().find(|l| &l.name == name))
}

/// Plans the configuration. Networks on links that are not present (or vlan/bond links, not
/// yet configured by the agent) are skipped with a line; without network_data the first
/// Ethernet interface gets DHCPv4.
// Over 100 lines on purpose: network_data.json's networks with their routes and DNS, then
// its services, in one pass that keeps the interface table they share.
pub fn plan(data: Option<&NetworkData>, links: &[LinkInfo]) -> Result<NetworkPlan, PlanError> {
    let mut out = NetworkPlan::default();
    let Some(data) = data else {
        if let Some(first) = links.iter().find(|l| !l.mac.is_empty() && l.name != "lo") {
            out.interfaces.push(InterfacePlan {
                link: first.clone(),
                mtu: None,
                addresses: vec![],
                routes: vec![],
                dhcp4: true,
            });
        }
        return Ok(out);
    };
    for (i, network) in data.networks.iter().enumerate() {
        let field = |f: &str| format!("networks[{i}].{f}");
        let Some(link) = find_link(data, &network.link, links) else {
            out.skipped.push(format!(
                "networks[{i}] ({}): link {:?} not found among this machine's interfaces",
                network.id, network.link
            ));
            continue;
        };
        let at = match out.interfaces.iter().position(|p| p.link == *link) {
            Some(at) => at,
            None => {
                let mtu = data
                    .links
                    .iter()
                    .find(|l| l.id == network.link)
                    .and_then(|l| l.mtu);
                out.interfaces.push(InterfacePlan {
                    link: link.clone(),
                    mtu,
                    addresses: vec![],
                    routes: vec![],
                    dhcp4: false,
                });
                out.interfaces.len() - 1
            }
        };
        let entry = &mut out.interfaces[at];
        match &network.kind {
            NetworkKind::Ipv4 | NetworkKind::Ipv6 => {
                let text = network
                    .ip_address
                    .as_deref()
                    .ok_or_else(|| PlanError::Invalid {
                        field: field("ip_address"),
                        message: "expected an address for a static network".into(),
                    })?;
                let (addr_text, inline_prefix) = match text.split_once('/') {
                    Some((a, p)) => (a, Some(p)),
                    None => (text, None),
                };
                let addr: IpAddr = addr_text.parse().map_err(|_| PlanError::Invalid {
                    field: field("ip_address"),
                    message: format!("expected an IP address, got {text:?}"),
                })?;
                let prefix = inline_prefix
                    .or(network.netmask.as_deref())
                    .and_then(prefix_len)
                    .or(if addr.is_ipv6() { Some(64) } else { None })
                    .ok_or_else(|| PlanError::Invalid {
                        field: field("netmask"),
                        message: format!("expected a netmask, got {:?}", network.netmask),
                    })?;
                let net = IpNet::new(addr, prefix).map_err(|_| PlanError::Invalid {
                    field: field("netmask"),
                    message: format!("prefix {prefix} too long for {addr}"),
                })?;
                entry.addresses.push(net);
            }
            NetworkKind::Ipv4Dhcp => entry.dhcp4 = true,
            other => out.skipped.push(format!(
                "networks[{i}] ({}): type {other:?} not configured by the agent",
                network.id
            )),
        }
        for (j, route) in network.routes.iter().enumerate() {
            let rfield = |f: &str| format!("networks[{i}].routes[{j}].{f}");
            let dest: IpAddr = route.network.parse().map_err(|_| PlanError::Invalid {
                field: rfield("network"),
                message: format!("expected an IP address, got {:?}", route.network),
            })?;
            let prefix = prefix_len(&route.netmask).ok_or_else(|| PlanError::Invalid {
                field: rfield("netmask"),
                message: format!("expected a netmask, got {:?}", route.netmask),
            })?;
            let gateway: IpAddr = route.gateway.parse().map_err(|_| PlanError::Invalid {
                field: rfield("gateway"),
                message: format!("expected an IP address, got {:?}", route.gateway),
            })?;
            let destination = IpNet::new(dest, prefix)
                .map_err(|_| PlanError::Invalid {
                    field: rfield("netmask"),
                    message: "prefix too long".into(),
                })?
                .trunc();
            entry.routes.push(RoutePlan {
                destination,
                gateway,
            });
        }
        for dns in &network.dns_nameservers {
            push_unique(&mut out.dns, *dns);
        }
    }
    for service in &data.services {
        if service.kind == "dns"
            && let Ok(addr) = service.address.parse()
        {
            push_unique(&mut out.dns, addr);
        }
    }
    Ok(out)
}

fn push_unique(list: &mut Vec<IpAddr>, addr: IpAddr) {
    if !list.contains(&addr) {
        list.push(addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, mac: &str) -> LinkInfo {
        LinkInfo {
            index,
            name: name.into(),
            mac: mac.into(),
        }
    }

    fn fixture(name: &str) -> NetworkData {
        let path = format!(
            "{}/../testdata/openstack-metadata/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn netmasks() {
        assert_eq!(prefix_len("255.255.255.0"), Some(24));
        assert_eq!(prefix_len("255.255.255.192"), Some(26));
        assert_eq!(prefix_len("0.0.0.0"), Some(0));
        assert_eq!(prefix_len("ffff:ffff:ffff:ffff::"), Some(64));
        assert_eq!(prefix_len("16"), Some(16));
        assert_eq!(prefix_len("255.0.255.0"), None, "not contiguous");
        assert_eq!(prefix_len("junk"), None);
    }

    #[test]
    fn kubevirt_fixture_by_mac() {
        let data = fixture("kubevirt_config_drive_openstack_latest_network_data.json");
        let links = [link(1, "lo", ""), link(2, "ens3", "06:aa:bb:cc:dd:00")];
        let plan = plan(Some(&data), &links).unwrap();
        let first = &plan.interfaces[0];
        assert_eq!(
            first.link.name, "ens3",
            "matched by MAC, not by the name eth0"
        );
        assert_eq!(first.addresses[0].to_string(), "192.168.1.10/24");
        assert_eq!(first.routes[0].destination.to_string(), "0.0.0.0/0");
        assert_eq!(first.routes[0].gateway.to_string(), "192.168.1.1");
        assert_eq!(plan.dns.len(), 4);
    }

    #[test]
    fn ibm_fixture_and_missing_links() {
        let data = fixture("ibmcloud-classic_network_data.json");
        let links = [link(2, "eth0", "06:52:db:01:ff:d9")];
        let plan = plan(Some(&data), &links).unwrap();
        let eth0 = &plan.interfaces[0];
        assert_eq!(eth0.addresses[0].to_string(), "10.135.202.146/26");
        assert_eq!(eth0.routes.len(), 3);
        assert_eq!(eth0.routes[2].destination.to_string(), "166.8.0.0/14");
        // The public network's link is not on this machine: skipped and said so.
        assert!(
            plan.skipped.iter().any(|s| s.contains("not found")),
            "{:?}",
            plan.skipped
        );
    }

    #[test]
    fn no_network_data_means_dhcp_on_the_first_nic_and_bad_fields_are_named() {
        let links = [link(1, "lo", ""), link(2, "eth0", "52:54:00:00:00:01")];
        let p = plan(None, &links).unwrap();
        assert!(p.interfaces[0].dhcp4 && p.interfaces[0].link.name == "eth0");
        let mut data = fixture("kubevirt_config_drive_openstack_latest_network_data.json");
        data.networks[0].netmask = Some("255.0.255.0".into());
        let links = [link(2, "ens3", "06:aa:bb:cc:dd:00")];
        let err = plan(Some(&data), &links).unwrap_err().to_string();
        assert!(err.contains("networks[0].netmask"), "{err}");
    }
}
