//! The families of the agent itself and its process: build info, uptime, and the
//! `process_*` families Prometheus' client libraries export (memory, CPU, descriptors,
//! threads).

use super::{Family, count, counter, float, gauge, int, none, one};

/// These families, in the order they are written.
pub(super) const FAMILIES: &[Family] = &[
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
];
