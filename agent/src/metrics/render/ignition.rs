//! The families of the Ignition server on :22623: whether it serves, and its requests by
//! route, pool, spec version and code.

use super::{Family, count, counter, gauge, int, none, one};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
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
