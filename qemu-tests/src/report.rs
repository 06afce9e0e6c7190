//! The closing table of a whole-cluster run (`make qemu-cluster`, `make openstack-cluster`):
//! one row per scenario with its result, time and what it measured; scenarios after the
//! first failure are listed as skipped.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::testbed::Testbed;

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario's name (`1 boot`).
    pub scenario: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// How long it took.
    pub time: Duration,
    /// What it measured, or the first line of its error.
    pub detail: String,
}

/// The scenarios run so far.
#[derive(Debug)]
pub struct Report {
    /// The program's name, for its log lines (`qemu-cluster: 1 boot: ok ...`).
    pub program: &'static str,
    /// One per scenario run.
    pub rows: Vec<Row>,
}

impl Report {
    /// An empty report for `program`.
    pub fn new(program: &'static str) -> Self {
        Report {
            program,
            rows: Vec::new(),
        }
    }

    /// Runs one scenario; on failure prints what the nodes in `involved` show (their
    /// consoles, and the journals of stand-ins) and returns `None`.
    pub fn run<C: Testbed + ?Sized, T>(
        &mut self,
        cluster: &mut C,
        scenario: &'static str,
        involved: &[&str],
        f: impl FnOnce(&mut C) -> Result<T>,
        detail: impl FnOnce(&T) -> String,
    ) -> Option<T> {
        let program = self.program;
        eprintln!("{program}: {scenario} ...");
        let start = Instant::now();
        let result = f(cluster);
        let time = start.elapsed();
        match result {
            Ok(v) => {
                let d = detail(&v);
                eprintln!(
                    "{program}: {scenario}: ok in {:.1} s: {d}",
                    time.as_secs_f64()
                );
                self.rows.push(Row {
                    scenario,
                    ok: true,
                    time,
                    detail: d,
                });
                Some(v)
            }
            Err(e) => {
                eprintln!("{program}: {scenario}: FAILED: {e:#}");
                eprintln!("{}", cluster.consoles(involved, 40));
                self.rows.push(Row {
                    scenario,
                    ok: false,
                    time,
                    detail: format!("{e:#}").lines().next().unwrap_or("").to_owned(),
                });
                None
            }
        }
    }

    /// Whether every scenario run passed and every one in `order` ran.
    pub fn passed(&self, order: &[&str]) -> bool {
        self.rows.iter().all(|r| r.ok)
            && order
                .iter()
                .all(|o| self.rows.iter().any(|r| r.scenario == *o))
    }

    /// Prints the table: the rows, then every scenario of `order` that did not run.
    pub fn print(&self, order: &[&str]) {
        print!("{}", self.table(order));
    }

    /// The table [`Report::print`] prints, with a blank line before it.
    pub fn table(&self, order: &[&str]) -> String {
        let mut t = format!(
            "\n{:<12} {:<7} {:>8}  detail\n",
            "scenario", "result", "time"
        );
        for r in &self.rows {
            t += &format!(
                "{:<12} {:<7} {:>6.1} s  {}\n",
                r.scenario,
                if r.ok { "ok" } else { "FAILED" },
                r.time.as_secs_f64(),
                r.detail
            );
        }
        for s in order
            .iter()
            .filter(|o| !self.rows.iter().any(|r| r.scenario == **o))
        {
            t += &format!(
                "{s:<12} {:<7} {:>8}  (an earlier scenario failed)\n",
                "skipped", "-"
            );
        }
        t
    }
}

/// A duration as the scenario lines print it: seconds, one decimal.
pub fn secs(d: std::time::Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
