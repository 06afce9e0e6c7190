//! The scenarios of `make qemu-cluster` (issue 9), in order; each later one builds on the
//! state the earlier ones left. Each returns a one-line detail with what it measured, or an
//! error; the runner prints a table and, for a failure, the consoles of the nodes involved.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::{API_VIP, Cluster, INGRESS_VIP, MetadataSource, ServiceFault};
use crate::configdrive::NetworkMode;
use crate::probe::{self, ClientLoop};

/// The cluster zone of `examples/install-config.yaml`.
pub const ZONE: &str = "ocp4.osd2019.local";
/// How long a node may take from QEMU start to its ready line under TCG with six VMs on a
/// small host.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const ACCEPT_32: &str = "Accept: application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1";

fn names(c: &Cluster, role: &str) -> Vec<String> {
    c.plan
        .iter()
        .filter(|n| n.role == role)
        .map(|n| n.name.clone())
        .collect()
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// 1. Boot: every node of the control plane reports ready, the bootstrap holds the API VIP,
///    masters fetched their configs from it over :22623, workers are told 500 meanwhile.
pub fn boot(c: &mut Cluster) -> Result<String> {
    let start = Instant::now();
    for node in c.plan.clone() {
        c.boot(&node.name)?;
    }
    let bootstrap = c.wait_ready(&["bootstrap".to_owned()], BOOT_TIMEOUT)?;
    let holder = c.wait_holder(API_VIP, Duration::from_secs(60), |h| h == "bootstrap")?;
    let vip_at = start.elapsed();
    let masters = names(c, "master");
    c.wait_ready(&masters, BOOT_TIMEOUT.saturating_sub(start.elapsed()))?;
    let masters_at = start.elapsed();
    for m in &masters {
        let console = c.vms[m].console_text();
        let url = format!("https://{API_VIP}:22623/config/master");
        ensure!(
            console.contains(&format!("fetched config {url}")),
            "{m} did not log fetching {url}"
        );
    }
    // Workers keep asking; the bootstrap answers 500 for the worker pool.
    let status = probe::http_status(
        &c.netns,
        &format!("https://{API_VIP}:22623/config/worker"),
        Duration::from_secs(5),
        &["-H", ACCEPT_32],
    );
    ensure!(
        status == 500,
        "the bootstrap answered {status} for /config/worker, expected 500"
    );
    let mut told = Vec::new();
    for w in names(c, "worker") {
        let vm = c.vms.get_mut(&w).context("worker not running")?;
        vm.wait_for_console("config/worker", Duration::from_secs(60))?;
        ensure!(
            !vm.console_text().contains("keelson-agent ready:"),
            "{w} is ready although only the bootstrap serves configs"
        );
        told.push(w);
    }
    // The masters registered through the VIP with the bootstrap and never claimed it.
    let sole = c.sole_holder(API_VIP, Duration::from_secs(10))?;
    ensure!(
        sole == "bootstrap",
        "{API_VIP} answered by {sole}, expected the bootstrap alone"
    );
    Ok(format!(
        "{holder} ready in {} and holds {API_VIP} at {} (the only node answering ARP for it once the masters are up); 3 masters ready at {} (configs from :22623); {} retrying on 500",
        secs(bootstrap),
        secs(vip_at),
        secs(masters_at),
        told.join(", ")
    ))
}

/// 1b. Cloud boot: each node took its metadata from where its plan says (config drive or the
///     metadata service at 169.254.169.254, asked from its DHCP address); DHCP nodes hold a
///     lease in dnsmasq's lease file; the faults were met and said so on the console (a
///     service unreachable for a while: retries naming it; no `network_data.json`: DHCP kept).
pub fn cloud_boot(c: &Cluster) -> Result<String> {
    let dhcp = c.dhcp.as_ref().context("no DHCP server")?;
    let service = c.metadata.as_ref().context("no metadata service")?;
    let mut lines = Vec::new();
    for node in &c.plan {
        let Some(vm) = c.vms.get(&node.name) else {
            continue;
        };
        let console = vm.console_text();
        let said = console
            .lines()
            .find_map(|l| l.split("metadata from ").nth(1))
            .with_context(|| format!("{}: no `metadata from` line", node.name))?;
        let keeps_dhcp = match node.source {
            MetadataSource::ConfigDrive(mode) => {
                ensure!(
                    said.starts_with("config-drive:"),
                    "{}: metadata from {said}, expected the config drive",
                    node.name
                );
                mode == NetworkMode::Dhcp
            }
            MetadataSource::Service(mode, fault) => {
                ensure!(
                    said.starts_with("http://169.254.169.254"),
                    "{}: metadata from {said}, expected the metadata service",
                    node.name
                );
                let served = service.served_to(node.address);
                ensure!(
                    served
                        .iter()
                        .any(|r| r.path.ends_with("user_data") && r.status == 200),
                    "{}: the service never served it user_data ({served:?})",
                    node.name
                );
                if let ServiceFault::UnreachableFor(_) = fault {
                    ensure!(
                        console.lines().any(|l| l.contains("metadata service: ")
                            && l.contains("169.254.169.254")
                            && l.contains("retrying in")),
                        "{}: no console line saying it waits for http://169.254.169.254",
                        node.name
                    );
                }
                if mode == NetworkMode::Absent {
                    ensure!(
                        served
                            .iter()
                            .any(|r| r.path.ends_with("network_data.json") && r.status == 404),
                        "{}: network_data.json was not asked for (and refused)",
                        node.name
                    );
                }
                ensure!(
                    console.contains(&format!("DHCPv4 on eth0 ({})", node.mac)),
                    "{}: no ephemeral DHCP line on the console",
                    node.name
                );
                mode != NetworkMode::Static
            }
        };
        if keeps_dhcp {
            ensure!(
                dhcp.has_lease(&node.mac),
                "{}: no lease for {} in dnsmasq's lease file",
                node.name,
                node.mac
            );
        }
        lines.push(format!("{} <- {}", node.name, node.source.describe()));
    }
    Ok(lines.join("; "))
}

/// 7. DHCP renewals: every running node that keeps DHCP renewed its lease (two DHCPACKs or
///    more: the lease is 120 s, T1 60 s) and still holds it.
pub fn renewals(c: &Cluster) -> Result<String> {
    let dhcp = c.dhcp.as_ref().context("no DHCP server")?;
    let mut renewed = Vec::new();
    for node in &c.plan {
        let keeps = matches!(
            node.source,
            MetadataSource::ConfigDrive(NetworkMode::Dhcp)
                | MetadataSource::Service(NetworkMode::Dhcp | NetworkMode::Absent, _)
        );
        let Some(vm) = c.vms.get(&node.name) else {
            continue;
        };
        if !keeps || vm.started.elapsed() < Duration::from_secs(90) {
            continue;
        }
        let acks = dhcp.acks_for(&node.mac);
        ensure!(
            acks >= 2 && dhcp.has_lease(&node.mac),
            "{}: {acks} DHCPACK(s) in dnsmasq's log after {}, expected a renewal",
            node.name,
            secs(vm.started.elapsed())
        );
        renewed.push(format!("{} {acks} ACKs", node.name));
    }
    ensure!(
        !renewed.is_empty(),
        "no node keeping DHCP ran long enough to renew"
    );
    Ok(renewed.join(", "))
}

/// 2. DNS from `nodes`: api/api-int -> API VIP, *.apps -> ingress VIP, node names -> node
///    addresses, AAAA of api NOERROR without answer, other names forwarded (NXDOMAIN or
///    SERVFAIL without upstreams, never a made-up answer).
pub fn dns(c: &Cluster, nodes: &[String]) -> Result<String> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(90);
    let mut checked = 0;
    for node in nodes {
        let server = c.node(node)?.address.to_string();
        // Names of other nodes come from members: give discovery time to converge.
        let mut expect: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for name in ["api", "api-int"] {
            expect.insert(
                format!("{name}.{ZONE}"),
                ("A".into(), vec![API_VIP.to_owned()]),
            );
        }
        expect.insert(
            format!("console-openshift-console.apps.{ZONE}"),
            ("A".into(), vec![INGRESS_VIP.to_owned()]),
        );
        for other in nodes {
            let addr = c.node(other)?.address.to_string();
            expect.insert(format!("{other}.{ZONE}"), ("A".into(), vec![addr.clone()]));
        }
        for (name, (rtype, want)) in &expect {
            loop {
                let got = probe::dig(&c.netns, &server, name, rtype);
                if got.status == "NOERROR" && &got.records == want {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("dig @{server} {name} {rtype}: {got:?}, expected NOERROR {want:?}");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            checked += 1;
        }
        let aaaa = probe::dig(&c.netns, &server, &format!("api.{ZONE}"), "AAAA");
        ensure!(
            aaaa.status == "NOERROR" && aaaa.records.is_empty(),
            "dig @{server} api.{ZONE} AAAA: {aaaa:?}, expected NOERROR with no answer"
        );
        let missing = probe::dig(&c.netns, &server, &format!("nosuchnode.{ZONE}"), "A");
        ensure!(
            missing.status == "NXDOMAIN",
            "dig @{server} nosuchnode.{ZONE}: {missing:?}, expected NXDOMAIN"
        );
        checked += 2;
    }
    Ok(format!(
        "{checked} answers from {} nodes ({})",
        nodes.len(),
        nodes.join(", ")
    ))
}

/// The node that answered `/version` through the API VIP (the stand-in names itself).
fn api_node(c: &Cluster) -> Option<String> {
    let body = probe::curl(
        &c.netns,
        &format!("https://{API_VIP}:6443/version"),
        Duration::from_secs(3),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["node"].as_str().map(str::to_owned)
}

/// 3. API through the VIP: `https://<apiVIP>:6443` answers and requests are spread over the
///    three masters (their proxies learn the masters from members and check them first).
pub fn api_spread(c: &Cluster) -> Result<String> {
    let start = Instant::now();
    let masters: BTreeSet<String> = names(c, "master").into_iter().collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut requests = 0;
    while start.elapsed() < Duration::from_secs(120) {
        if let Some(node) = api_node(c) {
            *seen.entry(node).or_default() += 1;
        }
        requests += 1;
        if masters
            .iter()
            .all(|m| seen.get(m).copied().unwrap_or(0) >= 2)
        {
            let ready = probe::curl(
                &c.netns,
                &format!("https://{API_VIP}:6443/readyz"),
                Duration::from_secs(3),
            );
            ensure!(
                ready.as_deref() == Some("ok"),
                "/readyz through the VIP: {ready:?}"
            );
            return Ok(format!(
                "{requests} requests through {API_VIP}:6443 answered by {seen:?}"
            ));
        }
    }
    bail!(
        "after {requests} requests through the VIP only {seen:?} answered, expected all of {masters:?}"
    )
}

/// 4. Pivot: the bootstrap powers off, the API VIP moves to a master, the Ignition server
///    answers through the VIP (now for workers too), and the workers finish their first boot.
pub fn pivot(c: &mut Cluster) -> Result<String> {
    let start = Instant::now();
    c.vms
        .get_mut("bootstrap")
        .context("bootstrap not running")?
        .power_off(Duration::from_secs(60))?;
    let off = start.elapsed();
    let holder = c.wait_holder(API_VIP, Duration::from_secs(60), |h| {
        h.starts_with("master-")
    })?;
    let moved = start.elapsed();
    // The new holder answers at once; a host whose ARP entry still names a node that held
    // the VIP for a moment learns the right one from the winner's next announcement.
    let served = Instant::now();
    let master_cfg = loop {
        if let Some(body) = probe::curl_with(
            &c.netns,
            &format!("https://{API_VIP}:22623/config/master"),
            Duration::from_secs(3),
            &["-H", ACCEPT_32],
        ) {
            break body;
        }
        if served.elapsed() > Duration::from_secs(20) {
            bail!("/config/master through the VIP did not answer within 20 s of the pivot");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let served = served.elapsed();
    let doc: serde_json::Value = serde_json::from_str(&master_cfg)?;
    ensure!(
        doc["ignition"]["version"] == "3.2.0",
        "served config: {}",
        &master_cfg[..master_cfg.len().min(200)]
    );
    let workers = names(c, "worker");
    c.wait_ready(&workers, BOOT_TIMEOUT)?;
    let workers_at = start.elapsed();
    for w in &workers {
        let url = format!("https://{API_VIP}:22623/config/worker");
        ensure!(
            c.vms[w]
                .console_text()
                .contains(&format!("fetched config {url}")),
            "{w} did not log fetching {url}"
        );
    }
    let api = c.sole_holder(API_VIP, Duration::from_secs(10))?;
    ensure!(
        api.starts_with("master-"),
        "{API_VIP} answered by {api} after the pivot"
    );
    let ingress = c.sole_holder(INGRESS_VIP, Duration::from_secs(30))?;
    ensure!(
        ingress.starts_with("worker-"),
        "{INGRESS_VIP} answered by {ingress}"
    );
    Ok(format!(
        "bootstrap off in {}; {API_VIP} on {holder} at {}; :22623 answered through the VIP {} later; workers ready at {}; one holder each: {api}, {ingress}",
        secs(off),
        secs(moved),
        secs(served),
        secs(workers_at)
    ))
}

/// Kills the holder of `vip` while a client loop requests `url` every 100 ms; returns the
/// holder, the new holder and the outage seen by the client.
fn kill_holder(
    c: &mut Cluster,
    vip: &str,
    url: &str,
    same_role: &str,
    settle: Duration,
) -> Result<(String, String, probe::Outage)> {
    let holder = c.wait_holder(vip, Duration::from_secs(30), |h| h.starts_with(same_role))?;
    let client = ClientLoop::start(
        &c.netns.name,
        url,
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    // A steady state first: 3 s of answers in a row (after the pivot the proxies may still
    // be taking the bootstrap out of their backends).
    let steady = Duration::from_secs(3);
    let warm = Instant::now();
    let since = loop {
        let samples = client.samples();
        let since = samples
            .iter()
            .rev()
            .take_while(|s| s.ok)
            .last()
            .map(|s| s.sent);
        if let Some(since) = since
            && samples
                .last()
                .is_some_and(|s| s.sent.duration_since(since) >= steady)
        {
            break since;
        }
        if warm.elapsed() > Duration::from_secs(60) {
            bail!("{url} did not answer steadily for {steady:?} within 60 s before the kill");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let killed_at = Instant::now();
    c.vms
        .get_mut(&holder)
        .context("holder not running")?
        .kill()?;
    client
        .wait_success_after(killed_at, Duration::from_secs(60))
        .with_context(|| format!("{url} never answered again after {holder} died"))?;
    std::thread::sleep(settle);
    let samples: Vec<_> = client
        .finish()
        .into_iter()
        .filter(|s| s.sent >= since)
        .collect();
    let outage = probe::outage(&samples, killed_at);
    let new_holder = c.wait_holder(vip, Duration::from_secs(10), |h| h != holder)?;
    let sole = c.sole_holder(vip, Duration::from_secs(10))?;
    ensure!(sole != holder, "{vip} still answered by the dead {holder}");
    ensure!(
        outage.failures_before == 0,
        "{} requests failed before {holder} was killed",
        outage.failures_before
    );
    Ok((holder, new_holder, outage))
}

/// 5. Failover: the API VIP's holder dies (`quit`, no goodbye); a client loop through the VIP
///    fails only in a window after the kill. Then the same for the ingress VIP on the workers.
///
/// Returns the killed master and what was measured.
pub fn failover(c: &mut Cluster) -> Result<(String, String)> {
    // The API: the new holder's proxy still has the dead master as a backend until its
    // checks fail (3 x 5 s), and a connect to it times out; count that window too.
    let (api_dead, api_new, api) = kill_holder(
        c,
        API_VIP,
        &format!("https://{API_VIP}:6443/readyz"),
        "master-",
        Duration::from_secs(25),
    )?;
    let api_back = api.first_success.context("API never answered")?;
    let api_last = api.last_failure.unwrap_or_default();
    ensure!(
        api_back <= Duration::from_secs(10),
        "the API VIP answered again only after {}",
        secs(api_back)
    );
    ensure!(
        api_last <= Duration::from_secs(25),
        "requests through the API VIP still failed {} after the kill",
        secs(api_last)
    );
    // Ingress: the router stand-in on the workers, straight to the VIP holder.
    let (ing_dead, ing_new, ing) = kill_holder(
        c,
        INGRESS_VIP,
        &format!("http://{INGRESS_VIP}:1936/healthz/ready"),
        "worker-",
        Duration::from_secs(5),
    )?;
    let ing_back = ing.first_success.context("ingress never answered")?;
    let ing_last = ing.last_failure.unwrap_or_default();
    ensure!(
        ing_back <= Duration::from_secs(10) && ing_last <= ing_back + Duration::from_secs(1),
        "ingress VIP: back after {}, last failure at {}",
        secs(ing_back),
        secs(ing_last)
    );
    Ok((
        api_dead.clone(),
        format!(
            "API: {api_dead} killed, {API_VIP} answered again after {} (now {api_new}), {} of {} requests failed, the last {} after the kill, {} after it answered again; \
             ingress: {ing_dead} killed, {INGRESS_VIP} answered again after {} (now {ing_new}), {} of {} requests failed",
            secs(api_back),
            api.failures_after,
            api.requests_after,
            secs(api_last),
            api.failures_after_back,
            secs(ing_back),
            ing.failures_after,
            ing.requests_after
        ),
    ))
}

/// 6. Rejoin: the killed master boots again, the others' DNS learns it again (members), and
///    the API proxy sends it requests again.
pub fn rejoin(c: &mut Cluster, master: &str) -> Result<String> {
    let start = Instant::now();
    c.boot(master)?;
    c.wait_ready(&[master.to_owned()], BOOT_TIMEOUT)?;
    let ready = start.elapsed();
    let other = names(c, "master")
        .into_iter()
        .find(|m| m != master && c.vms.contains_key(m))
        .context("no other master running")?;
    let server = c.node(&other)?.address.to_string();
    let want = vec![c.node(master)?.address.to_string()];
    let name = format!("{master}.{ZONE}");
    let mut dns_at = None;
    let mut api_at = None;
    while start.elapsed() < Duration::from_secs(180) && (dns_at.is_none() || api_at.is_none()) {
        if dns_at.is_none() && probe::dig(&c.netns, &server, &name, "A").records == want {
            dns_at = Some(start.elapsed());
        }
        if api_at.is_none() && api_node(c).as_deref() == Some(master) {
            api_at = Some(start.elapsed());
        }
    }
    let dns_at = dns_at.with_context(|| format!("{other}'s DNS never answered {name}"))?;
    let api_at = api_at.with_context(|| format!("the API VIP never sent a request to {master}"))?;
    // The node that came back took nothing it should not have.
    c.sole_holder(API_VIP, Duration::from_secs(10))?;
    c.sole_holder(INGRESS_VIP, Duration::from_secs(10))?;
    Ok(format!(
        "{master} ready in {}; in {other}'s DNS at {}; serving through the API VIP at {}",
        secs(ready),
        secs(dns_at),
        secs(api_at)
    ))
}
