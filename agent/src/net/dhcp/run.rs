//! The DHCP client's I/O edge: a UDP socket on port 68 bound to the interface, netlink for
//! the lease, a watch value with the current lease for whoever waits on it.
//!
//! Nothing here ends the client but `stop`: a netlink call that fails is retried with the
//! agent's backoff (the lease is kept and applied again), and an interface that vanishes
//! (deleted, or its driver reset) is looked for again by MAC address until it is back, when
//! the client starts over. Each failure says on the console what failed and what happens next.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use ipnet::{IpNet, Ipv4Net};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Action, Client, Destination, Lease, LeaseRoute, decode, encode};
use crate::net::mac::Mac;
use crate::net::{LinkInfo, Netlink};
use crate::retry::Backoff;

/// How the client behaves.
#[derive(Debug, Clone, Default)]
pub struct DhcpOptions {
    /// Host name sent in requests (option 12).
    pub hostname: Option<String>,
    /// Overrides the server's T1 (tests shorten renewal this way).
    pub t1_override: Option<Duration>,
}

/// A DHCP client running on one interface (see [`DhcpClient::spawn`]).
#[derive(Debug)]
pub struct DhcpClient {
    stop: CancellationToken,
    release: Arc<AtomicBool>,
    lease: watch::Receiver<Option<Lease>>,
    task: tokio::task::JoinHandle<()>,
    interface: String,
}

impl DhcpClient {
    /// Starts a client on `link` that publishes each lease's DNS servers on `dns`. It stops
    /// (releasing its lease) when `parent` is cancelled, or through [`DhcpClient::stop`].
    pub fn spawn(
        netlink: Netlink,
        link: LinkInfo,
        options: DhcpOptions,
        dns: watch::Sender<Vec<IpAddr>>,
        parent: &CancellationToken,
    ) -> Self {
        let stop = parent.child_token();
        let release = Arc::new(AtomicBool::new(true));
        let (lease_tx, lease) = watch::channel(None);
        let interface = link.name.clone();
        let task = {
            let (stop, release) = (stop.clone(), release.clone());
            tokio::spawn(async move {
                if let Err(e) =
                    run_client(netlink, link, options, dns, lease_tx, stop, release).await
                {
                    crate::log::console(&format!("dhcp: {e:#}"));
                }
            })
        };
        DhcpClient {
            stop,
            release,
            lease,
            task,
            interface,
        }
    }

    /// The interface it runs on.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The current lease (`None` until the first ACK and after an expiry).
    pub fn lease(&self) -> watch::Receiver<Option<Lease>> {
        self.lease.clone()
    }

    /// Waits for a lease, saying every 10 s on the console that it still waits.
    pub async fn wait_for_lease(&self, stop: &CancellationToken) -> Option<Lease> {
        let mut rx = self.lease.clone();
        let start = tokio::time::Instant::now();
        let mut tick =
            tokio::time::interval_at(start + Duration::from_secs(10), Duration::from_secs(10));
        loop {
            if let Some(lease) = rx.borrow_and_update().clone() {
                return Some(lease);
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                changed = rx.changed() => if changed.is_err() { return None },
                _ = tick.tick() => crate::log::console(&format!(
                    "network: still waiting for a DHCP lease on {} ({} s)",
                    self.interface,
                    start.elapsed().as_secs()
                )),
            }
        }
    }

    /// Stops the client. With `release` it sends DHCPRELEASE and removes the lease's address
    /// and routes (shutdown); without, it leaves them as they are and returns the lease, for
    /// a caller that hands the interface over to a static configuration.
    pub async fn stop(self, release: bool) -> Option<Lease> {
        let lease = self.lease.borrow().clone();
        self.release.store(release, Ordering::SeqCst);
        self.stop.cancel();
        let _ = self.task.await;
        lease
    }
}

/// Runs a client on `link` until `stop`, releasing the lease at the end (the namespace tests
/// and simple callers; PID 1 uses [`DhcpClient`]).
pub async fn run(
    netlink: Netlink,
    link: LinkInfo,
    hostname: Option<String>,
    t1_override: Option<Duration>,
    dns: watch::Sender<Vec<IpAddr>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (lease_tx, _) = watch::channel(None);
    let options = DhcpOptions {
        hostname,
        t1_override,
    };
    run_client(
        netlink,
        link,
        options,
        dns,
        lease_tx,
        stop,
        Arc::new(AtomicBool::new(true)),
    )
    .await
}

fn socket_on(interface: &str) -> std::io::Result<tokio::net::UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_broadcast(true)?;
    socket.bind_device(Some(interface.as_bytes()))?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68).into())?;
    tokio::net::UdpSocket::from_std(socket.into())
}

/// What the lease put on the interface, so a new lease or an expiry can take it away again.
#[derive(Debug, Clone, Default)]
struct Applied {
    address: Option<Ipv4Net>,
    routes: Vec<LeaseRoute>,
}

/// Why the inner loop ended.
enum Ended {
    Stopped,
    LinkGone(String),
}

async fn run_client(
    netlink: Netlink,
    link: LinkInfo,
    options: DhcpOptions,
    dns: watch::Sender<Vec<IpAddr>>,
    lease_tx: watch::Sender<Option<Lease>>,
    stop: CancellationToken,
    release: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let Mac(mac) = link
        .mac
        .parse::<Mac>()
        .with_context(|| format!("{}: interface has no MAC address", link.name))?;
    let mut link = link;
    let mut waiting = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        let socket = match socket_on(&link.name) {
            Ok(s) => s,
            Err(e) => {
                let delay = waiting.next_delay();
                crate::log::console(&format!(
                    "dhcp: {}: opening the DHCP socket: {e}; retrying in {:.1} s",
                    link.name,
                    delay.as_secs_f64()
                ));
                if sleep_or_stop(delay, &stop).await {
                    return Ok(());
                }
                link = find_link(&netlink, &link, &stop).await?;
                continue;
            }
        };
        let mut session = Session {
            netlink: &netlink,
            link: &link,
            socket,
            client: Client::new(
                mac,
                options.hostname.clone(),
                crate::retry::random_u64() as u32,
            ),
            applied: Applied::default(),
            pending: None,
            retry_apply: Backoff::new(Duration::from_millis(500), Duration::from_secs(10)),
            dns: &dns,
            lease_tx: &lease_tx,
        };
        session.client.t1_override = options.t1_override;
        match session.run(&stop).await {
            Ended::Stopped => {
                session.finish(release.load(Ordering::SeqCst)).await;
                return Ok(());
            }
            Ended::LinkGone(why) => {
                crate::log::console(&format!(
                    "dhcp: {} ({}): {why}; looking for the interface again",
                    link.name, link.mac
                ));
                lease_tx.send_replace(None);
                link = find_link(&netlink, &link, &stop).await?;
                waiting.reset();
                crate::log::console(&format!(
                    "dhcp: {} ({}) is back (index {}); asking for a lease again",
                    link.name, link.mac, link.index
                ));
            }
        }
    }
}

/// Sleeps `delay`; true when `stop` came first.
async fn sleep_or_stop(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(delay) => false,
    }
}

/// Waits until a link with `old`'s MAC exists (it may come back under another index or name)
/// and is up. Errors only when stopped.
async fn find_link(
    netlink: &Netlink,
    old: &LinkInfo,
    stop: &CancellationToken,
) -> anyhow::Result<LinkInfo> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
    let mut said = false;
    loop {
        match netlink.links().await {
            Ok(links) => {
                if let Some(found) = links.into_iter().find(|l| l.mac == old.mac) {
                    match netlink.set_up(found.index, None).await {
                        Ok(()) => return Ok(found),
                        Err(e) => crate::log::console(&format!(
                            "dhcp: {}: setting the link up: {e}",
                            found.name
                        )),
                    }
                } else if !said {
                    crate::log::console(&format!(
                        "dhcp: no interface with MAC {} (was {}); waiting for it",
                        old.mac, old.name
                    ));
                    said = true;
                }
            }
            Err(e) => crate::log::console(&format!("dhcp: listing interfaces: {e}")),
        }
        if sleep_or_stop(backoff.next_delay(), stop).await {
            anyhow::bail!("stopped while waiting for {}", old.name);
        }
    }
}

/// One run of the state machine on one socket and link.
struct Session<'a> {
    netlink: &'a Netlink,
    link: &'a LinkInfo,
    socket: tokio::net::UdpSocket,
    client: Client,
    applied: Applied,
    /// A lease whose configuration failed and is tried again.
    pending: Option<Lease>,
    retry_apply: Backoff,
    dns: &'a watch::Sender<Vec<IpAddr>>,
    lease_tx: &'a watch::Sender<Option<Lease>>,
}

/// Errors that mean the interface is gone (or going).
fn link_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENODEV) | Some(libc::ENXIO) | Some(libc::ENETDOWN)
    )
}

impl Session<'_> {
    async fn run(&mut self, stop: &CancellationToken) -> Ended {
        let start = tokio::time::Instant::now();
        let mut actions = self.client.start(start.elapsed());
        let mut buf = vec![0u8; 1500];
        let mut link_check = tokio::time::interval(Duration::from_secs(2));
        let mut apply_at: Option<tokio::time::Instant> = None;
        loop {
            for action in std::mem::take(&mut actions) {
                match action {
                    Action::Send(msg, dest) => {
                        let to = match dest {
                            Destination::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, 67),
                            Destination::Server(s) => SocketAddrV4::new(s, 67),
                        };
                        let Some(bytes) = encode(&msg) else { continue };
                        if let Err(e) = self.socket.send_to(&bytes, to).await {
                            if link_gone(&e) {
                                return Ended::LinkGone(format!("sending to {to}: {e}"));
                            }
                            crate::log::console(&format!(
                                "dhcp: {}: sending to {to}: {e} (the client retransmits)",
                                self.link.name
                            ));
                        }
                    }
                    Action::Apply(lease) => {
                        self.pending = Some(lease);
                        self.retry_apply.reset();
                        apply_at = Some(tokio::time::Instant::now());
                    }
                    Action::Expire(lease) => {
                        crate::log::console(&format!(
                            "dhcp: {} lease {} expired",
                            self.link.name, lease.address
                        ));
                        self.pending = None;
                        apply_at = None;
                        self.lease_tx.send_replace(None);
                        self.unapply().await;
                    }
                }
            }
            if let Some(at) = apply_at
                && at <= tokio::time::Instant::now()
            {
                apply_at = self.apply_pending().await;
            }
            let wait = self.client.next_timer().saturating_sub(start.elapsed());
            let retry_apply = async {
                match apply_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                _ = tokio::time::sleep(wait) => actions = self.client.on_timer(start.elapsed()),
                _ = retry_apply => {}
                _ = link_check.tick() => {
                    match self.netlink.link_by_index(self.link.index).await {
                        Ok(Some(l)) if l.mac == self.link.mac => {}
                        Ok(_) => return Ended::LinkGone("the interface is gone".into()),
                        Err(e) => crate::log::console(&format!("dhcp: {}: checking the link: {e}", self.link.name)),
                    }
                }
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((n, _)) => {
                        if let Some(msg) = decode(&buf[..n]) {
                            actions = self.client.on_packet(&msg, start.elapsed());
                        }
                    }
                    Err(e) if link_gone(&e) => return Ended::LinkGone(format!("receiving: {e}")),
                    Err(e) => crate::log::console(&format!("dhcp: {}: receiving: {e}", self.link.name)),
                },
            }
        }
    }

    /// Configures the pending lease; on failure says so and returns when to try again.
    async fn apply_pending(&mut self) -> Option<tokio::time::Instant> {
        let lease = self.pending.clone()?;
        match self.apply(&lease).await {
            Ok(()) => {
                self.pending = None;
                crate::log::console(&format!(
                    "dhcp: {} lease {} routes [{}] mtu {} dns {:?} for {} s",
                    self.link.name,
                    lease.address,
                    lease
                        .routes()
                        .iter()
                        .map(|r| match r.gateway {
                            Some(gw) => format!("{} via {gw}", r.destination),
                            None => format!("{} on-link", r.destination),
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    lease.mtu.map_or("-".into(), |m| m.to_string()),
                    lease.dns,
                    lease.lease.as_secs()
                ));
                self.dns
                    .send_replace(lease.dns.iter().map(|d| (*d).into()).collect());
                self.lease_tx.send_replace(Some(lease));
                None
            }
            Err(e) => {
                let delay = self.retry_apply.next_delay();
                crate::log::console(&format!(
                    "dhcp: {}: configuring lease {}: {e:#}; retrying in {:.1} s",
                    self.link.name,
                    lease.address,
                    delay.as_secs_f64()
                ));
                Some(tokio::time::Instant::now() + delay)
            }
        }
    }

    /// MTU, address, routes; the previous lease's address and routes go if they changed.
    async fn apply(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let index = self.link.index;
        if let Some(mtu) = lease.mtu {
            self.netlink
                .set_up(index, Some(u32::from(mtu)))
                .await
                .with_context(|| format!("setting MTU {mtu}"))?;
        }
        if self.applied.address.is_some_and(|a| a != lease.address) {
            self.unapply().await;
        }
        self.netlink
            .add_address(index, IpNet::V4(lease.address))
            .await
            .with_context(|| format!("adding address {}", lease.address))?;
        self.applied.address = Some(lease.address);
        let routes = lease.routes();
        for stale in self.applied.routes.clone() {
            if !routes.contains(&stale) {
                let _ = self
                    .netlink
                    .del_route(
                        index,
                        IpNet::V4(stale.destination),
                        stale.gateway.map(IpAddr::V4),
                    )
                    .await;
            }
        }
        // On-link routes first: a classless route's gateway may only be reachable through one.
        let mut ordered = routes.clone();
        ordered.sort_by_key(|r| r.gateway.is_some());
        for route in &ordered {
            self.netlink
                .add_route_via(
                    index,
                    IpNet::V4(route.destination),
                    route.gateway.map(IpAddr::V4),
                )
                .await
                .with_context(|| format!("adding route {}", route.destination))?;
        }
        self.applied.routes = routes;
        Ok(())
    }

    /// Removes what the last lease configured.
    async fn unapply(&mut self) {
        let index = self.link.index;
        for route in std::mem::take(&mut self.applied.routes) {
            let _ = self
                .netlink
                .del_route(
                    index,
                    IpNet::V4(route.destination),
                    route.gateway.map(IpAddr::V4),
                )
                .await;
        }
        if let Some(address) = self.applied.address.take() {
            let _ = self.netlink.del_address(index, IpNet::V4(address)).await;
        }
    }

    /// On stop: RELEASE and clean up, or leave everything for a handover.
    async fn finish(&mut self, release: bool) {
        if !release {
            return;
        }
        if let Some(lease) = self.client.lease().cloned()
            && let Some((msg, Destination::Server(server))) = self.client.release()
        {
            if let Some(bytes) = encode(&msg) {
                let _ = self
                    .socket
                    .send_to(&bytes, SocketAddrV4::new(server, 67))
                    .await;
            }
            tracing::info!("dhcp: released {}", lease.address);
        }
        self.unapply().await;
        self.lease_tx.send_replace(None);
    }
}
