//! The day-2 scenarios of `make qemu-day2` (issue 30, docs/operations.md): a rolling agent
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
use crate::probe::{self, ClientLoop, Sample};
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

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Runs a shell script in `node` and returns its output (fails on a non-zero exit).
fn sh(c: &dyn Testbed, node: &str, script: &str) -> Result<String> {
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
        &c.outside().netns.name,
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
    sh(
        c,
        &order[0],
        &format!("curl -fsS --noproxy '*' -o /tmp/keelson-agent.new {url}"),
    )?;
    let first_fetch = first_fetch.elapsed();
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
                format!(
                    "curl -fsS --noproxy '*' --cacert /etc/keelson/tls/ca.crt \
                     --resolve api-int.{ZONE}:22623:{address} \
                     -o /tmp/keelson-agent.new https://api-int.{ZONE}:22623/assets/keelson-agent"
                )
            }
        };
        sh(c, node, &fetch)?;
        let got = sh(c, node, "sha512sum /tmp/keelson-agent.new")?;
        ensure!(
            got.split_whitespace().next() == Some(published.as_str()),
            "{node}: the downloaded agent's sha512 is {got:?}, the published one's {published}"
        );
        // Step 2: install atomically, label, restart (the page's commands, verbatim but
        // restorecon, which is a no-op where SELinux is off as on the stand-in).
        let restart_at = Instant::now();
        events.push((restart_at, format!("{node}: installing, restarting")));
        sh(
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
        let running = sh(
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
    let during: Vec<String> = samples
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
        .collect();
    ensure!(
        new_holder != holder,
        "{API_VIP} still on {holder} after its restart: the holder restart did not hand it over"
    );
    ensure!(
        failed.is_empty(),
        "{} of {requests} requests through {API_VIP}:6443 failed during the roll, sent at {}; order {}{tls_note}",
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
        "{requests} requests through {API_VIP}:6443, 0 failed; the first copy from the build took {} before the client started; order {}; {API_VIP} {holder} -> {new_holder}; every member on {:?}; the rest fetched it from {}'s /assets/keelson-agent{tls_note}; roll {}",
        secs(first_fetch),
        steps.join(", "),
        versions.iter().next().unwrap_or(&String::new()),
        source.unwrap_or_default(),
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
/// one never comes back. A client through the API VIP counts failed requests all along
/// (reported: the dead backend is dropped by the proxy's checks or by members expiry).
pub fn replace(c: &mut Cluster) -> Result<String> {
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
    let ns = c.outside().netns.name.clone();
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
    let first_boot =
        scenarios::standin_first_boot(c, &new, &format!("https://{API_VIP}:22623/config/master"))?;
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
    Ok(format!(
        "{victim} ({victim_addr}) killed; out of the DNS of {} at {} (members.expirySecs {}); {new} ({new_addr}) ready {} after boot; {first_boot}; in the DNS of {} at {}; served through the API VIP at {}; {API_VIP} on {sole}; client: {} of {requests} requests failed{}; replacement {}",
        survivors.join(", "),
        secs(out_of_dns),
        secs(expiry),
        secs(ready),
        everyone.join(", "),
        secs(in_dns),
        secs(api_at),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" (sent at {} after the start)", failed.join(", "))
        },
        secs(start.elapsed())
    ))
}
