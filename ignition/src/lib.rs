//! keelson-ignition: the cluster's payloads as data.
//!
//! - [`cluster`]: `cluster.json`, the agent's cluster-wide configuration.
//! - [`version`]: the Ignition spec versions keelson writes.
//! - [`routes`]: the hook through which the agent adds routes to the config server.
//!
//! Everything here is pure (no sockets) except the config server, which `keelson serve`
//! and the agent's `ignition_server` share.

pub mod cluster;
pub mod routes;
pub mod version;

pub use cluster::{ClusterConfig, Role};
pub use version::SpecVersion;
