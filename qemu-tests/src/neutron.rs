//! The harness's namespace plays Neutron for the VMs, as a stock OpenStack network does:
//!
//! - [`Dhcp`]: dnsmasq with one fixed address per MAC (Neutron's DHCP agent runs dnsmasq the
//!   same way), the interface MTU (option 26), DNS, and the route to the metadata service as
//!   a classless static route (option 121), which is how Neutron's isolated metadata reaches
//!   instances on a network without a router.
//! - [`MetadataService`]: `http://169.254.169.254/openstack/latest/...` answering each
//!   instance by its source address, as Neutron's metadata proxy does, with the faults a
//!   real one shows (404 for `network_data.json`, slow answers).
//!
//! Both run only inside the namespace the harness created.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::netns::{HarnessNetns, Netns};

/// The metadata service's address.
pub const METADATA_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// One instance as the DHCP server knows it.
#[derive(Debug, Clone)]
pub struct DhcpHost {
    /// MAC address.
    pub mac: String,
    /// Its fixed address.
    pub address: Ipv4Addr,
    /// Host name.
    pub name: String,
}

/// dnsmasq serving the segment from the namespace.
#[derive(Debug)]
pub struct Dhcp {
    child: Child,
    /// dnsmasq's log (`--log-dhcp`).
    pub log: PathBuf,
    /// Its lease file.
    pub leases: PathBuf,
}

/// How the DHCP server is set up.
#[derive(Debug, Clone)]
pub struct DhcpSettings {
    /// The interface in the namespace.
    pub interface: String,
    /// The namespace's own address on it (the next hop to the metadata service).
    pub server: Ipv4Addr,
    /// The segment's prefix length.
    pub prefix: u8,
    /// MTU handed out.
    pub mtu: u16,
    /// Lease time in seconds (dnsmasq's minimum is 120).
    pub lease_secs: u32,
    /// The DNS servers handed out (option 6); `server` when empty.
    pub dns: Vec<Ipv4Addr>,
}

impl Dhcp {
    /// Starts dnsmasq in `ns` with a fixed address for each of `hosts`; files go to `work`.
    pub fn start(
        ns: &Netns,
        settings: &DhcpSettings,
        hosts: &[DhcpHost],
        work: &Path,
    ) -> Result<Self> {
        let dnsmasq = crate::tools::require("dnsmasq")?;
        let log = work.join("dnsmasq.log");
        let leases = work.join("dnsmasq.leases");
        let hostsfile = work.join("dnsmasq.hosts");
        let _ = std::fs::remove_file(&log);
        let _ = std::fs::remove_file(&leases);
        let text: String = hosts
            .iter()
            .map(|h| format!("{},{},{}\n", h.mac, h.address, h.name))
            .collect();
        std::fs::write(&hostsfile, text)?;
        let net = ipnet::Ipv4Net::new(settings.server, settings.prefix)?.network();
        let mut cmd = ns.exec(&dnsmasq);
        cmd.args([
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=0",
            "--log-dhcp",
        ])
        .arg(format!("--interface={}", settings.interface))
        .arg("--bind-interfaces")
        // Only the fixed addresses, as Neutron configures its dnsmasq.
        .arg(format!(
            "--dhcp-range={net},static,{},{}",
            ipnet::Ipv4Net::new(settings.server, settings.prefix)?.netmask(),
            settings.lease_secs
        ))
        .arg(format!("--dhcp-hostsfile={}", hostsfile.display()))
        .arg(format!("--dhcp-option=option:mtu,{}", settings.mtu))
        .arg(format!(
            "--dhcp-option=option:dns-server,{}",
            if settings.dns.is_empty() {
                settings.server.to_string()
            } else {
                settings
                    .dns
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        ))
        .arg(format!(
            "--dhcp-option=option:classless-static-route,{METADATA_ADDRESS}/32,{}",
            settings.server
        ))
        .arg(format!("--dhcp-leasefile={}", leases.display()))
        .arg(format!("--log-facility={}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("starting dnsmasq")?;
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("DHCP, static leases only") || text.contains("DHCP, IP range") {
                break;
            }
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                bail!("dnsmasq exited ({status}): {err}{text}");
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!("dnsmasq did not start within 10 s: {text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Dhcp { child, log, leases })
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many DHCPACKs went to `mac` (a renewal makes the second).
    pub fn acks_for(&self, mac: &str) -> usize {
        self.log_text()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(mac))
            .count()
    }

    /// Whether the lease file holds a lease for `mac`.
    pub fn has_lease(&self, mac: &str) -> bool {
        std::fs::read_to_string(&self.leases)
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(mac))
    }
}

impl Drop for Dhcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the metadata service knows about one instance.
#[derive(Debug, Clone, Default)]
pub struct Instance {
    /// `openstack/latest/meta_data.json`.
    pub meta_data: Vec<u8>,
    /// `openstack/latest/network_data.json`; `None` answers 404.
    pub network_data: Option<Vec<u8>>,
    /// `openstack/latest/user_data`.
    pub user_data: Vec<u8>,
    /// Every answer to this instance waits this long first (an overloaded service).
    pub delay: Duration,
}

/// One request the service answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Source address.
    pub from: IpAddr,
    /// Path.
    pub path: String,
    /// Status sent.
    pub status: u16,
}

/// The metadata service, on 169.254.169.254:80 inside the namespace.
#[derive(Debug)]
pub struct MetadataService {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Every request answered, in order.
    pub served: Arc<Mutex<Vec<Served>>>,
}

impl MetadataService {
    /// Adds 169.254.169.254/32 to `interface` in `ns` and serves `instances` (by source
    /// address) until dropped.
    pub fn start(
        ns: &Netns,
        interface: &str,
        instances: BTreeMap<Ipv4Addr, Instance>,
    ) -> Result<Self> {
        ns.try_ip(&[
            "addr",
            "add",
            &format!("{METADATA_ADDRESS}/32"),
            "dev",
            interface,
        ])?;
        let listener = ns.bind_tcp(SocketAddr::new(METADATA_ADDRESS.into(), 80))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let instances = Arc::new(instances);
        let thread = {
            let (stop, served) = (stop.clone(), served.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, peer)) => {
                            let (instances, served) = (instances.clone(), served.clone());
                            std::thread::spawn(move || {
                                let _ = answer(conn, peer, &instances, &served);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        Ok(MetadataService {
            stop,
            thread: Some(thread),
            served,
        })
    }

    /// The requests answered to `from`.
    pub fn served_to(&self, from: Ipv4Addr) -> Vec<Served> {
        self.served
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|r| r.from == IpAddr::V4(from))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for MetadataService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves one HTTP/1.x request. Hand-written on purpose: a test fixture that must answer
/// slowly or wrongly on demand, for three GET paths, is simpler as this than as a server
/// framework's middleware.
fn answer(
    conn: TcpStream,
    peer: SocketAddr,
    instances: &BTreeMap<Ipv4Addr, Instance>,
    served: &Mutex<Vec<Served>>,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let mut words = request_line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
    let instance = match peer.ip() {
        IpAddr::V4(v4) => instances.get(&v4),
        IpAddr::V6(_) => None,
    };
    let body = match (method, instance) {
        ("GET", Some(i)) => {
            std::thread::sleep(i.delay);
            match path {
                "/openstack/latest/meta_data.json" => Some(i.meta_data.clone()),
                "/openstack/latest/network_data.json" => i.network_data.clone(),
                "/openstack/latest/user_data" => Some(i.user_data.clone()),
                _ => None,
            }
        }
        _ => None,
    };
    let status = if body.is_some() { 200 } else { 404 };
    let body = body.unwrap_or_default();
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if status == 200 { "OK" } else { "Not Found" },
        body.len()
    )?;
    conn.write_all(&body)?;
    if let Ok(mut s) = served.lock() {
        s.push(Served {
            from: peer.ip(),
            path: path.to_owned(),
            status,
        });
    }
    Ok(())
}
