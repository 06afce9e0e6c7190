//! What to configure on which link: the plan [`super::Netlink`] applies. It is made from
//! `network_data.json` by `metadata::network_plan` (pure, tested on the metadata fixtures).

use std::net::IpAddr;

use ipnet::IpNet;

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// MAC address, lower case `aa:bb:...` (empty for loopback and tunnels).
    pub mac: String,
}

/// A static route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePlan {
    /// Destination.
    pub destination: IpNet,
    /// Next hop.
    pub gateway: IpAddr,
}

/// What to do on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfacePlan {
    /// The interface.
    pub link: LinkInfo,
    /// MTU to set.
    pub mtu: Option<u32>,
    /// Static addresses.
    pub addresses: Vec<IpNet>,
    /// Routes via this interface.
    pub routes: Vec<RoutePlan>,
    /// Ask DHCPv4 for an address.
    pub dhcp4: bool,
}

/// The whole plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkPlan {
    /// Per interface, in network_data order.
    pub interfaces: Vec<InterfacePlan>,
    /// DNS servers (services and per-network `dns_nameservers`), in order, deduplicated.
    pub dns: Vec<IpAddr>,
    /// Things skipped, one line each (logged).
    pub skipped: Vec<String>,
}
