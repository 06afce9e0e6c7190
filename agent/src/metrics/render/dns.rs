//! The families of the cluster DNS server, where it runs: queries and answers, by
//! question type and response code from fixed tables.

use super::{Family, Rows, Sample, count, counter, gauge, histogram, none};
use crate::status::model::{AgentStatus, DnsStatus};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
    counter(
        "keelson_dns_requests",
        "Requests received (UDP datagrams and TCP messages).",
        |st| dns_one(st, |d| count(d.received)),
    ),
    counter(
        "keelson_dns_queries",
        "Decoded queries by question type.",
        |st| dns_by(st, "qtype", |d| &d.queries),
    ),
    counter(
        "keelson_dns_responses",
        "Responses by response code.",
        |st| dns_by(st, "rcode", |d| &d.responses),
    ),
    counter(
        "keelson_dns_authoritative",
        "Queries answered from the cluster zone.",
        |st| dns_one(st, |d| count(d.authoritative)),
    ),
    counter(
        "keelson_dns_forwarded",
        "Queries for names outside the zone (sent upstream or answered from the cache).",
        |st| dns_one(st, |d| count(d.forwarded)),
    ),
    counter(
        "keelson_dns_forward_failures",
        "Forwarded queries no upstream answered (SERVFAIL sent).",
        |st| dns_one(st, |d| count(d.forward_failures)),
    ),
    counter(
        "keelson_dns_cache_hits",
        "Forwarded queries answered from the cache.",
        |st| dns_one(st, |d| count(d.cache_hits)),
    ),
    histogram(
        "keelson_dns_forward_duration_seconds",
        "Time to an upstream's answer of forwarded queries.",
        |st| dns_one(st, |d| Sample::Histogram(d.forward_latency.clone())),
    ),
    counter(
        "keelson_dns_dropped",
        "Requests dropped without an answer, by reason.",
        |st| dns_by(st, "reason", |d| &d.dropped),
    ),
    counter(
        "keelson_dns_truncated",
        "UDP responses truncated (TC set).",
        |st| dns_one(st, |d| count(d.truncated)),
    ),
    counter(
        "keelson_dns_tcp_refused",
        "TCP connections refused (too many at once).",
        |st| dns_one(st, |d| count(d.tcp_refused)),
    ),
    gauge(
        "keelson_dns_zone_nodes",
        "Node names in the cluster zone.",
        |st| dns_one(st, |d| count(d.nodes)),
    ),
    gauge(
        "keelson_dns_upstreams",
        "Upstream resolvers configured or learned.",
        |st| dns_one(st, |d| count(d.upstreams.len() as u64)),
    ),
];

fn dns_one(st: &AgentStatus, f: impl Fn(&DnsStatus) -> Sample) -> Rows {
    st.dns.iter().map(|d| (none(), f(d))).collect()
}

fn dns_by(
    st: &AgentStatus,
    key: &'static str,
    f: impl Fn(&DnsStatus) -> &std::collections::BTreeMap<String, u64>,
) -> Rows {
    st.dns
        .iter()
        .flat_map(|d| f(d).iter())
        .map(|(k, n)| (vec![(key, k.clone())], count(*n)))
        .collect()
}
