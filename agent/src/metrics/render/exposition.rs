//! The two exposition formats written by hand: the Prometheus text format 0.0.4 and
//! OpenMetrics 1.0 (sample values, label escaping, `# HELP` / `# TYPE`, histograms as
//! cumulative buckets). Knows nothing of the status: the families hand it rows.

use super::{Format, Labels};
use crate::status::histogram::HistogramSnapshot;

/// A sample value: integers print as integers, floats in Prometheus' spelling.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value {
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
pub(super) struct Builder {
    pub(super) format: Format,
    pub(super) out: String,
}

/// Escapes a label value (both formats) or, with `quote` false, a 0.0.4 HELP text.
pub(super) fn escape(s: &str, quote: bool) -> std::borrow::Cow<'_, str> {
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

    pub(super) fn family(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        rows: Vec<(Labels, Value)>,
    ) {
        if rows.is_empty() {
            return;
        }
        self.header(name, help, kind);
        let suffix = if kind == "counter" { "_total" } else { "" };
        for (labels, v) in rows {
            self.sample(name, suffix, &labels, v);
        }
    }

    pub(super) fn histogram(
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
