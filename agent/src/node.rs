//! Node identity: who this node is (name, role, interface, addresses).
//!
//! Comes from metadata and user_data at boot; a `node.json` file overrides it, so tests in
//! network namespaces need no metadata service.

use std::path::Path;

use ipnet::IpNet;
use keelson_cluster::Role;

use crate::dns_label::DnsLabel;
use serde::{Deserialize, Serialize};

/// This node's identity, as `node.json` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeIdentity {
    /// Node name (short host name), e.g. `master-0`.
    pub name: DnsLabel,
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

/// What an operator process learns about its node: as environment variables, and as
/// `${NAME}` in its arguments (one cluster.json entry serves every node, yet a process can
/// bind its own node's address: the VIP and the wildcard stay free for the agent).
pub fn node_vars(node: &NodeIdentity) -> Vec<(&'static str, String)> {
    let addr = |v6| node.address(v6).map(|a| a.to_string()).unwrap_or_default();
    vec![
        ("KEELSON_NODE_NAME", node.name.to_string()),
        ("KEELSON_NODE_ROLE", node.role.as_str().to_owned()),
        ("KEELSON_NODE_ADDRESS", addr(false)),
        ("KEELSON_NODE_ADDRESS6", addr(true)),
    ]
}

/// `arg` with every `${NAME}` of `vars` replaced; other text (and unknown `${...}`) kept.
pub fn expand(arg: &str, vars: &[(&'static str, String)]) -> String {
    vars.iter().fold(arg.to_owned(), |a, (k, v)| {
        a.replace(&format!("${{{k}}}"), v)
    })
}

/// The role file the rendered Ignition configs write (`master`, `worker`, `bootstrap`).
pub const ROLE_FILE: &str = "etc/keelson/role";

/// The node's role: the role file under `root`, else the `keelson-role` metadata property
/// (`openstack server create --property keelson-role=master`), else the name's prefix
/// (`bootstrap`, `master-0`, `worker-1`).
pub fn role_hint(
    root: &Path,
    meta: Option<&std::collections::BTreeMap<String, String>>,
    name: &str,
) -> Option<Role> {
    let parse = |s: &str| -> Option<Role> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bootstrap" => Some(Role::Bootstrap),
            "master" | "control-plane" | "controlplane" => Some(Role::Master),
            "worker" | "compute" => Some(Role::Worker),
            _ => None,
        }
    };
    if let Ok(text) = std::fs::read_to_string(root.join(ROLE_FILE))
        && let Some(role) = parse(&text)
    {
        return Some(role);
    }
    if let Some(role) = meta
        .and_then(|m| m.get("keelson-role"))
        .and_then(|r| parse(r))
    {
        return Some(role);
    }
    let short = name.split('.').next().unwrap_or(name);
    ["bootstrap", "master", "worker", "control-plane", "compute"]
        .iter()
        .find(|p| short.starts_with(*p))
        .and_then(|p| parse(p))
}

/// Errors deriving the identity from the running system.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// No role could be determined.
    #[error(
        "node {name}: no role (write /etc/keelson/role, set the keelson-role property, or \
         name the node bootstrap/master-N/worker-N)"
    )]
    NoRole {
        /// The node.
        name: String,
    },
    /// The host name is not a DNS label (and the metadata named none).
    #[error("the host name: {0}")]
    BadName(#[from] crate::dns_label::DnsLabelError),
    /// No address is what `cluster.json` asks for (the machine networks, `nodeAddress`).
    #[error("node {name}: {why}")]
    NoAddress {
        /// The node.
        name: String,
        /// What was asked for and what the machine has.
        why: String,
    },
}

/// The identity from the running system: name from metadata or the host name, role from
/// [`role_hint`], interface and addresses from the machine's addresses as `cluster.json`'s
/// machine networks and `nodeAddress` pick them ([`crate::node_address::select`]).
pub fn from_system(
    cluster: &keelson_cluster::ClusterConfig,
    root: &Path,
    metadata: Option<&crate::metadata::Metadata>,
) -> Result<NodeIdentity, IdentityError> {
    let host_name = nix::unistd::gethostname()
        .ok()
        .map(|h| {
            h.to_string_lossy()
                .split('.')
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .filter(|h| !h.is_empty());
    let name = match (metadata.and_then(|m| m.node_name()), host_name) {
        (Some(name), _) => name,
        (None, Some(host)) => DnsLabel::new(host)?,
        (None, None) => DnsLabel::new("localhost").expect("a DNS label"),
    };
    let role = role_hint(root, metadata.map(|m| &m.meta_data.meta), &name).ok_or_else(|| {
        IdentityError::NoRole {
            name: name.to_string(),
        }
    })?;
    let (interface, addresses) =
        crate::node_address::select(cluster, &crate::node_address::observe()).map_err(|why| {
            IdentityError::NoAddress {
                name: name.to_string(),
                why,
            }
        })?;
    Ok(NodeIdentity {
        name,
        role,
        interface,
        addresses,
    })
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn role_sources_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let meta: std::collections::BTreeMap<String, String> =
            [("keelson-role".to_owned(), "worker".to_owned())].into();
        assert_eq!(
            role_hint(dir.path(), Some(&meta), "master-0"),
            Some(Role::Worker)
        );
        assert_eq!(
            role_hint(dir.path(), None, "master-0.novalocal"),
            Some(Role::Master)
        );
        assert_eq!(
            role_hint(dir.path(), None, "bootstrap"),
            Some(Role::Bootstrap)
        );
        assert_eq!(role_hint(dir.path(), None, "db-1"), None);
        std::fs::create_dir_all(dir.path().join("etc/keelson")).unwrap();
        std::fs::write(dir.path().join(ROLE_FILE), "bootstrap\n").unwrap();
        assert_eq!(
            role_hint(dir.path(), Some(&meta), "master-0"),
            Some(Role::Bootstrap)
        );
    }

    /// On a thread with a host name and a network of its own (the machine's are none of
    /// this test's business): named after a master, with loopback up.
    #[test]
    fn from_system_finds_loopback_in_a_loopback_machine_network() {
        if !keelson_testkit::require_root() {
            return;
        }
        std::thread::spawn(|| {
            use nix::sched::CloneFlags;
            nix::sched::unshare(CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWNET).unwrap();
            nix::unistd::sethostname("master-0.example.com").unwrap();
            keelson_testkit::sh(&["ip", "link", "set", "lo", "up"]);
            let mut cluster = keelson_cluster::ClusterConfig::from_json(include_bytes!(
                "dns/testdata/cluster.json"
            ))
            .unwrap();
            cluster.machine_networks = vec!["127.0.0.0/8".parse().unwrap()];
            let dir = tempfile::tempdir().unwrap();
            let node = from_system(&cluster, dir.path(), None).unwrap();
            assert_eq!(node.name, "master-0");
            assert_eq!(node.role, Role::Master);
            assert_eq!(node.interface, "lo");
            assert_eq!(node.addresses[0].to_string(), "127.0.0.1/8");
            // A host name that is no DNS label, and no metadata to name the node: refused.
            nix::unistd::sethostname("master_0").unwrap();
            let err = from_system(&cluster, dir.path(), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("\"master_0\": expected a DNS label"), "{err}");
            nix::unistd::sethostname("master-0").unwrap();
            cluster.machine_networks = vec!["fdcb:a1e5:7:1::/64".parse().unwrap()];
            let err = from_system(&cluster, dir.path(), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("fdcb:a1e5:7:1::/64"), "{err}");
        })
        .join()
        .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_arguments_expand_the_node_variables() {
        let node = NodeIdentity {
            name: "master-1".parse().unwrap(),
            role: Role::Master,
            interface: "eth0".into(),
            addresses: vec!["10.0.0.12/16".parse().unwrap()],
        };
        let vars = node_vars(&node);
        assert_eq!(
            expand("--listen=${KEELSON_NODE_ADDRESS}:6443", &vars),
            "--listen=10.0.0.12:6443"
        );
        assert_eq!(
            expand("${KEELSON_NODE_NAME}/${KEELSON_NODE_ROLE}", &vars),
            "master-1/master"
        );
        // No IPv6 address: empty, not the literal; unknown names stay as written.
        assert_eq!(expand("[${KEELSON_NODE_ADDRESS6}]", &vars), "[]");
        assert_eq!(
            expand("${HOME} $KEELSON_NODE_NAME", &vars),
            "${HOME} $KEELSON_NODE_NAME"
        );
    }

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
