//! The status document as Prometheus metrics: every metric of `docs/metrics.md`, built
//! from one [`AgentStatus`] (the one `keelson-agent status` shows), written as the
//! Prometheus text format 0.0.4 or OpenMetrics 1.0.
//!
//! Pure: a status in, text out. Labels are bounded by construction: instance, check,
//! frontend and backend names come from `cluster.json` and the members (masters), question
//! types and response codes from fixed tables, Ignition pools and routes from a fixed set;
//! no client address ever becomes a label.

use crate::status::histogram::HistogramSnapshot;
use crate::status::model::{AgentStatus, VrrpState};

/// The exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4` (the default; what `promtool check metrics` reads).
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a non-zero quality, the 0.0.4 text otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            if !media.eq_ignore_ascii_case("application/openmetrics-text") {
                continue;
            }
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            if q > 0.0 {
                return Format::OpenMetrics;
            }
        }
        Format::Prometheus
    }
}

type Labels = Vec<(&'static str, String)>;

/// A sample value: integers print as integers, floats in Prometheus' spelling.
#[derive(Debug, Clone, Copy)]
enum Value {
    Int(i128),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Float(x) if x.is_nan() => f.write_str("NaN"),
            Value::Float(x) if x == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(x) if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            // Rust's shortest round-trip form, never an exponent: 0.0005, 1700000000.5.
            Value::Float(x) => write!(f, "{x}"),
        }
    }
}

/// Writes the families in the order they are added, in either format.
///
/// Hand-written rather than through an exposition crate: `fastmetrics` (the one crate that
/// writes both the 0.0.4 text `promtool` reads and OpenMetrics; `prometheus-client` writes
/// OpenMetrics only) put the static agent over its 12 MiB bar (docs/architecture.md, "Bars";
/// `docs/decisions.md`), and what is needed here — counters, gauges and histograms from
/// a snapshot, label escaping, the two naming rules for counters — is short.
struct Builder {
    format: Format,
    out: String,
}

/// Escapes a label value (both formats) or, with `quote` false, a 0.0.4 HELP text.
fn escape(s: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '\n', '"']) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

impl Builder {
    /// `# HELP` and `# TYPE` of a family. Counters: the 0.0.4 text names the family like
    /// its samples (`x_total`, Prometheus' convention); OpenMetrics names it `x` and only
    /// the samples `x_total`.
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        use std::fmt::Write as _;
        let suffix = if kind == "counter" && self.format == Format::Prometheus {
            "_total"
        } else {
            ""
        };
        // OpenMetrics escapes quotes in HELP too.
        let help = escape(help, self.format == Format::OpenMetrics);
        let _ = writeln!(self.out, "# HELP {name}{suffix} {help}");
        let _ = writeln!(self.out, "# TYPE {name}{suffix} {kind}");
    }

    fn sample(&mut self, name: &str, suffix: &str, labels: &[(&str, String)], v: Value) {
        use std::fmt::Write as _;
        let _ = write!(self.out, "{name}{suffix}");
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(val, true));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }

    fn family(&mut self, name: &str, help: &str, kind: &str, rows: Vec<(Labels, Value)>) {
        if rows.is_empty() {
            return;
        }
        self.header(name, help, kind);
        let suffix = if kind == "counter" { "_total" } else { "" };
        for (labels, v) in rows {
            self.sample(name, suffix, &labels, v);
        }
    }

    /// A counter family; `name` without `_total`.
    fn counter(&mut self, name: &'static str, help: &'static str, rows: Vec<(Labels, u64)>) {
        let rows = rows
            .into_iter()
            .map(|(l, v)| (l, Value::Int(v.into())))
            .collect();
        self.family(name, help, "counter", rows);
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, rows: Vec<(Labels, i64)>) {
        let rows = rows
            .into_iter()
            .map(|(l, v)| (l, Value::Int(v.into())))
            .collect();
        self.family(name, help, "gauge", rows);
    }

    fn gauge_f(&mut self, name: &'static str, help: &'static str, rows: Vec<(Labels, f64)>) {
        let rows = rows
            .into_iter()
            .map(|(l, v)| (l, Value::Float(v)))
            .collect();
        self.family(name, help, "gauge", rows);
    }

    fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        rows: Vec<(Labels, HistogramSnapshot)>,
    ) {
        if rows.is_empty() {
            return;
        }
        self.header(name, help, "histogram");
        for (labels, h) in rows {
            for (le, n) in h.cumulative() {
                let mut l = labels.clone();
                l.push(("le", Value::Float(le).to_string()));
                self.sample(name, "_bucket", &l, Value::Int(n.into()));
            }
            self.sample(name, "_count", &labels, Value::Int(h.count().into()));
            self.sample(name, "_sum", &labels, Value::Float(h.sum_seconds));
        }
    }

    /// `process_cpu_seconds_total`: a float counter.
    fn counter_f_seconds(&mut self, secs: f64) {
        self.family(
            "process_cpu_seconds",
            "Total user and system CPU time spent, seconds.",
            "counter",
            vec![(none(), Value::Float(secs))],
        );
    }
}

fn none() -> Labels {
    Vec::new()
}

fn b(v: bool) -> i64 {
    i64::from(v)
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Renders `st` in `format`.
pub fn render(st: &AgentStatus, format: Format) -> String {
    let mut m = Builder {
        format,
        out: String::with_capacity(16 * 1024),
    };
    process(&mut m, st);
    vrrp(&mut m, st);
    proxy(&mut m, st);
    dns(&mut m, st);
    members(&mut m, st);
    ignition(&mut m, st);
    if format == Format::OpenMetrics {
        m.out.push_str("# EOF\n");
    }
    m.out
}

fn process(m: &mut Builder, st: &AgentStatus) {
    let p = &st.process;
    m.gauge(
        "keelson_build_info",
        "The agent's version and git commit (always 1).",
        vec![(
            vec![
                ("version", st.build.version.clone()),
                ("commit", st.build.commit.clone()),
            ],
            1,
        )],
    );
    m.gauge(
        "keelson_node_info",
        "This node's name and role (always 1).",
        vec![(
            vec![
                ("node", st.node.name.clone()),
                ("role", st.node.role.to_string()),
            ],
            1,
        )],
    );
    m.gauge_f(
        "keelson_uptime_seconds",
        "Seconds since the agent started serving.",
        vec![(none(), p.uptime_seconds)],
    );
    m.gauge(
        "keelson_service_ready",
        "Services that are up (always 1).",
        st.ready
            .iter()
            .map(|s| (vec![("service", s.clone())], 1))
            .collect(),
    );
    m.counter(
        "keelson_service_restarts",
        "Restarts of services and operator processes by the supervisor.",
        st.restarts
            .iter()
            .map(|(s, r)| (vec![("service", s.clone())], r.restarts))
            .collect(),
    );
    m.gauge_f(
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, seconds.",
        vec![(none(), p.start_time_seconds)],
    );
    m.counter_f_seconds(p.cpu_seconds);
    m.gauge(
        "process_resident_memory_bytes",
        "Resident memory size, bytes.",
        vec![(none(), i(p.resident_memory_bytes))],
    );
    m.gauge(
        "process_virtual_memory_bytes",
        "Virtual memory size, bytes.",
        vec![(none(), i(p.virtual_memory_bytes))],
    );
    m.gauge(
        "process_open_fds",
        "Open file descriptors.",
        vec![(none(), i(p.open_fds))],
    );
    m.gauge(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        vec![(none(), i(p.max_fds))],
    );
    m.gauge(
        "process_threads",
        "Threads of the process.",
        vec![(none(), i(p.threads))],
    );
}

fn vrrp(m: &mut Builder, st: &AgentStatus) {
    let inst = |name: &str| vec![("vrrp_instance", name.to_string())];
    let each = |f: &dyn Fn(&crate::status::model::VrrpInstance) -> u64| {
        st.vrrp
            .iter()
            .map(|v| (inst(&v.name), f(v)))
            .collect::<Vec<_>>()
    };
    m.gauge(
        "keelson_vrrp_state",
        "VRRP state of each instance: 1 for the current state, 0 for the others.",
        st.vrrp
            .iter()
            .flat_map(|v| {
                VrrpState::ALL.iter().map(move |s| {
                    (
                        vec![
                            ("vrrp_instance", v.name.clone()),
                            ("state", s.as_str().to_string()),
                        ],
                        b(v.state == *s),
                    )
                })
            })
            .collect(),
    );
    m.gauge(
        "keelson_vrrp_vip_info",
        "The VIP and virtual router ID of each instance (always 1).",
        st.vrrp
            .iter()
            .map(|v| {
                (
                    vec![
                        ("vrrp_instance", v.name.clone()),
                        ("vip", v.vip.to_string()),
                        ("vrid", v.vrid.to_string()),
                    ],
                    1,
                )
            })
            .collect(),
    );
    m.gauge_f(
        "keelson_vrrp_state_seconds",
        "Seconds each instance has been in its current state.",
        st.vrrp
            .iter()
            .map(|v| (inst(&v.name), v.state_seconds))
            .collect(),
    );
    m.gauge(
        "keelson_vrrp_priority",
        "Effective priority (base plus the weights of passing checks).",
        st.vrrp
            .iter()
            .map(|v| (inst(&v.name), i64::from(v.priority)))
            .collect(),
    );
    m.gauge(
        "keelson_vrrp_base_priority",
        "Base priority of this node's role.",
        st.vrrp
            .iter()
            .map(|v| (inst(&v.name), i64::from(v.base_priority)))
            .collect(),
    );
    m.gauge(
        "keelson_vrrp_master_priority",
        "Priority of the master last heard (this node's own when master).",
        st.vrrp
            .iter()
            .filter_map(|v| Some((inst(&v.name), i64::from(v.master_priority?))))
            .collect(),
    );
    m.counter(
        "keelson_vrrp_transitions",
        "VRRP state changes.",
        each(&|v| v.transitions),
    );
    m.counter(
        "keelson_vrrp_adverts_received",
        "Valid adverts received for the instance.",
        each(&|v| v.adverts_received),
    );
    m.counter(
        "keelson_vrrp_adverts_sent",
        "Adverts sent (one per destination).",
        each(&|v| v.adverts_sent),
    );
    m.counter(
        "keelson_vrrp_announcements",
        "Gratuitous ARPs / unsolicited neighbour advertisements sent for the VIP.",
        each(&|v| v.announcements),
    );
    m.counter(
        "keelson_vrrp_arp_conflicts",
        "Unicast: ARP frames showing another holder of the VIP that sends no adverts.",
        each(&|v| v.arp_conflicts),
    );
    m.counter(
        "keelson_vrrp_conflict_yields",
        "Unicast: times this node gave the VIP up to a holder it cannot hear.",
        each(&|v| v.conflict_yields),
    );
    m.counter(
        "keelson_vrrp_lone_claims",
        "Unicast: times the claim grace ran out with no peer heard and the VIP was claimed alone.",
        each(&|v| v.lone_claims),
    );
    m.counter(
        "keelson_vrrp_drops",
        "Packets dropped, by reason.",
        st.vrrp
            .iter()
            .flat_map(|v| {
                v.drops.iter().map(move |(r, n)| {
                    (
                        vec![("vrrp_instance", v.name.clone()), ("reason", r.clone())],
                        *n,
                    )
                })
            })
            .collect(),
    );
    let check = |v: &crate::status::model::VrrpInstance, c: &crate::status::model::HealthCheck| {
        vec![("vrrp_instance", v.name.clone()), ("check", c.name.clone())]
    };
    let checks = || {
        st.vrrp
            .iter()
            .flat_map(|v| v.checks.iter().map(move |c| (v, c)))
    };
    m.gauge(
        "keelson_health_check_passing",
        "Whether each health check of a VRRP instance passes.",
        checks().map(|(v, c)| (check(v, c), b(c.passing))).collect(),
    );
    m.gauge(
        "keelson_health_check_weight",
        "Priority a health check adds while it passes.",
        checks()
            .map(|(v, c)| (check(v, c), i64::from(c.weight)))
            .collect(),
    );
    m.counter(
        "keelson_health_check_transitions",
        "Times a health check changed between passing and failing.",
        checks()
            .map(|(v, c)| (check(v, c), c.transitions))
            .collect(),
    );
}

fn proxy(m: &mut Builder, st: &AgentStatus) {
    let Some(px) = &st.proxy else { return };
    m.gauge(
        "keelson_proxy_healthy",
        "Whether the API proxy has at least one backend up.",
        vec![(none(), b(px.healthy))],
    );
    let fe = |f: &crate::status::model::FrontendStatus| {
        vec![
            ("frontend", f.addr.to_string()),
            ("kind", f.kind.as_str().to_string()),
        ]
    };
    m.counter(
        "keelson_proxy_frontend_accepted",
        "Client connections accepted.",
        px.frontends.iter().map(|f| (fe(f), f.accepted)).collect(),
    );
    m.counter(
        "keelson_proxy_frontend_refused",
        "Accepted clients closed at once because no backend answered.",
        px.frontends.iter().map(|f| (fe(f), f.refused)).collect(),
    );
    m.gauge(
        "keelson_proxy_frontend_active_connections",
        "Client connections open now.",
        px.frontends.iter().map(|f| (fe(f), i(f.active))).collect(),
    );
    m.gauge(
        "keelson_proxy_vip_redirected",
        "VIP:6443 addresses redirected to the node frontend with nftables (always 1).",
        px.vip_redirects
            .iter()
            .map(|a| (vec![("frontend", a.to_string())], 1))
            .collect(),
    );
    m.counter(
        "keelson_proxy_drained_connections",
        "Client connections still open when the proxy began to stop (let finish).",
        vec![(none(), px.drained)],
    );
    m.counter(
        "keelson_proxy_drain_cut_connections",
        "Client connections cut at the drain deadline.",
        vec![(none(), px.drain_cut)],
    );
    let be = |a: &std::net::SocketAddr| vec![("backend", a.to_string())];
    let each = |f: &dyn Fn(&crate::status::model::BackendSnapshot) -> u64| {
        px.backends
            .iter()
            .map(|bk| (be(&bk.addr), f(bk)))
            .collect::<Vec<_>>()
    };
    m.gauge(
        "keelson_proxy_backend_up",
        "Whether each backend takes new connections.",
        px.backends
            .iter()
            .map(|bk| (be(&bk.addr), b(bk.state == "up")))
            .collect(),
    );
    m.gauge(
        "keelson_proxy_backend_weight_percent",
        "Share of new connections a backend takes: below 100 while in slowstart, 0 when down.",
        px.backends
            .iter()
            .map(|bk| (be(&bk.addr), i64::from(bk.weight_percent)))
            .collect(),
    );
    m.counter(
        "keelson_proxy_backend_transitions",
        "Times a backend went up or down.",
        each(&|bk| bk.transitions),
    );
    m.gauge(
        "keelson_proxy_backend_active_connections",
        "Connections to the backend open now.",
        px.backends
            .iter()
            .map(|bk| (be(&bk.addr), i(bk.active)))
            .collect(),
    );
    m.counter(
        "keelson_proxy_backend_connections",
        "Connections proxied to the backend.",
        each(&|bk| bk.total),
    );
    m.counter(
        "keelson_proxy_backend_bytes",
        "Bytes proxied, by direction (to_backend: from clients; to_client: from the backend).",
        px.backends
            .iter()
            .flat_map(|bk| {
                [("to_backend", bk.bytes_in), ("to_client", bk.bytes_out)].map(|(d, n)| {
                    (
                        vec![
                            ("backend", bk.addr.to_string()),
                            ("direction", d.to_string()),
                        ],
                        n,
                    )
                })
            })
            .collect(),
    );
    m.counter(
        "keelson_proxy_backend_connect_failures",
        "Client connects to the backend that failed or stayed silent while another answered.",
        each(&|bk| bk.connect_failures),
    );
    m.counter(
        "keelson_proxy_backend_connect_staggers",
        "Times the connect stagger ran out waiting for the backend and another was tried alongside.",
        each(&|bk| bk.staggers),
    );
    m.counter(
        "keelson_proxy_backend_sessions_shut_down",
        "Client connections closed because the backend was marked down.",
        each(&|bk| bk.sessions_shut_down),
    );
    m.counter(
        "keelson_proxy_backend_checks",
        "Active health checks, by result.",
        px.backends
            .iter()
            .flat_map(|bk| {
                [("pass", bk.checks_passed), ("fail", bk.checks_failed)].map(|(r, n)| {
                    (
                        vec![("backend", bk.addr.to_string()), ("result", r.to_string())],
                        n,
                    )
                })
            })
            .collect(),
    );
    m.histogram(
        "keelson_proxy_backend_check_duration_seconds",
        "Duration of active health checks.",
        px.backends
            .iter()
            .map(|bk| (be(&bk.addr), bk.check_latency.clone()))
            .collect(),
    );
}

fn dns(m: &mut Builder, st: &AgentStatus) {
    let Some(d) = &st.dns else { return };
    let by = |key: &'static str, map: &std::collections::BTreeMap<String, u64>| {
        map.iter()
            .map(|(k, n)| (vec![(key, k.clone())], *n))
            .collect::<Vec<_>>()
    };
    m.counter(
        "keelson_dns_requests",
        "Requests received (UDP datagrams and TCP messages).",
        vec![(none(), d.received)],
    );
    m.counter(
        "keelson_dns_queries",
        "Decoded queries by question type.",
        by("qtype", &d.queries),
    );
    m.counter(
        "keelson_dns_responses",
        "Responses by response code.",
        by("rcode", &d.responses),
    );
    m.counter(
        "keelson_dns_authoritative",
        "Queries answered from the cluster zone.",
        vec![(none(), d.authoritative)],
    );
    m.counter(
        "keelson_dns_forwarded",
        "Queries for names outside the zone (sent upstream or answered from the cache).",
        vec![(none(), d.forwarded)],
    );
    m.counter(
        "keelson_dns_forward_failures",
        "Forwarded queries no upstream answered (SERVFAIL sent).",
        vec![(none(), d.forward_failures)],
    );
    m.counter(
        "keelson_dns_cache_hits",
        "Forwarded queries answered from the cache.",
        vec![(none(), d.cache_hits)],
    );
    m.histogram(
        "keelson_dns_forward_duration_seconds",
        "Time to an upstream's answer of forwarded queries.",
        vec![(none(), d.forward_latency.clone())],
    );
    m.counter(
        "keelson_dns_dropped",
        "Requests dropped without an answer, by reason.",
        by("reason", &d.dropped),
    );
    m.counter(
        "keelson_dns_truncated",
        "UDP responses truncated (TC set).",
        vec![(none(), d.truncated)],
    );
    m.counter(
        "keelson_dns_tcp_refused",
        "TCP connections refused (too many at once).",
        vec![(none(), d.tcp_refused)],
    );
    m.gauge(
        "keelson_dns_zone_nodes",
        "Node names in the cluster zone.",
        vec![(none(), i(d.nodes))],
    );
    m.gauge(
        "keelson_dns_upstreams",
        "Upstream resolvers configured or learned.",
        vec![(none(), d.upstreams.len() as i64)],
    );
}

fn members(m: &mut Builder, st: &AgentStatus) {
    let transport = st
        .discovery
        .as_ref()
        .map(|d| d.transport.clone())
        .unwrap_or_else(|| "none".to_string());
    let mut counts: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for role in keelson_ignition::Role::ALL {
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
    m.gauge(
        "keelson_members",
        "Live members by role and by how this node learned them (self, mdns, unicast).",
        counts
            .into_iter()
            .map(|((role, source), n)| (vec![("role", role), ("source", source)], n))
            .collect(),
    );
    if let Some(d) = &st.discovery {
        m.counter(
            "keelson_members_received",
            "mDNS packets or unicast registrations received.",
            vec![(vec![("transport", d.transport.clone())], d.received)],
        );
        m.counter(
            "keelson_members_drops",
            "Member records or packets dropped, by reason.",
            d.drops
                .iter()
                .map(|(r, n)| {
                    (
                        vec![("transport", d.transport.clone()), ("reason", r.clone())],
                        *n,
                    )
                })
                .collect(),
        );
        if let Some(a) = &d.auth {
            m.gauge(
                "keelson_members_authenticated",
                "1 when member records are signed and checked (cluster.json names a key).",
                vec![(vec![], i64::from(a.authenticated))],
            );
            m.counter(
                "keelson_members_auth_drops",
                "Member records dropped by authentication, by reason.",
                a.drops
                    .iter()
                    .map(|(r, n)| (vec![("reason", r.clone())], *n))
                    .collect(),
            );
        }
        if d.transport == "unicast" {
            m.counter(
                "keelson_members_registrations_refused",
                "Unicast registrations a registry refused or answered with something unusable.",
                vec![(vec![], d.refused)],
            );
        }
    }
}

fn ignition(m: &mut Builder, st: &AgentStatus) {
    m.gauge(
        "keelson_ignition_server_up",
        "Whether the Ignition server is serving on this node.",
        vec![(none(), b(st.ignition_running))],
    );
    let Some(ig) = &st.ignition else { return };
    m.counter(
        "keelson_ignition_requests",
        "Ignition server requests by route, pool, spec version served and HTTP status.",
        ig.requests
            .iter()
            .map(|r| {
                (
                    vec![
                        ("route", r.route.clone()),
                        ("pool", r.pool.clone()),
                        ("spec", r.spec.clone()),
                        ("code", r.status.to_string()),
                    ],
                    r.count,
                )
            })
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::model::*;

    /// A status with one of everything.
    pub(crate) fn sample() -> AgentStatus {
        let backend = crate::status::model::BackendSnapshot {
            addr: "10.0.0.11:6443".parse().unwrap(),
            state: "up".into(),
            last_check_unix_ms: Some(1),
            last_error: None,
            active: 2,
            total: 40,
            connect_failures: 1,
            bytes_in: 100,
            bytes_out: 2000,
            staggers: 3,
            sessions_shut_down: 4,
            checks_passed: 5,
            checks_failed: 6,
            transitions: 7,
            last_check_seconds: Some(0.002),
            check_latency: {
                let h = crate::status::histogram::Histogram::default();
                h.observe(std::time::Duration::from_millis(2));
                h.snapshot()
            },
            weight_percent: 50,
        };
        AgentStatus {
            node: NodeStatus {
                name: "master-0".into(),
                role: keelson_ignition::Role::Master,
                interface: "eth0".into(),
                addresses: vec!["10.0.0.11/24".parse().unwrap()],
                cluster: "ocp4.example.com".into(),
            },
            build: BuildInfo {
                version: "0.1.0".into(),
                commit: "abc".into(),
            },
            process: ProcessStatus {
                uptime_seconds: 12.5,
                start_time_seconds: 1.7e9,
                resident_memory_bytes: 1 << 20,
                virtual_memory_bytes: 1 << 24,
                open_fds: 20,
                max_fds: 1024,
                cpu_seconds: 0.25,
                threads: 3,
            },
            ready: vec!["dns".into(), "proxy".into()],
            restarts: [(
                "dns".to_string(),
                crate::status::model::Restarts {
                    restarts: 2,
                    last_error: "x".into(),
                },
            )]
            .into(),
            vips_held: vec!["10.0.0.5".parse().unwrap()],
            proxy_healthy: true,
            ignition_running: true,
            dns_upstreams: vec![],
            members: vec![crate::members::member::Member {
                name: "master-0".parse().unwrap(),
                role: keelson_ignition::Role::Master,
                addresses: vec!["10.0.0.11".parse().unwrap()],
                version: "0.1.0".into(),
            }],
            vrrp: vec![VrrpInstance {
                name: "api".into(),
                vip: "10.0.0.5".parse().unwrap(),
                vrid: 51,
                state: VrrpState::Master,
                state_seconds: 3.0,
                base_priority: 40,
                priority: 90,
                master: Some("10.0.0.11".parse().unwrap()),
                master_priority: Some(90),
                transitions: 2,
                adverts_received: 10,
                adverts_sent: 20,
                announcements: 1,
                arp_conflicts: 0,
                conflict_yields: 0,
                lone_claims: 0,
                claim_gate: Default::default(),
                destinations: vec![],
                drops: [("ttl".to_string(), 1)].into(),
                checks: vec![HealthCheck {
                    name: "proxy".into(),
                    passing: true,
                    weight: 50,
                    transitions: 1,
                }],
            }],
            proxy: Some(ProxyStatus {
                healthy: true,
                frontends: vec![FrontendStatus {
                    addr: "[::]:9445".parse().unwrap(),
                    kind: FrontendKind::Node,
                    accepted: 9,
                    refused: 1,
                    active: 2,
                }],
                vip_redirects: vec!["10.0.0.5:6443".parse().unwrap()],
                backends: vec![backend],
                drained: 0,
                drain_cut: 0,
            }),
            dns: Some(DnsStatus {
                zone: "ocp4.example.com".into(),
                nodes: 1,
                listen: vec![],
                upstreams: vec![],
                received: 5,
                queries: [("A".to_string(), 4), ("other".to_string(), 1)].into(),
                responses: [("NOERROR".to_string(), 5)].into(),
                authoritative: 4,
                forwarded: 1,
                forward_failures: 0,
                cache_hits: 0,
                forward_latency: crate::status::histogram::Histogram::default().snapshot(),
                dropped: [("short".to_string(), 0)].into(),
                truncated: 0,
                tcp_refused: 0,
                etcd: None,
            }),
            discovery: Some(DiscoveryStatus {
                transport: "mdns".into(),
                received: 3,
                drops: [("malformed".to_string(), 1)].into(),
                refused: 0,
                registries: Default::default(),
                auth: None,
            }),
            ignition: Some(IgnitionStatus {
                tls: None,
                plain: None,
                bootstrap: false,
                allowed_networks: vec![],
                requests: vec![IgnitionRequests {
                    route: "config".into(),
                    pool: "master".into(),
                    spec: "3.2.0".into(),
                    status: 200,
                    count: 2,
                }],
            }),
            other: Default::default(),
        }
    }

    #[test]
    fn renders_the_0_0_4_text_promtool_reads() {
        let st = sample();
        let text = render(&st, Format::Prometheus);
        assert_eq!(
            text,
            render(&st, Format::Prometheus),
            "same status, same bytes"
        );
        for line in [
            "# TYPE keelson_vrrp_transitions_total counter",
            "keelson_vrrp_transitions_total{vrrp_instance=\"api\"} 2",
            "keelson_vrrp_state{vrrp_instance=\"api\",state=\"master\"} 1",
            "keelson_vrrp_state{vrrp_instance=\"api\",state=\"backup\"} 0",
            "keelson_vrrp_drops_total{vrrp_instance=\"api\",reason=\"ttl\"} 1",
            "keelson_proxy_backend_bytes_total{backend=\"10.0.0.11:6443\",direction=\"to_client\"} 2000",
            "keelson_proxy_backend_connect_staggers_total{backend=\"10.0.0.11:6443\"} 3",
            "keelson_proxy_frontend_refused_total{frontend=\"[::]:9445\",kind=\"node\"} 1",
            "keelson_dns_queries_total{qtype=\"A\"} 4",
            "keelson_members{role=\"master\",source=\"self\"} 1",
            "keelson_ignition_requests_total{route=\"config\",pool=\"master\",spec=\"3.2.0\",code=\"200\"} 2",
            "keelson_build_info{version=\"0.1.0\",commit=\"abc\"} 1",
            "process_cpu_seconds_total 0.25",
            // Cumulative buckets: the 2 ms check is in every bucket from 2.5 ms up.
            "keelson_proxy_backend_check_duration_seconds_bucket{backend=\"10.0.0.11:6443\",le=\"0.001\"} 0",
            "keelson_proxy_backend_check_duration_seconds_bucket{backend=\"10.0.0.11:6443\",le=\"0.0025\"} 1",
            "keelson_proxy_backend_check_duration_seconds_bucket{backend=\"10.0.0.11:6443\",le=\"+Inf\"} 1",
            "keelson_proxy_backend_check_duration_seconds_count{backend=\"10.0.0.11:6443\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("# EOF"));
        // The families come in the order of docs/metrics.md, not a hash map's.
        let first = text.find("keelson_build_info").unwrap();
        let last = text.find("keelson_ignition_requests_total").unwrap();
        assert!(first < text.find("keelson_vrrp_state").unwrap() && last > first);
    }

    #[test]
    fn docs_list_every_metric() {
        let docs = include_str!("../../../docs/metrics.md");
        let text = render(&sample(), Format::Prometheus);
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(families.len() > 60, "the sample has one of everything");
        for family in families {
            assert!(
                docs.contains(&format!("`{family}`")),
                "docs/metrics.md does not list {family}"
            );
        }
    }

    #[test]
    fn the_dashboard_asks_only_for_metrics_that_exist() {
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/grafana-dashboard.json")).unwrap();
        let text = render(&sample(), Format::Prometheus);
        let mut exprs = 0;
        for panel in dash["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap();
                exprs += 1;
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("keelson_") || word.starts_with("process_") {
                        let base = word
                            .trim_end_matches("_bucket")
                            .trim_end_matches("_count")
                            .trim_end_matches("_sum");
                        assert!(
                            text.contains(&format!("# TYPE {base} ")),
                            "panel {:?} asks for {word}, which /metrics does not have",
                            panel["title"]
                        );
                    }
                }
            }
        }
        assert!(exprs > 20);
    }

    #[test]
    fn renders_openmetrics_on_request() {
        let text = render(&sample(), Format::OpenMetrics);
        assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
        assert!(
            text.contains("# TYPE keelson_vrrp_transitions counter\n"),
            "{text}"
        );
        assert!(text.contains("keelson_vrrp_transitions_total{vrrp_instance=\"api\"} 2\n"));
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape("plain", true), "plain");
        assert_eq!(escape("a\"b\\c\nd", true), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("say \"hi\"\n", false), "say \"hi\"\\n");
        let mut st = sample();
        st.build.commit = "we\"ird\n".into();
        let text = render(&st, Format::Prometheus);
        assert!(
            text.contains("keelson_build_info{version=\"0.1.0\",commit=\"we\\\"ird\\n\"} 1\n"),
            "{text}"
        );
        assert_eq!(Value::Float(f64::INFINITY).to_string(), "+Inf");
        assert_eq!(Value::Float(0.0005).to_string(), "0.0005");
        assert_eq!(Value::Float(1.7e9).to_string(), "1700000000");
    }

    #[test]
    fn negotiation() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4")),
            Format::Prometheus
        );
        // What Prometheus 2.x sends.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Prometheus
        );
    }

    #[test]
    fn backends_without_labels_leave_their_families_out() {
        let mut st = sample();
        st.proxy = None;
        st.dns = None;
        let text = render(&st, Format::Prometheus);
        assert!(!text.contains("keelson_proxy_") && !text.contains("keelson_dns_"));
        assert!(text.contains("keelson_vrrp_state{"));
    }
}
