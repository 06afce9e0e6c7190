//! The status document as Prometheus metrics: every metric of `docs/metrics.md`, built
//! from one [`AgentStatus`] (the one `keelson-agent status` shows), written as the
//! Prometheus text format 0.0.4 or OpenMetrics 1.0.
//!
//! Pure: a status in, text out; every family is one row of a table (name, help, kind, and
//! how the status gives its rows), one table per part of the agent, written in turn:
//!
//! - `process`: the agent itself and its process;
//! - `vrrp`: VRRP instances and their health checks;
//! - `proxy`: the API proxy's frontends and backends;
//! - `dns`: the cluster DNS server;
//! - `members`: member discovery, authentication and the registry;
//! - `ignition`: the Ignition server;
//! - `exposition`: the two text formats, which know nothing of the status.
//!
//! Labels are bounded by construction: instance, check, frontend and backend names come
//! from `cluster.json` and the members (masters), question types and response codes from
//! fixed tables, Ignition pools and routes from a fixed set; no client address ever
//! becomes a label.

use crate::status::histogram::HistogramSnapshot;
use crate::status::model::AgentStatus;
use keelson_cluster::negotiate::media_ranges;

mod dns;
mod exposition;
mod ignition;
mod members;
mod process;
mod proxy;
mod vrrp;

use exposition::{Builder, Value};

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

/// Every family, in the order they are written: the agent and its process, VRRP, the
/// proxy, DNS, members, the Ignition server (the order of docs/metrics.md).
const FAMILIES: &[&[Family]] = &[
    process::FAMILIES,
    vrrp::FAMILIES,
    proxy::FAMILIES,
    dns::FAMILIES,
    members::FAMILIES,
    ignition::FAMILIES,
];

/// Renders `st` in `format`.
pub fn render(st: &AgentStatus, format: Format) -> String {
    let mut m = Builder {
        format,
        out: String::with_capacity(16 * 1024),
    };
    for f in FAMILIES.iter().flat_map(|t| t.iter()) {
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

#[cfg(test)]
mod tests;
