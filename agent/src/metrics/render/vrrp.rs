//! The families of the VRRP instances and their health checks, one row per instance
//! (`vrrp_instance`) or per check (`vrrp_instance`, `check`).

use super::{Family, Rows, Sample, count, counter, float, gauge, int};
use crate::status::model::{AgentStatus, HealthCheck, VrrpInstance, VrrpState};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
    gauge(
        "keelson_vrrp_state",
        "VRRP state of each instance: 1 for the current state, 0 for the others.",
        |st| {
            st.vrrp
                .iter()
                .flat_map(|v| {
                    VrrpState::ALL.iter().map(move |s| {
                        (
                            vec![
                                ("vrrp_instance", v.name.clone()),
                                ("state", s.as_str().to_string()),
                            ],
                            int(i64::from(v.state == *s)),
                        )
                    })
                })
                .collect()
        },
    ),
    gauge(
        "keelson_vrrp_vip_info",
        "The VIP and virtual router ID of each instance (always 1).",
        |st| {
            st.vrrp
                .iter()
                .map(|v| {
                    (
                        vec![
                            ("vrrp_instance", v.name.clone()),
                            ("vip", v.vip.to_string()),
                            ("vrid", v.vrid.to_string()),
                        ],
                        int(1),
                    )
                })
                .collect()
        },
    ),
    gauge(
        "keelson_vrrp_state_seconds",
        "Seconds each instance has been in its current state.",
        |st| per_vrrp(st, |v| Some(float(v.state_seconds))),
    ),
    gauge(
        "keelson_vrrp_priority",
        "Effective priority (base plus the weights of passing checks).",
        |st| per_vrrp(st, |v| Some(int(v.priority.into()))),
    ),
    gauge(
        "keelson_vrrp_base_priority",
        "Base priority of this node's role.",
        |st| per_vrrp(st, |v| Some(int(v.base_priority.into()))),
    ),
    gauge(
        "keelson_vrrp_master_priority",
        "Priority of the master last heard (this node's own when master).",
        |st| per_vrrp(st, |v| Some(int(v.master_priority?.into()))),
    ),
    counter("keelson_vrrp_transitions", "VRRP state changes.", |st| {
        per_vrrp(st, |v| Some(count(v.transitions)))
    }),
    counter(
        "keelson_vrrp_adverts_received",
        "Valid adverts received for the instance.",
        |st| per_vrrp(st, |v| Some(count(v.adverts_received))),
    ),
    counter(
        "keelson_vrrp_adverts_sent",
        "Adverts sent (one per destination).",
        |st| per_vrrp(st, |v| Some(count(v.adverts_sent))),
    ),
    gauge(
        "keelson_vrrp_advert_destinations",
        "Where each advert goes: unicast peers (the fan-out), or 1 for the multicast group.",
        |st| per_vrrp(st, |v| Some(count(v.destinations.len() as u64))),
    ),
    counter(
        "keelson_vrrp_announcements",
        "Gratuitous ARPs / unsolicited neighbour advertisements sent for the VIP.",
        |st| per_vrrp(st, |v| Some(count(v.announcements))),
    ),
    counter(
        "keelson_vrrp_arp_conflicts",
        "Unicast: ARP frames showing another holder of the VIP that sends no adverts.",
        |st| per_vrrp(st, |v| Some(count(v.arp_conflicts))),
    ),
    counter(
        "keelson_vrrp_conflict_yields",
        "Unicast: times this node gave the VIP up to a holder it cannot hear.",
        |st| per_vrrp(st, |v| Some(count(v.conflict_yields))),
    ),
    counter(
        "keelson_vrrp_lone_claims",
        "Unicast: times the claim grace ran out with no peer heard and the VIP was claimed alone.",
        |st| per_vrrp(st, |v| Some(count(v.lone_claims))),
    ),
    counter(
        "keelson_vrrp_claims_held",
        "Times a silent master's VIP holder still answered ARP / neighbour solicitation, so this backup did not claim.",
        |st| per_vrrp(st, |v| Some(count(v.claims_held))),
    ),
    counter(
        "keelson_vrrp_deaf_yields",
        "Times this master gave the VIP up to a router that could not hear its adverts.",
        |st| per_vrrp(st, |v| Some(count(v.deaf_yields))),
    ),
    counter(
        "keelson_vrrp_foreign_adverts",
        "Adverts on the instance's VRID from another virtual router: a host that is not a member advertising other VIPs (another cluster uses the VRID).",
        |st| per_vrrp(st, |v| Some(count(v.foreign_adverts))),
    ),
    counter(
        "keelson_vrrp_heard_forgotten",
        "Routers heard that were forgotten early to keep at most 256 (the one heard longest ago first).",
        |st| per_vrrp(st, |v| Some(count(v.heard_forgotten))),
    ),
    counter("keelson_vrrp_drops", "Packets dropped, by reason.", |st| {
        st.vrrp
            .iter()
            .flat_map(|v| {
                v.drops.iter().map(move |(r, n)| {
                    (
                        vec![("vrrp_instance", v.name.clone()), ("reason", r.clone())],
                        count(*n),
                    )
                })
            })
            .collect()
    }),
    gauge(
        "keelson_vrrp_port_security_problem",
        "Cloud port security problems found (docs/vrrp.md, Port security): 1 while found.",
        |st| {
            st.vrrp
                .iter()
                .flat_map(|v| {
                    crate::vrrp::portsec::Problem::ALL.iter().map(move |p| {
                        (
                            vec![
                                ("vrrp_instance", v.name.clone()),
                                ("problem", p.as_str().to_string()),
                            ],
                            int(i64::from(v.port_security.iter().any(|f| f.problem == *p))),
                        )
                    })
                })
                .collect()
        },
    ),
    gauge(
        "keelson_health_check_passing",
        "Whether each health check of a VRRP instance passes.",
        |st| per_check(st, |c| int(c.passing.into())),
    ),
    gauge(
        "keelson_health_check_weight",
        "Priority a health check adds while it passes.",
        |st| per_check(st, |c| int(c.weight.into())),
    ),
    counter(
        "keelson_health_check_transitions",
        "Times a health check changed between passing and failing.",
        |st| per_check(st, |c| count(c.transitions)),
    ),
];

fn per_vrrp(st: &AgentStatus, f: impl Fn(&VrrpInstance) -> Option<Sample>) -> Rows {
    st.vrrp
        .iter()
        .filter_map(|v| Some((vec![("vrrp_instance", v.name.clone())], f(v)?)))
        .collect()
}

fn per_check(st: &AgentStatus, f: impl Fn(&HealthCheck) -> Sample) -> Rows {
    st.vrrp
        .iter()
        .flat_map(|v| v.checks.iter().map(move |c| (v, c)))
        .map(|(v, c)| {
            let labels = vec![("vrrp_instance", v.name.clone()), ("check", c.name.clone())];
            (labels, f(c))
        })
        .collect()
}
