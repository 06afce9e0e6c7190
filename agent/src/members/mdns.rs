//! mDNS / DNS-SD (RFC 6762/6763) for members, as pure logic: the packets we send and what
//! we learn from the packets we receive. The sockets are in [`super::mdns_net`].
//!
//! Each node publishes, with TTL = the members expiry:
//! - `_keelson._tcp.local. PTR <node>._keelson._tcp.local.` (shared record),
//! - `<node>._keelson._tcp.local. SRV 0 0 <ignition tls port> <node>.local.` (cache-flush),
//! - `<node>._keelson._tcp.local. TXT "role=.." "cluster=<zone>" "version=.."` (cache-flush),
//! - `<node>.local. A/AAAA` per address (cache-flush).
//!
//! In a cluster whose records are authenticated (`members.keyId`, [`super::auth`]) the TXT
//! record is the whole member record, signed: it also carries `addrs=` (the addresses,
//! comma-separated, continued in `addrs2=`, `addrs3=`... past 255 bytes) and the proof
//! (`kid=`, `time=`, `seq=`, `mac=`), and a TTL-0 TXT is a signed goodbye. A cache with a
//! [`Verifier`] then believes only signed TXT records (from one of the addresses they sign,
//! or from an IPv6 link-local address, which is where IPv6 mDNS comes from); PTR, SRV and
//! A/AAAA records, which anyone can send, only tell it what to ask for. avahi still browses
//! and resolves the nodes: the records it reads are all there.
//!
//! The wire format is hickory-proto's `Message` (without its `mdns` feature, which would
//! change record parsing for the unicast DNS server too): the cache-flush and unicast-response
//! bits are carried in the class field by hand, as `DNSClass::Unknown(0x8001)`.
//!
//! - here: the names (service, instance, host) and the cache-flush class both sides use;
//! - `announce`: what this node sends ([`Announce`]) and the queries it asks;
//! - `cache`: what it learns from what it receives ([`Cache`]);
//! - `txt`: the TXT record's addresses and proof, written and read.

use hickory_proto::rr::domain::Label;
use hickory_proto::rr::{DNSClass, Name, Record};

use crate::dns_label::DnsLabel;

mod announce;
mod cache;
mod txt;

pub use announce::{Announce, browse_query, resolve_query};
pub use cache::{Cache, Received, Rejected};

/// The DNS-SD service type members use.
pub const SERVICE: &str = "_keelson._tcp.local.";
/// The mDNS port.
pub const MDNS_PORT: u16 = 5353;
/// The IPv4 mDNS group.
pub const MDNS_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(224, 0, 0, 251);

/// Class IN with the top bit (cache-flush in answers, unicast-response in questions).
const IN_FLUSH: DNSClass = DNSClass::Unknown(0x8001);

/// Errors naming our own records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MdnsError {
    /// The node name does not make a DNS name with the service (hickory refused it).
    #[error("node name {0:?}: no mDNS name can be made of it")]
    BadNodeName(String),
}

fn service_name() -> Name {
    Name::from_ascii(SERVICE).expect("constant name")
}

/// `node` as one DNS label, its bytes as they are: hickory's `&str` conversions would run
/// IDNA over an A-label (`xn--...`) and refuse one it cannot decode, which is not ours to
/// judge (and the agent has no Unicode tables to judge it with).
fn label(node: &DnsLabel) -> Result<Label, MdnsError> {
    Label::from_raw_bytes(node.as_bytes()).map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn instance_name(node: &DnsLabel) -> Result<Name, MdnsError> {
    service_name()
        .prepend_label(label(node)?)
        .map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn host_name(node: &DnsLabel) -> Result<Name, MdnsError> {
    Name::from_labels([
        label(node)?,
        Label::from_ascii("local").expect("constant label"),
    ])
    .map_err(|_| MdnsError::BadNodeName(node.to_string()))
}

fn flush(mut r: Record) -> Record {
    r.dns_class = IN_FLUSH;
    r
}

#[cfg(test)]
mod tests;
