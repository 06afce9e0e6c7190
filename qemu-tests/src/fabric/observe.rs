//! What the routers say: the next hops a namespace routes a VIP through, and whether a
//! BFD session is up (from BIRD's or FRR's own command line), with waits for both.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::topology::ip;
use super::{Daemon, Fabric, SPINE};

impl Fabric {
    /// The next hops `ns` routes `vip` through (empty when it has no route).
    pub fn nexthops(&self, ns: &str, vip: &str) -> Vec<String> {
        let family = if vip.contains(':') { "-6" } else { "-4" };
        let Ok(text) = ip(ns, &[family, "route", "show", vip]) else {
            return vec![];
        };
        let mut hops: Vec<String> = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .map(|w| w[1].to_owned())
            .collect();
        hops.sort();
        hops.dedup();
        hops
    }

    /// Waits until `ns` routes `vip` through exactly `want` (sorted), up to `limit`.
    pub fn wait_nexthops(&self, ns: &str, vip: &str, want: &[&str], limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        loop {
            let now = self.nexthops(ns, vip);
            if now == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{ns}: {vip} via {now:?}, expected {want:?} within {limit:?} (logs in {})",
                    self.work.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The next hops of `vip` at the ToR of `rack` that are masters (their addresses).
    pub fn tor_nexthops(&self, rack: usize, vip: &str) -> Vec<String> {
        self.nexthops(self.tor_ns(rack), vip)
    }

    /// The spine's next hops for `vip` (ToR addresses).
    pub fn spine_nexthops(&self, vip: &str) -> Vec<String> {
        self.nexthops(SPINE, vip)
    }

    /// Whether the BFD session of router namespace `ns` with `peer` is up.
    pub fn bfd_up(&self, ns: &str, peer: &str) -> bool {
        let out = match self.daemon {
            Daemon::Bird => Command::new("birdc")
                .arg("-s")
                .arg(self.work.path().join(format!("{ns}.ctl")))
                .args(["show", "bfd", "sessions"])
                .output(),
            Daemon::Frr => Command::new("vtysh")
                .args(["-N", ns, "-c", "show bfd peers brief"])
                .output(),
        };
        let Ok(out) = out else { return false };
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.contains(&peer) && w.iter().any(|x| x.eq_ignore_ascii_case("up"))
        })
    }

    /// Waits until every ToR's BFD sessions with its masters are up (so a death is noticed
    /// by BFD, not by the BGP hold timer).
    pub fn wait_bfd(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        for m in &self.masters {
            let tor = self.tor_ns(m.rack);
            while !(self.bfd_up(tor, &m.v4) && self.bfd_up(tor, &m.v6)) {
                if Instant::now() > deadline {
                    bail!("{tor}: BFD with {} not up within {limit:?}", m.name);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}
