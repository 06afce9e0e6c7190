//! The families of the API proxy, where it runs: per frontend (`frontend`, `kind`) and
//! per backend (`backend`), with the backends' check durations as histograms.

use super::{Family, Rows, Sample, count, counter, gauge, histogram, int, none};
use crate::status::model::{AgentStatus, BackendSnapshot, FrontendStatus};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
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
];

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
