//! The scenarios only a real OpenStack can run (docs/openstack.md): what Nova's consoles
//! and metadata say about each node's boot, and Neutron's port security breaking a VIP in
//! the two ways it does, with what keelson says and does about it.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::{
    API_FIP, CLUSTER, EXTERNAL_NETWORK, HOST_PUBLIC, INGRESS_FIP, OTHER_CLUSTER, OpenStackCluster,
    SPARE_FIP, as_list, parallel, tag, tail,
};
use crate::cluster::{API_VIP, INGRESS_VIP, MetadataSource};
use crate::netns::HarnessNetns;
use crate::probe;
use crate::report::secs;
use crate::testbed::Testbed;

/// Seconds since the epoch of an RFC 3339 / ISO 8601 time (`date -d`).
fn epoch(time: &str) -> Result<f64> {
    let out = Command::new("date")
        .args(["-u", "-d", time, "+%s.%N"])
        .output()
        .context("running date")?;
    ensure!(out.status.success(), "date -d {time:?} failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// When the node's agent said it was ready, in seconds since the epoch: the timestamp of
/// the appliance's log line, or the stand-in's journal entry.
fn ready_at(c: &OpenStackCluster, name: &str) -> Result<f64> {
    if c.is_standin(name) {
        let g = c
            .guest(name)
            .with_context(|| format!("{name}: no guest agent"))?;
        let journal = g.output(
            &[
                "journalctl",
                "--no-pager",
                "-q",
                "-o",
                "short-unix",
                "-b",
                "-t",
                "keelson-agent",
            ],
            Duration::from_secs(30),
        )?;
        let line = journal
            .lines()
            .find(|l| l.contains("keelson-agent ready:"))
            .with_context(|| format!("{name}: no ready entry in the agent's journal"))?;
        return Ok(line.split_whitespace().next().unwrap_or("").parse()?);
    }
    let console = c.console_text(name);
    let line = console
        .lines()
        .find(|l| l.contains("INFO keelson-agent ready:"))
        .with_context(|| format!("{name}: no timed ready line on the console"))?;
    epoch(line.split_whitespace().next().unwrap_or(""))
}

/// 1b. The boot as Nova shows it: each of `nodes`' ready line in `openstack console log
///     show`, its metadata from where the script asked (a config drive Nova wrote, or
///     Nova's metadata service through Neutron's proxy), and the time from `server create`
///     to the agent's ready line. The workers are checked after the pivot (4a): until the
///     masters serve `/config/worker`, the bootstrap answers it 500 and they keep asking,
///     as OpenShift's machine-config-server makes them.
pub fn cloud(c: &OpenStackCluster, nodes: &[&str]) -> Result<String> {
    let mut lines = Vec::new();
    for node in c.plan().to_vec() {
        if !nodes.contains(&node.name.as_str()) || !c.is_running(&node.name) {
            continue;
        }
        let log = c.console_log_show(&node.name)?;
        ensure!(
            log.contains("keelson-agent ready:"),
            "{}: `openstack console log show` has no ready line",
            node.name
        );
        let drive = matches!(node.source, MetadataSource::ConfigDrive(_));
        let from = if c.is_standin(&node.name) {
            // Upstream Ignition read the user_data: from the drive Nova wrote, or over HTTP.
            let g = c.guest(&node.name).context("no guest agent")?;
            let ignition = g.output(
                &["journalctl", "--no-pager", "-q", "-t", "ignition"],
                Duration::from_secs(30),
            )?;
            // Upstream Ignition's OpenStack provider races the config drive against the
            // metadata service and takes the first to answer, so a node with a drive also
            // asks the service until the drive is read. Which one won: a drive read shows
            // as its mount op finished (a mount cut short by the service's answer fails).
            let drive_read = ignition.contains("[finished] mounting config drive");
            let asked_service =
                ignition.contains("GET http://169.254.169.254/openstack/latest/user_data");
            ensure!(
                drive_read == drive && (drive || asked_service),
                "{}: Ignition {}, expected the {}:\n{ignition}",
                node.name,
                if drive_read {
                    "read a config drive"
                } else if asked_service {
                    "read no config drive (it asked the metadata service)"
                } else {
                    "read neither the config drive nor the metadata service"
                },
                if drive {
                    "config drive"
                } else {
                    "metadata service"
                }
            );
            if drive_read {
                " read by Ignition".to_owned()
            } else {
                " from http://169.254.169.254, by Ignition".to_owned()
            }
        } else {
            let said = log
                .lines()
                .find_map(|l| l.split("metadata from ").nth(1))
                .with_context(|| format!("{}: no `metadata from` line", node.name))?;
            // The metadata service: over IPv4 once leased (what the agent asks first), or
            // its IPv6 address on the link (Nova serves both; a slow lease makes it the one).
            let wanted: &[&str] = if drive {
                &["config-drive:"]
            } else {
                &["http://169.254.169.254", "http://[fe80::a9fe:a9fe%"]
            };
            ensure!(
                wanted.iter().any(|w| said.starts_with(w)),
                "{}: metadata from {said}, expected {}",
                node.name,
                wanted.join(" or ")
            );
            let url = said.split_whitespace().next().unwrap_or(said);
            format!(" from {}", url.trim_end_matches(':'))
        };
        // The hosted bootstrap fetched its config from Glance's public endpoint, with the
        // token of the pointer (a 401 would have stopped it there).
        let hosted = if node.role == "bootstrap" && c.deployment.hosted_bootstrap {
            let line = c
                .console_text(&node.name)
                .lines()
                .find(|l| l.contains("fetching config http://") && l.contains("/v2/images/"))
                .map(str::to_owned)
                .with_context(|| {
                    format!(
                        "{}: no `fetching config http://.../v2/images/<id>/file` line: the hosted config was not fetched",
                        node.name
                    )
                })?;
            let url = line.split("fetching config ").nth(1).unwrap_or("").trim();
            format!(", its config hosted in Glance ({url})")
        } else {
            String::new()
        };
        let created = c.show_field(&node.name, "created")?;
        let ready = ready_at(c, &node.name)? - epoch(&created)?;
        lines.push(format!(
            "{} ({}, {}{from}{hosted}) ready {ready:.0} s after create",
            node.name,
            node.image.as_str(),
            if drive {
                "config drive"
            } else {
                "metadata service"
            }
        ));
    }
    Ok(lines.join("; "))
}

/// The value of `name{labels}` in a node's `/metrics`, read from outside.
fn metric(c: &OpenStackCluster, node: &str, series: &str) -> Option<f64> {
    let addr = c.node(node).ok()?.address;
    let text = probe::curl(
        c.outside().netns,
        &format!("http://{addr}:22625/metrics"),
        Duration::from_secs(3),
    )?;
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

fn problem_series(problem: &str) -> String {
    format!("keelson_vrrp_port_security_problem{{vrrp_instance=\"api\",problem=\"{problem}\"}}")
}

/// Waits until `node`'s `/metrics` shows `series` at `want`; returns how long it took.
fn wait_metric(
    c: &OpenStackCluster,
    node: &str,
    series: &str,
    want: f64,
    timeout: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        last = metric(c, node, series);
        if last == Some(want) {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    bail!("{node}: {series} is {last:?} after {timeout:?}, expected {want}")
}

/// The running nodes that take part in the API VIP (bootstrap and masters).
fn api_nodes(c: &OpenStackCluster) -> Vec<String> {
    c.plan()
        .iter()
        .filter(|n| n.role != "worker" && c.is_running(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// P1. The VIP is not an allowed address pair of its holder's port (`openstack port set
///     --no-allowed-address`): the holder sees that traffic from the VIP does not leave its
///     port, says so (log, `/metrics`) naming the fix, and steps down, so that a node whose
///     port passes the VIP serves it; the pairs restored, nothing moves back and forth.
pub fn vip_not_allowed(c: &mut OpenStackCluster) -> Result<String> {
    let holder = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    let port = c.port_id(&holder)?;
    let t0 = Instant::now();
    c.client
        .run(&["port", "set", "--no-allowed-address", &port])?;
    let series = problem_series("vip_not_allowed");
    let found = wait_metric(c, &holder, &series, 1.0, Duration::from_secs(90))?;
    let console = c.console_text(&holder);
    let fix = format!("openstack port set --allowed-address ip-address={API_VIP}");
    ensure!(
        console
            .lines()
            .any(|l| l.contains("does not leave this node's port") && l.contains(&fix)),
        "{holder}: no log line naming the fix `{fix} ...`"
    );
    let others: Vec<String> = api_nodes(c).into_iter().filter(|n| *n != holder).collect();
    let mut moved = String::from("no other node takes part: the VIP stays dark, reported");
    if !others.is_empty() {
        let new = c.wait_holder(API_VIP, Duration::from_secs(60), &|h| h != holder)?;
        let back = t0.elapsed();
        let served = (0..30).find_map(|_| {
            let s = probe::http_status(
                c.outside().netns,
                &format!("https://{API_VIP}:22623/healthz"),
                Duration::from_secs(2),
                &[],
            );
            if s == 200 {
                Some(())
            } else {
                std::thread::sleep(Duration::from_secs(1));
                None
            }
        });
        ensure!(
            served.is_some(),
            "{API_VIP}:22623 does not answer through {new}"
        );
        moved = format!(
            "{API_VIP} moved to {new} and answered {} after the change",
            secs(back)
        );
    }
    c.client.run(&[
        "port",
        "set",
        "--allowed-address",
        &format!("ip-address={API_VIP}"),
        "--allowed-address",
        &format!("ip-address={INGRESS_VIP}"),
        &port,
    ])?;
    let settled = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    if !others.is_empty() {
        ensure!(
            settled != holder,
            "{API_VIP} went back to {holder}, whose port was seen dropping it"
        );
    }
    Ok(format!(
        "{holder}'s port without the pair: found in {}, log names `{fix} ...`; {moved}; pairs restored, {API_VIP} stays on {settled}",
        secs(found)
    ))
}

/// How long P2 keeps watching for a second holder after every backup found the blocked
/// adverts: 6 more Master_Down intervals (~3.1 s each at the cluster's 1 s adverts).
const VRRP_BLOCKED_OBSERVE: Duration = Duration::from_secs(20);

/// P2. The security group without IP protocol 112: adverts stop arriving at the backups.
///     Each backup sees the holder answer ARP for the VIP while no advert comes, holds its
///     claim (one holder throughout: no split brain) and says the group lacks protocol 112;
///     the rule restored, adverts arrive and the finding clears.
pub fn vrrp_blocked(c: &mut OpenStackCluster) -> Result<String> {
    let holder = c.sole_holder(API_VIP, Duration::from_secs(30))?;
    let backups: Vec<String> = api_nodes(c).into_iter().filter(|n| *n != holder).collect();
    ensure!(!backups.is_empty(), "no backup of the API VIP is running");
    let rules = c.client.json(&[
        "security",
        "group",
        "rule",
        "list",
        CLUSTER,
        "--protocol",
        "112",
        "-c",
        "ID",
    ])?;
    let ids: Vec<String> = rules
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["ID"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        !ids.is_empty(),
        "security group {CLUSTER} has no protocol 112 rule"
    );
    for id in &ids {
        c.client.run(&["security", "group", "rule", "delete", id])?;
    }
    let series = problem_series("vrrp_blocked");
    let start = Instant::now();
    let mut found = Vec::new();
    let mut checks = 0;
    // Never a second holder, and every backup finds the problem: watched until all have
    // found it (within a minute; the finding takes 3 Master_Down intervals without an
    // advert, ~10 s at the cluster's 1 s adverts) and VRRP_BLOCKED_OBSERVE beyond. A backup
    // decides whether to hold its claim at each Master_Down (~3 s): the watch covers the
    // first decisions (the claim of 2026-11-25 came at the first) and six after the
    // finding. (It was a fixed minute, ~46 s of it after the finding.)
    let mut all_found: Option<Instant> = None;
    loop {
        match all_found {
            Some(t) if t.elapsed() >= VRRP_BLOCKED_OBSERVE => break,
            None if start.elapsed() >= Duration::from_secs(60) => break,
            _ => {}
        }
        let holders = c.holders_of(API_VIP)?;
        ensure!(
            holders == [holder.clone()],
            "{API_VIP} answered by {holders:?} {} after protocol 112 was blocked, expected {holder} alone",
            secs(start.elapsed())
        );
        checks += 1;
        for b in &backups {
            if !found.iter().any(|(n, _): &(String, Duration)| n == b)
                && metric(c, b, &series) == Some(1.0)
            {
                found.push((b.clone(), start.elapsed()));
            }
        }
        if all_found.is_none() && found.len() == backups.len() {
            all_found = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let blocked = start.elapsed();
    for b in &backups {
        ensure!(
            found.iter().any(|(n, _)| n == b),
            "{b}: {series} never became 1 with protocol 112 blocked"
        );
        ensure!(
            c.console_text(b)
                .lines()
                .any(|l| l.contains("no VRRP advert has arrived") && l.contains("--protocol 112")),
            "{b}: no log line saying adverts do not arrive and naming the fix"
        );
    }
    // Back as the create script made it: from the machine network only.
    c.client.run(&[
        "security",
        "group",
        "rule",
        "create",
        "--protocol",
        "112",
        "--remote-ip",
        &machine_cidr(c)?,
        CLUSTER,
    ])?;
    let mut cleared = Vec::new();
    for b in &backups {
        let t = wait_metric(c, b, &series, 0.0, Duration::from_secs(60))?;
        cleared.push(format!("{b} {}", secs(t)));
    }
    let sole = c.sole_holder(API_VIP, Duration::from_secs(10))?;
    ensure!(
        sole == holder,
        "{API_VIP} moved to {sole} after the rule came back"
    );
    Ok(format!(
        "protocol 112 blocked for {}: {holder} the only holder in {checks} ARP checks; found by {}; rule restored, cleared on {}",
        secs(blocked),
        found
            .iter()
            .map(|(n, t)| format!("{n} in {}", secs(*t)))
            .collect::<Vec<_>>()
            .join(", "),
        cleared.join(", ")
    ))
}

/// H. Heat: `keelson build`'s `openstack.yaml` passes Heat's own validator (heat-engine
///    parses it, resolves every resource type and intrinsic function and checks the
///    parameters), and `openstack stack create --dry-run` previews the whole stack against
///    this cloud, with the images and flavors the run uploaded and made: heat-engine builds
///    every resource and checks its properties and their constraints (the image and the
///    flavor exist in Glance and Nova) without creating any. The run creates the cluster
///    with the README's script, not the stack: a second boot of every node under TCG would
///    double its time.
pub fn heat_template(c: &OpenStackCluster) -> Result<String> {
    let template = c.out.join("openstack.yaml");
    let template = template.to_str().context("the template's path")?;
    let v = c
        .client
        .json(&["orchestration", "template", "validate", "-t", template])?;
    let params = v["Parameters"]
        .as_object()
        .context("Heat's validator answered without Parameters")?;
    for p in ["keelson_image", "rhcos_image", "master_flavor"] {
        ensure!(
            params.contains_key(p),
            "Heat's validator does not list the parameter {p}: {v}"
        );
    }
    // The parameters as the script's environment for this run sets them (its defaults
    // where it sets none).
    let env: std::collections::BTreeMap<&str, String> = c.script_env().into_iter().collect();
    let pick = |key: &str, default: &str| env.get(key).cloned().unwrap_or(default.to_owned());
    // The images as the script named them ("appliance": the cluster's appliance image).
    let image = |name: String| match name.as_str() {
        "appliance" => format!("{CLUSTER}-keelson"),
        _ => name,
    };
    let rhcos = if env.contains_key("RHCOS_QCOW2") {
        format!("{CLUSTER}-rhcos")
    } else {
        image(pick("RHCOS_IMAGE", "rhcos"))
    };
    let fip_id = |a: &str| c.floating_ips.get(a).cloned().unwrap_or_default();
    let values = [
        ("keelson_image", format!("{CLUSTER}-keelson")),
        ("rhcos_image", rhcos.clone()),
        ("worker_image", image(pick("WORKER_IMAGE", &rhcos))),
        ("bootstrap_flavor", pick("FLAVOR", "m1.small")),
        ("master_flavor", pick("MASTER_FLAVOR", "m1.xlarge")),
        ("worker_flavor", pick("WORKER_FLAVOR", "m1.large")),
        ("external_network", EXTERNAL_NETWORK.to_owned()),
        ("api_floating_ip_id", fip_id(API_FIP)),
        ("ingress_floating_ip_id", fip_id(INGRESS_FIP)),
        ("status_source", pick("STATUS_SOURCE", "0.0.0.0/0")),
    ];
    let mut args = vec![
        "stack".to_owned(),
        "create".to_owned(),
        "--dry-run".to_owned(),
        "-t".to_owned(),
        template.to_owned(),
    ];
    for (k, v) in &values {
        args.push("--parameter".to_owned());
        args.push(format!("{k}={v}"));
    }
    // The hosted bootstrap's pointer, as the template takes it.
    let pointer = c.out.join("bootstrap.pointer.ign");
    let hosted = pointer.exists();
    if hosted {
        args.push("--parameter-file".to_owned());
        // Absolute: the client reads a relative parameter file from the template's directory.
        let pointer = std::path::absolute(&pointer)?;
        args.push(format!("bootstrap_user_data={}", pointer.display()));
    }
    args.push(format!("{CLUSTER}-preview"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let preview = c.client.json(&args)?;
    // Some versions of the client print the list as a JSON string inside the JSON.
    let listed = match &preview["resources"] {
        serde_json::Value::String(text) => serde_json::from_str(text)?,
        other => other.clone(),
    };
    let resources = listed
        .as_array()
        .with_context(|| format!("the stack preview lists no resources: {preview}"))?;
    let servers: Vec<&str> = resources
        .iter()
        .filter(|r| r["resource_type"] == "OS::Nova::Server")
        .filter_map(|r| r["resource_name"].as_str())
        .collect();
    let in_template = std::fs::read_to_string(template)?
        .matches("type: OS::Nova::Server")
        .count();
    ensure!(
        servers.len() == in_template,
        "the stack preview has {} servers ({servers:?}), the template {in_template}",
        servers.len()
    );
    for wanted in [
        "router",
        "api_floating_ip",
        "ingress_floating_ip",
        "api_vip_port",
    ] {
        ensure!(
            resources.iter().any(|r| r["resource_name"] == wanted),
            "the stack preview has no {wanted} (the external network and floating IPs given)"
        );
    }
    Ok(format!(
        "Heat's validator accepts openstack.yaml ({} parameters); `stack create --dry-run` with this run's images, flavors, external network and floating IPs{} previews {} resources, {} servers ({})",
        params.len(),
        if hosted {
            " and the hosted bootstrap's pointer"
        } else {
            ""
        },
        resources.len(),
        servers.len(),
        servers.join(", ")
    ))
}

/// The machine network, as cluster.json says.
fn machine_cidr(c: &OpenStackCluster) -> Result<String> {
    let path = c.out.join("cluster.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    v["machineNetworks"][0]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{}: machineNetworks", path.display()))
}

/// Every kind of resource the create script makes, as `openstack` lists it by tag.
const TAGGED_KINDS: [&str; 7] = [
    "servers",
    "ports",
    "networks",
    "subnets",
    "routers",
    "security groups",
    "images",
];

/// The IDs of what carries cluster `name`'s tag, by kind (of `kinds`); listed at once.
fn tagged(
    c: &OpenStackCluster,
    name: &str,
    kinds: &[&str],
) -> Result<Vec<(&'static str, Vec<String>)>> {
    let t = tag(name);
    let mut all: Vec<(&'static str, Vec<&str>)> = vec![
        (
            "servers",
            vec![
                "--os-compute-api-version",
                "2.26",
                "server",
                "list",
                "--tags",
            ],
        ),
        ("ports", vec!["port", "list", "--tags"]),
        ("networks", vec!["network", "list", "--tags"]),
        ("subnets", vec!["subnet", "list", "--tags"]),
        ("routers", vec!["router", "list", "--tags"]),
        (
            "security groups",
            vec!["security", "group", "list", "--tags"],
        ),
        ("images", vec!["image", "list", "--tag"]),
    ];
    all.retain(|(k, _)| kinds.contains(k));
    let jobs = all
        .into_iter()
        .map(|(kind, args)| {
            let t = t.clone();
            Box::new(move || -> Result<(&'static str, Vec<String>)> {
                let mut args = args;
                args.push(t.as_str());
                let mut ids: Vec<String> = as_list(c.client.json(&args)?)
                    .into_iter()
                    .filter_map(|v| v["ID"].as_str().map(str::to_owned))
                    .collect();
                ids.sort();
                Ok((kind, ids))
            }) as Box<dyn FnOnce() -> Result<(&'static str, Vec<String>)> + Send + '_>
        })
        .collect();
    parallel(jobs)
}

/// R. `create-cluster.sh` a second time, as it is: it looks every resource up, changes
///    nothing and says so; every resource tagged with the cluster is the same after as
///    before.
pub fn rerun(c: &mut OpenStackCluster) -> Result<String> {
    // What a second run would make again if it did not look first (network and security
    // group names are checked by the script itself, and a duplicate would stop it).
    let kinds = ["servers", "ports", "images"];
    let before = tagged(c, CLUSTER, &kinds)?;
    let run = c.script("create-cluster.sh", "create-cluster-rerun", &[])?;
    ensure!(
        run.success,
        "the second run failed:\n{}",
        tail(&run.log, 20)
    );
    let said = run.said();
    let created: Vec<&&str> = said.iter().filter(|l| l.contains(" created ")).collect();
    ensure!(
        created.is_empty(),
        "the second run made something: {created:?}"
    );
    let summary = said
        .iter()
        .find(|l| l.contains("nothing changed"))
        .with_context(|| {
            format!(
                "the second run did not say nothing changed:\n{}",
                said.join("\n")
            )
        })?;
    let after = tagged(c, CLUSTER, &kinds)?;
    ensure!(
        before == after,
        "the resources tagged {} changed: before {before:?}, after {after:?}",
        tag(CLUSTER)
    );
    let count: usize = after.iter().map(|(_, ids)| ids.len()).sum();
    c.timings.insert("create-cluster.sh again", run.took);
    Ok(format!(
        "{} ({count} servers, ports and images tagged {}, the same IDs before and after) in {}",
        summary.trim_start_matches("create-cluster: "),
        tag(CLUSTER),
        secs(run.took)
    ))
}

/// Whether a TCP connection to `addr:port` from namespace `ns` is answered (connected or
/// refused: a node's kernel answered) or not (dropped on the way: a security group).
fn reached(ns: &crate::netns::Netns, addr: &str, port: u16) -> Result<bool> {
    let out = ns
        .command("bash")
        .args([
            "-c",
            &format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>&1; echo \"exit $?\""),
        ])
        .output()
        .context("running bash in the namespace")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // 0: connected; 1 with "refused": a node answered RST; 124: the timeout, nothing came.
    Ok(text.contains("exit 0") || text.contains("refused"))
}

/// F. The cluster from the world: the floating IPs from the external network's gateway
///    namespace. The API's (6443, open to anywhere) reaches the API VIP's holder and answers
///    through the proxy; the ports the machine network alone may reach (Ignition 22623, DNS
///    53, /metrics 22625, the proxy's 9445, the router's stats 1936) and the status port (the
///    host's address alone) are dropped on the way to that same holder, which would answer
///    or refuse each if it came; where a node holds the ingress VIP (workers run), its
///    floating IP's 80 and 443 (anywhere) reach it. The create script printed the DNS
///    records to publish.
pub fn floating(c: &OpenStackCluster) -> Result<String> {
    let ns = &c.external;
    let ready = probe::curl(
        ns,
        &format!("https://{API_FIP}:6443/readyz"),
        Duration::from_secs(5),
    )
    .with_context(|| {
        format!(
            "https://{API_FIP}:6443/readyz did not answer from {}",
            ns.name()
        )
    })?;
    let mut open = vec![format!("{API_FIP}:6443 answered {:?}", ready.trim())];
    match c.holder_of(INGRESS_VIP)? {
        Some(holder) => {
            for port in [80, 443] {
                ensure!(
                    reached(ns, INGRESS_FIP, port)?,
                    "{INGRESS_FIP}:{port} (ingress, open to anywhere) does not reach {holder}, which holds {INGRESS_VIP}"
                );
                open.push(format!("{INGRESS_FIP}:{port} reached {holder}"));
            }
        }
        None => open.push(format!(
            "{INGRESS_VIP} held by no node here (no workers): {INGRESS_FIP} not probed"
        )),
    }
    // Each dropped port costs the probe's timeout: all at once.
    let dropped = [
        22623,
        53,
        22625,
        9445,
        1936,
        keelson_cluster::operator::PORT,
    ];
    let probes = dropped
        .iter()
        .map(|&port| {
            Box::new(move || reached(ns, API_FIP, port))
                as Box<dyn FnOnce() -> Result<bool> + Send + '_>
        })
        .collect();
    let mut closed = Vec::new();
    for (port, got) in dropped.iter().zip(parallel(probes)?) {
        ensure!(
            !got,
            "{API_FIP}:{port} is reached from the external network: the security group should pass it from the machine network (or the status source) only"
        );
        closed.push(format!("{port}"));
    }
    let log = std::fs::read_to_string(c.work.join("create-cluster.log")).unwrap_or_default();
    for record in [
        format!("api.ocp4.osd2019.local.     A  {API_FIP}"),
        format!("*.apps.ocp4.osd2019.local.  A  {INGRESS_FIP}"),
    ] {
        ensure!(
            log.contains(&record),
            "create-cluster.sh did not print the DNS record {record:?}"
        );
    }
    Ok(format!(
        "from {}: {}; dropped on the way to the API VIP's holder: {} (the machine network's; the status port the host's); the script printed api. and *.apps. records for the floating IPs",
        ns.name(),
        open.join(", "),
        closed.join(", ")
    ))
}

/// S. `keelson status --cluster out/` on the host, through the API's floating IP (the
///    default): answered by the API VIP's holder, every running node listed with its role
///    and agent version, each VIP's holder the one ARP shows; the table printed. From the
///    external gateway's namespace (not the status source) it gets no answer.
pub fn status(c: &mut OpenStackCluster) -> Result<String> {
    let keelson = crate::payload::env_path("KEELSON_BIN", "target/debug/keelson");
    let run = |json: bool| -> Result<(bool, String, String, Duration)> {
        let mut cmd = Command::new(&keelson);
        cmd.args(["status", "--cluster"]).arg(&c.out);
        if json {
            cmd.arg("--json");
        }
        let t = Instant::now();
        let out = cmd.output().context("running keelson status")?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            t.elapsed(),
        ))
    };
    let (ok, json, err, took) = run(true)?;
    ensure!(ok, "keelson status --json failed: {err}");
    let report: keelson_cluster::operator::ClusterReport =
        serde_json::from_str(&json).context("keelson status --json")?;
    let holder = c.sole_holder(crate::cluster::API_VIP, Duration::from_secs(30))?;
    ensure!(
        report.answered_by == holder,
        "answered by {}, but {holder} holds the API VIP the floating IP leads to",
        report.answered_by
    );
    let running: Vec<String> = c
        .plan()
        .iter()
        .filter(|n| c.is_running(&n.name))
        .map(|n| n.name.clone())
        .collect();
    let listed: Vec<String> = report.nodes.iter().map(|n| n.name.clone()).collect();
    for name in &running {
        ensure!(
            listed.contains(name),
            "{name} is not in the report: {listed:?}"
        );
    }
    for n in &report.nodes {
        let st = n
            .status
            .as_ref()
            .with_context(|| format!("{}: no status ({:?})", n.name, n.error))?;
        let role = c.node(&n.name).map(|p| p.role).unwrap_or("?");
        ensure!(
            st["node"]["role"] == role,
            "{}: role {} in the report, {role} in the plan",
            n.name,
            st["node"]["role"]
        );
        ensure!(
            st["build"]["version"].is_string(),
            "{}: no agent version",
            n.name
        );
        // The API VIP's holder by the report is the one ARP shows.
        let holds = st["vrrp"].as_array().is_some_and(|v| {
            v.iter()
                .any(|i| i["name"] == "api" && i["state"] == "master")
        });
        ensure!(
            holds == (n.name == holder),
            "{}: the report says it {} the API VIP; ARP shows {holder}",
            n.name,
            if holds { "holds" } else { "does not hold" }
        );
    }
    let (ok, table, err, _) = run(false)?;
    ensure!(ok, "keelson status failed: {err}");
    eprintln!("openstack-cluster: keelson status --cluster out/ (through {API_FIP}):\n{table}");
    // Not the status source: nothing answers (the security group), whatever certificate.
    let refused = c
        .external
        .exec(&keelson)
        .args(["status", "--timeout", "5", "--cluster"])
        .arg(&c.out)
        .output()?;
    ensure!(
        !refused.status.success(),
        "keelson status answered from {} too, which is not the status source",
        c.external.name()
    );
    c.timings.insert("keelson status", took);
    Ok(format!(
        "from the host ({HOST_PUBLIC}) through {API_FIP}: answered by {} (the API VIP's holder) in {}, {} members with role, version and readiness; the table's VIP line: {}; from {} (not the status source) no answer",
        report.answered_by,
        secs(took),
        report.nodes.len(),
        table
            .lines()
            .find(|l| l.starts_with("api "))
            .unwrap_or("?")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        c.external.name()
    ))
}

/// B. Bad input stops the create script with what to do, before anything changes: a
///    cluster name another cluster's resources carry, an external network that does not
///    exist, a floating IP attached elsewhere (the spare one, on the bootstrap's port). The
///    three run at once; afterwards the other cluster still has its one network and nothing
///    else, and the spare floating IP is attached where it was.
pub fn bad_input(c: &mut OpenStackCluster) -> Result<String> {
    let bootstrap_port = c.port_id("bootstrap")?;
    c.client.run(&[
        "floating",
        "ip",
        "set",
        "--port",
        &bootstrap_port,
        SPARE_FIP,
    ])?;
    // (name, the environment it runs the script with, what its refusal must say)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "collision",
            vec![("CLUSTER", OTHER_CLUSTER.to_owned())],
            "belongs to another cluster named ocp4-other",
        ),
        (
            "external",
            vec![("EXTERNAL_NETWORK", "no-such-network".to_owned())],
            "external network no-such-network: not found",
        ),
        (
            "fip",
            vec![("API_FLOATING_IP", SPARE_FIP.to_owned())],
            "floating IP 172.24.4.52 is in use",
        ),
    ];
    let cr = &*c;
    let jobs = cases
        .iter()
        .map(|(name, env, _)| {
            Box::new(move || {
                cr.script(
                    "create-cluster.sh",
                    &format!("create-cluster-bad-{name}"),
                    env,
                )
            }) as Box<dyn FnOnce() -> Result<super::ScriptRun> + Send + '_>
        })
        .collect();
    let runs = parallel(jobs)?;
    let mut said = Vec::new();
    for ((name, _, expected), run) in cases.iter().zip(&runs) {
        ensure!(!run.success, "{name}: create-cluster.sh did not stop");
        let lines = run.said();
        let line = lines
            .iter()
            .find(|l| l.contains(expected))
            .with_context(|| format!("{name}: no line with {expected:?}:\n{}", lines.join("\n")))?;
        ensure!(
            run.log.contains("nothing was changed") && !run.log.contains(" created "),
            "{name}: something was made:\n{}",
            lines.join("\n")
        );
        said.push(format!(
            "{name}: {}",
            line.trim_start_matches("create-cluster: ")
        ));
    }
    let other = tagged(c, OTHER_CLUSTER, &TAGGED_KINDS)?;
    let count = |kind: &str| {
        other
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, v)| v.len())
    };
    ensure!(
        count("networks") == 1
            && count("subnets") == 0
            && count("ports") == 0
            && count("servers") == 0,
        "the other cluster's resources changed: {other:?}"
    );
    Ok(format!(
        "each stopped before any change ({}): {}",
        secs(runs.iter().map(|r| r.took).max().unwrap_or_default()),
        said.join("; ")
    ))
}

/// D. `delete-cluster.sh`: afterwards nothing carries the cluster's tag (servers, ports,
///    networks, subnets, routers, security groups, images), the other cluster in the project
///    is untouched, and a second run finds nothing to delete; then the other cluster goes
///    the same way.
pub fn delete(c: &mut OpenStackCluster) -> Result<String> {
    let run = c.delete_cluster(CLUSTER)?;
    c.forget_servers();
    c.timings.insert("delete-cluster.sh", run.took);
    let (left, other) = {
        let cr = &*c;
        let both = parallel(vec![
            Box::new(move || tagged(cr, CLUSTER, &TAGGED_KINDS))
                as Box<dyn FnOnce() -> Result<Vec<(&'static str, Vec<String>)>> + Send + '_>,
            Box::new(move || tagged(cr, OTHER_CLUSTER, &TAGGED_KINDS)),
        ])?;
        let mut it = both.into_iter();
        (it.next().unwrap_or_default(), it.next().unwrap_or_default())
    };
    let remaining: Vec<String> = left
        .iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(k, ids)| format!("{k}: {ids:?}"))
        .collect();
    ensure!(
        remaining.is_empty(),
        "left with the tag {}: {}",
        tag(CLUSTER),
        remaining.join("; ")
    );
    let others: usize = other.iter().map(|(_, ids)| ids.len()).sum();
    ensure!(others == 2, "the other cluster lost something: {other:?}");
    let again = c.delete_cluster(CLUSTER)?;
    ensure!(
        again.log.contains("nothing to delete"),
        "the second delete did not say nothing was left:\n{}",
        again.said().join("\n")
    );
    let other_run = c.delete_cluster(OTHER_CLUSTER)?;
    let deleted = run
        .said()
        .iter()
        .find(|l| l.contains("deleted ("))
        .map(|l| l.trim_start_matches("delete-cluster: ").to_owned())
        .unwrap_or_default();
    Ok(format!(
        "{deleted} in {}; nothing left with the tag; {OTHER_CLUSTER}'s network and group untouched; again: nothing to delete ({}); {OTHER_CLUSTER} then deleted ({})",
        secs(run.took),
        secs(again.took),
        secs(other_run.took)
    ))
}
