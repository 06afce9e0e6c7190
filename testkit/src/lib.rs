//! The one harness every keelson test uses (docs/testing.md).
//!
//! - [`need`]: what a test needs from the machine (a command, root, a file, a variable) and
//!   the one rule when it is missing: **fail when `CI` is set** (to anything: `make test`
//!   sets `CI=1`), otherwise skip with one loud `SKIPPED` line naming what is missing.
//!   Every command a test runs is looked up here, and must be in `scripts/setup.sh`'s
//!   `REQUIRED` table (the skip line names its Debian package from there).
//! - [`cmd`]: run a command that must succeed ([`cmd::sh`]); child processes stopped on drop
//!   ([`cmd::Proc`]), and the JSON lines one prints ([`cmd::JsonLines`], which refuses to
//!   answer for a process that has died).
//! - [`netns`]: network namespaces with names unique to this process, deleted on drop; run
//!   a closure or a future inside one; bind a listener inside one.
//! - [`segment`]: a bridge with `n` namespaces on it (IPv4 and IPv6), address holders,
//!   link cuts, partitions, a multicast-dropping bridge.
//! - [`wait`]: poll a condition until a limit, failing with what was awaited (and, with
//!   [`wait_for_ok`], what was still missing).
//! - [`port`]: a free loopback port.
//! - [`http`]: `curl` on the host or in a namespace; a tiny route-table HTTP server; a
//!   server that never stops sending (for bounded readers).
//! - [`dig`]: `dig` on the host or in a namespace, and its output read back.
//! - [`tls`]: throw-away certificates and server configurations.
//! - [`config_drive`]: an OpenStack config-drive ISO made with `xorriso`.
//! - [`dhcp`]: a real DHCPv4 server (dnsmasq) in a namespace.
//! - [`proptest`]: the configuration every property test uses: a fixed seed per test
//!   under `CI`, printed and settable (`PROPTEST_RNG_SEED`), committed regression files
//!   read, nothing written.
//! - [`timing`]: the VRRP tests' timing bounds, derived from RFC 5798 with stated margins.
//! - [`agent`]: `keelson-agent` processes as the tests start them (VRRP-only agents,
//!   `run` nodes with the files `keelson build` writes, keepalived beside them).
//!
//! Everything here panics on failure (it is test code): a panic names what failed. A
//! command that fails is an error, never an empty value, and a helper that reads what a
//! process printed or answers checks first that the process still runs.

pub mod agent;
pub mod cmd;
pub mod config_drive;
pub mod dhcp;
pub mod dig;
#[cfg(test)]
mod harness_fails;
pub mod http;
pub mod need;
pub mod netns;
pub mod port;
pub mod proptest;
pub mod segment;
pub mod timing;
pub mod tls;
pub mod wait;

pub use cmd::{Proc, sh};
pub use need::{ci, require, require_env, require_file, require_root};
pub use netns::{Netns, in_netns};
pub use port::free_port;
pub use segment::Segment;
pub use wait::{wait_for, wait_for_async, wait_for_ok};
