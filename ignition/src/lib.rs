//! keelson-ignition: the cluster's payloads as data.
//!
//! - [`cluster`]: `cluster.json`, the agent's cluster-wide configuration.
//! - [`version`]: the Ignition spec versions keelson writes.
//! - [`routes`]: the hook through which the agent adds routes to the config server.
//! - [`negotiate`]: which spec version to serve for an `Accept` header.
//! - [`server`]: the Ignition config server (`keelson serve`, agent `ignition_server`).
//!
//! Everything here is pure (no sockets) except the config server, which `keelson serve`
//! and the agent's `ignition_server` share.

pub mod cluster;
pub mod install_config;
pub mod negotiate;
pub mod pki;
pub mod render;
pub mod routes;
pub mod server;
pub mod unit;
pub mod version;

pub use cluster::{ClusterConfig, Role};
pub use version::SpecVersion;
