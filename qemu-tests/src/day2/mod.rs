//! The day-2 scenarios of `make qemu-day2` (docs/operations.md), one module each:
//!
//! - [`roll`]: a rolling agent upgrade of the masters through the API VIP with a client
//!   counting failed requests;
//! - [`replace`]: a master replaced by a new one at another address;
//! - [`rotate`]: the membership key rotated on every node in rolling steps.
//!
//! This module holds what they share (a node's status, waits, the steady client, journal
//! counts) and [`no_port_findings`]. Each step is the one docs/operations.md tells an
//! operator to take, run inside the RHCOS stand-in masters through their guest agent, so the
//! page and the test cannot drift apart.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::{API_VIP, Cluster, ImageKind, MetadataSource, NodePlan};
use crate::configdrive::NetworkMode;
use crate::netns::HarnessNetns;
use crate::probe::{self, ClientLoop, Sample};
use crate::report::secs;
use crate::scenarios::{self, STANDIN_BOOT_TIMEOUT, ZONE, in_node};
use crate::testbed::Testbed;

mod replace;
mod roll;
mod rotate;

pub use replace::{new_master, replace};
pub use roll::roll;
pub use rotate::rotate;

/// Where the harness serves the new agent binary on the segment ("copy it to each node").
const PUBLISH_PORT: u16 = 8099;
/// How long one command of a procedure may take inside a node (a holder's stop waits for its
/// successor's first advert; a 12 MB download under TCG takes seconds).
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a restarted node may take to be back in every list (docs/operations.md: a
/// renewal interval; far more under TCG on a loaded host).
const BACK_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a shell script in `node` and returns its output (fails on a non-zero exit).
fn shell_on_node(c: &dyn Testbed, node: &str, script: &str) -> Result<String> {
    c.guest(node)
        .with_context(|| format!("{node} has no guest agent"))?
        .output(&["/bin/sh", "-c", script], STEP_TIMEOUT)
        .with_context(|| format!("on {node}: {script}"))
}

/// `keelson-agent status --json` of `node`.
fn status(c: &dyn Testbed, node: &str) -> Result<serde_json::Value> {
    let text = in_node(c, node, &["keelson-agent", "status", "--json"])?;
    serde_json::from_str(&text).with_context(|| format!("{node}: status --json: {text}"))
}

/// The member names in a status document.
fn member_names(status: &serde_json::Value) -> BTreeSet<String> {
    status["members"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `node`'s status lists every one of `live` and each of `live` lists `node`
/// again (docs/operations.md, "one node at a time": the step before the next node).
fn wait_back(c: &dyn Testbed, node: &str, live: &[String]) -> Result<Duration> {
    let start = Instant::now();
    let want: BTreeSet<String> = live.iter().cloned().collect();
    loop {
        let own = status(c, node)
            .map(|s| member_names(&s))
            .unwrap_or_default();
        let mut listed = want.is_subset(&own);
        if listed {
            for other in live.iter().filter(|o| *o != node) {
                let theirs = status(c, other)
                    .map(|s| member_names(&s))
                    .unwrap_or_default();
                if !theirs.contains(node) {
                    listed = false;
                    break;
                }
            }
        }
        if listed {
            return Ok(start.elapsed());
        }
        if start.elapsed() > BACK_TIMEOUT {
            bail!(
                "{node} not back in every list after {}: it lists {own:?}, expected {want:?}",
                secs(BACK_TIMEOUT)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Starts the client of both scenarios: `GET https://<API VIP>:6443/readyz` every 100 ms
/// with a 1 s timeout (as the failover scenario's), and waits for 3 s of answers in a row.
fn steady_client(c: &dyn Testbed) -> Result<(ClientLoop, Instant)> {
    let client = ClientLoop::start(
        c.outside().netns.name(),
        &format!("https://{API_VIP}:6443/readyz"),
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    let since = client
        .wait_steady(Duration::from_secs(3), Duration::from_secs(60))
        .context("the API VIP did not answer steadily for 3 s within 60 s")?;
    Ok((client, since))
}

/// Requests sent from `since` on, and how many of them failed (with when, after `since`).
fn failures(samples: &[Sample], since: Instant) -> (usize, Vec<String>) {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent >= since).collect();
    let failed = after
        .iter()
        .filter(|s| !s.ok)
        .map(|s| secs(s.sent.duration_since(since)))
        .collect();
    (after.len(), failed)
}

/// How many times each running master's agent took a VIP over because its holder's adverts
/// stopped (a Master_Down, not a goodbye), from its journal.
fn false_takeovers(c: &Cluster) -> std::collections::BTreeMap<String, u64> {
    journal_counts(c, "stopped; taking over")
}

/// The running nodes with a guest agent port (the stand-in runs `qemu-ga`): the ones whose
/// journal can be read.
fn running_nodes(c: &Cluster) -> impl Iterator<Item = &String> {
    c.vms
        .keys()
        .filter(|n| c.is_running(n) && c.guest(n).is_some())
}

/// How many lines of each running node's agent journal contain `pattern` (a fixed string);
/// a node whose journal could not be read is left out.
fn journal_counts(c: &Cluster, pattern: &str) -> std::collections::BTreeMap<String, u64> {
    // Inside single quotes in the guest's shell: a quote would end them.
    assert!(
        !pattern.contains('\''),
        "pattern {pattern:?} has a single quote"
    );
    running_nodes(c)
        .filter_map(|n| {
            let count = shell_on_node(
                c,
                n,
                &format!(
                    "journalctl --no-pager -q -o cat -u keelson-agent.service | grep -cF '{pattern}' || true"
                ),
            )
            .ok()?;
            Some((n.clone(), count.trim().parse().ok()?))
        })
        .collect()
}

/// The port-security findings (docs/vrrp.md, "Port security") of every running node over
/// the whole run: the segment has no port security and no security group, so any finding
/// is false, and each made its node give the VIP away (priority 1). A hand-back that
/// forwarded the port check's own answers to the old holder made every new holder find
/// its port dropping the VIP during a roll: this keeps that from coming back.
pub fn no_port_findings(c: &mut Cluster) -> Result<String> {
    let findings = [
        ("does not leave this node", "VIP dropped by the port"),
        ("no VRRP advert has arrived", "adverts blocked"),
    ];
    let running = running_nodes(c).count();
    let mut text = Vec::new();
    let mut any = false;
    for (pattern, what) in findings {
        let counts = journal_counts(c, pattern);
        // Every journal read, or the check would pass on what it could not see.
        ensure!(
            counts.len() == running,
            "{what}: read the journals of {} of the {running} running masters",
            counts.len()
        );
        any |= counts.values().any(|&n| n > 0);
        text.push(format!(
            "{what}: {}",
            per_node_since(&counts, &Default::default())
        ));
    }
    let text = text.join("; ");
    if any {
        bail!("a node found a port-security problem on a segment without port security: {text}");
    }
    Ok(format!("no finding on any node ({text})"))
}

/// Each node's count in `now` less its count in `before`, as `name n, name n`.
fn per_node_since(
    now: &std::collections::BTreeMap<String, u64>,
    before: &std::collections::BTreeMap<String, u64>,
) -> String {
    now.iter()
        .map(|(n, k)| {
            format!(
                "{n} {}",
                k.saturating_sub(before.get(n).copied().unwrap_or(0))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Requests failed (as "sent at (what was under way)") among `samples` from `since` on.
fn failed_during(samples: &[Sample], since: Instant, events: &[(Instant, String)]) -> Vec<String> {
    samples
        .iter()
        .filter(|s| s.sent >= since && !s.ok)
        .map(|s| {
            let under_way = events
                .iter()
                .rev()
                .find(|(at, _)| *at <= s.sent)
                .map(|(_, what)| what.as_str())
                .unwrap_or("?");
            format!("{} ({under_way})", secs(s.sent.duration_since(since)))
        })
        .collect()
}

/// The segment's drops towards each VM since `before` ([`Cluster::segment_drops`]), as text.
fn segment_drops_since(c: &Cluster, before: &std::collections::BTreeMap<String, u64>) -> String {
    per_node_since(&c.segment_drops(), before)
}

#[cfg(test)]
mod tests {
    use super::rotate::{key_id_in, new_membership_key, rotation};
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Runs `script` with `sh -c` and a `systemctl` that only records its arguments.
    fn run(dir: &Path, script: &str) -> std::process::Output {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let fake = bin.join("systemctl");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}/systemctl.log\n",
                dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .env("PATH", path)
            .output()
            .unwrap()
    }

    /// The three steps' shell text, run for real on a node's files (as the build writes
    /// them: a pretty-printed `cluster.json`): the keys end where docs/operations.md says,
    /// `members.keyId` names the new key, each step restarts the agent; a wrong ID stops
    /// the switch before it touches `cluster.json` or restarts anything.
    #[test]
    fn the_rotation_steps_move_the_keys_and_the_key_id() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path();
        std::fs::create_dir_all(etc.join("tls")).unwrap();
        let (old, old_id) = new_membership_key().unwrap();
        let (new, new_id) = new_membership_key().unwrap();
        assert_ne!(old_id, new_id);
        std::fs::write(etc.join("tls/membership.key"), &old).unwrap();
        let cluster = format!(
            "{{\n  \"members\": {{\n    \"expirySecs\": 35,\n    \"keyId\": \"{old_id}\"\n  }},\n  \"metrics\": {{}}\n}}\n"
        );
        std::fs::write(etc.join("cluster.json"), &cluster).unwrap();
        let d = etc.to_str().unwrap();

        let out = run(etc, &rotation::introduce(d, new.trim()));
        assert!(out.status.success(), "{out:?}");
        let next = etc.join("tls/membership.next.key");
        assert_eq!(std::fs::read_to_string(&next).unwrap().trim(), new.trim());
        assert_eq!(
            std::fs::metadata(&next).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // A wrong ID: refused before anything but the renames.
        let before = std::fs::read_to_string(etc.join("cluster.json")).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(scratch.path().join("tls")).unwrap();
        std::fs::write(scratch.path().join("tls/membership.key"), &old).unwrap();
        std::fs::write(scratch.path().join("tls/membership.next.key"), &new).unwrap();
        std::fs::write(scratch.path().join("cluster.json"), &cluster).unwrap();
        let out = run(
            scratch.path(),
            &rotation::switch(scratch.path().to_str().unwrap(), &old_id, false),
        );
        assert!(!out.status.success());
        assert_eq!(
            std::fs::read_to_string(scratch.path().join("cluster.json")).unwrap(),
            cluster
        );
        assert!(!scratch.path().join("systemctl.log").exists());

        let out = run(etc, &rotation::switch(d, &new_id, false));
        assert!(out.status.success(), "{out:?}");
        let text = std::fs::read_to_string(etc.join("cluster.json")).unwrap();
        assert_eq!(key_id_in(&text).unwrap(), new_id);
        assert_eq!(text, before.replace(&old_id, &new_id));
        assert_eq!(
            std::fs::read_to_string(etc.join("tls/membership.key")).unwrap(),
            new.trim()
        );
        assert_eq!(
            std::fs::read_to_string(etc.join("tls/membership.previous.key")).unwrap(),
            old
        );
        assert!(!next.exists());

        let out = run(etc, &rotation::retire(d));
        assert!(out.status.success(), "{out:?}");
        assert!(!etc.join("tls/membership.previous.key").exists());
        assert_eq!(
            std::fs::read_to_string(etc.join("systemctl.log")).unwrap(),
            "restart keelson-agent\n".repeat(3)
        );

        // A late node catching up: switch and retire in one.
        std::fs::write(etc.join("tls/membership.next.key"), &old).unwrap();
        let out = run(etc, &rotation::switch(d, &old_id, true));
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            key_id_in(&std::fs::read_to_string(etc.join("cluster.json")).unwrap()).unwrap(),
            old_id
        );
        assert!(!etc.join("tls/membership.previous.key").exists());
        assert!(!etc.join("tls/membership.next.key").exists());
    }
}
