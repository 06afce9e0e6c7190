//! The node side of an announcement, through rtnetlink: the VIP as an address on `lo` (so
//! the node accepts the traffic the fabric sends it) and a host route for it in the keelson
//! kernel table, which the routing daemon redistributes. Nothing here touches a route in
//! any other table.

use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::net::vip::{VipError, VipManager};

/// The interface that carries announced VIPs.
pub const VIP_INTERFACE: &str = "lo";

/// Errors changing the VIP routes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// Opening the netlink socket failed.
    #[error("netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The loopback interface is missing.
    #[error("interface {VIP_INTERFACE}: not found")]
    NoLoopback,
    /// A route change failed.
    #[error("netlink {op} route {vip} in table {table}: {source}")]
    Route {
        /// What we tried.
        op: &'static str,
        /// The VIP.
        vip: IpAddr,
        /// The table.
        table: u32,
        /// The netlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// Listing the table failed.
    #[error("netlink listing table {table}: {source}")]
    List {
        /// The table.
        table: u32,
        /// The netlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// The VIP address on `lo` could not be changed.
    #[error(transparent)]
    Address(Box<VipError>),
}

impl From<VipError> for RouteError {
    fn from(e: VipError) -> Self {
        RouteError::Address(Box::new(e))
    }
}

/// The table a route message belongs to (the attribute wins over the 8-bit header field).
pub fn table_of(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

/// The destination of a host route (`/32`, `/128`), if the message is one.
pub fn host_destination(msg: &RouteMessage) -> Option<IpAddr> {
    let full = match msg.header.address_family {
        AddressFamily::Inet => 32,
        AddressFamily::Inet6 => 128,
        _ => return None,
    };
    if msg.header.destination_prefix_length != full {
        return None;
    }
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(d) => match d {
            netlink_packet_route::route::RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            netlink_packet_route::route::RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        },
        _ => None,
    })
}

/// Adds and removes VIP host routes in one kernel table.
#[derive(Debug, Clone)]
pub struct VipRoutes {
    handle: Handle,
    table: u32,
    lo: u32,
}

impl VipRoutes {
    /// Opens a netlink connection (its task runs on the current runtime) for `table`.
    pub fn new(table: u32) -> Result<Self, RouteError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(RouteError::Socket)?;
        tokio::spawn(conn);
        let lo = crate::net::vip::if_index(VIP_INTERFACE).ok_or(RouteError::NoLoopback)?;
        Ok(Self { handle, table, lo })
    }

    /// The table.
    pub fn table(&self) -> u32 {
        self.table
    }

    fn message(&self, vip: IpAddr) -> RouteMessage {
        let prefix = if vip.is_ipv4() { 32 } else { 128 };
        RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(vip, prefix)
            .expect("a host prefix of the address's own family is valid")
            .output_interface(self.lo)
            .table_id(self.table)
            .protocol(RouteProtocol::Static)
            .scope(RouteScope::Link)
            .build()
    }

    /// Announces `vip`: the address on `lo` first (so traffic that arrives is accepted),
    /// then the route the daemon picks up. Idempotent.
    pub async fn announce(&self, vip: IpAddr) -> Result<(), RouteError> {
        VipManager::new(VIP_INTERFACE, vip).await?.add().await?;
        self.handle
            .route()
            .add(self.message(vip))
            .replace()
            .execute()
            .await
            .map_err(|source| RouteError::Route {
                op: "add",
                vip,
                table: self.table,
                source,
            })
    }

    /// Withdraws `vip`: the route first (the daemon withdraws it from the peers), then the
    /// address. A route or address already gone is fine.
    pub async fn withdraw(&self, vip: IpAddr) -> Result<(), RouteError> {
        match self.handle.route().del(self.message(vip)).execute().await {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENOENT => {}
            Err(source) => {
                return Err(RouteError::Route {
                    op: "delete",
                    vip,
                    table: self.table,
                    source,
                });
            }
        }
        VipManager::new(VIP_INTERFACE, vip).await?.remove().await?;
        Ok(())
    }

    /// Every route in the table (both families).
    async fn dump(&self) -> Result<Vec<RouteMessage>, RouteError> {
        let mut out = Vec::new();
        for family in [true, false] {
            let query = if family {
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
            } else {
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
            };
            let msgs: Vec<RouteMessage> = self
                .handle
                .route()
                .get(query)
                .execute()
                .try_collect()
                .await
                .map_err(|source| RouteError::List {
                    table: self.table,
                    source,
                })?;
            out.extend(msgs.into_iter().filter(|m| table_of(m) == self.table));
        }
        Ok(out)
    }

    /// The host routes in the table now.
    pub async fn announced(&self) -> Result<Vec<IpAddr>, RouteError> {
        let mut v: Vec<IpAddr> = self
            .dump()
            .await?
            .iter()
            .filter_map(host_destination)
            .collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    /// Empties the table (it is keelson's alone: whatever is there is a leftover of an
    /// agent that crashed or was killed) and removes `vips` from `lo`. Returns how many
    /// routes were removed.
    pub async fn flush(&self, vips: &[IpAddr]) -> Result<usize, RouteError> {
        let stale = self.dump().await?;
        let n = stale.len();
        for m in stale {
            let vip = host_destination(&m).unwrap_or(IpAddr::from([0, 0, 0, 0]));
            match self.handle.route().del(m).execute().await {
                Ok(()) => {}
                Err(rtnetlink::Error::NetlinkError(e))
                    if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENOENT => {}
                Err(source) => {
                    return Err(RouteError::Route {
                        op: "delete stale",
                        vip,
                        table: self.table,
                        source,
                    });
                }
            }
        }
        for vip in vips {
            VipManager::new(VIP_INTERFACE, *vip).await?.remove().await?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_destination_of_a_built_message() {
        let m = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix("10.255.0.5".parse().unwrap(), 32)
            .unwrap()
            .table_id(198)
            .build();
        assert_eq!(table_of(&m), 198);
        assert_eq!(host_destination(&m), Some("10.255.0.5".parse().unwrap()));
        let m = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix("fd00::5".parse().unwrap(), 128)
            .unwrap()
            .table_id(1000)
            .build();
        assert_eq!(table_of(&m), 1000);
        assert_eq!(host_destination(&m), Some("fd00::5".parse().unwrap()));
        let net = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix("10.255.0.0".parse().unwrap(), 24)
            .unwrap()
            .build();
        assert_eq!(host_destination(&net), None, "not a host route");
    }
}
