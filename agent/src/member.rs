//! One node of the cluster as member discovery (`members/`) sees it: what every transport announces and
//! learns, what the bus carries to VRRP, the proxy and DNS, and what the status lists.

use std::net::IpAddr;
use std::sync::Arc;

use keelson_cluster::Role;
use serde::{Deserialize, Serialize};

use crate::dns_label::DnsLabel;
use crate::node::NodeIdentity;

/// One node of the cluster as members discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Node name.
    pub name: DnsLabel,
    /// Role.
    pub role: Role,
    /// Addresses on the machine network.
    pub addresses: Vec<IpAddr>,
    /// Agent version the node runs.
    pub version: String,
}

/// The live member list, sorted by name; this node included.
pub type MemberList = Arc<Vec<Member>>;

impl Member {
    /// `node` as a member, running this agent.
    pub fn of(node: &NodeIdentity) -> Self {
        Member {
            name: node.name.clone(),
            role: node.role,
            addresses: node.addresses.iter().map(|n| n.addr()).collect(),
            version: crate::VERSION.to_string(),
        }
    }
}
