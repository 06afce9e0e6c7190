//! Node identity: who this node is (name, role, interface, addresses).
//!
//! Comes from metadata and user_data at boot; a `node.json` file overrides it, so tests in
//! network namespaces need no metadata service.

use std::path::Path;

use ipnet::IpNet;
use keelson_ignition::Role;
use serde::{Deserialize, Serialize};

/// This node's identity, as `node.json` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeIdentity {
    /// Node name (short host name), e.g. `master-0`.
    pub name: String,
    /// Role in the cluster.
    pub role: Role,
    /// The interface on the machine network (VIPs are added here, adverts sent here).
    pub interface: String,
    /// The node's own addresses on that interface, with prefix length.
    pub addresses: Vec<IpNet>,
}

/// Errors reading `node.json`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeIdentityError {
    /// The file could not be read.
    #[error("node.json {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid node.json (the message names the field).
    #[error("node.json {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A field is present but unusable.
    #[error("node.json {path}: {field}: expected {expected}")]
    Invalid {
        /// The file.
        path: String,
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
    },
}

impl NodeIdentity {
    /// Reads and checks a `node.json` file.
    pub fn load(path: &Path) -> Result<Self, NodeIdentityError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| NodeIdentityError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_json(&bytes, &shown)
    }

    /// Parses and checks a `node.json` document; `path` is only used in errors.
    pub fn from_json(bytes: &[u8], path: &str) -> Result<Self, NodeIdentityError> {
        let node: NodeIdentity =
            serde_json::from_slice(bytes).map_err(|source| NodeIdentityError::Parse {
                path: path.into(),
                source,
            })?;
        if node.name.is_empty() {
            return Err(NodeIdentityError::Invalid {
                path: path.into(),
                field: "name",
                expected: "a non-empty node name",
            });
        }
        if node.interface.is_empty() {
            return Err(NodeIdentityError::Invalid {
                path: path.into(),
                field: "interface",
                expected: "a network interface name",
            });
        }
        Ok(node)
    }

    /// The first address of the given family (IPv4 when `v6` is false).
    pub fn address(&self, v6: bool) -> Option<std::net::IpAddr> {
        self.addresses
            .iter()
            .map(|n| n.addr())
            .find(|a| a.is_ipv6() == v6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_unknown_fields() {
        let ok = br#"{"name":"master-0","role":"master","interface":"eth0","addresses":["10.0.0.11/16"]}"#;
        let node = NodeIdentity::from_json(ok, "n.json").unwrap();
        assert_eq!(node.role, Role::Master);
        assert_eq!(node.address(false).unwrap().to_string(), "10.0.0.11");
        let bad = br#"{"name":"m","role":"master","interface":"eth0","addresses":[],"x":1}"#;
        let err = NodeIdentity::from_json(bad, "n.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `x`"), "{err}");
        let bad_role = br#"{"name":"m","role":"boss","interface":"eth0","addresses":[]}"#;
        assert!(NodeIdentity::from_json(bad_role, "n.json").is_err());
    }
}
