//! The VIP on the interface, through rtnetlink: add (label `<iface>:vip`, /32 or /128,
//! IPv6 without DAD so it is usable at once), remove, and find/remove stale copies; retire
//! (off the node's addresses, but what arrives for it on the interface is still delivered
//! here, so that connections to it live on after a hand-over: [`crate::vrrp::handback`]).
//! Used by VRRP's instances, BGP's announced VIPs and the appliance's cloud set-up.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use netlink_packet_route::IpProtocol;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::route::{RouteMessage, RouteScope, RouteType};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};

use crate::net::ignore_exists;

/// Errors changing addresses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VipError {
    /// The interface does not exist.
    #[error("interface {0}: not found")]
    NoInterface(String),
    /// Netlink failed.
    #[error("netlink {op} {vip} on {iface}: {source}")]
    Netlink {
        /// What we tried.
        op: &'static str,
        /// The VIP.
        vip: IpAddr,
        /// The interface.
        iface: String,
        /// The netlink error.
        source: rtnetlink::Error,
    },
    /// Opening the netlink socket failed.
    #[error("netlink socket: {0}")]
    Socket(#[from] std::io::Error),
}

/// Adds and removes one VIP on one interface.
#[derive(Debug, Clone)]
pub struct VipManager {
    handle: Handle,
    iface: String,
    index: u32,
    /// The loopback interface's index (a retired VIP's local route uses it).
    lo: u32,
    vip: IpAddr,
}

/// The label of VIP addresses: IPv4 labels must start with the interface name.
pub fn label(iface: &str) -> String {
    // IFNAMSIZ is 16 including the NUL; the kernel rejects longer labels.
    let mut l = format!("{iface}:vip");
    l.truncate(15);
    l
}

impl VipManager {
    /// Opens a netlink connection (its task runs on the current runtime) for `vip` on
    /// interface `iface`.
    pub async fn new(iface: &str, vip: IpAddr) -> Result<Self, VipError> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        let index = if_index(iface).ok_or_else(|| VipError::NoInterface(iface.into()))?;
        let lo = if_index("lo").ok_or_else(|| VipError::NoInterface("lo".into()))?;
        Ok(Self {
            handle,
            iface: iface.into(),
            index,
            lo,
            vip,
        })
    }

    /// The VIP.
    pub fn vip(&self) -> IpAddr {
        self.vip
    }

    /// The interface index.
    pub fn index(&self) -> u32 {
        self.index
    }

    fn err(&self, op: &'static str) -> impl FnOnce(rtnetlink::Error) -> VipError + '_ {
        move |source| VipError::Netlink {
            op,
            vip: self.vip,
            iface: self.iface.clone(),
            source,
        }
    }

    /// Adds the VIP; an already present VIP is fine.
    pub async fn add(&self) -> Result<(), VipError> {
        let prefix = if self.vip.is_ipv6() { 128 } else { 32 };
        let mut req = self.handle.address().add(self.index, self.vip, prefix);
        let msg = req.message_mut();
        if self.vip.is_ipv4() {
            msg.attributes
                .push(AddressAttribute::Label(label(&self.iface)));
        } else {
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match req.replace().execute().await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.err("add")(e)),
        }
    }

    /// Takes the VIP off the interface, so this node neither answers ARP / neighbour
    /// solicitations for it nor reaches it locally (its own clients of the VIP go to the new
    /// holder, as on any other node: the members registry, kubelet), but keeps delivering
    /// here the TCP segments that arrive for it on the interface: a policy rule
    /// `to VIP iif <iface> ipproto tcp lookup` [`RETIRED_TABLE`] (priority
    /// [`RETIRED_RULE_PRIORITY`]) whose only route is `local VIP dev lo`. The segments a new
    /// holder forwards back reach this node's open connections. The rule names TCP because
    /// ARP asks the routing rules whether an address is local (`arp_process`, with no layer-4
    /// protocol): a rule for every protocol would make the node answer ARP for the retired
    /// VIP beside the new holder (unless `arp_ignore` is set, which RHCOS's unit cannot
    /// write). [`VipManager::remove`] undoes it.
    pub async fn retire(&self) -> Result<(), VipError> {
        ignore_exists(
            self.handle
                .route()
                .add(self.retired_route())
                .replace()
                .execute()
                .await,
        )
        .map_err(self.err("retire (route)"))?;
        if self.retired_rules().await?.is_empty() {
            let mut rule = self
                .handle
                .rule()
                .add()
                .input_interface(self.iface.clone())
                .table_id(RETIRED_TABLE)
                .priority(RETIRED_RULE_PRIORITY)
                .action(RuleAction::ToTable);
            rule.message_mut()
                .attributes
                .push(RuleAttribute::IpProtocol(IpProtocol::Tcp));
            let res = match self.vip {
                IpAddr::V4(v) => rule.v4().destination_prefix(v, 32).execute().await,
                IpAddr::V6(v) => rule.v6().destination_prefix(v, 128).execute().await,
            };
            ignore_exists(res).map_err(self.err("retire (rule)"))?;
        }
        self.remove_addresses().await.map(|_| ())
    }

    /// The `local VIP dev lo` route of [`RETIRED_TABLE`].
    fn retired_route(&self) -> RouteMessage {
        match self.vip {
            IpAddr::V4(v) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(v, 32)
                .output_interface(self.lo)
                .table_id(RETIRED_TABLE)
                .kind(RouteType::Local)
                .scope(RouteScope::Host)
                .build(),
            IpAddr::V6(v) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(v, 128)
                .output_interface(self.lo)
                .table_id(RETIRED_TABLE)
                .kind(RouteType::Local)
                .build(),
        }
    }

    /// This VIP's retirement rules.
    async fn retired_rules(&self) -> Result<Vec<RuleMessage>, VipError> {
        let version = if self.vip.is_ipv4() {
            IpVersion::V4
        } else {
            IpVersion::V6
        };
        let rules: Vec<RuleMessage> = self
            .handle
            .rule()
            .get(version)
            .execute()
            .try_collect()
            .await
            .map_err(self.err("list rules"))?;
        Ok(rules
            .into_iter()
            .filter(|r| {
                r.attributes.contains(&RuleAttribute::Table(RETIRED_TABLE))
                    && r.attributes.contains(&RuleAttribute::Destination(self.vip))
            })
            .collect())
    }

    /// Undoes [`VipManager::retire`] (what is absent is fine) and leaves the VIP's addresses
    /// as they are: for a node that is master again when its retirement's window ends. How
    /// many rules it removed.
    pub async fn end_retirement(&self) -> Result<usize, VipError> {
        let rules = self.retired_rules().await?;
        let n = rules.len();
        for r in rules {
            if let Err(e) = self.handle.rule().del(r).execute().await
                && !gone(&e)
            {
                return Err(self.err("remove rule")(e));
            }
        }
        if let Err(e) = self
            .handle
            .route()
            .del(self.retired_route())
            .execute()
            .await
            && !gone(&e)
        {
            return Err(self.err("remove route")(e));
        }
        Ok(n)
    }

    /// The VIP's address messages currently on the interface.
    async fn present(&self) -> Result<Vec<AddressMessage>, VipError> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(self.index)
            .set_address_filter(self.vip)
            .execute()
            .try_collect()
            .await
            .map_err(self.err("list"))?;
        Ok(msgs)
    }

    /// Whether the VIP is on the interface.
    pub async fn is_present(&self) -> Result<bool, VipError> {
        Ok(!self.present().await?.is_empty())
    }

    /// Removes every copy of the VIP from the interface (whatever its prefix or label:
    /// also the stale ones a crashed agent or an earlier keepalived left) and its
    /// retirement ([`VipManager::retire`]). Returns how many were found.
    pub async fn remove(&self) -> Result<usize, VipError> {
        Ok(self.remove_addresses().await? + self.end_retirement().await?)
    }

    /// Removes every copy of the VIP from the interface; how many.
    async fn remove_addresses(&self) -> Result<usize, VipError> {
        let msgs = self.present().await?;
        let n = msgs.len();
        for m in msgs {
            if let Err(e) = self.handle.address().del(m).execute().await {
                // Gone in between (another remover) is fine.
                if !gone(&e) {
                    return Err(self.err("remove")(e));
                }
            }
        }
        Ok(n)
    }
}

/// The routing table of retired VIPs ([`VipManager::retire`]): "ke" in ASCII, a number no
/// distribution gives a name.
pub const RETIRED_TABLE: u32 = 0x6b65;
/// The priority of a retired VIP's rule: after `local` (0), before `main` (32766).
pub const RETIRED_RULE_PRIORITY: u32 = 1000;

/// Whether a removal failed because the thing is not there (removed in between, or never
/// made).
fn gone(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m)
        if [libc::EADDRNOTAVAIL, libc::ESRCH, libc::ENOENT, libc::ENODEV].contains(&-m.raw_code()))
}

/// Interface index by name.
pub fn if_index(iface: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(iface).ok()
}

/// The interface's MAC address (for gratuitous ARP and the NA's link-layer option).
pub fn mac(iface: &str) -> std::io::Result<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))?;
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() != 6 {
        return Err(std::io::Error::other(format!(
            "{iface}: MAC {text:?} is not 6 bytes"
        )));
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(std::io::Error::other)?;
    }
    Ok(mac)
}

/// The interface's first IPv6 link-local address (the source of VRRPv3 IPv6 adverts,
/// RFC 5798 §5.1.2.1) that is usable, i.e. not tentative.
pub fn link_local(iface: &str) -> Option<std::net::Ipv6Addr> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    for a in addrs {
        if a.interface_name != iface {
            continue;
        }
        if let Some(sin6) = a.address.as_ref().and_then(|s| s.as_sockaddr_in6()) {
            let ip = sin6.ip();
            if ip.is_unicast_link_local() && !tentative(iface, ip) {
                return Some(ip);
            }
        }
    }
    None
}

/// Whether `ip` on `iface` is still tentative (DAD running): the kernel will not send from
/// it. Read from /proc/net/if_inet6 (flags column, IFA_F_TENTATIVE = 0x40).
fn tentative(iface: &str, ip: std::net::Ipv6Addr) -> bool {
    let hex: String = ip.octets().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::read_to_string("/proc/net/if_inet6")
        .map(|t| {
            t.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 6
                    && f[0] == hex
                    && f[5] == iface
                    && u32::from_str_radix(f[4], 16).is_ok_and(|x| x & 0x40 != 0)
            })
        })
        .unwrap_or(false)
}

/// Sets `arp_announce` 2 on `iface`: the kernel's ARP requests then carry the node's own
/// address as sender, never the VIP. With the default (0) a packet sent from the VIP (the
/// port check's probes, a reply from the VIP) to a neighbour whose entry has gone stale makes
/// the kernel ask for that neighbour *from the VIP*; a cloud port without the VIP as an
/// allowed address pair drops that request (Neutron's ARP protection), the entry fails, and
/// everything queued for the neighbour goes with it, VRRP adverts included: the backup
/// stops hearing its master and claims the VIP (found by agent/tests/vrrp_port_security.rs,
/// which failed 3 runs in 11 that way). keepalived's documentation asks for the same
/// setting where VIPs share a segment. Failing to set it is logged, not fatal.
pub fn announce_from_own_address(iface: &str) {
    if let Err(e) = crate::net::set_ipv4_conf(iface, "arp_announce", "2") {
        tracing::warn!("{e}: ARP requests may go out from the VIP");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_starts_with_interface_and_fits() {
        assert_eq!(label("eth0"), "eth0:vip");
        assert_eq!(label("enp0s31f6long"), "enp0s31f6long:v");
        assert!(label("enp0s31f6long").len() <= 15);
    }

    #[test]
    fn loopback_has_index_and_mac() {
        assert!(if_index("lo").is_some());
        assert_eq!(mac("lo").unwrap(), [0; 6]);
        assert!(if_index("no-such-if0").is_none());
    }
}
