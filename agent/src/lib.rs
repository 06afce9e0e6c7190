//! keelson-agent: the node agent.
//!
//! One module per concern, each owning its state (docs/architecture.md, "Inside the agent"); they talk through the
//! watch channels of [`context::Bus`]. Pure protocol logic lives apart from the socket
//! and netlink code at each module's edge so it can be tested without either.

pub mod apply;
pub mod bgp;
pub mod context;
pub mod dns;
pub mod dns_label;
pub mod health;
pub mod heap;
pub mod ignition_server;
pub mod init;
pub mod log;
pub mod member;
pub mod members;
pub mod metadata;
pub mod metrics;
pub mod net;
pub mod node;
pub mod node_address;
pub mod operator;
pub mod process_limits;
pub mod proxy;
pub mod retry;
pub mod run;
pub mod signals;
pub mod status;
pub mod supervisor;
pub mod vrrp;

/// The agent's version, as members announce it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
