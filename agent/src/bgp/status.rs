//! What `keelson-agent status` shows about BGP: per VIP whether this node announces it,
//! and if not, why (pure: built from the check states, the table and the daemon's answer).

use super::birdc::Protocol;
use super::plan::{NodePlan, VipPlan};
use crate::health::CheckState;
use crate::status::model::{CheckStateStatus, SessionStatus, VipStatus};

/// Whether a VIP with these check states is announced: every check passes (a VIP without
/// checks always is).
pub fn checks_pass(checks: &[CheckState]) -> bool {
    checks.iter().all(|c| c.passing)
}

/// The sessions of `plan` with their state from `protocols` (`None`: the daemon was not
/// asked or did not answer).
pub fn sessions(plan: &NodePlan, protocols: Option<&[Protocol]>) -> Vec<SessionStatus> {
    plan.peers
        .iter()
        .filter(|p| {
            plan.vips
                .iter()
                .any(|v| v.vip.is_ipv4() == p.address.is_ipv4())
        })
        .map(|p| {
            let row = protocols.and_then(|ps| ps.iter().find(|r| r.name == p.name));
            SessionStatus {
                peer: p.address,
                asn: p.asn,
                state: row.map(|r| {
                    if r.info.is_empty() {
                        r.state.clone()
                    } else {
                        r.info.clone()
                    }
                }),
                established: row.is_some_and(Protocol::established),
            }
        })
        .collect()
}

/// The status of one VIP. `sessions_known` is false for a daemon the agent cannot ask.
pub fn vip_status(
    vip: &VipPlan,
    checks: &[CheckState],
    route_installed: bool,
    sessions: &[SessionStatus],
    sessions_known: bool,
    daemon_error: Option<&str>,
) -> VipStatus {
    let mut why = Vec::new();
    let failing: Vec<&str> = checks
        .iter()
        .filter(|c| !c.passing)
        .map(|c| c.name.as_str())
        .collect();
    if !failing.is_empty() {
        why.push(format!("check failing: {}", failing.join(", ")));
    } else if !route_installed {
        why.push("route not in the keelson table yet".into());
    }
    let family: Vec<&SessionStatus> = sessions
        .iter()
        .filter(|s| s.peer.is_ipv4() == vip.vip.is_ipv4())
        .collect();
    if family.is_empty() {
        why.push(format!(
            "no {} BGP peer on this node's networks",
            if vip.vip.is_ipv4() { "IPv4" } else { "IPv6" }
        ));
    } else if sessions_known && !family.iter().any(|s| s.established) {
        match daemon_error {
            Some(e) => why.push(format!("routing daemon not answering: {e}")),
            None => why.push(format!(
                "no BGP session established ({})",
                family
                    .iter()
                    .map(|s| format!("{}: {}", s.peer, s.state.as_deref().unwrap_or("unknown")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    VipStatus {
        name: vip.name.clone(),
        vip: vip.vip,
        route_installed,
        announced: why.is_empty(),
        why_not: why,
        prepend: vip.prepend,
        checks: checks
            .iter()
            .map(|c| CheckStateStatus {
                name: c.name.clone(),
                passing: c.passing,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip() -> VipPlan {
        VipPlan {
            name: "api".into(),
            vip: "10.255.0.5".parse().unwrap(),
            prepend: 1,
            checks: vec![],
        }
    }

    fn check(name: &str, passing: bool) -> CheckState {
        CheckState {
            name: name.into(),
            passing,
            weight: 10,
            transitions: 0,
        }
    }

    fn session(peer: &str, established: bool) -> SessionStatus {
        SessionStatus {
            peer: peer.parse().unwrap(),
            asn: 65001,
            state: Some(if established { "Established" } else { "Active" }.into()),
            established,
        }
    }

    #[test]
    fn announced_when_checks_pass_and_a_session_is_up() {
        let s = vip_status(
            &vip(),
            &[check("api-proxy", true)],
            true,
            &[session("10.1.0.1", true), session("10.2.0.1", false)],
            true,
            None,
        );
        assert!(s.announced, "{s:?}");
        assert!(s.why_not.is_empty());
    }

    #[test]
    fn says_which_check_fails() {
        let s = vip_status(
            &vip(),
            &[check("api-proxy", true), check("local-apiserver", false)],
            false,
            &[session("10.1.0.1", true)],
            true,
            None,
        );
        assert!(!s.announced);
        assert_eq!(s.why_not, ["check failing: local-apiserver"]);
        assert!(!checks_pass(&[check("a", true), check("b", false)]));
        assert!(checks_pass(&[]));
    }

    #[test]
    fn says_no_session_or_no_peer() {
        let s = vip_status(&vip(), &[], true, &[session("10.1.0.1", false)], true, None);
        assert_eq!(s.why_not, ["no BGP session established (10.1.0.1: Active)"]);
        let s = vip_status(&vip(), &[], true, &[session("fd01::1", true)], true, None);
        assert_eq!(s.why_not, ["no IPv4 BGP peer on this node's networks"]);
        let s = vip_status(
            &vip(),
            &[],
            true,
            &[session("10.1.0.1", false)],
            true,
            Some("connection refused"),
        );
        assert_eq!(
            s.why_not,
            ["routing daemon not answering: connection refused"]
        );
        // A daemon the agent cannot ask: the route is all it knows.
        let s = vip_status(
            &vip(),
            &[],
            true,
            &[session("10.1.0.1", false)],
            false,
            None,
        );
        assert!(s.announced);
    }

    #[test]
    fn summary_lines() {
        let st = crate::status::model::BgpStatus {
            table: 198,
            daemon: "bird".into(),
            daemon_run: "agent".into(),
            daemon_error: None,
            router_id: "10.1.0.11".into(),
            sessions: vec![session("10.1.0.1", true)],
            vips: vec![vip_status(
                &vip(),
                &[check("local-apiserver", false)],
                false,
                &[session("10.1.0.1", true)],
                true,
                None,
            )],
        };
        let text = crate::status::bgp_lines(&st);
        assert!(text.contains("peer 10.1.0.1"), "{text}");
        assert!(
            text.contains("api 10.255.0.5: not announced: check failing: local-apiserver"),
            "{text}"
        );
    }
}
