//! The well-known paths on a node, defined once: `keelson` writes files there through the
//! Ignition configs it renders, and the agent reads them there, so the two cannot drift
//! apart.

/// The agent's cluster settings (`cluster.json`).
pub const CLUSTER_JSON: &str = "/etc/keelson/cluster.json";
/// The node's role.
pub const ROLE: &str = "/etc/keelson/role";
/// The node's TLS files ([`crate::tls_files`] names them).
pub const TLS_DIR: &str = "/etc/keelson/tls";
/// The cluster root CA.
pub const CA: &str = "/etc/keelson/tls/ca.crt";
/// The Ignition server certificate (bootstrap and masters).
pub const SERVER_CERT: &str = "/etc/keelson/tls/server.crt";
/// Its key.
pub const SERVER_KEY: &str = "/etc/keelson/tls/server.key";
/// The CA in the system trust store (RHCOS picks up anchors from here).
pub const TRUST_ANCHOR: &str = "/etc/pki/ca-trust/source/anchors/keelson-ca.crt";
/// Where a node keeps the service assets: a master serves them (the agent's Ignition server
/// reads `/assets/` from here), and the appliance image carries them here.
pub const ASSETS_DIR: &str = "/etc/keelson/assets";
/// Where a master keeps the operator's own Ignition configs it merges into what it serves.
pub const MERGE_DIR: &str = "/etc/keelson/merge";
/// Where the agent keeps state across restarts.
pub const STATE_DIR: &str = "/var/lib/keelson";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_paths_are_in_the_tls_dir_under_their_file_names() {
        use crate::tls_files::{CA_CERT, SERVER_CERT as CERT, SERVER_KEY as KEY};
        assert_eq!(CA, format!("{TLS_DIR}/{CA_CERT}"));
        assert_eq!(SERVER_CERT, format!("{TLS_DIR}/{CERT}"));
        assert_eq!(SERVER_KEY, format!("{TLS_DIR}/{KEY}"));
    }
}
