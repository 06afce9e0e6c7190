//! What the whole-cluster scenarios need of a running cluster, whoever runs it: QEMU and our
//! own Neutron stand-in ([`crate::cluster::Cluster`], `make qemu-cluster`) or a real
//! OpenStack ([`crate::openstack::OpenStackCluster`], `make openstack-cluster`). The
//! scenarios ([`crate::scenarios`]) are written once against this trait and checked from
//! outside: from a network namespace on the cluster's segment.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::guest::GuestAgent;
use crate::netns::{HarnessNetns, Netns};
use crate::node_plan::{ImageKind, NodePlan};

/// The outside participant on the cluster's segment: a namespace, its interface there and
/// its address (where `dig`, `curl` and the ARP probes run from).
#[derive(Debug, Clone, Copy)]
pub struct Outside<'a> {
    /// The namespace.
    pub netns: &'a Netns,
    /// Its interface on the segment.
    pub iface: &'a str,
    /// Its address on the segment.
    pub address: Ipv4Addr,
}

/// A running cluster of VMs the scenarios act on.
pub trait Testbed {
    /// The nodes: name, role, address, MAC, image.
    fn plan(&self) -> &[NodePlan];
    /// The outside participant.
    fn outside(&self) -> Outside<'_>;
    /// `keelson build`'s output the nodes boot from (`cluster.json`, the configs).
    fn out_dir(&self) -> &std::path::Path;
    /// Boots every node of the plan for the first time.
    fn start_all(&mut self) -> Result<()>;
    /// Boots a node again after [`Testbed::kill`] (its disk kept).
    fn restart(&mut self, name: &str) -> Result<()>;
    /// Shuts a node down for good, in order (the bootstrap at the pivot).
    fn power_off(&mut self, name: &str) -> Result<()>;
    /// Takes a node down as a failure would (it may come back with [`Testbed::restart`]);
    /// returns when it went down, as near as the testbed can tell: what a client's outage
    /// is measured from (an OpenStack `server stop` reaches the guest seconds after the
    /// command starts).
    fn kill(&mut self, name: &str) -> Result<Instant>;
    /// Whether the node is running now.
    fn is_running(&self, name: &str) -> bool;
    /// The node's console since its current boot started.
    fn console_text(&self, name: &str) -> String;
    /// Waits until the console of the node's current boot holds a line with `needle`;
    /// returns that line.
    fn wait_console(&mut self, name: &str, needle: &str, timeout: Duration) -> Result<String>;
    /// The node's QEMU guest agent, if it has one.
    fn guest(&self, name: &str) -> Option<GuestAgent>;
    /// What the cluster's payloads are: keelson's alone unless the testbed says otherwise.
    fn payload(&self) -> crate::cluster::Payload {
        crate::cluster::Payload::Keelson
    }

    /// The last console lines of the named nodes (for a failed scenario); for stand-in
    /// nodes also the journal of `keelson-agent.service` and Ignition's log (journald
    /// forwards every entry to the serial console, `systemd.journald.forward_to_console`).
    fn consoles(&self, names: &[&str], lines: usize) -> String {
        let mut text = String::new();
        for name in names {
            // A node killed or powered off still shows its last boot's console.
            let console = self.console_text(name);
            if console.is_empty() {
                continue;
            }
            let all: Vec<&str> = console.lines().collect();
            text.push_str(&format!(
                "---- {name} (last {lines} lines)\n{}\n",
                all[all.len().saturating_sub(lines)..].join("\n")
            ));
            if self.is_standin(name) {
                for (what, tag, argv) in [
                    (
                        "journal of keelson-agent.service",
                        "keelson-agent[",
                        [
                            "journalctl",
                            "--no-pager",
                            "-q",
                            "-u",
                            "keelson-agent.service",
                        ],
                    ),
                    (
                        "Ignition's log",
                        "ignition[",
                        ["journalctl", "--no-pager", "-q", "-t", "ignition"],
                    ),
                ] {
                    // From the node's journal (every level, every boot) when its guest agent
                    // answers; else the entries journald forwarded to the console.
                    if let Some(journal) = self
                        .guest(name)
                        .and_then(|g| g.output(&argv, Duration::from_secs(10)).ok())
                    {
                        let entries: Vec<&str> = journal.lines().collect();
                        let shown = &entries[entries.len().saturating_sub(lines)..];
                        text.push_str(&format!(
                            "---- {name}: {what} (`{}`, last {} of {} entries)\n{}\n",
                            argv.join(" "),
                            shown.len(),
                            entries.len(),
                            shown.join("\n")
                        ));
                        continue;
                    }
                    let entries = journal_entries(&console, tag);
                    let shown = &entries[entries.len().saturating_sub(lines)..];
                    text.push_str(&format!(
                        "---- {name}: {what} (from the console, last {} of {} entries)\n{}\n",
                        shown.len(),
                        entries.len(),
                        shown.join("\n")
                    ));
                }
            }
        }
        text
    }

    /// The node's plan entry.
    fn node(&self, name: &str) -> Result<&NodePlan> {
        self.plan()
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// Whether `name` boots the RHCOS stand-in.
    fn is_standin(&self, name: &str) -> bool {
        self.node(name).is_ok_and(|n| n.image == ImageKind::Standin)
    }

    /// The names of the nodes of a role, in plan order.
    fn names(&self, role: &str) -> Vec<String> {
        self.plan()
            .iter()
            .filter(|n| n.role == role)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Waits until every named node printed its ready line; returns when the last one did.
    fn wait_ready(&mut self, names: &[String], timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        for name in names {
            let left = timeout.saturating_sub(start.elapsed());
            self.wait_console(name, "keelson-agent ready:", left)?;
        }
        Ok(start.elapsed())
    }

    /// Which node's MAC the outside sees for `vip` right now (after a fresh ARP). An error
    /// when `ping` could not run at all (missing, or exit status 2): that is not "nobody
    /// holds it".
    fn holder_of(&self, vip: &str) -> Result<Option<String>> {
        let ns = self.outside().netns;
        ns.flush_neighbour(vip);
        let out = ns
            .command("ping")
            .args(["-c", "1", "-W", "1", vip])
            .output()
            .context("running ping")?;
        // ping: 0 answered, 1 no answer (a security group may drop ICMP while ARP still
        // answers); anything else (2, ip's 255 for a failed exec) is an error of the tool,
        // not of the cluster.
        if !matches!(out.status.code(), Some(0 | 1)) {
            bail!(
                "ping {vip} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let Some(mac) = ns.neighbour_mac(vip) else {
            return Ok(None);
        };
        Ok(self
            .plan()
            .iter()
            .find(|n| n.mac == mac)
            .map(|n| n.name.clone()))
    }

    /// Every node answering ARP for `vip` right now (by MAC; an unknown MAC as itself).
    fn holders_of(&self, vip: &str) -> Result<Vec<String>> {
        let out = self.outside();
        let macs = crate::probe::arp_answers(
            out.netns,
            out.iface,
            out.address,
            vip.parse()?,
            Duration::from_millis(500),
        )?;
        Ok(self.names_of_macs(macs))
    }

    /// The node of the plan each MAC belongs to, by name (an unknown MAC as itself).
    fn names_of_macs(&self, macs: Vec<String>) -> Vec<String> {
        macs.into_iter()
            .map(|mac| {
                self.plan()
                    .iter()
                    .find(|n| n.mac == mac)
                    .map(|n| n.name.clone())
                    .unwrap_or(mac)
            })
            .collect()
    }

    /// Waits (up to `timeout`) until exactly one node answers ARP for `vip`, twice in a row
    /// a second apart; returns it, or fails naming every holder (several holders is how a
    /// network that drops VRRP fails: every node claims the VIP).
    fn sole_holder(&self, vip: &str, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        let mut last = Vec::new();
        let mut seen: Option<String> = None;
        while start.elapsed() < timeout {
            last = self.holders_of(vip)?;
            match (last.as_slice(), &seen) {
                ([one], Some(prev)) if one == prev => return Ok(one.clone()),
                ([one], _) => seen = Some(one.clone()),
                _ => seen = None,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("{vip}: answered by {last:?} after {timeout:?}, expected exactly one node")
    }

    /// Waits until `vip` is held by a node `accept` approves; returns the holder.
    fn wait_holder(
        &self,
        vip: &str,
        timeout: Duration,
        accept: &dyn Fn(&str) -> bool,
    ) -> Result<String> {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < timeout {
            last = self.holder_of(vip)?;
            if let Some(holder) = &last
                && accept(holder)
            {
                return Ok(holder.clone());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("{vip}: held by {last:?} after {timeout:?}, not by an expected node")
    }
}

/// The journal entries of one syslog identifier (`tag` is `name[`) among the console's
/// lines, as journald forwards them (`[  12.345678] name[pid]: message`).
pub fn journal_entries<'a>(console: &'a str, tag: &str) -> Vec<&'a str> {
    console
        .lines()
        .filter(|l| {
            l.find(tag).is_some_and(|i| {
                // The identifier starts the entry: after the timestamp or the line start.
                l[..i].trim_end().is_empty() || l[..i].trim_end().ends_with(']')
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_entries_by_identifier() {
        let console = "[    3.1] ignition[312]: fetch: fetched referenced config\n\
                       [    3.2] systemd[1]: Started ignition-files.service\n\
                       [   20.0] keelson-agent[640]: keelson-agent ready: node=master-0\n\
                       some keelson-agent[ in the middle\n\
                       ignition[1]: at the start";
        assert_eq!(
            journal_entries(console, "keelson-agent["),
            ["[   20.0] keelson-agent[640]: keelson-agent ready: node=master-0"]
        );
        assert_eq!(journal_entries(console, "ignition[").len(), 2);
    }
}
