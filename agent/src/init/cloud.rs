//! How PID 1 finds its metadata and brings the network up, the way clouds provide them
//! (docs/agent.md, "First boot"):
//!
//! 1. **Config drive first.** Nova attaches it at boot when the user or the cloud asked for
//!    one; PID 1 looks for a volume labelled `config-2` for [`CONFIG_DRIVE_WAIT`].
//! 2. **Otherwise the metadata service**, as cloud-init does it: an *ephemeral* DHCPv4 lease on
//!    the first Ethernet NIC (Neutron hands the route to 169.254.169.254 as a classless static
//!    route, option 121), then `http://169.254.169.254/openstack/latest/`, and
//!    `http://[fe80::a9fe:a9fe%<nic>]` where no IPv4 lease comes. A config drive that shows up
//!    late still wins. Every retry says on the console what it waits for.
//! 3. **Then `network_data.json`'s plan**: static addresses replace the ephemeral lease, DHCP
//!    stays where the plan asks for it (the running client is kept, not restarted); without
//!    `network_data.json` the first NIC keeps DHCP.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use ipnet::IpNet;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::log;
use crate::metadata::{ConfigDriveSource, Metadata, MetadataError, Source, config_drive, http};
use crate::net::dhcp::{DhcpClient, DhcpOptions};
use crate::net::{Configured, LinkInfo, Netlink};
use crate::retry::{Backoff, Transient};

/// How long PID 1 looks for a config drive before it asks DHCP and the metadata service.
/// Nova attaches the drive before the instance starts, so it is there as soon as the block
/// drivers have probed (well under a second here, even under TCG); the rest is margin.
pub const CONFIG_DRIVE_WAIT: Duration = Duration::from_secs(3);

/// How long the metadata service's first try waits for the DHCPv4 lease before it tries
/// the IPv6 link-local address too.
pub const FIRST_TRY_WAIT: Duration = Duration::from_secs(5);

/// Where PID 1 looks for its metadata: the places a cloud provides it
/// ([`CloudSources::default`]); tests point them at what they built (an image file for the
/// config drive, a shorter wait).
#[derive(Debug, Clone)]
pub struct CloudSources {
    /// The config drive: every block device labelled `config-2`, or a given device or image
    /// (attached while the file exists).
    pub config_drive: ConfigDriveSource,
    /// How long to look for a config drive before DHCP and the metadata service.
    pub config_drive_wait: Duration,
    /// The metadata service over IPv4 (reached through the ephemeral lease); over IPv6 it is
    /// `fe80::a9fe:a9fe` on the fallback NIC ([`http::ipv6_url`]).
    pub metadata_url: String,
}

impl Default for CloudSources {
    fn default() -> Self {
        CloudSources {
            config_drive: ConfigDriveSource::default(),
            config_drive_wait: CONFIG_DRIVE_WAIT,
            metadata_url: http::DEFAULT_URL.into(),
        }
    }
}

/// The node's network once PID 1 has configured it.
#[derive(Debug)]
pub struct NodeNetwork {
    /// What the plan configured (first interface, addresses, DNS).
    pub configured: Configured,
    /// DHCP clients that keep running (renewals) until power-off.
    pub dhcp: Vec<DhcpClient>,
    /// DNS servers: the plan's, then whatever DHCP leases bring.
    pub dns: watch::Receiver<Vec<IpAddr>>,
}

/// Finds the metadata in `sources` and configures the network; retries until it can,
/// returns `None` only when `stop` is cancelled.
pub async fn metadata_and_network(
    netlink: &Netlink,
    sources: &CloudSources,
    stop: &CancellationToken,
) -> anyhow::Result<Option<(Metadata, NodeNetwork)>> {
    let (dns_tx, dns_rx) = watch::channel(Vec::new());
    let mut ephemeral = None;
    let metadata = match wait_for_config_drive(sources, stop).await? {
        Some(md) => md,
        None => {
            let Some(md) =
                from_metadata_service(netlink, sources, &dns_tx, &mut ephemeral, stop).await?
            else {
                return Ok(None);
            };
            md
        }
    };
    log(&format!(
        "metadata from {}: node {}",
        metadata.source,
        metadata.node_name().as_deref().unwrap_or("(no name)")
    ));
    let network = apply_plan(netlink, &metadata, dns_tx, dns_rx, ephemeral, stop).await?;
    Ok(Some((metadata, network)))
}

/// Polls for a config drive for `sources.config_drive_wait`; a drive that is there but
/// unreadable is an error (it will not fix itself).
async fn wait_for_config_drive(
    sources: &CloudSources,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Metadata>> {
    log(&format!(
        "looking for a config drive (label config-2) for {} s",
        sources.config_drive_wait.as_secs_f32()
    ));
    let start = tokio::time::Instant::now();
    loop {
        if let Some(md) = config_drive_now(&sources.config_drive).await? {
            return Ok(Some(md));
        }
        if start.elapsed() >= sources.config_drive_wait || stop.is_cancelled() {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The config drive's metadata if a drive is attached right now: a block device labelled
/// `config-2`, or the given device or image once it exists.
async fn config_drive_now(drive: &ConfigDriveSource) -> anyhow::Result<Option<Metadata>> {
    let attached = match &drive.device {
        Some(device) => device.exists(),
        None => !tokio::task::spawn_blocking(config_drive::find_devices)
            .await
            .unwrap_or_default()
            .is_empty(),
    };
    if !attached {
        return Ok(None);
    }
    let md = drive.read().await.context("reading the config drive")?;
    Ok(Some(md))
}

/// The first Ethernet NIC (lowest index with a MAC): the one clouds put on the machine
/// network and the one cloud-init's fallback picks.
fn fallback_nic(links: &[LinkInfo]) -> Option<LinkInfo> {
    links
        .iter()
        .find(|l| !l.mac.is_empty() && l.name != "lo")
        .cloned()
}

/// One try at the metadata service, and why it failed.
#[derive(Debug)]
struct Waiting(String);

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Transient for Waiting {
    fn is_transient(&self) -> bool {
        true
    }
}

/// Ephemeral DHCP on the fallback NIC, then the metadata service (IPv4 once leased, and the
/// IPv6 link-local address), then a late config drive; forever, saying why on each retry.
async fn from_metadata_service(
    netlink: &Netlink,
    sources: &CloudSources,
    dns_tx: &watch::Sender<Vec<IpAddr>>,
    ephemeral: &mut Option<DhcpClient>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Metadata>> {
    let links = netlink.links().await.context("listing links")?;
    let nic = fallback_nic(&links);
    match &nic {
        Some(nic) => {
            log(&format!(
                "no config drive: DHCPv4 on {} ({}) to reach the metadata service",
                nic.name, nic.mac
            ));
            netlink
                .set_up(nic.index, None)
                .await
                .with_context(|| format!("setting {} up", nic.name))?;
            *ephemeral = Some(DhcpClient::spawn(
                netlink.clone(),
                nic.clone(),
                DhcpOptions::default(),
                dns_tx.clone(),
                stop,
            ));
        }
        None => log("no config drive and no Ethernet interface: waiting for either"),
    }
    let lease = ephemeral.as_ref().map(|c| c.lease());
    let v6_url = nic.as_ref().map(|n| http::ipv6_url(&n.name));
    // The first try waits for the DHCPv4 lease (it normally comes within two or three
    // seconds): IPv4 is the path every cloud serves, IPv6 the fallback where no lease
    // comes. Tried at once, both paths fail (no lease yet, the link-local address still
    // tentative) and the retry warns that no metadata source answered, on every boot.
    if nic.is_some() {
        let leased = || lease.as_ref().is_some_and(|l| l.borrow().is_some());
        let waited = std::time::Instant::now();
        while waited.elapsed() < FIRST_TRY_WAIT && !leased() && !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
    let attempt = || {
        let lease = lease.clone();
        let v6_url = v6_url.clone();
        let nic_name = nic.as_ref().map(|n| n.name.clone());
        async move {
            if let Some(md) = config_drive_now(&sources.config_drive)
                .await
                .map_err(|e| Waiting(format!("{e:#}")))?
            {
                return Ok(md);
            }
            let mut why = Vec::new();
            let leased = lease.as_ref().is_some_and(|l| l.borrow().is_some());
            if leased {
                match crate::metadata::http::read(&sources.metadata_url).await {
                    Ok(md) => return Ok(md),
                    Err(e @ MetadataError::Invalid { .. }) => return Err(Waiting(e.to_string())),
                    Err(e) => why.push(e.to_string()),
                }
            } else if let Some(name) = &nic_name {
                why.push(format!("no DHCPv4 lease on {name} yet"));
            }
            let v6_ready = nic_name
                .as_deref()
                .is_some_and(|n| crate::net::vip::link_local(n).is_some());
            if let (Some(url), false) = (&v6_url, v6_ready) {
                why.push(format!(
                    "{}'s IPv6 link-local address is still tentative, so {url} cannot be asked yet",
                    nic_name.as_deref().unwrap_or("the NIC")
                ));
            } else if let Some(url) = &v6_url {
                match crate::metadata::http::read(url).await {
                    Ok(md) => return Ok(md),
                    Err(e @ MetadataError::Invalid { .. }) => return Err(Waiting(e.to_string())),
                    Err(e) => why.push(e.to_string()),
                }
            }
            Err(Waiting(why.join("; ")))
        }
    };
    let result = tokio::select! {
        r = crate::retry::retry("metadata service", backoff, None, attempt) => r,
        _ = stop.cancelled() => return Ok(None),
    };
    // Only a refused answer (over a size limit, invalid JSON) ends the retries: say so and let
    // PID 1's boot loop start over, as it does for any failed boot.
    result.map(Some).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Applies `network_data.json` (or DHCP on the first NIC without it), taking over or retiring
/// the ephemeral client.
async fn apply_plan(
    netlink: &Netlink,
    metadata: &Metadata,
    dns_tx: watch::Sender<Vec<IpAddr>>,
    dns_rx: watch::Receiver<Vec<IpAddr>>,
    mut ephemeral: Option<DhcpClient>,
    stop: &CancellationToken,
) -> anyhow::Result<NodeNetwork> {
    let links = netlink.links().await.context("listing links")?;
    let plan = crate::metadata::network_plan::plan(metadata.network_data.as_ref(), &links)?;
    let configured = netlink
        .apply(&plan)
        .await
        .context("configuring the network")?;
    if !plan.dns.is_empty() {
        dns_tx.send_replace(plan.dns.clone());
    }
    let mut dhcp = Vec::new();
    for iface in plan.interfaces.iter().filter(|i| i.dhcp4) {
        let client = match ephemeral.take() {
            Some(c) if c.interface() == iface.link.name => {
                log(&format!(
                    "network: {} keeps DHCPv4 (network_data.json asks for it)",
                    iface.link.name
                ));
                c
            }
            other => {
                ephemeral = other;
                log(&format!("network: DHCPv4 on {}", iface.link.name));
                DhcpClient::spawn(
                    netlink.clone(),
                    iface.link.clone(),
                    DhcpOptions {
                        hostname: metadata.node_name().map(String::from),
                        ..DhcpOptions::default()
                    },
                    dns_tx.clone(),
                    stop,
                )
            }
        };
        dhcp.push(client);
    }
    if let Some(client) = ephemeral.take() {
        retire(netlink, client, &plan).await;
    }
    for client in &dhcp {
        client.wait_for_lease(stop).await;
    }
    let mut configured = configured;
    if configured.addresses.is_empty()
        && let Some(first) = dhcp.first()
        && let Some(lease) = first.lease().borrow().clone()
    {
        configured.interface = Some(first.interface().to_owned());
        configured.addresses = vec![IpNet::V4(lease.address)];
    }
    log(&format!(
        "network: {} {:?}, DNS {:?}",
        configured.interface.as_deref().unwrap_or("-"),
        configured
            .addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        dns_rx.borrow().clone()
    ));
    Ok(NodeNetwork {
        configured,
        dhcp,
        dns: dns_rx,
    })
}

/// Stops the ephemeral client and removes its address and routes unless the static plan
/// configured the same ones (then nothing flaps).
async fn retire(netlink: &Netlink, client: DhcpClient, plan: &crate::net::NetworkPlan) {
    let interface = client.interface().to_owned();
    let Some(lease) = client.stop(false).await else {
        return;
    };
    let same = plan
        .interfaces
        .iter()
        .any(|i| i.link.name == interface && i.addresses.contains(&IpNet::V4(lease.address)));
    log(&format!(
        "network: {interface}: {} the ephemeral DHCP lease {}",
        if same {
            "the same static address replaces"
        } else {
            "network_data.json's plan replaces"
        },
        lease.address
    ));
    remove_lease(netlink, &interface, plan, &lease).await;
}

async fn remove_lease(
    netlink: &Netlink,
    interface: &str,
    plan: &crate::net::NetworkPlan,
    lease: &crate::net::dhcp::Lease,
) {
    let Ok(Some(link)) = netlink
        .links()
        .await
        .map(|l| l.into_iter().find(|l| l.name == interface))
    else {
        return;
    };
    let planned = plan.interfaces.iter().find(|i| i.link.index == link.index);
    let keeps_route =
        |dest: IpNet| planned.is_some_and(|p| p.routes.iter().any(|r| r.destination == dest));
    for route in lease.routes() {
        if !keeps_route(IpNet::V4(route.destination)) {
            let _ = netlink
                .del_route(
                    link.index,
                    IpNet::V4(route.destination),
                    route.gateway.map(IpAddr::V4),
                )
                .await;
        }
    }
    if !planned.is_some_and(|p| p.addresses.contains(&IpNet::V4(lease.address))) {
        promote_secondaries(&link.name);
        let _ = netlink
            .del_address(link.index, IpNet::V4(lease.address))
            .await;
    }
}

/// Linux removes an interface's secondary IPv4 addresses along with its primary one unless
/// `promote_secondaries` is set. The plan's static address in the lease's subnet was added
/// after the lease's, so it is a secondary: without this it would go with the lease (found
/// by agent/tests/cloud_netns.rs), leaving the node without an address.
fn promote_secondaries(interface: &str) {
    if let Err(e) = crate::net::set_ipv4_conf(interface, "promote_secondaries", "1") {
        log(&format!("network: {e}"));
    }
}
