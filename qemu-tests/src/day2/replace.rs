//! A master replaced by a new one at another address: the old one stops for good, the new
//! one boots and joins, and the survivors expire the old member.

use super::*;

/// `members.expirySecs` of the build's `cluster.json` (35 by default).
pub(super) fn expiry(c: &dyn Testbed) -> Result<Duration> {
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

/// [`false_takeovers`] since `before`, as text.
pub(super) fn takeovers_since(
    c: &Cluster,
    before: &std::collections::BTreeMap<String, u64>,
) -> String {
    per_node_since(&false_takeovers(c), before)
}

pub(super) fn replace_steps(c: &mut Cluster) -> Result<String> {
    let start = Instant::now();
    let holder = c.wait_holder(API_VIP, Duration::from_secs(30), &|h| {
        h.starts_with("master-")
    })?;
    let victim = c
        .names("master")
        .into_iter()
        .rev()
        .find(|m| *m != holder && c.is_running(m))
        .context("no master besides the holder")?;
    let survivors: Vec<String> = c
        .names("master")
        .into_iter()
        .filter(|m| *m != victim && c.is_running(m))
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
