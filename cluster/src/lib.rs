//! keelson-cluster: the cluster model and its payloads — what `keelson` and the agent share.
//!
//! - [`cluster`]: `cluster.json`, the agent's cluster-wide configuration ([`bgp`]: its
//!   BGP section).
//! - [`version`]: the Ignition spec versions keelson writes.
//! - [`routes`]: the hook through which the agent adds routes to the config server.
//! - [`negotiate`]: the `Accept` header parser, and which spec version to serve for it.
//! - [`paths`]: the well-known paths on a node (`/etc/keelson/cluster.json`...).
//! - [`server`]: the Ignition config server (`keelson serve`, agent `ignition_server`).
//! - [`render`]: the Ignition configs each role boots from, and the pointer configs.
//! - [`unit`]: the systemd unit that runs the agent on RHCOS.
//! - [`resolver`]: the NetworkManager profile that points an RHCOS node at the cluster DNS.
//! - [`membership`]: the cluster membership key that signs member records.
//! - [`operator`]: the operator's view of a running cluster (agent serves, `keelson status`
//!   reads).
//! - With the `build` feature: `install_config` (OpenShift's `install-config.yaml`) and
//!   `pki` (the cluster CA and the Ignition server certificate), which only `keelson` needs.
//!
//! Everything here is pure (no sockets) except the config server, which `keelson serve`
//! and the agent's `ignition_server` share.

pub mod bgp;
pub mod cluster;
#[cfg(feature = "build")]
pub mod install_config;
pub mod membership;
pub mod negotiate;
pub mod operator;
pub mod paths;
#[cfg(feature = "build")]
pub mod pki;
pub mod render;
pub mod resolver;
pub mod routes;
pub mod server;
pub mod unit;
pub mod version;

pub use cluster::{ClusterConfig, Role};

/// The most nodes, masters and workers together, a keelson cluster holds: every members
/// registry keeps at most this many records (the agent's `members::table::MAX_MEMBERS`;
/// docs/scale.md). `keelson build` refuses an install-config that asks for more, rather
/// than a cluster whose last nodes are missing from DNS.
pub const MAX_NODES: u32 = 4096;

/// File names in a build's `tls/` directory, and on nodes under `/etc/keelson/tls/`.
pub mod tls_files {
    /// CA certificate.
    pub const CA_CERT: &str = "ca.crt";
    /// CA key (stays with the operator).
    pub const CA_KEY: &str = "ca.key";
    /// Server certificate.
    pub const SERVER_CERT: &str = "server.crt";
    /// Server key.
    pub const SERVER_KEY: &str = "server.key";
    /// The membership key: signs and verifies member records (docs/members.md).
    pub const MEMBERSHIP_KEY: &str = "membership.key";
    /// A key being retired: still verifies, never signs (key rotation).
    pub const MEMBERSHIP_PREVIOUS_KEY: &str = "membership.previous.key";
    /// A key being introduced: already verifies, does not sign yet (key rotation).
    pub const MEMBERSHIP_NEXT_KEY: &str = "membership.next.key";
    /// Every membership key file, signing key first.
    pub const MEMBERSHIP_KEYS: [&str; 3] =
        [MEMBERSHIP_KEY, MEMBERSHIP_PREVIOUS_KEY, MEMBERSHIP_NEXT_KEY];
}
pub use version::SpecVersion;
