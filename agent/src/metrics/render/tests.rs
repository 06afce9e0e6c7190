//! The sample status with one of everything, rendered in both formats and checked
//! against docs/metrics.md and the Grafana dashboard.

use super::exposition::{Value, escape};
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
    let docs = include_str!("../../../../docs/metrics.md");
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
        serde_json::from_str(include_str!("../../../../docs/grafana-dashboard.json")).unwrap();
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
