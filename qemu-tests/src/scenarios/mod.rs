//! The scenarios of `make qemu-cluster` (docs/qemu-cluster.md), in order; each later one
//! builds on the state the earlier ones left. Each returns a one-line detail with what it
//! measured, or an error; the runner prints a table and, for a failure, the consoles of
//! the nodes involved.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::{API_VIP, Cluster, INGRESS_VIP, MetadataSource, Payload, ServiceFault};
use crate::configdrive::NetworkMode;
use crate::probe::{self, ClientLoop};
use crate::report::secs;
use crate::testbed::Testbed;

mod ingress;

pub use ingress::ingress_routers;

/// The cluster zone of `examples/install-config.yaml`.
pub const ZONE: &str = "ocp4.osd2019.local";
/// How long a node may take from QEMU start to its ready line under TCG with six VMs on a
/// small host.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
/// The same for an RHCOS stand-in: Ignition in the initramfs, then a systemd root (about
/// twice an appliance's boot under TCG, and far more on a loaded host).
pub const STANDIN_BOOT_TIMEOUT: Duration = Duration::from_secs(600);
const ACCEPT_32: &str = "Accept: application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1";

fn names(c: &dyn Testbed, role: &str) -> Vec<String> {
    c.names(role)
}

/// The configs a node of `role` fetches through the API VIP: keelson's from keelson's server
/// and, beside OpenShift, OpenShift's from the machine-config-server first (as the pointer
/// lists them).
fn config_urls(c: &dyn Testbed, role: &str) -> Vec<String> {
    let payload = c.payload();
    let keelson = format!(
        "https://{API_VIP}:{}/config/{role}",
        payload.keelson_ignition_port()
    );
    match payload {
        Payload::Keelson => vec![keelson],
        Payload::OpenShift => vec![
            format!("https://api-int.{ZONE}:22623/config/{role}"),
            keelson,
        ],
    }
}

/// How long `nodes` may take to boot: longer when one is a stand-in.
fn boot_timeout(c: &dyn Testbed, nodes: &[String]) -> Duration {
    if nodes.iter().any(|n| c.is_standin(n)) {
        STANDIN_BOOT_TIMEOUT
    } else {
        BOOT_TIMEOUT
    }
}

/// 1. Boot: every node of the control plane reports ready, the bootstrap holds the API VIP,
///    masters fetched their configs from it over :22623, workers are told 500 meanwhile.
pub fn boot(c: &mut dyn Testbed) -> Result<String> {
    let start = Instant::now();
    c.start_all()?;
    // The boot bounds count from the nodes' start, not from the testbed's own set-up before
    // it (on OpenStack the README's script uploads the images first: minutes under load).
    let started = Instant::now();
    let bootstrap = c.wait_ready(&["bootstrap".to_owned()], BOOT_TIMEOUT)?;
    let holder = c.wait_holder(API_VIP, Duration::from_secs(60), &|h| h == "bootstrap")?;
    let vip_at = start.elapsed();
    let masters = names(c, "master");
    c.wait_ready(
        &masters,
        boot_timeout(c, &masters).saturating_sub(started.elapsed()),
    )?;
    let masters_at = start.elapsed();
    let mut standin_notes = Vec::new();
    let urls = config_urls(c, "master");
    for m in &masters {
        if c.is_standin(m) {
            standin_notes.push(standin_first_boot(c, m, &urls)?);
            continue;
        }
        let console = c.console_text(m);
        for url in &urls {
            ensure!(
                console.contains(&format!("fetched config {url}")),
                "{m} did not log fetching {url}"
            );
        }
    }
    // Workers keep asking; the bootstrap answers 500 for the worker pool.
    let port = c.payload().keelson_ignition_port();
    let status = probe::http_status(
        c.outside().netns,
        &format!("https://{API_VIP}:{port}/config/worker"),
        Duration::from_secs(5),
        &["-H", ACCEPT_32],
    );
    ensure!(
        status == 500,
        "the bootstrap answered {status} for /config/worker, expected 500"
    );
    let mut told = Vec::new();
    for w in names(c, "worker") {
        c.wait_console(&w, "config/worker", Duration::from_secs(60))?;
        ensure!(
            !c.console_text(&w).contains("keelson-agent ready:"),
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
    let standin = if standin_notes.is_empty() {
        String::new()
    } else {
        format!("; RHCOS stand-ins: {}", standin_notes.join("; "))
    };
    Ok(format!(
        "{holder} ready in {} and holds {API_VIP} at {} (the only node answering ARP for it once the masters are up); {} masters ready at {} (configs from {}); {} retrying on 500{standin}",
        secs(bootstrap),
        secs(vip_at),
        masters.len(),
        secs(masters_at),
        urls.join(" and "),
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
        // The appliance's agent reads the metadata and says where from; on the RHCOS
        // stand-in Ignition reads user_data (config drive or service) and NetworkManager does
        // DHCP, so the service's own log says who asked it.
        let standin = c.is_standin(&node.name);
        let console = vm.console_text();
        let said = if standin {
            None
        } else {
            Some(
                console
                    .lines()
                    .find_map(|l| l.split("metadata from ").nth(1))
                    .with_context(|| format!("{}: no `metadata from` line", node.name))?,
            )
        };
        let served = service.served_to(node.address);
        let served_user_data = served
            .iter()
            .any(|r| r.path.ends_with("user_data") && r.status == 200);
        let keeps_dhcp = match node.source {
            MetadataSource::ConfigDrive(mode) => {
                if let Some(said) = said {
                    ensure!(
                        said.starts_with("config-drive:"),
                        "{}: metadata from {said}, expected the config drive",
                        node.name
                    );
                }
                ensure!(
                    !served_user_data,
                    "{}: has a config drive but took user_data from the service",
                    node.name
                );
                mode == NetworkMode::Dhcp
            }
            MetadataSource::Service(mode, fault) => {
                if let Some(said) = said {
                    ensure!(
                        said.starts_with("http://169.254.169.254"),
                        "{}: metadata from {said}, expected the metadata service",
                        node.name
                    );
                }
                ensure!(
                    served_user_data,
                    "{}: the service never served it user_data ({served:?})",
                    node.name
                );
                if !standin {
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
                }
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
        lines.push(format!(
            "{} ({}) <- {}",
            node.name,
            node.image.as_str(),
            node.source.describe()
        ));
    }
    Ok(lines.join("; "))
}

/// 7. DHCP renewals: every running node that keeps DHCP renewed its lease (two DHCPACKs or
///    more: the lease is 120 s, T1 60 s) and still holds it.
pub fn renewals(c: &mut Cluster) -> Result<String> {
    let dhcp = c.dhcp.as_ref().context("no DHCP server")?;
    let mut renewed = Vec::new();
    for node in &c.plan {
        let keeps = matches!(
            node.source,
            MetadataSource::ConfigDrive(NetworkMode::Dhcp)
                | MetadataSource::Service(NetworkMode::Dhcp | NetworkMode::Absent, _)
        );
        // A node killed by an earlier scenario (the failover's) renews nothing any more.
        let Some(vm) = c.vms.get_mut(&node.name) else {
            continue;
        };
        if !vm.is_running() {
            continue;
        }
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

/// How long a command inside a node may take.
const GUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn guest(c: &dyn Testbed, name: &str) -> Result<crate::guest::GuestAgent> {
    c.guest(name)
        .with_context(|| format!("{name} has no guest agent"))
}

/// Runs `argv` in `name` and returns its output.
pub fn in_node(c: &dyn Testbed, name: &str, argv: &[&str]) -> Result<String> {
    guest(c, name)?
        .output(argv, GUEST_TIMEOUT)
        .with_context(|| format!("on {name}"))
}

/// The seconds since kernel start of a `journalctl -o short-monotonic` line.
fn monotonic(line: &str) -> Option<f64> {
    let rest = line.trim_start().strip_prefix('[')?;
    rest.split(']').next()?.trim().parse().ok()
}

/// Journal entries of `ident` in `-o short-monotonic` (this boot only with `this_boot`).
fn journal(c: &dyn Testbed, name: &str, ident: &str, this_boot: bool) -> Result<Vec<String>> {
    let mut argv = vec![
        "journalctl",
        "--no-pager",
        "-q",
        "-o",
        "short-monotonic",
        "-t",
        ident,
    ];
    if this_boot {
        argv.push("-b");
    }
    Ok(in_node(c, name, &argv)?
        .lines()
        .filter(|l| monotonic(l).is_some())
        .map(str::to_owned)
        .collect())
}

/// What an RHCOS node's first boot must show: the unmodified Ignition fetched the full
/// configs from `urls` (the pointer's merges, through the API VIP, trusting the pointer's
/// CAs) and finished; NetworkManager, not the agent, owns the NIC; systemd runs the agent
/// as Ignition enabled it. Returns "name: Ignition X s, ready Y s".
pub fn standin_first_boot(c: &dyn Testbed, name: &str, urls: &[String]) -> Result<String> {
    let g = guest(c, name)?;
    g.wait(Duration::from_secs(60))?;
    let log = journal(c, name, "ignition", false)?;
    for url in urls {
        ensure!(
            log.iter()
                .any(|l| l.contains(&format!("fetched referenced config at {url}"))),
            "{name}: Ignition's log has no \"fetched referenced config at {url}\":\n{}",
            log.join("\n")
        );
    }
    let finished = log
        .iter()
        .rev()
        .find(|l| l.contains("Ignition finished successfully"))
        .with_context(|| format!("{name}: Ignition never finished:\n{}", log.join("\n")))?;
    let ignition =
        monotonic(finished).unwrap_or(0.0) - log.first().and_then(|l| monotonic(l)).unwrap_or(0.0);
    for unit in [
        "keelson-agent.service",
        "NetworkManager.service",
        "kube-apiserver.service",
    ] {
        let state = in_node(c, name, &["systemctl", "is-active", unit]).unwrap_or_default();
        ensure!(
            state.trim() == "active",
            "{name}: {unit} is {state:?}, expected active"
        );
    }
    let enabled = in_node(
        c,
        name,
        &["systemctl", "is-enabled", "keelson-agent.service"],
    )?;
    ensure!(
        enabled.trim() == "enabled",
        "{name}: keelson-agent.service is {enabled:?}: Ignition's preset did not enable it"
    );
    // NetworkManager holds the NIC with the node's address.
    let address = c.node(name)?.address.to_string();
    let devices = in_node(
        c,
        name,
        &["nmcli", "-t", "-f", "DEVICE,TYPE,STATE", "device"],
    )?;
    let nic = devices
        .lines()
        .find(|l| l.contains(":ethernet:connected"))
        .and_then(|l| l.split(':').next())
        .with_context(|| {
            format!("{name}: NetworkManager manages no connected ethernet device:\n{devices}")
        })?
        .to_owned();
    let addrs = in_node(
        c,
        name,
        &["nmcli", "-g", "IP4.ADDRESS", "device", "show", &nic],
    )?;
    ensure!(
        addrs.contains(&format!("{address}/")),
        "{name}: NetworkManager's {nic} has {addrs:?}, expected {address}"
    );
    let ready = journal(c, name, "keelson-agent", true)?
        .iter()
        .find(|l| l.contains("keelson-agent ready:"))
        .and_then(|l| monotonic(l))
        .with_context(|| format!("{name}: no ready line in the agent's journal"))?;
    Ok(format!(
        "{name}: Ignition {ignition:.1} s in the initramfs, agent ready {ready:.1} s after kernel start, NIC {nic} by NetworkManager"
    ))
}

/// 2. DNS from `nodes`: api/api-int -> API VIP, *.apps -> ingress VIP, node names -> node
///    addresses, AAAA of api NOERROR without answer, other names forwarded (NXDOMAIN or
///    SERVFAIL without upstreams, never a made-up answer).
pub fn dns(c: &dyn Testbed, nodes: &[String]) -> Result<String> {
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
                let got = probe::dig(c.outside().netns, &server, name, rtype);
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
        let aaaa = probe::dig(c.outside().netns, &server, &format!("api.{ZONE}"), "AAAA");
        ensure!(
            aaaa.status == "NOERROR" && aaaa.records.is_empty(),
            "dig @{server} api.{ZONE} AAAA: {aaaa:?}, expected NOERROR with no answer"
        );
        let missing = probe::dig(
            c.outside().netns,
            &server,
            &format!("nosuchnode.{ZONE}"),
            "A",
        );
        ensure!(
            missing.status == "NXDOMAIN",
            "dig @{server} nosuchnode.{ZONE}: {missing:?}, expected NXDOMAIN"
        );
        checked += 2;
        if c.is_standin(node) {
            checked += own_resolver(c, node)?;
        }
    }
    Ok(format!(
        "{checked} answers from {} nodes ({})",
        nodes.len(),
        nodes.join(", ")
    ))
}

/// The node's own resolver (glibc, through the resolv.conf NetworkManager wrote from the
/// payload's profile) answers cluster names from the agent: `api-int` by FQDN and, through
/// the search domain, by its short name. Returns the number of names checked.
fn own_resolver(c: &dyn Testbed, node: &str) -> Result<usize> {
    let resolv = in_node(c, node, &["cat", "/etc/resolv.conf"])?;
    ensure!(
        resolv.contains("Generated by NetworkManager"),
        "{node}: /etc/resolv.conf was not written by NetworkManager:\n{resolv}"
    );
    let first = resolv.lines().find(|l| l.starts_with("nameserver"));
    ensure!(
        first == Some("nameserver 127.0.0.1") && resolv.contains(&format!("search {ZONE}")),
        "{node}: /etc/resolv.conf does not ask the agent first for {ZONE}:\n{resolv}"
    );
    for name in [
        format!("api-int.{ZONE}"),
        "api-int".to_owned(),
        format!("{node}.{ZONE}"),
    ] {
        let want = if name.starts_with("api") {
            API_VIP.to_owned()
        } else {
            c.node(node)?.address.to_string()
        };
        let got = in_node(c, node, &["getent", "hosts", &name])?;
        ensure!(
            got.split_whitespace().next() == Some(want.as_str()),
            "{node}: getent hosts {name} gave {got:?}, expected {want}"
        );
    }
    Ok(3)
}

/// 4c. API through VIP:6443 on an RHCOS master: the holder's kube-apiserver owns `*:6443`, so
///     the agent reaches the VIP through its nftables redirect to the proxy; requests
///     through the VIP are spread over every master (the local apiserver alone would only
///     ever name the holder).
pub fn api_on_rhcos(c: &dyn Testbed) -> Result<String> {
    let holder = c.wait_holder(API_VIP, Duration::from_secs(30), &|h| {
        h.starts_with("master-")
    })?;
    if !c.is_standin(&holder) {
        return api_spread(c);
    }
    let listeners = in_node(c, &holder, &["ss", "-Hltnp", "sport = :6443"])?;
    ensure!(
        listeners.contains("0.0.0.0:6443") && listeners.contains("kube-standin"),
        "{holder}: *:6443 is not the apiserver's: {listeners:?}"
    );
    let table = in_node(c, &holder, &["nft", "list", "table", "inet", "keelson_api"])?;
    ensure!(
        // The rule takes opening SYNs only (docs/proxy.md); nft prints that match between the
        // port and the redirect, in a form that varies with its version.
        table.lines().any(|l| {
            l.contains(&format!("ip daddr {API_VIP} tcp dport 6443 "))
                && l.contains("redirect to :")
        }),
        "{holder}: no VIP:6443 redirect in nftables:\n{table}"
    );
    let spread = api_spread(c)?;
    Ok(format!(
        "{holder} holds {API_VIP}, its apiserver owns *:6443, nftables redirects the VIP to the proxy; {spread}"
    ))
}

/// The node that answered `/version` through the API VIP (the stand-in names itself).
pub fn api_node(c: &dyn Testbed) -> Option<String> {
    let body = probe::curl(
        c.outside().netns,
        &format!("https://{API_VIP}:6443/version"),
        Duration::from_secs(3),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["node"].as_str().map(str::to_owned)
}

/// 3. API through the VIP: `https://<apiVIP>:6443` answers and requests are spread over the
///    three masters (their proxies learn the masters from members and check them first).
///    Once the VIP has answered, no request through it may fail: the proxy sends requests
///    only to backends its checks passed.
pub fn api_spread(c: &dyn Testbed) -> Result<String> {
    let start = Instant::now();
    let masters: BTreeSet<String> = names(c, "master").into_iter().collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut requests = 0;
    // Requests before the first answer (the VIP's holder may still be starting its proxy),
    // and the times of those that failed after it.
    let mut before_first = 0;
    let mut failed: Vec<String> = Vec::new();
    while start.elapsed() < Duration::from_secs(120) {
        let sent = start.elapsed();
        match api_node(c) {
            Some(node) => *seen.entry(node).or_default() += 1,
            None if seen.is_empty() => before_first += 1,
            None => failed.push(format!("{:.1} s", sent.as_secs_f64())),
        }
        requests += 1;
        ensure!(
            failed.is_empty(),
            "a request through {API_VIP}:6443 failed after the VIP had answered (sent {} after the start; answered so far: {seen:?})",
            failed.join(", ")
        );
        if masters
            .iter()
            .all(|m| seen.get(m).copied().unwrap_or(0) >= 2)
        {
            let ready = probe::curl(
                c.outside().netns,
                &format!("https://{API_VIP}:6443/readyz"),
                Duration::from_secs(3),
            );
            ensure!(
                ready.as_deref() == Some("ok"),
                "/readyz through the VIP: {ready:?}"
            );
            return Ok(format!(
                "{requests} requests through {API_VIP}:6443 answered by {seen:?}, 0 failed after the first answer ({before_first} before it)"
            ));
        }
    }
    bail!(
        "after {requests} requests through the VIP only {seen:?} answered, expected all of {masters:?}"
    )
}

/// 4. Pivot: the bootstrap powers off, the API VIP moves to a master, the Ignition server
///    answers through the VIP (now for workers too), and the workers finish their first boot.
pub fn pivot(c: &mut dyn Testbed) -> Result<String> {
    let start = Instant::now();
    c.power_off("bootstrap")?;
    let off = start.elapsed();
    let holder = c.wait_holder(API_VIP, Duration::from_secs(60), &|h| {
        h.starts_with("master-")
    })?;
    let moved = start.elapsed();
    // The new holder answers at once; a host whose ARP entry still names a node that held
    // the VIP for a moment learns the right one from the winner's next announcement.
    let served = Instant::now();
    let port = c.payload().keelson_ignition_port();
    let master_cfg = loop {
        if let Some(body) = probe::curl_with(
            c.outside().netns,
            &format!("https://{API_VIP}:{port}/config/master"),
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
    // Beside OpenShift the VIP follows the machine-config-server: a master serves
    // OpenShift's configs on :22623 through it.
    let mcs = if c.payload() == Payload::OpenShift {
        let status = probe::http_status(
            c.outside().netns,
            &format!("https://{API_VIP}:22623/config/worker"),
            Duration::from_secs(5),
            &[],
        );
        ensure!(
            status == 200,
            "the machine-config-server answered {status} for /config/worker through {API_VIP} after the pivot, expected 200"
        );
        "; the machine-config-server answers :22623 through the VIP".to_owned()
    } else {
        String::new()
    };
    let workers = names(c, "worker");
    c.wait_ready(&workers, BOOT_TIMEOUT)?;
    let workers_at = start.elapsed();
    let urls = config_urls(c, "worker");
    for w in &workers {
        for url in &urls {
            ensure!(
                c.console_text(w).contains(&format!("fetched config {url}")),
                "{w} did not log fetching {url}"
            );
        }
    }
    let api = c.sole_holder(API_VIP, Duration::from_secs(10))?;
    ensure!(
        api.starts_with("master-"),
        "{API_VIP} answered by {api} after the pivot"
    );
    // The ingress VIP is the workers' (a run without workers has nobody to hold it).
    let ingress = if workers.is_empty() {
        "nobody (no workers)".to_owned()
    } else {
        let ingress = c.sole_holder(INGRESS_VIP, Duration::from_secs(30))?;
        ensure!(
            ingress.starts_with("worker-"),
            "{INGRESS_VIP} answered by {ingress}"
        );
        ingress
    };
    Ok(format!(
        "bootstrap off in {}; {API_VIP} on {holder} at {}; :{port} answered through the VIP {} later{mcs}; workers ready at {}; one holder each: {api}, {ingress}",
        secs(off),
        secs(moved),
        secs(served),
        secs(workers_at)
    ))
}

/// Kills the holder of `vip` while a client requests `url` every 100 ms (each with a 1 s
/// timeout, whether or not the one before answered); returns the holder, the new holder and
/// the outage seen by the client.
fn kill_holder(
    c: &mut dyn Testbed,
    vip: &str,
    url: &str,
    same_role: &str,
    settle: Duration,
) -> Result<(String, String, probe::Outage)> {
    let holder = c.wait_holder(vip, Duration::from_secs(30), &|h| h.starts_with(same_role))?;
    let client = ClientLoop::start_overlapping(
        c.outside().netns.name(),
        url,
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    // A steady state first: 3 s of answers in a row (after the pivot the proxies may still
    // be taking the bootstrap out of their backends).
    let steady = Duration::from_secs(3);
    let since = client
        .wait_steady(steady, Duration::from_secs(60))
        .with_context(|| {
            format!("{url} did not answer steadily for {steady:?} within 60 s before the kill")
        })?;
    let killed_at = c.kill(&holder)?;
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
    let new_holder = c.wait_holder(vip, Duration::from_secs(10), &|h| h != holder)?;
    let sole = c.sole_holder(vip, Duration::from_secs(10))?;
    ensure!(sole != holder, "{vip} still answered by the dead {holder}");
    ensure!(
        outage.failures_before == 0,
        "{} requests failed before {holder} was killed ({})",
        outage.failures_before,
        samples
            .iter()
            .filter(|s| !s.ok && s.done < killed_at)
            .map(|s| format!(
                "sent {} and given up {} before",
                secs(killed_at - s.sent),
                secs(killed_at - s.done)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok((holder, new_holder, outage))
}

/// 5. Failover: the API VIP's holder dies (`quit`, no goodbye); a client loop through the VIP
///    fails only in a window after the kill. Then the same for the ingress VIP on the workers.
///
/// Returns the killed master and what was measured.
pub fn failover(c: &mut dyn Testbed) -> Result<(String, String)> {
    // The API, held to what the design promises (docs/proxy.md, "The VRRP hint"): the VIP
    // moves within Master_Down_Interval, and no request fails once it has. The new holder's
    // proxy takes the dead master out at once on VRRP's word, before its checks (5 s apart,
    // then 1 s: about 7 s) or a client's connect stagger could; the client keeps asking for
    // 10 s after the VIP answered again, longer than those would take, to see that.
    let moves_within = vip_move_bound(c, "api")?;
    let (api_dead, api_new, api) = kill_holder(
        c,
        API_VIP,
        &format!("https://{API_VIP}:6443/readyz"),
        "master-",
        Duration::from_secs(10),
    )?;
    let api_back = api.first_success.context("API never answered")?;
    let api_last = api.last_failure.unwrap_or_default();
    // 2 s for TCG guests: a request sent just before the move fails by its 1 s timeout, and
    // the guests' timers run late on a loaded host.
    let slack = Duration::from_secs(2);
    ensure!(
        api_back <= moves_within + slack,
        "the API VIP answered again only after {} (VIP move bound {} + 2 s)",
        secs(api_back),
        secs(moves_within)
    );
    ensure!(
        api_last <= moves_within + slack,
        "requests through the API VIP still failed {} after the kill (VIP move bound {} + 2 s)",
        secs(api_last),
        secs(moves_within)
    );
    ensure!(
        api.failures_after_back == 0,
        "{} requests through the API VIP failed after it answered again",
        api.failures_after_back
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

/// How soon VRRP moves VIP instance `name` when its holder dies, by the cluster's own
/// `cluster.json`: the backup with the base master priority claims once the holder's
/// death is confirmed, the later of Master_Down_Interval (RFC 5798 §6.1, 3 adverts plus
/// the skew) and the end of the ARP round's least wait (1.3 adverts + 150 ms), counted
/// from the last advert (docs/vrrp.md, "Fast failover without flapping").
pub fn vip_move_bound(c: &dyn Testbed, name: &str) -> Result<Duration> {
    let cluster: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.out_dir().join("cluster.json"))?)?;
    let inst = cluster["vrrp"]["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == name))
        .with_context(|| format!("cluster.json: no vrrp instance {name}"))?;
    let advert = inst["advertIntervalMs"]
        .as_u64()
        .context("cluster.json: advertIntervalMs")?;
    let prio = inst["priorities"]["master"]
        .as_u64()
        .or_else(|| inst["priorities"]["worker"].as_u64())
        .context("cluster.json: priorities.master")?;
    let master_down = 3 * advert + (256 - prio) * advert / 256;
    let confirmed = advert * 13 / 10 + 150;
    Ok(Duration::from_millis(master_down.max(confirmed)))
}

/// 6. Rejoin: the killed master boots again, the others' DNS learns it again (members), and
///    the API proxy sends it requests again.
pub fn rejoin(c: &mut dyn Testbed, master: &str) -> Result<String> {
    let start = Instant::now();
    c.restart(master)?;
    c.wait_ready(&[master.to_owned()], boot_timeout(c, &[master.to_owned()]))?;
    let ready = start.elapsed();
    let second_boot = if c.is_standin(master) {
        standin_second_boot(c, master)?
    } else {
        String::new()
    };
    let other = names(c, "master")
        .into_iter()
        .find(|m| m != master && c.is_running(m))
        .context("no other master running")?;
    let server = c.node(&other)?.address.to_string();
    let want = vec![c.node(master)?.address.to_string()];
    let name = format!("{master}.{ZONE}");
    let mut dns_at = None;
    let mut api_at = None;
    // From the ready line on: members and the proxy's checks need their time after the boot,
    // however long the boot took.
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline && (dns_at.is_none() || api_at.is_none()) {
        if dns_at.is_none() && probe::dig(c.outside().netns, &server, &name, "A").records == want {
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
        "{master} ready in {}{second_boot}; in {other}'s DNS at {}; serving through the API VIP at {}",
        secs(ready),
        secs(dns_at),
        secs(api_at)
    ))
}

/// A stand-in's second boot: the disk Ignition wrote is kept, no Ignition runs (no
/// `ignition.firstboot`, no Ignition entry in this boot's journal while the first boot's are
/// still there), and systemd started the agent again on its own.
fn standin_second_boot(c: &dyn Testbed, name: &str) -> Result<String> {
    guest(c, name)?.wait(Duration::from_secs(60))?;
    let cmdline = in_node(c, name, &["cat", "/proc/cmdline"])?;
    ensure!(
        !cmdline
            .split_whitespace()
            .any(|w| w == "ignition.firstboot"),
        "{name}: the second boot has ignition.firstboot: {cmdline}"
    );
    let this_boot = journal(c, name, "ignition", true)?;
    ensure!(
        this_boot.is_empty(),
        "{name}: Ignition ran on the second boot:\n{}",
        this_boot.join("\n")
    );
    let all = journal(c, name, "ignition", false)?;
    ensure!(
        all.iter()
            .any(|l| l.contains("Ignition finished successfully")),
        "{name}: the first boot's Ignition entries are gone: the disk was not kept"
    );
    let state = in_node(
        c,
        name,
        &["systemctl", "is-active", "keelson-agent.service"],
    )?;
    ensure!(
        state.trim() == "active",
        "{name}: keelson-agent.service is {state:?}"
    );
    let ready = journal(c, name, "keelson-agent", true)?
        .iter()
        .find(|l| l.contains("keelson-agent ready:"))
        .and_then(|l| monotonic(l))
        .unwrap_or(0.0);
    Ok(format!(
        " (second boot: no Ignition, systemd started the agent, ready {ready:.1} s after kernel start)"
    ))
}

/// 4d. Own Ignition (beside OpenShift): every node applied both OpenShift's config (from the
///     machine-config-server) and keelson's, with the operator's own merged into keelson's
///     (`keelson build --merge`). On each stand-in master: the operator's file, user and the
///     marker its unit left; OpenShift's rendered file and the marker of its unit; the
///     machine-config-server and keelson's agent running. On the appliance nodes, which run
///     no units: both configs' units named in their refusals, so both were merged.
pub fn own_ignition(c: &dyn Testbed) -> Result<String> {
    use crate::openshift::{
        MARKER_UNIT, MCS_UNIT, OPERATOR_FILE, OPERATOR_MARKER, OPERATOR_UNIT, OPERATOR_USER,
        RENDERED_MARKER, UNIT_MARKER,
    };
    let mut lines = Vec::new();
    for node in c.plan().to_vec() {
        let name = node.name.as_str();
        if node.role == "bootstrap" || !c.is_running(name) {
            continue;
        }
        if c.is_standin(name) {
            let read = |path: &str| in_node(c, name, &["cat", path]).map(|s| s.trim().to_owned());
            let want = [
                (OPERATOR_FILE, format!("operator {}", node.role)),
                (OPERATOR_MARKER, "ran".to_owned()),
                (RENDERED_MARKER, node.role.to_string()),
                (UNIT_MARKER, "ran".to_owned()),
            ];
            for (path, expected) in &want {
                let got = read(path)?;
                ensure!(
                    &got == expected,
                    "{name}: {path} holds {got:?}, expected {expected:?}"
                );
            }
            let user = in_node(c, name, &["getent", "passwd", OPERATOR_USER])?;
            ensure!(
                user.starts_with(&format!("{OPERATOR_USER}:")),
                "{name}: no user {OPERATOR_USER} ({user:?})"
            );
            for unit in [
                "keelson-agent.service",
                MCS_UNIT,
                OPERATOR_UNIT,
                MARKER_UNIT,
            ] {
                let state = in_node(c, name, &["systemctl", "is-active", unit]).unwrap_or_default();
                ensure!(
                    state.trim() == "active",
                    "{name}: {unit} is {state:?}, expected active"
                );
            }
            lines.push(format!(
                "{name}: operator's file, user and unit; OpenShift's file and unit; machine-config-server and agent active"
            ));
        } else {
            let console = c.console_text(name);
            for unit in [OPERATOR_UNIT, MARKER_UNIT] {
                ensure!(
                    console.contains(&format!("not applied: systemd.units {unit}")),
                    "{name}: no refusal of {unit} on the console: it never got that config"
                );
            }
            lines.push(format!(
                "{name} (appliance): refused {OPERATOR_UNIT} and {MARKER_UNIT}, so both configs were merged"
            ));
        }
    }
    ensure!(!lines.is_empty(), "no node to check");
    Ok(lines.join("; "))
}

#[cfg(test)]
mod tests;
