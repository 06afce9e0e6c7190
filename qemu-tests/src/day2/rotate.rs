//! The membership key rotated on every node in rolling steps, with a client counting failed
//! requests through the API VIP and the nodes counting adverts from an unknown key.

use super::*;

/// A new membership key as key-file text (32 random bytes, base64: what `head -c 32
/// /dev/urandom | base64` writes) and its ID (`members.keyId`: the first 16 hex digits of
/// its SHA-256, as `keelson build` computes it).
pub(super) fn new_membership_key() -> Result<(String, String)> {
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
pub(super) fn key_id_in(cluster_json: &str) -> Result<String> {
    let doc: serde_json::Value = serde_json::from_str(cluster_json)?;
    doc["members"]["keyId"]
        .as_str()
        .map(str::to_owned)
        .context("cluster.json names no members.keyId")
}

/// `keelson_members_auth_drops_total{reason="unknownKey"}` on `node`'s `/metrics`, scraped
/// from the harness's namespace (the machine network is allowed to).
pub(super) fn metric_unknown_key(c: &dyn Testbed, node: &str) -> Result<u64> {
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
pub(super) fn auth_drops(status: &serde_json::Value, reason: &str) -> u64 {
    status["discovery"]["auth"]["drops"][reason]
        .as_u64()
        .unwrap_or(0)
}

/// The procedure's shell steps, as docs/operations.md, "Rotating the membership key", gives
/// them. The one difference: the stand-in has no `jq`, so the switch edits `members.keyId`
/// with `sed` (same effect, same atomic rename); and it checks that the ID the node computes
/// is the one the harness computed.
pub(super) mod rotation {
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
pub(super) fn rolling_step(
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
pub(super) fn holder_last(c: &dyn Testbed, nodes: &[String]) -> Result<Vec<String>> {
    let holder = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    let mut order = nodes.to_vec();
    order.sort_by_key(|n| *n == holder);
    Ok(order)
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
        .filter(|m| c.is_running(m))
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
