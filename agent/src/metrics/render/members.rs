//! The families of member discovery: the live members by role and source, what the
//! transport received and dropped, member authentication, and (unicast) the registry.

use super::{Family, Rows, Sample, count, counter, gauge, int, none};
use crate::status::model::{AgentStatus, MembersAuth, RegistryStatus};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
    gauge(
        "keelson_members",
        "Live members by role and by how this node learned them (self, mdns, unicast).",
        members_by_role_and_source,
    ),
    counter(
        "keelson_members_received",
        "mDNS packets or unicast registrations received.",
        |st| {
            st.discovery
                .iter()
                .map(|d| (vec![("transport", d.transport.clone())], count(d.received)))
                .collect()
        },
    ),
    counter(
        "keelson_members_drops",
        "Member records or packets dropped, by reason.",
        |st| {
            st.discovery
                .iter()
                .flat_map(|d| {
                    d.drops.iter().map(move |(r, n)| {
                        (
                            vec![("transport", d.transport.clone()), ("reason", r.clone())],
                            count(*n),
                        )
                    })
                })
                .collect()
        },
    ),
    gauge(
        "keelson_members_authenticated",
        "1 when member records are signed and checked (cluster.json names a key).",
        |st| {
            members_auth(st)
                .map(|a| (none(), int(a.authenticated.into())))
                .collect()
        },
    ),
    counter(
        "keelson_members_auth_drops",
        "Member records dropped by authentication, by reason.",
        |st| {
            members_auth(st)
                .flat_map(|a| a.drops.iter())
                .map(|(r, n)| (vec![("reason", r.clone())], count(*n)))
                .collect()
        },
    ),
    counter(
        "keelson_members_registrations_refused",
        "Unicast registrations a registry refused or answered with something unusable.",
        |st| {
            st.discovery
                .iter()
                .filter(|d| d.transport == "unicast")
                .map(|d| (none(), count(d.refused)))
                .collect()
        },
    ),
    gauge(
        "keelson_members_registry_entries",
        "Unicast: members this node's registry holds (registered or merged; this node aside).",
        |st| registry_one(st, |r| count(r.entries)),
    ),
    gauge(
        "keelson_members_registry_limit",
        "Unicast: the most members a registry holds.",
        |st| registry_one(st, |r| count(r.limit)),
    ),
    counter(
        "keelson_members_registry_refused",
        "Unicast: registrations refused before they were believed: full, address (too many members at the sender's address), rate (too many registrations from it).",
        |st| {
            registries(st)
                .flat_map(|r| r.refused.iter())
                .map(|(reason, n)| (vec![("reason", reason.clone())], count(*n)))
                .collect()
        },
    ),
    counter(
        "keelson_members_registry_merge_skipped",
        "Unicast: entries of other registries' answers not taken because the registry was full.",
        |st| registry_one(st, |r| count(r.merge_skipped)),
    ),
    counter(
        "keelson_members_registry_answers",
        "Unicast: answers this registry served to registrations (lists and unchanged).",
        |st| registry_one(st, |r| count(r.answers)),
    ),
    counter(
        "keelson_members_registry_answers_unchanged",
        "Unicast: answers that said the list the node holds is unchanged (304), sending no list.",
        |st| registry_one(st, |r| count(r.unchanged)),
    ),
    counter(
        "keelson_members_registry_answer_bytes",
        "Unicast: bytes of the member lists served (before TLS).",
        |st| registry_one(st, |r| count(r.answer_bytes)),
    ),
    gauge(
        "keelson_members_registry_sources",
        "Unicast: addresses the per-address registration limit keeps.",
        |st| registry_one(st, |r| count(r.sources)),
    ),
];

fn registries(st: &AgentStatus) -> impl Iterator<Item = &RegistryStatus> {
    st.discovery.iter().filter_map(|d| d.registry.as_ref())
}

/// One unlabelled sample from the registry, when this node has one (unicast).
fn registry_one(st: &AgentStatus, f: impl Fn(&RegistryStatus) -> Sample) -> Rows {
    registries(st).map(|r| (none(), f(r))).collect()
}

fn members_auth(st: &AgentStatus) -> impl Iterator<Item = &MembersAuth> {
    st.discovery.iter().filter_map(|d| d.auth.as_ref())
}

/// Live members by role and source (`self`, or the transport that brought them); every role
/// with both sources, zero included, so a dashboard always has the series.
fn members_by_role_and_source(st: &AgentStatus) -> Rows {
    let transport = st
        .discovery
        .as_ref()
        .map(|d| d.transport.clone())
        .unwrap_or_else(|| "none".to_string());
    let mut counts: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for role in keelson_cluster::Role::ALL {
        counts.insert((role.to_string(), "self".into()), 0);
        counts.insert((role.to_string(), transport.clone()), 0);
    }
    for mem in &st.members {
        let source = if mem.name == st.node.name {
            "self".to_string()
        } else {
            transport.clone()
        };
        *counts.entry((mem.role.to_string(), source)).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((role, source), n)| (vec![("role", role), ("source", source)], int(n)))
        .collect()
}
