//! The dual-stack run of the QEMU cluster (`make qemu-cluster CONFIG=dualstack`,
//! docs/qemu-cluster.md, "Dual stack"): the example install-config with a second machine
//! network and a second VIP per role, of IPv6, built by `keelson build` (each role's IPv6
//! instance follows its IPv4 one, docs/vrrp.md "Dual stack"); every node boots the appliance
//! with a static IPv6 address from its `network_data.json` beside its IPv4 one. Checked from
//! the harness's namespace, which has an IPv6 address on the segment too: DNS answers both
//! families, the API answers through both VIPs, one node answers ARP for a role's IPv4 VIP
//! and neighbour discovery for its IPv6 VIP, and the two move together when the holder is
//! powered off or dies.
//!
//! The segment is the learning bridge the multicast configuration can run on, not the
//! unicast configuration's bridge that drops every multicast frame: IPv6 cannot work
//! without multicast (neighbour solicitations go to solicited-node groups), while VRRP and
//! the members stay unicast as `keelson build` writes them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::{self, API_VIP, Cluster, Config, INGRESS_VIP, ImageKind, Payload};
use crate::netns::{HarnessNetns, Netns};
use crate::probe::{self, ClientLoop};
use crate::report::{Report, secs};
use crate::scenarios::{self, ZONE};
use crate::testbed::Testbed;

/// The IPv6 machine network beside the example's 10.0.0.0/16.
pub const MACHINE_NETWORK6: &str = "fd00::/64";
/// The API VIP of IPv6.
pub const API_VIP6: &str = "fd00::5";
/// The ingress VIP of IPv6.
pub const INGRESS_VIP6: &str = "fd00::7";
/// The host-side participant's IPv6 address on the segment.
pub const HOST_ADDRESS6: &str = "fd00::250";

/// The harness's MAC on the segment (locally administered, unlike the nodes' 52:54:00:...).
pub const HOST_MAC: &str = "02:00:00:00:02:50";

/// A node's IPv6 address: the last octet of its IPv4 address in the same digits
/// (10.0.0.11 is fd00::11), so a reader of the report pairs them at a glance.
pub fn node_address(v4: Ipv4Addr) -> Ipv6Addr {
    let digits = v4.octets()[3].to_string();
    let low = u16::from_str_radix(&digits, 16).expect("decimal digits are hex digits");
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, low)
}

/// Gives the namespace's interface on the segment its IPv6 address (without DAD: the
/// address is the harness's own, and the probes start at once), turning IPv6 on there
/// first: the segment's bridge is made without it, for the IPv4-only runs.
pub fn add_host_address(netns: &Netns, iface: &str) -> Result<()> {
    let out = netns
        .command("sysctl")
        .args(["-qw", &format!("net.ipv6.conf.{iface}.disable_ipv6=0")])
        .output()
        .context("running sysctl")?;
    ensure!(
        out.status.success(),
        "sysctl net.ipv6.conf.{iface}.disable_ipv6=0 in {}: {}",
        netns.name(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    // A fixed MAC: a Linux bridge without one takes the lowest of its ports' and changes it
    // when that port goes (a killed VM's tap). The nodes' neighbour entries for the harness
    // then name a MAC nobody has; IPv4 heals at the harness's next broadcast ARP request
    // (every receiver updates the sender's entry), IPv6 only when the node's entry fails
    // its probes, some 8-16 s, which a client through the IPv6 VIP saw as the failover.
    netns.try_ip(&["link", "set", "dev", iface, "address", HOST_MAC])?;
    netns.try_ip(&[
        "-6",
        "addr",
        "add",
        &format!("{HOST_ADDRESS6}/64"),
        "dev",
        iface,
        "nodad",
    ])?;
    Ok(())
}

/// The example install-config made dual stack, as a user writes one: a second machine
/// network and a second API and ingress VIP, of IPv6, each list IPv4 first.
pub fn install_config(example: &str) -> Result<String> {
    let mut yaml = example.to_owned();
    for (from, to) in [
        (
            "  - cidr: 10.0.0.0/16\n",
            format!("  - cidr: 10.0.0.0/16\n  - cidr: {MACHINE_NETWORK6}\n"),
        ),
        (
            "    - 10.0.0.5\n",
            format!("    - 10.0.0.5\n    - {API_VIP6}\n"),
        ),
        (
            "    - 10.0.0.7\n",
            format!("    - 10.0.0.7\n    - {INGRESS_VIP6}\n"),
        ),
    ] {
        ensure!(
            yaml.contains(from),
            "the example install-config has no {from:?} to add IPv6 beside"
        );
        yaml = yaml.replacen(from, &to, 1);
    }
    Ok(yaml)
}

/// The built `cluster.json` has each role's IPv6 instance following its IPv4 one (a build
/// that wrote two independent instances would run two elections, and the run would prove
/// nothing about moving them together).
fn check_follows(out: &Path) -> Result<()> {
    let path = out.join("cluster.json");
    let cluster: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)
        .with_context(|| path.display().to_string())?;
    let instances = cluster["vrrp"]["instances"]
        .as_array()
        .with_context(|| format!("{}: vrrp.instances", path.display()))?;
    for (role, vip) in [("api", API_VIP6), ("ingress", INGRESS_VIP6)] {
        let name = format!("{role}-v6");
        let inst = instances
            .iter()
            .find(|i| i["name"] == name.as_str())
            .with_context(|| format!("{}: no vrrp instance {name}", path.display()))?;
        ensure!(
            inst["vip"] == vip && inst["follows"] == role,
            "{}: vrrp instance {name}: vip {} follows {}, expected {vip} following {role}",
            path.display(),
            inst["vip"],
            inst["follows"]
        );
    }
    Ok(())
}

/// The nodes of the run: the example cluster's, all on the appliance (a stand-in master's
/// first boot is several times an appliance's under TCG, and the RHCOS path does not change
/// with the address family). worker-1, which the IPv4 run leaves without
/// `network_data.json`, gets a DHCP one here: without a plan it would have no IPv6 address
/// and hold the ingress VIP without its IPv6 companion.
pub fn plan() -> Vec<cluster::NodePlan> {
    let mut plan = cluster::plan(ImageKind::Appliance);
    for node in &mut plan {
        if let cluster::MetadataSource::Service(mode @ crate::configdrive::NetworkMode::Absent, _) =
            &mut node.source
        {
            *mode = crate::configdrive::NetworkMode::Dhcp;
        }
    }
    plan
}

/// Every MAC that answers a neighbour solicitation for `target` on `iface` of namespace `ns`
/// within `wait` (lowercase, sorted, deduplicated), as [`probe::arp_answers`] does for ARP:
/// more than one means several hosts hold the address. The solicitation goes to the
/// target's solicited-node group with hop limit 255 (RFC 4861 §7.1.1: a node ignores any
/// other) and our link-layer address; the MAC is an advertisement's target link-layer
/// address option, which an answer to a multicast solicitation carries (§7.2.4).
pub fn ndp_answers(
    ns: &Netns,
    iface: &str,
    target: Ipv6Addr,
    wait: Duration,
) -> Result<Vec<String>> {
    let out = ns.try_ip(&["-j", "link", "show", "dev", iface])?;
    let link: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let index = link[0]["ifindex"].as_u64().context("ifindex")? as u32;
    let mac_text = link[0]["address"].as_str().context("MAC address")?;
    let mut mac = [0u8; 6];
    for (m, part) in mac.iter_mut().zip(mac_text.split(':')) {
        *m = u8::from_str_radix(part, 16)?;
    }
    let path = format!("/run/netns/{}", ns.name());
    std::thread::spawn(move || -> Result<Vec<String>> {
        let file = std::fs::File::open(&path)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
        let sock = socket2::Socket::new(
            socket2::Domain::IPV6,
            socket2::Type::RAW,
            Some(socket2::Protocol::ICMPV6),
        )?;
        sock.set_multicast_hops_v6(255)?;
        sock.set_multicast_if_v6(index)?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let t = target.octets();
        let group = Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | u16::from(t[13]),
            u16::from_be_bytes([t[14], t[15]]),
        );
        // Type 135, code 0, checksum (the kernel fills it for ICMPv6 raw sockets),
        // reserved, the target, then the source link-layer address option.
        let mut ns_msg = vec![135u8, 0, 0, 0, 0, 0, 0, 0];
        ns_msg.extend_from_slice(&t);
        ns_msg.extend_from_slice(&[1, 1]);
        ns_msg.extend_from_slice(&mac);
        let to = std::net::SocketAddrV6::new(group, 0, 0, index);
        sock.send_to(&ns_msg, &to.into())?;
        let deadline = Instant::now() + wait;
        let mut macs = BTreeSet::new();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 256];
        while Instant::now() < deadline {
            let Ok(n) = sock.recv(&mut buf) else { continue };
            // SAFETY: recv initialised the first `n` bytes.
            let m = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
            if n < 24 || m[0] != 136 || m[8..24] != t {
                continue;
            }
            let mut opts = &m[24..];
            while opts.len() >= 8 && opts[1] != 0 {
                let len = usize::from(opts[1]) * 8;
                if opts[0] == 2 && len >= 8 {
                    macs.insert(
                        opts[2..8]
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(":"),
                    );
                }
                opts = opts.get(len..).unwrap_or(&[]);
            }
        }
        Ok(macs.into_iter().collect())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("neighbour discovery probe thread panicked"))?
}

/// Every node answering neighbour discovery for `vip` now, by name (an unknown MAC as itself).
fn holders6(c: &dyn Testbed, vip: &str) -> Result<Vec<String>> {
    let out = c.outside();
    let macs = ndp_answers(
        out.netns,
        out.iface,
        vip.parse()?,
        Duration::from_millis(500),
    )?;
    Ok(c.names_of_macs(macs))
}

/// Waits (up to `timeout`) until one node, the same twice a second apart, answers ARP for
/// `vip4` and neighbour discovery for `vip6` alone; returns it, or fails naming who
/// answered each (a role's VIPs on two nodes, or either on two, is what the run is to
/// rule out).
fn sole_holder_of_both(
    c: &dyn Testbed,
    vip4: &str,
    vip6: &str,
    timeout: Duration,
) -> Result<String> {
    let start = Instant::now();
    let (mut last4, mut last6) = (Vec::new(), Vec::new());
    let mut seen: Option<String> = None;
    while start.elapsed() < timeout {
        last4 = c.holders_of(vip4)?;
        last6 = holders6(c, vip6)?;
        match (last4.as_slice(), last6.as_slice(), &seen) {
            ([a], [b], Some(prev)) if a == b && a == prev => return Ok(a.clone()),
            ([a], [b], _) if a == b => seen = Some(a.clone()),
            _ => seen = None,
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "{vip4} answered (ARP) by {last4:?} and {vip6} (neighbour discovery) by {last6:?} after {timeout:?}, expected one node for both"
    )
}

/// 1b. Both families: every node answers `ping` at its IPv6 address (its static IPv6
///     network applied, from a config drive or the metadata service); the bootstrap holds
///     both API VIPs, alone.
pub fn both_families(c: &mut Cluster) -> Result<String> {
    let mut answered = Vec::new();
    for node in c.plan.clone() {
        let v6 = node_address(node.address).to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = c
                .netns
                .command("ping")
                .args(["-6", "-c", "1", "-W", "1", &v6])
                .output()
                .context("running ping")?
                .status
                .success();
            if ok {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{} does not answer ping at {v6} (its network_data.json's ipv6 network)",
                node.name
            );
        }
        answered.push(format!("{} {v6}", node.name));
    }
    let holder = sole_holder_of_both(c, API_VIP, API_VIP6, Duration::from_secs(30))?;
    ensure!(
        holder == "bootstrap",
        "{API_VIP} and {API_VIP6} held by {holder}, expected the bootstrap"
    );
    Ok(format!(
        "ping -6 answered by {}; {API_VIP} (ARP) and {API_VIP6} (NDP) answered by {holder} alone",
        answered.join(", ")
    ))
}

/// 2. DNS of both families, at every named node's IPv4 and IPv6 address: `api` and
///    `api-int` have the A record of the IPv4 API VIP and the AAAA record of the IPv6 one,
///    `*.apps` the ingress VIPs; each node's name has its IPv4 address (members) and, when
///    the answer carries one, its IPv6 address (printed: the count of names that have one).
pub fn dns(c: &dyn Testbed, nodes: &[String]) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut checked = 0;
    let mut with_aaaa = BTreeSet::new();
    for node in nodes {
        let v4 = c.node(node)?.address;
        let servers = [v4.to_string(), node_address(v4).to_string()];
        let mut expect: BTreeMap<(String, &str), String> = BTreeMap::new();
        for name in ["api", "api-int"] {
            expect.insert((format!("{name}.{ZONE}"), "A"), API_VIP.into());
            expect.insert((format!("{name}.{ZONE}"), "AAAA"), API_VIP6.into());
        }
        let apps = format!("console-openshift-console.apps.{ZONE}");
        expect.insert((apps.clone(), "A"), INGRESS_VIP.into());
        expect.insert((apps, "AAAA"), INGRESS_VIP6.into());
        for other in nodes {
            let addr = c.node(other)?.address.to_string();
            expect.insert((format!("{other}.{ZONE}"), "A"), addr);
        }
        for server in &servers {
            for ((name, rtype), want) in &expect {
                loop {
                    let got = probe::dig(c.outside().netns, server, name, rtype);
                    if got.status == "NOERROR" && got.records == [want.clone()] {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("dig @{server} {name} {rtype}: {got:?}, expected NOERROR [{want}]");
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                checked += 1;
            }
        }
        for other in nodes {
            let want = node_address(c.node(other)?.address).to_string();
            let got = probe::dig(
                c.outside().netns,
                &servers[0],
                &format!("{other}.{ZONE}"),
                "AAAA",
            );
            ensure!(
                got.status == "NOERROR"
                    && (got.records.is_empty() || got.records == [want.clone()]),
                "dig @{} {other}.{ZONE} AAAA: {got:?}, expected NOERROR with {want} or no answer",
                servers[0]
            );
            if !got.records.is_empty() {
                with_aaaa.insert(other.clone());
            }
        }
    }
    Ok(format!(
        "{checked} answers at {} nodes' IPv4 and IPv6 addresses: api, api-int A {API_VIP} + AAAA {API_VIP6}, *.apps A {INGRESS_VIP} + AAAA {INGRESS_VIP6}; node names with an AAAA record: {} of {}",
        nodes.len(),
        with_aaaa.len(),
        nodes.len()
    ))
}

/// The node that answered `/version` through the API VIP `vip`, an address or `[v6]`.
fn api_node_at(c: &dyn Testbed, vip: &str) -> Option<String> {
    let body = probe::curl(
        c.outside().netns,
        &format!("https://{vip}:6443/version"),
        Duration::from_secs(3),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["node"].as_str().map(str::to_owned)
}

/// Requests `/version` through `vip` until every master answered twice; once the VIP
/// answered, no request through it may fail. Returns the requests and who answered.
fn spread(c: &dyn Testbed, vip: &str) -> Result<(usize, BTreeMap<String, usize>)> {
    let start = Instant::now();
    let masters: BTreeSet<String> = c.names("master").into_iter().collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut requests = 0;
    while start.elapsed() < Duration::from_secs(120) {
        requests += 1;
        match api_node_at(c, vip) {
            Some(node) => *seen.entry(node).or_default() += 1,
            None if seen.is_empty() => {}
            None => bail!(
                "a request through {vip}:6443 failed after it had answered ({:.1} s after the start; answered so far: {seen:?})",
                start.elapsed().as_secs_f64()
            ),
        }
        if masters
            .iter()
            .all(|m| seen.get(m).copied().unwrap_or(0) >= 2)
        {
            return Ok((requests, seen));
        }
    }
    bail!(
        "after {requests} requests through {vip}:6443 only {seen:?} answered, expected all of {masters:?}"
    )
}

/// 3. The API through both VIPs: requests through `https://10.0.0.5:6443/version`, then
///    through `https://[fd00::5]:6443/version`, reach every master (the holder's proxy
///    behind both). One family at a time: the proxy's round robin is shared by its
///    frontends, and with four backends requests alternating between the two VIPs would
///    reach only every other backend through each.
pub fn api_both(c: &dyn Testbed) -> Result<String> {
    let (n4, seen4) = spread(c, API_VIP)?;
    let (n6, seen6) = spread(c, &format!("[{API_VIP6}]"))?;
    Ok(format!(
        "through {API_VIP}:6443 {n4} requests answered by {seen4:?}; through [{API_VIP6}]:6443 {n6} answered by {seen6:?}"
    ))
}

/// 4. Pivot (the existing scenario: the bootstrap powered off, the API VIP on a master,
///    the workers served and ready), then both API VIPs on one master and both ingress VIPs
///    on one worker.
pub fn pivot(c: &mut Cluster) -> Result<String> {
    let pivot = scenarios::pivot(c)?;
    let api = sole_holder_of_both(c, API_VIP, API_VIP6, Duration::from_secs(20))?;
    ensure!(
        api.starts_with("master-"),
        "the API VIPs are on {api} after the pivot"
    );
    let ingress = sole_holder_of_both(c, INGRESS_VIP, INGRESS_VIP6, Duration::from_secs(30))?;
    ensure!(
        ingress.starts_with("worker-"),
        "the ingress VIPs are on {ingress}"
    );
    Ok(format!(
        "{pivot}; both API VIPs on {api}, both ingress VIPs on {ingress}"
    ))
}

/// What one holder's death did to the clients through a role's two VIPs.
struct BothMoved {
    dead: String,
    new_holder: String,
    /// Per family (IPv4, IPv6): the outage the client saw.
    outages: [probe::Outage; 2],
    /// The namespace's neighbour entries for the VIPs as they changed, from the kill on.
    neighbours: Vec<String>,
}

/// The namespace's neighbour entries for `vips`, read (`ip neigh show`, which changes
/// nothing) every 100 ms from `origin` until `stop`: each change as `+0.4 s fd00::5
/// 52:54:00:0a:00:0c STALE`. What the clients' host believed about each VIP, and when.
struct NeighbourLog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl NeighbourLog {
    fn start(netns: &str, vips: [&str; 2], origin: Instant) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ns = Netns::existing(netns);
        let vips = vips.map(str::to_owned);
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last: [String; 2] = Default::default();
                let mut changes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (vip, last) in vips.iter().zip(last.iter_mut()) {
                        let now = ns
                            .try_ip(&["neigh", "show", vip])
                            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                            .unwrap_or_default();
                        if now != *last {
                            let t = Instant::now().saturating_duration_since(origin);
                            let shown = now.replace(" dev kqbr0 lladdr", "");
                            changes.push(format!(
                                "{:+.1} s {}",
                                t.as_secs_f64(),
                                if shown.is_empty() {
                                    format!("{vip} (none)")
                                } else {
                                    shown
                                }
                            ));
                            *last = now;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                changes
            })
        };
        NeighbourLog { stop, thread }
    }

    fn finish(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Kills the node holding `vips` (IPv4, IPv6; ARP and neighbour discovery agree) while a
/// client requests each of `urls` every 200 ms, each with a 1 s timeout whether or not the
/// one before answered; waits until both answer again and `settle` more, then finds the
/// new holder of both.
fn kill_holder_of_both(
    c: &mut Cluster,
    vips: [&str; 2],
    urls: [&str; 2],
    role: &str,
    settle: Duration,
) -> Result<BothMoved> {
    let dead = sole_holder_of_both(c, vips[0], vips[1], Duration::from_secs(30))?;
    ensure!(
        dead.starts_with(role),
        "{vips:?} held by {dead}, expected a {role}"
    );
    // Each client every 200 ms: together the IPv4 run's one client's 10 requests a second.
    // Twice that (TLS handshakes all, on the holder's one emulated vCPU) starved its VRRP
    // adverts past Master_Down on a loaded host, and the VIPs moved before any kill.
    let clients = urls.map(|url| {
        ClientLoop::start_overlapping(
            c.netns.name(),
            url,
            Duration::from_millis(200),
            Duration::from_secs(1),
        )
    });
    let steady = Duration::from_secs(3);
    let mut since = Vec::new();
    for (client, url) in clients.iter().zip(urls) {
        since.push(
            client
                .wait_steady(steady, Duration::from_secs(60))
                .with_context(|| format!("{url} did not answer steadily before the kill"))?,
        );
    }
    // No ARP or neighbour probes until the clients are through: an answer to a probe
    // updates the namespace's neighbour entry for the VIP, and the clients would learn the
    // new holder from the probe instead of from its own announcements.
    // The segment's ARP and ICMPv6 frames around the kill, for a reader of a slow move,
    // where tcpdump is installed (nothing checks them: the neighbour log is the figure).
    // `-U` writes each frame at once: the capture ends with a kill, which loses a buffer.
    let capture = c.work.join(format!("failover-{dead}.pcap"));
    let mut tcpdump = match crate::tools::find("tcpdump") {
        Some(tcpdump) => {
            let child = c
                .netns
                .exec(&tcpdump)
                .args(["-q", "-n", "-U", "-i", &c.host_iface, "-w"])
                .arg(&capture)
                .arg("arp or icmp6")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("running tcpdump")?;
            std::thread::sleep(Duration::from_millis(500));
            Some(child)
        }
        None => None,
    };
    let origin = Instant::now();
    let log = NeighbourLog::start(c.netns.name(), vips, origin);
    let killed_at = c.kill(&dead)?;
    for (client, url) in clients.iter().zip(urls) {
        client
            .wait_success_after(killed_at, Duration::from_secs(60))
            .with_context(|| format!("{url} never answered again after {dead} died"))?;
    }
    let neighbours = log.finish();
    if let Some(mut tcpdump) = tcpdump.take() {
        let _ = tcpdump.kill();
        let _ = tcpdump.wait();
        eprintln!(
            "qemu-cluster: frames around the kill in {}",
            capture.display()
        );
    }
    eprintln!(
        "qemu-cluster: {dead} killed at {:+.1} s; the namespace's neighbour entries: {}",
        killed_at.saturating_duration_since(origin).as_secs_f64(),
        neighbours.join("; ")
    );
    std::thread::sleep(settle);
    let mut outages = Vec::new();
    for ((client, since), url) in clients.into_iter().zip(since).zip(urls) {
        let samples: Vec<_> = client
            .finish()
            .into_iter()
            .filter(|s| s.sent >= since)
            .collect();
        let outage = probe::outage(&samples, killed_at);
        ensure!(
            outage.failures_before == 0,
            "{} requests to {url} failed before {dead} was killed",
            outage.failures_before
        );
        outages.push(outage);
    }
    let new_holder = sole_holder_of_both(c, vips[0], vips[1], Duration::from_secs(10))?;
    ensure!(
        new_holder != dead,
        "{vips:?} still answered by the dead {dead}"
    );
    let outages: [probe::Outage; 2] = outages
        .try_into()
        .map_err(|_| anyhow::anyhow!("two clients, two outages"))?;
    Ok(BothMoved {
        dead,
        new_holder,
        outages,
        neighbours,
    })
}

/// 5. Failover of both families: the master holding both API VIPs dies (QEMU `quit`) while
///    a client asks `/readyz` through each VIP (every 200 ms each); both VIPs move to one other master, each
///    client answered again within the VIP move bound + 2 s (as the IPv4 run's scenario),
///    none failing after that. Then the worker holding both ingress VIPs dies: both move to
///    the other worker (the router answers through the IPv4 VIP, `ping` through the IPv6
///    one: the router stand-in listens on IPv4 only).
///
/// Returns the killed master and what was measured.
pub fn failover(c: &mut Cluster) -> Result<(String, String)> {
    let bound = scenarios::vip_move_bound(c, "api")? + Duration::from_secs(2);
    let api4 = format!("https://{API_VIP}:6443/readyz");
    let api6 = format!("https://[{API_VIP6}]:6443/readyz");
    let api = kill_holder_of_both(
        c,
        [API_VIP, API_VIP6],
        [&api4, &api6],
        "master-",
        Duration::from_secs(10),
    )?;
    let mut text = Vec::new();
    for (family, outage) in ["IPv4", "IPv6"].iter().zip(&api.outages) {
        let back = outage.first_success.context("the API never answered")?;
        let last = outage.last_failure.unwrap_or_default();
        ensure!(
            back <= bound && last <= bound,
            "{family}: the API VIP answered again after {}, the last failure {} after the kill (VIP move bound + 2 s: {}); the namespace's neighbour entries from the kill: {}",
            secs(back),
            secs(last),
            secs(bound),
            api.neighbours.join("; ")
        );
        ensure!(
            outage.failures_after_back == 0,
            "{family}: {} requests through the API VIP failed after it answered again",
            outage.failures_after_back
        );
        text.push(format!(
            "{family} answered again after {}, {} of {} failed, the last {} after the kill",
            secs(back),
            outage.failures_after,
            outage.requests_after,
            secs(last)
        ));
    }
    let ing4 = format!("http://{INGRESS_VIP}:1936/healthz/ready");
    let ingress = kill_ingress_holder(c, &ing4)?;
    Ok((
        api.dead.clone(),
        format!(
            "API: {} killed, both VIPs on {}: {}; ingress: {ingress}",
            api.dead,
            api.new_holder,
            text.join("; ")
        ),
    ))
}

/// The ingress half of [`failover`]: the router through the IPv4 VIP, `ping -6` through the
/// IPv6 one.
fn kill_ingress_holder(c: &mut Cluster, url4: &str) -> Result<String> {
    let dead = sole_holder_of_both(c, INGRESS_VIP, INGRESS_VIP6, Duration::from_secs(30))?;
    ensure!(dead.starts_with("worker-"), "the ingress VIPs on {dead}");
    let client = ClientLoop::start_overlapping(
        c.netns.name(),
        url4,
        Duration::from_millis(100),
        Duration::from_secs(1),
    );
    let since = client
        .wait_steady(Duration::from_secs(3), Duration::from_secs(60))
        .context("the ingress VIP did not answer steadily before the kill")?;
    let killed_at = c.kill(&dead)?;
    let ping6 = loop {
        let ok = c
            .netns
            .command("ping")
            .args(["-6", "-c", "1", "-W", "1", INGRESS_VIP6])
            .output()
            .context("running ping")?
            .status
            .success();
        if ok {
            break killed_at.elapsed();
        }
        ensure!(
            killed_at.elapsed() < Duration::from_secs(30),
            "{INGRESS_VIP6} did not answer ping within 30 s of {dead}'s death"
        );
    };
    client
        .wait_success_after(killed_at, Duration::from_secs(60))
        .context("the ingress VIP never answered again")?;
    std::thread::sleep(Duration::from_secs(3));
    let samples: Vec<_> = client
        .finish()
        .into_iter()
        .filter(|s| s.sent >= since)
        .collect();
    let outage = probe::outage(&samples, killed_at);
    let back = outage.first_success.context("ingress never answered")?;
    ensure!(
        back <= Duration::from_secs(10),
        "the ingress VIP answered again only after {}",
        secs(back)
    );
    let new_holder = sole_holder_of_both(c, INGRESS_VIP, INGRESS_VIP6, Duration::from_secs(10))?;
    ensure!(
        new_holder != dead,
        "the ingress VIPs still on the dead {dead}"
    );
    Ok(format!(
        "{dead} killed, both VIPs on {new_holder}: IPv4 answered again after {} ({} of {} failed), {INGRESS_VIP6} answered ping after {}",
        secs(back),
        outage.failures_after,
        outage.requests_after,
        secs(ping6)
    ))
}

/// 6. Rejoin (the existing scenario): the killed master boots again and serves; the API
///    VIPs stay together on one master.
pub fn rejoin(c: &mut Cluster, master: &str) -> Result<String> {
    let rejoin = scenarios::rejoin(c, master)?;
    let api = sole_holder_of_both(c, API_VIP, API_VIP6, Duration::from_secs(20))?;
    Ok(format!("{rejoin}; both API VIPs on {api}"))
}

/// `make qemu-cluster CONFIG=dualstack`: builds the dual-stack cluster in `work`, boots it and
/// runs the scenarios; prints the table. Returns whether every scenario passed.
pub fn run(work: &Path) -> Result<bool> {
    let start = Instant::now();
    let example =
        std::fs::read_to_string(crate::payload::workspace().join("examples/install-config.yaml"))?;
    let install = work.join("install-config.dualstack.yaml");
    std::fs::write(&install, install_config(&example)?)?;
    let payload = Payload::Keelson;
    let out = crate::payload::build_from(
        &install,
        work,
        Config::DualStack,
        ImageKind::Appliance,
        payload,
    )?;
    check_follows(&out)?;
    let image: PathBuf = out.join("keelson.qcow2");
    let mut cluster = Cluster::new(work, &out, &image, Config::DualStack, payload, plan(), None)?;
    eprintln!("qemu-cluster: segment: {}", cluster.segment_text());
    let mut report = Report::new("qemu-cluster");
    let all = [
        "bootstrap",
        "master-0",
        "master-1",
        "master-2",
        "worker-0",
        "worker-1",
    ];
    let control = ["bootstrap", "master-0", "master-1", "master-2"];
    let order = [
        "1 boot",
        "1b dual",
        "2 dns",
        "3 api",
        "4 pivot",
        "5 failover",
        "6 rejoin",
    ];
    let passed = (|| {
        report.run(
            &mut cluster,
            "1 boot",
            &all,
            |c| scenarios::boot(c),
            |d| d.clone(),
        )?;
        report.run(&mut cluster, "1b dual", &all, both_families, |d| d.clone())?;
        let control_names: Vec<String> = control.iter().map(|s| s.to_string()).collect();
        report.run(
            &mut cluster,
            "2 dns",
            &control,
            |c| dns(c, &control_names),
            |d| d.clone(),
        )?;
        report.run(
            &mut cluster,
            "3 api",
            &control,
            |c| api_both(c),
            |d| d.clone(),
        )?;
        report.run(&mut cluster, "4 pivot", &all, pivot, |d| d.clone())?;
        let (dead, _) = report.run(&mut cluster, "5 failover", &all[1..], failover, |(_, d)| {
            d.clone()
        })?;
        report.run(
            &mut cluster,
            "6 rejoin",
            &all[1..4],
            |c| rejoin(c, &dead),
            |d| d.clone(),
        )?;
        Some(())
    })()
    .is_some();
    report.print(&order);
    println!(
        "\nqemu-cluster: dualstack configuration {} in {:.0} s (accel {}), consoles in {}",
        if passed { "PASSED" } else { "FAILED" },
        start.elapsed().as_secs_f64(),
        crate::vm::accel(),
        work.display()
    );
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_pair_with_the_ipv4_ones() {
        assert_eq!(
            node_address(Ipv4Addr::new(10, 0, 0, 11)),
            "fd00::11".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            node_address(Ipv4Addr::new(10, 0, 0, 250)).to_string(),
            HOST_ADDRESS6
        );
    }

    #[test]
    fn the_install_config_gets_a_second_family() {
        let example = std::fs::read_to_string(
            crate::payload::workspace().join("examples/install-config.yaml"),
        )
        .unwrap();
        let yaml = install_config(&example).unwrap();
        assert!(yaml.contains("  - cidr: 10.0.0.0/16\n  - cidr: fd00::/64\n"));
        assert!(yaml.contains("    - 10.0.0.5\n    - fd00::5\n"));
        assert!(yaml.contains("    - 10.0.0.7\n    - fd00::7\n"));
        assert!(install_config("no networks").is_err());
    }

    #[test]
    fn every_node_gets_a_network_plan() {
        for node in plan() {
            assert_eq!(node.image, ImageKind::Appliance, "{}", node.name);
            let mode = match node.source {
                cluster::MetadataSource::ConfigDrive(m)
                | cluster::MetadataSource::Service(m, _) => m,
            };
            assert_ne!(
                mode,
                crate::configdrive::NetworkMode::Absent,
                "{}",
                node.name
            );
        }
    }

    /// The probe on a real segment: a bridge in one namespace, two others on veth ports
    /// holding the same address (a split the run must catch) and a third holding another;
    /// the probe hears both holders of the one and only the holder of the other.
    #[test]
    fn the_neighbour_probe_hears_every_holder() {
        if !keelson_testkit::require_root() {
            return;
        }
        let pid = std::process::id() % 100_000;
        let hub = Netns::try_named(&format!("kqndp{pid}")).unwrap();
        hub.try_ip(&["link", "add", "br0", "type", "bridge"])
            .unwrap();
        hub.try_ip(&["link", "set", "br0", "up"]).unwrap();
        hub.try_ip(&["-6", "addr", "add", "fd00::250/64", "dev", "br0", "nodad"])
            .unwrap();
        let mut nodes = Vec::new();
        let mut macs = Vec::new();
        for (i, addr) in ["fd00::5", "fd00::5", "fd00::7"].iter().enumerate() {
            let ns = Netns::try_named(&format!("kqndp{pid}n{i}")).unwrap();
            let mac = format!("52:54:00:ee:00:{i:02x}");
            hub.try_ip(&[
                "link",
                "add",
                &format!("p{i}"),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
            ])
            .unwrap();
            hub.try_ip(&["link", "set", "eth0", "netns", ns.name()])
                .unwrap();
            hub.try_ip(&["link", "set", &format!("p{i}"), "master", "br0", "up"])
                .unwrap();
            ns.try_ip(&["link", "set", "eth0", "address", &mac, "up"])
                .unwrap();
            ns.try_ip(&[
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                "eth0",
                "nodad",
            ])
            .unwrap();
            nodes.push(ns);
            macs.push(mac);
        }
        // The bridge forwards once its ports leave the listening state.
        std::thread::sleep(Duration::from_secs(1));
        let wait = Duration::from_millis(500);
        let shared = ndp_answers(&hub, "br0", "fd00::5".parse().unwrap(), wait).unwrap();
        assert_eq!(shared, macs[..2], "both holders of fd00::5");
        let one = ndp_answers(&hub, "br0", "fd00::7".parse().unwrap(), wait).unwrap();
        assert_eq!(one, macs[2..], "the holder of fd00::7");
        let none = ndp_answers(&hub, "br0", "fd00::9".parse().unwrap(), wait).unwrap();
        assert!(none.is_empty(), "{none:?}");
    }
}
