//! The status document as Prometheus metrics: every metric of `docs/metrics.md`, built
//! from one [`AgentStatus`] (the one `keelson-agent status` shows), written as the
//! Prometheus text format 0.0.4 or OpenMetrics 1.0.
//!
//! Pure: a status in, text out; every family is one row of one table (`FAMILIES`: name,
//! help, kind, and how the status gives its rows). Labels are bounded by construction:
//! instance, check, frontend and backend names come from `cluster.json` and the members
//! (masters), question types and response codes from fixed tables, Ignition pools and routes
//! from a fixed set; no client address ever becomes a label.

use crate::status::histogram::HistogramSnapshot;
use crate::status::model::{
    AgentStatus, BackendSnapshot, DnsStatus, FrontendStatus, HealthCheck, MembersAuth,
    RegistryStatus, VrrpInstance, VrrpState,
};
use keelson_cluster::negotiate::media_ranges;

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
    /// The header is read by the same parser as the Ignition server's
    /// ([`keelson_cluster::negotiate::media_ranges`]), so both honour `q` alike.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let open_metrics = accept.is_some_and(|h| {
            media_ranges(h).iter().any(|r| {
                r.acceptable()
                    && r.media_type
                        .eq_ignore_ascii_case("application/openmetrics-text")
            })
        });
        if open_metrics {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
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
}

/// What a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One row of a family: its labels and its value.
enum Sample {
    Value(Value),
    Histogram(HistogramSnapshot),
}

type Rows = Vec<(Labels, Sample)>;

/// One metric family: its name (a counter's without `_total`), help, kind, and the rows the
/// status gives it (none: the family is left out). `docs/metrics.md` lists the same table.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    rows: fn(&AgentStatus) -> Rows,
}

const fn gauge(name: &'static str, help: &'static str, rows: fn(&AgentStatus) -> Rows) -> Family {
    Family {
        name,
        help,
        kind: Kind::Gauge,
        rows,
    }
}

/// `name` without `_total`.
const fn counter(name: &'static str, help: &'static str, rows: fn(&AgentStatus) -> Rows) -> Family {
    Family {
        name,
        help,
        kind: Kind::Counter,
        rows,
    }
}

const fn histogram(
    name: &'static str,
    help: &'static str,
    rows: fn(&AgentStatus) -> Rows,
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Histogram,
        rows,
    }
}

/// Every family, in the order they are written.
const FAMILIES: &[Family] = &[
    // The agent and its process.
    gauge(
        "keelson_build_info",
        "The agent's version and git commit (always 1).",
        |st| {
            one(
                vec![
                    ("version", st.build.version.clone()),
                    ("commit", st.build.commit.clone()),
                ],
                int(1),
            )
        },
    ),
    gauge(
        "keelson_node_info",
        "This node's name and role (always 1).",
        |st| {
            one(
                vec![
                    ("node", st.node.name.clone()),
                    ("role", st.node.role.to_string()),
                ],
                int(1),
            )
        },
    ),
    gauge(
        "keelson_node_address_problem",
        "1 while the node's address cannot be followed (on no link, or on one nodeAddress.interface excludes).",
        |st| one(none(), int(i64::from(st.node.address_problem.is_some()))),
    ),
    counter(
        "keelson_node_address_moves",
        "Times the node's address moved to another link and the services bound to it followed.",
        |st| one(none(), count(st.node.address_moves)),
    ),
    gauge(
        "keelson_uptime_seconds",
        "Seconds since the agent started serving.",
        |st| one(none(), float(st.process.uptime_seconds)),
    ),
    gauge(
        "keelson_service_ready",
        "Services that are up (always 1).",
        |st| {
            st.ready
                .iter()
                .map(|s| (vec![("service", s.clone())], int(1)))
                .collect()
        },
    ),
    counter(
        "keelson_service_restarts",
        "Restarts of services and operator processes by the supervisor.",
        |st| {
            st.restarts
                .iter()
                .map(|(s, r)| (vec![("service", s.clone())], count(r.restarts)))
                .collect()
        },
    ),
    gauge(
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, seconds.",
        |st| one(none(), float(st.process.start_time_seconds)),
    ),
    counter(
        "process_cpu_seconds",
        "Total user and system CPU time spent, seconds.",
        |st| one(none(), float(st.process.cpu_seconds)),
    ),
    gauge(
        "process_resident_memory_bytes",
        "Resident memory size, bytes.",
        |st| one(none(), count(st.process.resident_memory_bytes)),
    ),
    gauge(
        "process_virtual_memory_bytes",
        "Virtual memory size, bytes.",
        |st| one(none(), count(st.process.virtual_memory_bytes)),
    ),
    gauge("process_open_fds", "Open file descriptors.", |st| {
        one(none(), count(st.process.open_fds))
    }),
    gauge(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        |st| one(none(), count(st.process.max_fds)),
    ),
    gauge("process_threads", "Threads of the process.", |st| {
        one(none(), count(st.process.threads))
    }),
    // VRRP instances and their health checks.
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
    // The API proxy (where it runs).
    gauge(
        "keelson_proxy_healthy",
        "Whether the API proxy has at least one backend up.",
        |st| {
            st.proxy
                .iter()
                .map(|p| (none(), int(p.healthy.into())))
                .collect()
        },
    ),
    counter(
        "keelson_proxy_frontend_accepted",
        "Client connections accepted.",
        |st| per_frontend(st, |f| count(f.accepted)),
    ),
    counter(
        "keelson_proxy_frontend_refused",
        "Accepted clients closed at once because no backend answered.",
        |st| per_frontend(st, |f| count(f.refused)),
    ),
    gauge(
        "keelson_proxy_frontend_active_connections",
        "Client connections open now.",
        |st| per_frontend(st, |f| count(f.active)),
    ),
    gauge(
        "keelson_proxy_vip_redirected",
        "VIP:6443 addresses redirected to the node frontend with nftables (always 1).",
        |st| {
            st.proxy
                .iter()
                .flat_map(|p| p.vip_redirects.iter())
                .map(|a| (vec![("frontend", a.to_string())], int(1)))
                .collect()
        },
    ),
    counter(
        "keelson_proxy_drained_connections",
        "Client connections still open when the proxy began to stop (let finish).",
        |st| {
            st.proxy
                .iter()
                .map(|p| (none(), count(p.drained)))
                .collect()
        },
    ),
    counter(
        "keelson_proxy_drain_cut_connections",
        "Client connections cut at the drain deadline.",
        |st| {
            st.proxy
                .iter()
                .map(|p| (none(), count(p.drain_cut)))
                .collect()
        },
    ),
    gauge(
        "keelson_proxy_backend_up",
        "Whether each backend takes new connections.",
        |st| per_backend(st, |b| int((b.state == "up").into())),
    ),
    gauge(
        "keelson_proxy_backend_weight_percent",
        "Share of new connections a backend takes: below 100 while in slowstart, 0 when down.",
        |st| per_backend(st, |b| int(b.weight_percent.into())),
    ),
    counter(
        "keelson_proxy_backend_transitions",
        "Times a backend went up or down.",
        |st| per_backend(st, |b| count(b.transitions)),
    ),
    gauge(
        "keelson_proxy_backend_active_connections",
        "Connections to the backend open now.",
        |st| per_backend(st, |b| count(b.active)),
    ),
    counter(
        "keelson_proxy_backend_connections",
        "Connections proxied to the backend.",
        |st| per_backend(st, |b| count(b.total)),
    ),
    counter(
        "keelson_proxy_backend_bytes",
        "Bytes proxied, by direction (to_backend: from clients; to_client: from the backend).",
        |st| {
            per_backend_split(st, "direction", |b| {
                [("to_backend", b.bytes_in), ("to_client", b.bytes_out)]
            })
        },
    ),
    counter(
        "keelson_proxy_backend_connect_failures",
        "Client connects to the backend that failed or stayed silent while another answered.",
        |st| per_backend(st, |b| count(b.connect_failures)),
    ),
    counter(
        "keelson_proxy_backend_connect_staggers",
        "Times the connect stagger ran out waiting for the backend and another was tried alongside.",
        |st| per_backend(st, |b| count(b.staggers)),
    ),
    counter(
        "keelson_proxy_backend_sessions_shut_down",
        "Client connections closed because the backend was marked down.",
        |st| per_backend(st, |b| count(b.sessions_shut_down)),
    ),
    counter(
        "keelson_proxy_backend_checks",
        "Active health checks, by result.",
        |st| {
            per_backend_split(st, "result", |b| {
                [("pass", b.checks_passed), ("fail", b.checks_failed)]
            })
        },
    ),
    histogram(
        "keelson_proxy_backend_check_duration_seconds",
        "Duration of active health checks.",
        |st| {
            st.proxy
                .iter()
                .flat_map(|p| p.backends.iter())
                .map(|b| {
                    (
                        vec![("backend", b.addr.to_string())],
                        Sample::Histogram(b.check_latency.clone()),
                    )
                })
                .collect()
        },
    ),
    // The DNS server (where it runs).
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
    // Members.
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
    // The Ignition server.
    gauge(
        "keelson_cluster_server_up",
        "Whether the Ignition server is serving on this node.",
        |st| one(none(), int(st.ignition_running.into())),
    ),
    counter(
        "keelson_cluster_requests",
        "Ignition server requests by route, pool, spec version served and HTTP status.",
        |st| {
            st.ignition
                .iter()
                .flat_map(|ig| ig.requests.iter())
                .map(|r| {
                    (
                        vec![
                            ("route", r.route.clone()),
                            ("pool", r.pool.clone()),
                            ("spec", r.spec.clone()),
                            ("code", r.status.to_string()),
                        ],
                        count(r.count),
                    )
                })
                .collect()
        },
    ),
];

/// Renders `st` in `format`.
pub fn render(st: &AgentStatus, format: Format) -> String {
    let mut m = Builder {
        format,
        out: String::with_capacity(16 * 1024),
    };
    for f in FAMILIES {
        m.write(f, (f.rows)(st));
    }
    if format == Format::OpenMetrics {
        m.out.push_str("# EOF\n");
    }
    m.out
}

impl Builder {
    fn write(&mut self, f: &Family, rows: Rows) {
        match f.kind {
            Kind::Histogram => {
                let rows = rows
                    .into_iter()
                    .filter_map(|(l, s)| match s {
                        Sample::Histogram(h) => Some((l, h)),
                        Sample::Value(_) => None,
                    })
                    .collect();
                self.histogram(f.name, f.help, rows);
            }
            Kind::Counter | Kind::Gauge => {
                let rows = rows
                    .into_iter()
                    .filter_map(|(l, s)| match s {
                        Sample::Value(v) => Some((l, v)),
                        Sample::Histogram(_) => None,
                    })
                    .collect();
                let kind = if f.kind == Kind::Counter {
                    "counter"
                } else {
                    "gauge"
                };
                self.family(f.name, f.help, kind, rows);
            }
        }
    }
}

fn none() -> Labels {
    Vec::new()
}

fn int(v: i64) -> Sample {
    Sample::Value(Value::Int(v.into()))
}

/// A count: gauges of counts print like counters' values.
fn count(v: u64) -> Sample {
    Sample::Value(Value::Int(v.into()))
}

fn float(v: f64) -> Sample {
    Sample::Value(Value::Float(v))
}

fn one(labels: Labels, s: Sample) -> Rows {
    vec![(labels, s)]
}

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

fn per_frontend(st: &AgentStatus, f: impl Fn(&FrontendStatus) -> Sample) -> Rows {
    st.proxy
        .iter()
        .flat_map(|p| p.frontends.iter())
        .map(|fe| {
            let labels = vec![
                ("frontend", fe.addr.to_string()),
                ("kind", fe.kind.as_str().to_string()),
            ];
            (labels, f(fe))
        })
        .collect()
}

fn per_backend(st: &AgentStatus, f: impl Fn(&BackendSnapshot) -> Sample) -> Rows {
    st.proxy
        .iter()
        .flat_map(|p| p.backends.iter())
        .map(|b| (vec![("backend", b.addr.to_string())], f(b)))
        .collect()
}

/// Two counts of each backend told apart by a `label`.
fn per_backend_split(
    st: &AgentStatus,
    label: &'static str,
    f: impl Fn(&BackendSnapshot) -> [(&'static str, u64); 2],
) -> Rows {
    st.proxy
        .iter()
        .flat_map(|p| p.backends.iter())
        .flat_map(|b| {
            f(b).map(|(k, n)| {
                let labels = vec![("backend", b.addr.to_string()), (label, k.to_string())];
                (labels, count(n))
            })
        })
        .collect()
}

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
                role: keelson_cluster::Role::Master,
                interface: "eth0".into(),
                addresses: vec!["10.0.0.11/24".parse().unwrap()],
                cluster: "ocp4.example.com".into(),
                address_problem: None,
                address_moves: 1,
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
            members: vec![crate::member::Member {
                name: "master-0".parse().unwrap(),
                role: keelson_cluster::Role::Master,
                addresses: vec!["10.0.0.11".parse().unwrap()],
                version: "0.1.0".into(),
            }],
            vrrp: vec![VrrpInstance {
                name: "api".into(),
                vip: "10.0.0.5".parse().unwrap(),
                companion_vips: vec![],
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
                claims_held: 0,
                deaf_yields: 0,
                foreign_adverts: 7,
                heard_forgotten: 0,
                claim_gate: Default::default(),
                destinations: vec!["10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap()],
                drops: [("ttl".to_string(), 1)].into(),
                checks: vec![HealthCheck {
                    name: "proxy".into(),
                    passing: true,
                    weight: 50,
                    transitions: 1,
                }],
                port_security: vec![PortSecurityFinding {
                    problem: crate::vrrp::portsec::Problem::VipNotAllowed,
                    seconds: 12.0,
                    fix: "openstack port set --allowed-address ip-address=10.0.0.5 PORT".into(),
                }],
                foreign_routers: vec![],
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
                transport: "unicast".into(),
                received: 3,
                drops: [("malformed".to_string(), 1)].into(),
                refused: 0,
                registries: Default::default(),
                auth: None,
                registry: Some(RegistryStatus {
                    entries: 5,
                    limit: 4096,
                    registrations: 3,
                    refused: [
                        ("full".to_string(), 0),
                        ("address".to_string(), 1),
                        ("rate".to_string(), 2),
                    ]
                    .into(),
                    merge_skipped: 0,
                    answers: 3,
                    answer_bytes: 900,
                    unchanged: 0,
                    sources: 2,
                }),
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
            "keelson_vrrp_foreign_adverts_total{vrrp_instance=\"api\"} 7",
            "keelson_vrrp_port_security_problem{vrrp_instance=\"api\",problem=\"vip_not_allowed\"} 1",
            "keelson_vrrp_port_security_problem{vrrp_instance=\"api\",problem=\"vrrp_blocked\"} 0",
            "keelson_proxy_backend_bytes_total{backend=\"10.0.0.11:6443\",direction=\"to_client\"} 2000",
            "keelson_proxy_backend_connect_staggers_total{backend=\"10.0.0.11:6443\"} 3",
            "keelson_proxy_frontend_refused_total{frontend=\"[::]:9445\",kind=\"node\"} 1",
            "keelson_dns_queries_total{qtype=\"A\"} 4",
            "keelson_members{role=\"master\",source=\"self\"} 1",
            "keelson_members_registry_refused_total{reason=\"rate\"} 2",
            "keelson_members_registry_entries 5",
            "keelson_vrrp_advert_destinations{vrrp_instance=\"api\"} 2",
            "keelson_cluster_requests_total{route=\"config\",pool=\"master\",spec=\"3.2.0\",code=\"200\"} 2",
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
        let last = text.find("keelson_cluster_requests_total").unwrap();
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

    /// `q` is read as the Ignition server reads it (RFC 9110): parameter names are
    /// case-insensitive, `0`, `0.0` and `0.000` all refuse, three decimals at most.
    #[test]
    fn negotiation_honours_q_as_the_ignition_server_does() {
        let om = "application/openmetrics-text";
        for refused in ["q=0", "Q=0", "q=0.0", "q=0.000", "q = 0"] {
            let h = format!("{om}; {refused}, text/plain");
            assert_eq!(Format::negotiate(Some(&h)), Format::Prometheus, "{h}");
            // The Ignition negotiation skips a refused range the same way.
            let ign = format!(
                "{}; version=3.2.0; {refused}, */*",
                keelson_cluster::negotiate::IGNITION_MEDIA_TYPE
            );
            assert_eq!(
                keelson_cluster::negotiate::negotiate(Some(ign.as_bytes())).unwrap(),
                keelson_cluster::negotiate::NO_VERSION_DEFAULT,
                "{ign}"
            );
        }
        for accepted in ["q=0.001", "q=1", "Q=0.5", "q=1.000"] {
            let h = format!("text/plain, {om}; {accepted}");
            assert_eq!(Format::negotiate(Some(&h)), Format::OpenMetrics, "{h}");
        }
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
