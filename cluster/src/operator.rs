//! The operator's view of a running cluster, shared by the agent (which serves it) and
//! `keelson status` (which reads it); docs/architecture.md, "Security: what a node exposes".
//!
//! A control-plane node (bootstrap or master: the roles that hold the server certificate)
//! serves [`PORT`] over TLS and answers only a client whose certificate chains to the cluster
//! CA and is made for client authentication. No node holds such a certificate: `keelson
//! status` signs a short-lived one with `tls/ca.key` on the operator's machine for each run,
//! so the port answers the holder of the CA key and nobody else. [`CLUSTER_PATH`] gathers
//! every member's status document from its metrics port ([`STATUS_PATH`], which answers the
//! machine network as `/metrics` does) into one [`ClusterReport`]; [`NODE_PATH`] is the
//! answering node's own.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The operator status port (TLS, client certificate required), on the control plane: past
/// every port keelson's Ignition server may take (22623-22624, or 22626-22627 beside
/// OpenShift's machine-config-server) and `/metrics` (22625).
pub const PORT: u16 = 22628;
/// Every member's status, gathered by the node that answers.
pub const CLUSTER_PATH: &str = "/v1/cluster";
/// The answering node's own status.
pub const NODE_PATH: &str = "/v1/node";
/// A node's status document as JSON on its metrics port (`metrics.port`), beside `/metrics`
/// and open to the same clients.
pub const STATUS_PATH: &str = "/status";
/// The start of the common name of the client certificates `keelson status` signs.
pub const CLIENT_CN_PREFIX: &str = "keelson operator";

/// What [`CLUSTER_PATH`] answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    /// The node that answered and gathered.
    pub answered_by: String,
    /// Every live member the answering node knows, itself included, by name.
    pub nodes: Vec<NodeReport>,
}

/// One member in a [`ClusterReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// The member's name.
    pub name: String,
    /// Where it was asked.
    pub address: Option<IpAddr>,
    /// Its status document (`keelson-agent status --json`), when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// Why it did not, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
