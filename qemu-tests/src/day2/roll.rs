//! The rolling agent upgrade: each master in turn fetches the new agent from a server in
//! the harness's namespace, checks its digest and restarts, while a client counts failed
//! requests through the API VIP.

use super::*;

/// Serves `file` as `http://<outside>:PUBLISH_PORT/keelson-agent` from the harness's
/// namespace (the operator's "copy it to each node"), on a thread that lives as long as the
/// process.
pub(super) fn publish(c: &dyn Testbed, file: &Path) -> Result<String> {
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
pub(super) fn sha512_of(file: &Path) -> Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(file)?;
    Ok(sha2::Sha512::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
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
        .filter(|m| c.is_running(m))
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
