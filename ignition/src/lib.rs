//! keelson-ignition: the cluster's payloads as data.
//!
//! - [`cluster`]: `cluster.json`, the agent's cluster-wide configuration.
//!
//! Everything here is pure (no sockets) except the config server, which `keelson serve`
//! and the agent's `ignition_server` share.

pub mod cluster;

pub use cluster::{ClusterConfig, Role};
