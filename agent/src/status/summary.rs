//! The one-screen text of `keelson-agent status`: the same facts `/metrics` exports, a line
//! or two per thing.

use std::fmt::Write as _;

use super::model::{AgentStatus, BgpStatus, PortProblem, VrrpState};

fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|x| x.to_string()).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// `name value` pairs of non-zero counts, or `-`.
fn counts<'a>(map: impl IntoIterator<Item = (&'a String, &'a u64)>) -> String {
    join(
        map.into_iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}")),
    )
}

/// `1h02m`, `3m04s`, `12s`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `512 B`, `3.4 KiB`, `12.0 MiB`, `1.2 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn millis(secs: f64) -> String {
    format!("{:.1} ms", secs * 1000.0)
}

/// The human summary.
pub fn summary(st: &AgentStatus) -> String {
    let mut o = String::new();
    let n = &st.node;
    let p = &st.process;
    let _ = writeln!(
        o,
        "node {} ({}) in {} on {} {}",
        n.name,
        n.role,
        n.cluster,
        n.interface,
        join(&n.addresses)
    );
    if let Some(p) = &n.address_problem {
        let _ = writeln!(
            o,
            "  address problem for {}: {}",
            duration(p.seconds),
            p.problem
        );
    }
    let _ = writeln!(
        o,
        "keelson-agent {} ({}), up {}, {} resident, {} of {} fds, cpu {:.1} s",
        st.build.version,
        st.build.commit,
        duration(p.uptime_seconds),
        bytes(p.resident_memory_bytes),
        p.open_fds,
        p.max_fds,
        p.cpu_seconds
    );
    let _ = writeln!(
        o,
        "ready: {}; VIPs held: {}; DNS upstreams: {}",
        join(&st.ready),
        join(&st.vips_held),
        join(&st.dns_upstreams)
    );
    for (name, r) in &st.restarts {
        let _ = writeln!(
            o,
            "restarted {name} {} times; last: {}",
            r.restarts, r.last_error
        );
    }
    vrrp_lines(&mut o, st);
    proxy_lines(&mut o, st);
    dns_lines(&mut o, st);
    members_lines(&mut o, st);
    ignition_lines(&mut o, st);
    if let Some(b) = &st.other.bgp {
        o.push_str(&bgp_lines(b));
    }
    o
}

/// Each VRRP instance.
fn vrrp_lines(o: &mut String, st: &AgentStatus) {
    for v in &st.vrrp {
        let state = match v.state {
            VrrpState::Master => "MASTER",
            VrrpState::Backup => "BACKUP",
            VrrpState::Initialize => "INIT",
        };
        let master = match (v.master, v.master_priority) {
            (Some(a), Some(p)) => format!("{a} prio {p}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "vrrp {} {} vrid {}: {} for {}, prio {} (base {}), master {}, {} transitions, adverts in {} out {}, drops: {}",
            v.name,
            v.vip,
            v.vrid,
            state,
            duration(v.state_seconds),
            v.priority,
            v.base_priority,
            master,
            v.transitions,
            v.adverts_received,
            v.adverts_sent,
            counts(&v.drops)
        );
        for f in &v.port_security {
            let what = match f.problem {
                PortProblem::VipNotAllowed => {
                    "this node's port drops the VIP (not an allowed address pair?)"
                }
                PortProblem::VrrpBlocked => "VRRP adverts do not arrive (protocol 112 blocked?)",
            };
            let _ = writeln!(
                o,
                "  PORT SECURITY: {what} for {}; fix: {}",
                duration(f.seconds),
                f.fix
            );
        }
        if !v.checks.is_empty() {
            let checks = v.checks.iter().map(|c| {
                format!(
                    "{} {} ({:+}, {} changes)",
                    c.name,
                    if c.passing { "pass" } else { "FAIL" },
                    c.weight,
                    c.transitions
                )
            });
            let _ = writeln!(o, "  checks: {}", join(checks));
        }
    }
}

/// The API proxy.
fn proxy_lines(o: &mut String, st: &AgentStatus) {
    if let Some(px) = &st.proxy {
        let _ = writeln!(
            o,
            "proxy: {}; drained {} (cut {})",
            if px.healthy {
                "healthy"
            } else {
                "NO BACKEND UP"
            },
            px.drained,
            px.drain_cut
        );
        for f in &px.frontends {
            let _ = writeln!(
                o,
                "  frontend {} ({}): accepted {}, refused {}, active {}",
                f.addr,
                f.kind.as_str(),
                f.accepted,
                f.refused,
                f.active
            );
        }
        for b in &px.backends {
            let check = match b.last_check_seconds {
                Some(s) => millis(s),
                None => "-".into(),
            };
            let _ = writeln!(
                o,
                "  backend {} {}{}: conns {} active / {} total, {} in / {} out, connect failures {}, staggers {}, cut when down {}, {} transitions, check {}{}",
                b.addr,
                b.state.to_uppercase(),
                if b.weight_percent < 100 {
                    format!(" (slowstart {} %)", b.weight_percent)
                } else {
                    String::new()
                },
                b.active,
                b.total,
                bytes(b.bytes_in),
                bytes(b.bytes_out),
                b.connect_failures,
                b.staggers,
                b.sessions_shut_down,
                b.transitions,
                check,
                b.last_error
                    .as_ref()
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            );
        }
    }
}

/// The DNS server.
fn dns_lines(o: &mut String, st: &AgentStatus) {
    if let Some(d) = &st.dns {
        let _ = writeln!(
            o,
            "dns {} on {}: {} received; queries: {}; responses: {}",
            d.zone,
            join(&d.listen),
            d.received,
            counts(&d.queries),
            counts(&d.responses)
        );
        let mean = d
            .forward_latency
            .mean()
            .map(|m| millis(m.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            o,
            "  authoritative {}, forwarded {} (failed {}, cache hits {}, upstream mean {}), truncated {}, dropped: {}, tcp refused {}; upstreams: {}",
            d.authoritative,
            d.forwarded,
            d.forward_failures,
            d.cache_hits,
            mean,
            d.truncated,
            counts(&d.dropped),
            d.tcp_refused,
            join(&d.upstreams)
        );
        if let Some(e) = &d.etcd {
            let names: Vec<String> = e.names.iter().map(|(n, m)| format!("{n}={m}")).collect();
            let _ = writeln!(
                o,
                "  etcd names: {}; SRV {} ({} of {} masters){}{}",
                if names.is_empty() {
                    "-".to_string()
                } else {
                    names.join(", ")
                },
                if e.srv_ready { "answered" } else { "NODATA" },
                e.names.len(),
                e.masters,
                if e.unindexed.is_empty() {
                    String::new()
                } else {
                    format!("; no index in the name: {}", e.unindexed.join(", "))
                },
                if e.duplicates.is_empty() {
                    String::new()
                } else {
                    format!("; index taken: {}", e.duplicates.join(", "))
                },
            );
        }
    }
}

/// Members and their discovery.
fn members_lines(o: &mut String, st: &AgentStatus) {
    let _ = writeln!(o, "members ({}):", st.members.len());
    for m in &st.members {
        let _ = writeln!(
            o,
            "  {:<16} {:<9} {} (agent {})",
            m.name,
            m.role,
            join(&m.addresses),
            m.version
        );
    }
    if let Some(d) = &st.discovery {
        let _ = writeln!(
            o,
            "  discovery {}: {} received, drops: {}",
            d.transport,
            d.received,
            counts(&d.drops)
        );
        if !d.registries.is_empty() || d.refused > 0 {
            let regs = d.registries.iter().map(|(a, r)| format!("{a} {r}"));
            let _ = writeln!(
                o,
                "  registries: {} (refused {})",
                regs.collect::<Vec<_>>().join(", "),
                d.refused
            );
        }
        match &d.auth {
            Some(a) if a.authenticated => {
                let _ = writeln!(o, "  records signed; dropped: {}", counts(&a.drops));
            }
            Some(_) => {
                let _ = writeln!(
                    o,
                    "  records NOT authenticated (cluster.json names no membership key)"
                );
            }
            None => {}
        }
    }
}

/// The Ignition server.
fn ignition_lines(o: &mut String, st: &AgentStatus) {
    if let Some(ig) = &st.ignition {
        let listen = join(ig.tls.iter().chain(ig.plain.iter()));
        let requests = ig.requests.iter().map(|r| {
            let what = [r.route.as_str(), r.pool.as_str(), r.spec.as_str()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            format!("{what} {} x{}", r.status, r.count)
        });
        let _ = writeln!(
            o,
            "ignition on {}{}; allowed: {}; requests: {}",
            listen,
            if ig.bootstrap { " (bootstrap)" } else { "" },
            join(&ig.allowed_networks),
            join(requests)
        );
    }
}

/// BGP's own lines: per VIP, announced or why not.
pub fn bgp_lines(status: &BgpStatus) -> String {
    let mut out = format!(
        "bgp: {} ({}), table {}, router id {}\n",
        status.daemon, status.daemon_run, status.table, status.router_id
    );
    for s in &status.sessions {
        out.push_str(&format!(
            "  peer {:<24} AS{:<10} {}\n",
            s.peer,
            s.asn,
            s.state.as_deref().unwrap_or("unknown")
        ));
    }
    for v in &status.vips {
        if v.announced {
            out.push_str(&format!("  {} {}: announced\n", v.name, v.vip));
        } else {
            out.push_str(&format!(
                "  {} {}: not announced: {}\n",
                v.name,
                v.vip,
                v.why_not.join("; ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(duration(5.9), "5s");
        assert_eq!(duration(184.0), "3m04s");
        assert_eq!(duration(3720.0), "1h02m");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3482), "3.4 KiB");
        assert_eq!(bytes(12 << 20), "12.0 MiB");
    }
}
