//! The day-2 scenarios of `make qemu-day2` (docs/operations.md): a rolling agent
//! upgrade of the masters through the API VIP with a client counting failed requests, and a
//! master replaced by a new one at another address. Each step is the one docs/operations.md
//! tells an operator to take, run inside the RHCOS stand-in masters through their guest agent,
//! so the page and the test cannot drift apart.

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

/// Serves `file` as `http://<outside>:PUBLISH_PORT/keelson-agent` from the harness's
/// namespace (the operator's "copy it to each node"), on a thread that lives as long as the
/// process.
fn publish(c: &dyn Testbed, file: &Path) -> Result<String> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let out = c.outside();
    let listener = out
        .netns
        .bind_tcp((out.address, PUBLISH_PORT).into())
        .context("publishing the new agent")?;
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            );
            let _ = conn.write_all(&bytes);
        }
    });
    Ok(format!(
        "http://{}:{PUBLISH_PORT}/keelson-agent",
        out.address
    ))
}

/// The hex sha512 of a file on the harness.
fn sha512_of(file: &Path) -> Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(file)?;
    Ok(sha2::Sha512::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
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

/// (a) Rolling agent upgrade (docs/operations.md, "Upgrading the agent"): the new binary
/// (`new_agent`) reaches the first master from the build (served by the harness on the
/// segment), every other master takes it from that master's Ignition server
/// (`/assets/keelson-agent`, checked against the published sha512); each master installs it
/// atomically and restarts `keelson-agent.service`, one at a time, the backups first and the
/// API VIP holder last, each waiting until it is back in every list. A client through the
/// API VIP counts failed requests all along: none may fail; the holder's restart moves the
/// VIP once, to another master; in the end every member runs the new binary.
pub fn roll(c: &mut Cluster, new_agent: &Path) -> Result<String> {
    let start = Instant::now();
    let masters: Vec<String> = c
        .names("master")
        .into_iter()
        .filter(|m| c.vms.contains_key(m))
        .collect();
    let holder = c.wait_holder(API_VIP, Duration::from_secs(30), &|h| {
        h.starts_with("master-")
    })?;
    // Backups first, the holder last.
    let mut order: Vec<String> = masters.iter().filter(|m| **m != holder).cloned().collect();
    order.push(holder.clone());
    let url = publish(c, new_agent)?;
    let published = sha512_of(new_agent)?;
    // The copy from the build to the first node happens before the client starts: the
    // harness serves it through the same userspace frame copier as the client's requests
    // (the outside participant's tap bridge), and 12 MB through it under TCG delayed a client
    // request past its 1 s timeout in a run. The downloads from the upgraded master's
    // Ignition server, node to node, stay inside the measured window.
    let first_fetch = Instant::now();
    shell_on_node(
        c,
        &order[0],
        &format!("curl -fsS --noproxy '*' -o /tmp/keelson-agent.new {url}"),
    )?;
    let first_fetch = first_fetch.elapsed();
    let drops_before = c.segment_drops();
    let (client, since) = steady_client(c)?;
    let mut steps = Vec::new();
    // What was under way when: to name the step each failed request ran into.
    let mut events: Vec<(Instant, String)> = vec![(since, "before the first step".into())];
    let mut source: Option<String> = None;
    let mut tls_note = String::new();
    for node in &order {
        let step = Instant::now();
        events.push((step, format!("{node}: fetching the binary")));
        // Step 1: the binary onto the node. The first from the build, the rest from the
        // first upgraded master's Ignition server, trusting the cluster CA.
        let fetch = match &source {
            // Fetched from the build before the client started.
            None => "true".to_owned(),
            Some(upgraded) => {
                let address = c.node(upgraded)?.address;
                // The Ignition server's certificate names the API VIP and api-int/api (the
                // pki's SANs), not a master's own address: reach that master under the
                // api-int name (docs/operations.md says so).
                if tls_note.is_empty() {
                    let bare = c
                        .guest(node)
                        .context("no guest agent")?
                        .exec(
                            &[
                                "curl",
                                "-sS",
                                "--cacert",
                                "/etc/keelson/tls/ca.crt",
                                "-o",
                                "/dev/null",
                                &format!("https://{address}:22623/assets/keelson-agent"),
                            ],
                            STEP_TIMEOUT,
                        )?
                        .code;
                    tls_note = format!(
                        "; by the bare address the download is refused (curl exit {bare:?}: the certificate names api-int, not the address)"
                    );
                }
                // `nice -n 19`: under TCG a node's one emulated CPU takes some 20 s to
                // receive and decrypt 12 MB (a real one a fraction of a second); on the
                // API VIP's holder that starved its proxy and two client requests of a run
                // timed out (1 s). Niced, the download yields to the agent.
                format!(
                    "nice -n 19 curl -fsS --noproxy '*' --cacert /etc/keelson/tls/ca.crt \
                     --resolve api-int.{ZONE}:22623:{address} \
                     -o /tmp/keelson-agent.new https://api-int.{ZONE}:22623/assets/keelson-agent"
                )
            }
        };
        shell_on_node(c, node, &fetch)?;
        let got = shell_on_node(c, node, "sha512sum /tmp/keelson-agent.new")?;
        ensure!(
            got.split_whitespace().next() == Some(published.as_str()),
            "{node}: the downloaded agent's sha512 is {got:?}, the published one's {published}"
        );
        // Step 2: install atomically, label, restart (the page's commands, verbatim but
        // restorecon, which is a no-op where SELinux is off as on the stand-in).
        let restart_at = Instant::now();
        events.push((restart_at, format!("{node}: installing, restarting")));
        shell_on_node(
            c,
            node,
            "install -m 0755 /tmp/keelson-agent.new /usr/local/bin/keelson-agent.new && \
             mv /usr/local/bin/keelson-agent.new /usr/local/bin/keelson-agent && \
             (restorecon /usr/local/bin/keelson-agent || true) && \
             systemctl restart keelson-agent",
        )?;
        let restart = restart_at.elapsed();
        events.push((Instant::now(), format!("{node}: waiting until it is back")));
        let back = wait_back(c, node, &masters)?;
        events.push((Instant::now(), format!("{node}: back")));
        let running = shell_on_node(
            c,
            node,
            "sha512sum /proc/$(systemctl show -p MainPID --value keelson-agent)/exe",
        )?;
        ensure!(
            running.split_whitespace().next() == Some(published.as_str()),
            "{node}: the running agent is not the new binary ({running:?})"
        );
        steps.push(format!(
            "{node}{} restart {} back {} (step {})",
            if *node == holder { " (holder)" } else { "" },
            secs(restart),
            secs(back),
            secs(step.elapsed())
        ));
        source.get_or_insert(node.clone());
    }
    let new_holder = c.sole_holder(API_VIP, Duration::from_secs(20))?;
    // 3 s more of requests after the last step, then count.
    std::thread::sleep(Duration::from_secs(3));
    let samples = client.finish();
    let (requests, failed) = failures(&samples, since);
    let during = failed_during(&samples, since, &events);
    ensure!(
        new_holder != holder,
        "{API_VIP} still on {holder} after its restart: the holder restart did not hand it over"
    );
    let drops = segment_drops_since(c, &drops_before);
    ensure!(
        failed.is_empty(),
        "{} of {requests} requests through {API_VIP}:6443 failed during the roll, sent at {}; order {}{tls_note}; frames the segment dropped towards each VM: {drops}",
        failed.len(),
        during.join(", "),
        steps.join(", ")
    );
    // Every member, as every node sees it, runs the same version now.
    let versions: BTreeSet<String> = status(c, &new_holder)?["members"]
        .as_array()
        .context("members")?
        .iter()
        .filter_map(|m| m["version"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        versions.len() == 1,
        "members run {versions:?} after the roll"
    );
    Ok(format!(
        "{requests} requests through {API_VIP}:6443, 0 failed; the first copy from the build took {} before the client started; order {}; {API_VIP} {holder} -> {new_holder}; every member on {:?}; the rest fetched it from {}'s /assets/keelson-agent{tls_note}; frames the segment dropped towards each VM: {}; roll {}",
        secs(first_fetch),
        steps.join(", "),
        versions.iter().next().unwrap_or(&String::new()),
        source.unwrap_or_default(),
        drops,
        secs(start.elapsed())
    ))
}

/// `members.expirySecs` of the build's `cluster.json` (35 by default).
fn expiry(c: &dyn Testbed) -> Result<Duration> {
    let cluster: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.out_dir().join("cluster.json"))?)?;
    Ok(Duration::from_secs(
        cluster["members"]["expirySecs"].as_u64().unwrap_or(35),
    ))
}

/// The new master's plan entry: the next address after the last master's, the next index,
/// a config drive with a static address (no DHCP reservation or metadata-service entry
/// needed for a node added after the start), the RHCOS stand-in.
pub fn new_master(c: &Cluster) -> Result<NodePlan> {
    let masters: Vec<&NodePlan> = c.plan.iter().filter(|n| n.role == "master").collect();
    let last = masters.last().context("no master in the plan")?;
    let index = masters.len();
    let host = last.address.octets()[3] + 1;
    Ok(NodePlan {
        name: format!("master-{index}"),
        role: "master",
        address: Ipv4Addr::new(10, 0, 0, host),
        mac: format!("52:54:00:0a:00:{host:02x}"),
        source: MetadataSource::ConfigDrive(NetworkMode::Static),
        image: ImageKind::Standin,
    })
}

/// (b) Master replacement (docs/operations.md, "Replacing a master"): a master that holds
/// no VIP dies for good (QEMU `quit`: a deleted VM says no goodbye); it leaves the DNS of
/// every surviving master within `members.expirySecs` (plus 10 s for the renewal that last
/// heard it and TCG); then a new master at the next address boots with `master.ign` (the
/// pointer config, as at install), fetches the master config through the API VIP, is in the
/// DNS of every master (dig from outside) and serves requests through the API VIP; the dead
/// one never comes back. A client through the API VIP counts failed requests all along:
/// none may fail (the dead backend is dropped by the proxy's checks or by members expiry,
/// and a connect to it is retried on another backend meanwhile).
pub fn replace(c: &mut Cluster) -> Result<String> {
    let drops = c.segment_drops();
    let takeovers = false_takeovers(c);
    let result = replace_steps(c);
    // What the segment did meanwhile, success or not (a run once stopped here: a backup
    // stopped hearing the live holder during the new master's download, docs/operations.md).
    let seen = format!(
        "frames the segment dropped towards each VM: {}; Master_Down takeovers logged (`adverts from .. stopped`): {}",
        segment_drops_since(c, &drops),
        takeovers_since(c, &takeovers)
    );
    match result {
        Ok(text) => Ok(format!("{text}; {seen}")),
        Err(e) => Err(e.context(seen)),
    }
}

/// How many times each running master's agent took a VIP over because its holder's adverts
/// stopped (a Master_Down, not a goodbye), from its journal.
fn false_takeovers(c: &Cluster) -> std::collections::BTreeMap<String, u64> {
    journal_counts(c, "stopped; taking over")
}

/// The running nodes with a guest agent port (the stand-in runs `qemu-ga`; a stopped VM has
/// left `vms`): the ones whose journal can be read.
fn running_nodes(c: &Cluster) -> impl Iterator<Item = &String> {
    c.vms.keys().filter(|n| c.guest(n).is_some())
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

/// [`false_takeovers`] since `before`, as text.
fn takeovers_since(c: &Cluster, before: &std::collections::BTreeMap<String, u64>) -> String {
    per_node_since(&false_takeovers(c), before)
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

fn replace_steps(c: &mut Cluster) -> Result<String> {
    let start = Instant::now();
    let holder = c.wait_holder(API_VIP, Duration::from_secs(30), &|h| {
        h.starts_with("master-")
    })?;
    let victim = c
        .names("master")
        .into_iter()
        .rev()
        .find(|m| *m != holder && c.vms.contains_key(m))
        .context("no master besides the holder")?;
    let survivors: Vec<String> = c
        .names("master")
        .into_iter()
        .filter(|m| *m != victim && c.vms.contains_key(m))
        .collect();
    let expiry = expiry(c)?;
    let ns = c.outside().netns.name().to_owned();
    let ns = crate::netns::Netns::existing(&ns);
    let victim_name = format!("{victim}.{ZONE}");
    let victim_addr = c.node(&victim)?.address.to_string();
    let (client, since) = steady_client(c)?;
    let killed = Instant::now();
    c.kill(&victim)?;
    c.vms.remove(&victim);
    // Out of every survivor's DNS.
    let bound = expiry + Duration::from_secs(10);
    let mut gone = Vec::new();
    for s in &survivors {
        let server = c.node(s)?.address.to_string();
        loop {
            let got = probe::dig(&ns, &server, &victim_name, "A");
            if got.status == "NXDOMAIN" {
                gone.push(killed.elapsed());
                break;
            }
            ensure!(
                killed.elapsed() <= bound,
                "{s}'s DNS still answers {victim_name} with {got:?} {} after {victim} died (members.expirySecs {})",
                secs(killed.elapsed()),
                secs(expiry)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let out_of_dns = gone.iter().max().copied().unwrap_or_default();
    // The new master: next address, the master pointer config.
    let plan = new_master(c)?;
    let new = plan.name.clone();
    let new_addr = plan.address.to_string();
    c.plan.push(plan);
    let booted = Instant::now();
    c.boot(&new)?;
    c.wait_ready(std::slice::from_ref(&new), STANDIN_BOOT_TIMEOUT)?;
    let ready = booted.elapsed();
    let first_boot = scenarios::standin_first_boot(
        c,
        &new,
        &[format!("https://{API_VIP}:22623/config/master")],
    )?;
    let name = format!("{new}.{ZONE}");
    let mut everyone = survivors.clone();
    everyone.push(new.clone());
    let mut dns_at = Vec::new();
    for s in &everyone {
        let server = c.node(s)?.address.to_string();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let got = probe::dig(&ns, &server, &name, "A");
            if got.status == "NOERROR" && got.records == [new_addr.clone()] {
                dns_at.push(booted.elapsed());
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{s}'s DNS answers {name} with {got:?}, expected {new_addr}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        // And the dead one is not back anywhere (the new master included).
        let dead = probe::dig(&ns, &server, &victim_name, "A");
        ensure!(
            dead.status == "NXDOMAIN",
            "{s}'s DNS answers {victim_name} again: {dead:?} (it was {victim_addr})"
        );
    }
    let in_dns = dns_at.iter().max().copied().unwrap_or_default();
    // The proxy sends the new master requests (the stand-in apiserver names itself).
    let deadline = Instant::now() + Duration::from_secs(180);
    let api_at = loop {
        if scenarios::api_node(c).as_deref() == Some(new.as_str()) {
            break booted.elapsed();
        }
        ensure!(
            Instant::now() < deadline,
            "the API VIP never sent a request to {new}"
        );
    };
    let sole = c.sole_holder(API_VIP, Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_secs(2));
    let samples = client.finish();
    let (requests, failed) = failures(&samples, since);
    ensure!(
        failed.is_empty(),
        "{} of {requests} requests through {API_VIP}:6443 failed during the replacement, sent at {} after the start",
        failed.len(),
        failed.join(", ")
    );
    Ok(format!(
        "{victim} ({victim_addr}) killed; out of the DNS of {} at {} (members.expirySecs {}); {new} ({new_addr}) ready {} after boot; {first_boot}; in the DNS of {} at {}; served through the API VIP at {}; {API_VIP} on {sole}; client: {requests} requests, 0 failed; replacement {}",
        survivors.join(", "),
        secs(out_of_dns),
        secs(expiry),
        secs(ready),
        everyone.join(", "),
        secs(in_dns),
        secs(api_at),
        secs(start.elapsed())
    ))
}

/// A new membership key as key-file text (32 random bytes, base64: what `head -c 32
/// /dev/urandom | base64` writes) and its ID (`members.keyId`: the first 16 hex digits of
/// its SHA-256, as `keelson build` computes it).
fn new_membership_key() -> Result<(String, String)> {
    use base64::Engine;
    use sha2::Digest;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("reading /dev/urandom")?;
    let text = format!(
        "{}\n",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    Ok((text, hex::encode(&sha2::Sha256::digest(key)[..8])))
}

/// `members.keyId` of a `cluster.json` text.
fn key_id_in(cluster_json: &str) -> Result<String> {
    let doc: serde_json::Value = serde_json::from_str(cluster_json)?;
    doc["members"]["keyId"]
        .as_str()
        .map(str::to_owned)
        .context("cluster.json names no members.keyId")
}

/// `keelson_members_auth_drops_total{reason="unknownKey"}` on `node`'s `/metrics`, scraped
/// from the harness's namespace (the machine network is allowed to).
fn metric_unknown_key(c: &dyn Testbed, node: &str) -> Result<u64> {
    let address = c.node(node)?.address;
    let text = probe::curl(
        c.outside().netns,
        &format!("http://{address}:22625/metrics"),
        Duration::from_secs(5),
    )
    .with_context(|| format!("no answer from {node}'s /metrics"))?;
    text.lines()
        .find(|l| l.starts_with("keelson_members_auth_drops_total{reason=\"unknownKey\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{node}: no unknownKey drop counter in /metrics"))
}

/// A record drop counter (`discovery.auth.drops.<reason>`) in a status document.
fn auth_drops(status: &serde_json::Value, reason: &str) -> u64 {
    status["discovery"]["auth"]["drops"][reason]
        .as_u64()
        .unwrap_or(0)
}

/// The procedure's shell steps, as docs/operations.md, "Rotating the membership key", gives
/// them. The one difference: the stand-in has no `jq`, so the switch edits `members.keyId`
/// with `sed` (same effect, same atomic rename); and it checks that the ID the node computes
/// is the one the harness computed.
mod rotation {
    /// The agent's configuration directory on RHCOS nodes.
    pub const DIR: &str = "/etc/keelson";

    /// Step 1 on a node: the new key as `<dir>/tls/membership.next.key` (mode 0600), restart.
    pub fn introduce(dir: &str, key: &str) -> String {
        format!(
            "umask 077 && printf '%s' '{key}' > {dir}/tls/membership.next.key && \
             systemctl restart keelson-agent"
        )
    }

    /// Step 2 on a node: the keys renamed, `members.keyId` set to the new key's ID (`id`,
    /// checked against the one the node computes), restart; with `retire`, step 3 at once
    /// (a late node catching up).
    pub fn switch(dir: &str, id: &str, retire: bool) -> String {
        let retire = if retire {
            " && rm membership.previous.key"
        } else {
            ""
        };
        format!(
            r#"cd {dir}/tls && mv membership.key membership.previous.key && mv membership.next.key membership.key && id=$(base64 -d membership.key | sha256sum | cut -c1-16) && test "$id" = {id} && sed -i "s/\"keyId\": *\"[0-9a-f]*\"/\"keyId\": \"$id\"/" ../cluster.json && grep -q "\"keyId\": *\"$id\"" ../cluster.json{retire} && systemctl restart keelson-agent"#
        )
    }

    /// Step 3 on a node: the old key removed, restart.
    pub fn retire(dir: &str) -> String {
        format!("rm {dir}/tls/membership.previous.key && systemctl restart keelson-agent")
    }
}

/// Runs `script` on each of `nodes` in turn (the order given: backups first, the holder
/// last), each time waiting until the node lists every one of `live` and each of them lists
/// it; returns one text per node (time of the command, time until back) and the step's time.
fn rolling_step(
    c: &dyn Testbed,
    step: &str,
    nodes: &[String],
    live: &[String],
    script: &dyn Fn(&str) -> String,
    events: &mut Vec<(Instant, String)>,
) -> Result<(Vec<String>, Duration)> {
    let start = Instant::now();
    let mut done = Vec::new();
    for node in nodes {
        let at = Instant::now();
        events.push((at, format!("{step}: {node} restarting")));
        shell_on_node(c, node, &script(node)).with_context(|| format!("{step} on {node}"))?;
        let restart = at.elapsed();
        events.push((Instant::now(), format!("{step}: {node} waiting until back")));
        let back = wait_back(c, node, live).with_context(|| format!("{step} on {node}"))?;
        done.push(format!("{node} {}/{}", secs(restart), secs(back)));
    }
    events.push((Instant::now(), format!("after {step}")));
    Ok((done, start.elapsed()))
}

/// Orders `nodes` with the API VIP's holder last (docs/operations.md).
fn holder_last(c: &dyn Testbed, nodes: &[String]) -> Result<Vec<String>> {
    let holder = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    let mut order = nodes.to_vec();
    order.sort_by_key(|n| *n == holder);
    Ok(order)
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

/// (c) Membership key rotation (docs/operations.md, "Rotating the membership key"), in the
/// running cluster, node by node, the API VIP's holder last in every step, with a client
/// through the API VIP all along (none of its requests may fail):
/// 1. introduce: a new key (made on the harness, as the page makes it on the operator's
///    machine, into the build's `tls/`) as `membership.next.key` on every master;
/// 2. switch on every master but one backup, `late`; while two keys sign, no record is
///    dropped for its key or MAC (`discovery.auth.drops`);
/// 3. retire on the switched masters: `late`, still signing with the old key, leaves their
///    member lists and DNS; each of them logs the page's line naming `late` and the old key
///    ID and counts it in `status` and in `/metrics` (scraped from the harness);
///
/// then `late` catches up (switch and retire) and is back in every list; the build's `tls/`
/// and `cluster.json` get the new key (so a node provisioned later carries it).
pub fn rotate(c: &mut Cluster) -> Result<String> {
    let start = Instant::now();
    let masters: Vec<String> = c
        .names("master")
        .into_iter()
        .filter(|m| c.vms.contains_key(m))
        .collect();
    let out = c.out_dir().to_path_buf();
    let cluster_json = std::fs::read_to_string(out.join("cluster.json"))?;
    let old_id = key_id_in(&cluster_json)?;
    let (key, new_id) = new_membership_key()?;
    std::fs::write(out.join("tls/membership.next.key"), &key)?;
    let drops_before = c.segment_drops();
    let (client, since) = steady_client(c)?;
    let mut events: Vec<(Instant, String)> = vec![(since, "before the first step".into())];
    let mut figures = Vec::new();

    // 1. Introduce, everywhere.
    let order = holder_last(c, &masters)?;
    let (done, took) = rolling_step(
        c,
        "introduce",
        &order,
        &masters,
        &|_: &str| rotation::introduce(rotation::DIR, key.trim()),
        &mut events,
    )?;
    figures.push(format!("introduce {} ({})", secs(took), done.join(", ")));

    // 2. Switch, everywhere but `late`: a backup, the one with the lower address, so the
    // holder's restart hands the VIP to the other backup (the goodbye ranks: equal
    // priorities, the higher address first; docs/vrrp.md).
    let holder = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    let late = masters
        .iter()
        .filter(|m| **m != holder)
        .min_by_key(|m| c.node(m).map(|n| n.address).ok())
        .context("no backup master")?
        .clone();
    let on_new: Vec<String> = masters.iter().filter(|m| **m != late).cloned().collect();
    let order = holder_last(c, &on_new)?;
    let (done, took) = rolling_step(
        c,
        "switch",
        &order,
        &masters,
        &|_: &str| rotation::switch(rotation::DIR, &new_id, false),
        &mut events,
    )?;
    figures.push(format!(
        "switch {} ({}; {late} left on the old key)",
        secs(took),
        done.join(", ")
    ));
    // Two keys sign now: nothing dropped for its key or MAC anywhere.
    for m in &masters {
        let s = status(c, m)?;
        for reason in ["noMac", "badMac", "unknownKey"] {
            ensure!(
                auth_drops(&s, reason) == 0,
                "{m} dropped {} record(s) ({reason}) while two keys were in use: {}",
                auth_drops(&s, reason),
                s["discovery"]["auth"]
            );
        }
    }
    // The late node must not hold the VIP when the others cut it off (that is a holder
    // cut off, not the case the page describes): if the ranks gave it the VIP anyway, a
    // plain restart hands it on.
    if c.sole_holder(API_VIP, Duration::from_secs(30))? == late {
        events.push((
            Instant::now(),
            format!("{late}: restart to hand the VIP on"),
        ));
        shell_on_node(c, &late, "systemctl restart keelson-agent")?;
        wait_back(c, &late, &masters)?;
        figures.push(format!(
            "({late} held the VIP after the switch: restarted once)"
        ));
    }

    // 3. Retire on the switched nodes: `late` is cut off.
    let order = holder_last(c, &on_new)?;
    let (done, took) = rolling_step(
        c,
        "retire",
        &order,
        &on_new,
        &|_: &str| rotation::retire(rotation::DIR),
        &mut events,
    )?;
    let retired = Instant::now();
    figures.push(format!("retire {} ({})", secs(took), done.join(", ")));
    let ns = crate::netns::Netns::existing(c.outside().netns.name());
    let late_name = format!("{late}.{ZONE}");
    let line = format!(
        "dropped a record of {late} signed with membership key \"{old_id}\", which this node does not hold"
    );
    // Until `late` is out of every switched node's members and DNS, and each of them has
    // logged the line and counted the drop (a node just restarted meets `late`'s record
    // within a renewal interval); on the unicast members, `late` counts its refusals.
    let deadline = Instant::now() + BACK_TIMEOUT;
    let mut cut_after = None;
    let (refused, late_refused) = loop {
        let mut missing = Vec::new();
        let mut refused = Vec::new();
        let mut still_in = false;
        for m in &on_new {
            let s = status(c, m).unwrap_or_default();
            if member_names(&s).contains(&late) {
                still_in = true;
                missing.push(format!("{m} lists {late}"));
            }
            let server = c.node(m)?.address.to_string();
            let dns = probe::dig(&ns, &server, &late_name, "A");
            if dns.status != "NXDOMAIN" {
                still_in = true;
                missing.push(format!("{m}'s DNS answers {late_name}: {dns:?}"));
            }
            let unknown = auth_drops(&s, "unknownKey");
            if unknown == 0 || auth_drops(&s, "badMac") != 0 {
                missing.push(format!(
                    "{m}'s status counts {}",
                    s["discovery"]["auth"]["drops"]
                ));
            }
            let metric = metric_unknown_key(c, m).unwrap_or(0);
            if metric == 0 {
                missing.push(format!(
                    "{m}'s /metrics has keelson_members_auth_drops_total{{reason=\"unknownKey\"}} 0"
                ));
            }
            let journal = shell_on_node(
                c,
                m,
                "journalctl --no-pager -q -o cat -u keelson-agent.service",
            )
            .unwrap_or_default();
            if !journal.contains(&line) {
                missing.push(format!("{m} has not logged {line:?}"));
            }
            refused.push(format!("{m} {unknown} (status) / {metric} (/metrics)"));
        }
        if !still_in && cut_after.is_none() {
            cut_after = Some(retired.elapsed());
        }
        let late_refused = status(c, &late)
            .map(|s| s["discovery"]["refused"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        if c.config == crate::cluster::Config::Unicast && late_refused == 0 {
            missing.push(format!("{late} counts no registration refused"));
        }
        if missing.is_empty() {
            break (refused, late_refused);
        }
        ensure!(
            Instant::now() < deadline,
            "{late} (still on key {old_id}) {} after the old key's retirement: {}",
            secs(BACK_TIMEOUT),
            missing.join("; ")
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let cut_after = cut_after.unwrap_or_else(|| retired.elapsed());
    events.push((Instant::now(), format!("{late} cut off")));
    figures.push(format!(
        "{late} out of the members and DNS of {} {} after the last retirement; the line logged and counted: {}; {late} counts {late_refused} registrations refused",
        on_new.join(", "),
        secs(cut_after),
        refused.join(", ")
    ));
    // The late node catches up.
    let (done, took) = rolling_step(
        c,
        "catch-up",
        std::slice::from_ref(&late),
        &masters,
        &|_: &str| rotation::switch(rotation::DIR, &new_id, true),
        &mut events,
    )?;
    figures.push(format!(
        "{late} switched and retired: back in every list {} ({})",
        secs(took),
        done.join(", ")
    ));
    // The build carries the new key from now on (the page's last step).
    std::fs::rename(
        out.join("tls/membership.next.key"),
        out.join("tls/membership.key"),
    )?;
    std::fs::write(
        out.join("cluster.json"),
        cluster_json.replace(&format!("\"{old_id}\""), &format!("\"{new_id}\"")),
    )?;
    ensure!(
        key_id_in(&std::fs::read_to_string(out.join("cluster.json"))?)? == new_id,
        "the build's cluster.json does not name the new key"
    );
    let sole = c.sole_holder(API_VIP, Duration::from_secs(20))?;
    std::thread::sleep(Duration::from_secs(3));
    let samples = client.finish();
    let (requests, failed) = failures(&samples, since);
    let drops = segment_drops_since(c, &drops_before);
    ensure!(
        failed.is_empty(),
        "{} of {requests} requests through {API_VIP}:6443 failed during the rotation, sent at {}; {}; frames the segment dropped towards each VM: {drops}",
        failed.len(),
        failed_during(&samples, since, &events).join(", "),
        figures.join("; ")
    );
    Ok(format!(
        "{requests} requests through {API_VIP}:6443, 0 failed; key {old_id} -> {new_id}; {}; {API_VIP} on {sole}; frames the segment dropped towards each VM: {drops}; rotation {}",
        figures.join("; "),
        secs(start.elapsed())
    ))
}

/// The segment's drops towards each VM since `before` ([`Cluster::segment_drops`]), as text.
fn segment_drops_since(c: &Cluster, before: &std::collections::BTreeMap<String, u64>) -> String {
    per_node_since(&c.segment_drops(), before)
}

#[cfg(test)]
mod tests {
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
