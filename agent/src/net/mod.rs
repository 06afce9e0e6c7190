//! The node's network: links, addresses and routes over netlink (rtnetlink; no shelling out
//! to `ip`) from `network_data.json` or DHCP, and the sockets the services listen on.
//!
//! - [`plan`]: what to configure where (made from metadata by `metadata::network_plan`);
//!   [`Netlink`] applies it.
//! - [`dhcp`]: the DHCPv4 client.
//! - [`listen`]: listening sockets; [`http_server`]: HTTP/1.1 serving for small endpoints;
//!   [`http_client`]: the agent's one HTTP client.
//! - [`vip`]: a VIP on a link (add, remove, retire after a hand-over), for VRRP and BGP.

pub mod dhcp;
pub mod http_client;
pub mod http_server;
pub mod listen;
pub mod mac;
pub mod nft;
pub mod plan;
pub mod vip;

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::link::LinkAttribute;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

pub use plan::{InterfacePlan, LinkInfo, NetworkPlan};

/// Sets `net.ipv4.conf.<interface>.<key>` (through /proc, in the caller's network
/// namespace) unless it already has `value`.
pub fn set_ipv4_conf(interface: &str, key: &str, value: &str) -> std::io::Result<()> {
    let path = format!("/proc/sys/net/ipv4/conf/{interface}/{key}");
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// A netlink connection.
#[derive(Debug, Clone)]
pub struct Netlink {
    handle: Handle,
}

/// What configuring the network gave us.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Configured {
    /// The first configured interface (the machine network's).
    pub interface: Option<String>,
    /// Its addresses.
    pub addresses: Vec<IpNet>,
    /// DNS servers to forward to.
    pub dns: Vec<IpAddr>,
}

impl Netlink {
    /// Opens a netlink socket (in the caller's network namespace).
    pub fn connect() -> std::io::Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    /// Every link with its index, name and MAC.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, rtnetlink::Error> {
        let mut out = Vec::new();
        let mut stream = self.handle.link().get().execute();
        while let Some(message) = stream.try_next().await? {
            let mut info = LinkInfo {
                index: message.header.index,
                name: String::new(),
                mac: String::new(),
            };
            for attr in &message.attributes {
                match attr {
                    LinkAttribute::IfName(name) => info.name = name.clone(),
                    LinkAttribute::Address(mac)
                        if mac.len() == 6 && mac.iter().any(|b| *b != 0) =>
                    {
                        let octets: [u8; 6] = mac[..].try_into().unwrap_or_default();
                        info.mac = mac::Mac(octets).to_string();
                    }
                    _ => {}
                }
            }
            out.push(info);
        }
        out.sort_by_key(|l| l.index);
        Ok(out)
    }

    /// Sets a link up, with an MTU when given.
    pub async fn set_up(&self, index: u32, mtu: Option<u32>) -> Result<(), rtnetlink::Error> {
        let mut builder = LinkUnspec::new_with_index(index).up();
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.handle.link().set(builder.build()).execute().await
    }

    /// Adds an address (already present is fine).
    pub async fn add_address(&self, index: u32, net: IpNet) -> Result<(), rtnetlink::Error> {
        ignore_exists(
            self.handle
                .address()
                .add(index, net.addr(), net.prefix_len())
                .execute()
                .await,
        )
    }

    /// Removes an address (absent is fine).
    pub async fn del_address(&self, index: u32, net: IpNet) -> Result<(), rtnetlink::Error> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(message) = stream.try_next().await? {
            let matches = message.header.prefix_len == net.prefix_len()
                && message.attributes.iter().any(|a| {
                    matches!(a, netlink_packet_route::address::AddressAttribute::Address(ip) if *ip == net.addr())
                });
            if matches {
                return self.handle.address().del(message).execute().await;
            }
        }
        Ok(())
    }

    /// Adds a route via `gateway` on `index` (already present is fine).
    pub async fn add_route(
        &self,
        index: u32,
        destination: IpNet,
        gateway: IpAddr,
    ) -> Result<(), rtnetlink::Error> {
        self.add_route_via(index, destination, Some(gateway)).await
    }

    fn route_message(
        index: u32,
        destination: IpNet,
        gateway: Option<IpAddr>,
    ) -> Option<netlink_packet_route::route::RouteMessage> {
        use netlink_packet_route::route::RouteScope;
        let on_link = gateway.is_none();
        Some(match (destination, gateway) {
            (IpNet::V4(d), None | Some(IpAddr::V4(_))) => {
                let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                    .destination_prefix(d.addr(), d.prefix_len())
                    .output_interface(index);
                if let Some(IpAddr::V4(g)) = gateway {
                    b = b.gateway(g);
                }
                if on_link {
                    b = b.scope(RouteScope::Link);
                }
                b.build()
            }
            (IpNet::V6(d), None | Some(IpAddr::V6(_))) => {
                let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                    .destination_prefix(d.addr(), d.prefix_len())
                    .output_interface(index);
                if let Some(IpAddr::V6(g)) = gateway {
                    b = b.gateway(g);
                }
                b.build()
            }
            _ => return None,
        })
    }

    /// Adds a route on `index`, via `gateway` or on-link when `None` (already present is fine).
    pub async fn add_route_via(
        &self,
        index: u32,
        destination: IpNet,
        gateway: Option<IpAddr>,
    ) -> Result<(), rtnetlink::Error> {
        let Some(message) = Self::route_message(index, destination, gateway) else {
            return Ok(());
        };
        ignore_exists(self.handle.route().add(message).execute().await)
    }

    /// Removes a route added by [`Netlink::add_route_via`] (absent is fine).
    pub async fn del_route(
        &self,
        index: u32,
        destination: IpNet,
        gateway: Option<IpAddr>,
    ) -> Result<(), rtnetlink::Error> {
        let Some(message) = Self::route_message(index, destination, gateway) else {
            return Ok(());
        };
        match self.handle.route().del(message).execute().await {
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENODEV =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// The link with `index`, if it exists.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<LinkInfo>, rtnetlink::Error> {
        Ok(self.links().await?.into_iter().find(|l| l.index == index))
    }

    /// Brings up loopback.
    pub async fn loopback_up(&self) -> Result<(), rtnetlink::Error> {
        let links = self.links().await?;
        if let Some(lo) = links.iter().find(|l| l.name == "lo") {
            self.set_up(lo.index, None).await?;
        }
        Ok(())
    }

    /// Applies a plan: links up, addresses, routes. Returns what the node now has.
    pub async fn apply(&self, plan: &NetworkPlan) -> Result<Configured, rtnetlink::Error> {
        let mut configured = Configured {
            dns: plan.dns.clone(),
            ..Configured::default()
        };
        for line in &plan.skipped {
            tracing::warn!("network: {line}");
        }
        for iface in &plan.interfaces {
            self.set_up(iface.link.index, iface.mtu).await?;
            for addr in &iface.addresses {
                self.add_address(iface.link.index, *addr).await?;
                tracing::info!("network: {} address {addr}", iface.link.name);
            }
            for route in &iface.routes {
                self.add_route(iface.link.index, route.destination, route.gateway)
                    .await?;
                tracing::info!(
                    "network: route {} via {} dev {}",
                    route.destination,
                    route.gateway,
                    iface.link.name
                );
            }
            if configured.interface.is_none() {
                configured.interface = Some(iface.link.name.clone());
                configured.addresses = iface.addresses.clone();
            }
        }
        Ok(configured)
    }
}

/// `Ok` for a netlink request whose object already exists (`EEXIST`).
pub(crate) fn ignore_exists(result: Result<(), rtnetlink::Error>) -> Result<(), rtnetlink::Error> {
    match result {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
        other => other,
    }
}
