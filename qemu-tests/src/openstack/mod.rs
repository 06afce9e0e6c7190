//! The cluster on a real OpenStack (`make openstack-cluster`, docs/openstack.md): the
//! all-in-one cloud `scripts/openstack/up.sh` runs on this machine, the README's commands
//! (`examples/openstack/create-cluster.sh`, run as it is) create the image, network,
//! security group, ports and servers, and the scenarios check the cluster from the
//! namespace holding the outside end of the provider network's veth pair.
//!
//! Every change of a node's life goes through the `openstack` client, as a user's would:
//! `server delete` (the pivot), `server stop` (failover), `server start` (rejoin). The
//! consoles are the serial logs Nova keeps (what `openstack console log show` prints; the
//! `1b cloud` scenario checks them through the client); the stand-ins' journals are read
//! through their QEMU guest agents via libvirt.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::cluster::{ImageKind, MetadataSource, NodePlan, ServiceFault};
use crate::configdrive::NetworkMode;
use crate::guest::{GuestAgent, GuestChannel};
use crate::netns::Netns;
use crate::testbed::{Outside, Testbed};

pub mod scenarios;

/// Where `scripts/openstack/up.sh` keeps the admin's credentials.
pub const ADMIN_OPENRC: &str = "/var/lib/keelson-openstack/admin-openrc";
/// The namespace holding the outside end of the provider veth (`scripts/openstack/lib.sh`).
pub const OUTSIDE_NETNS: &str = "kos-outside";
/// Its interface there.
pub const OUTSIDE_IF: &str = "kos-out";
/// The outside's address on the machine network: outside the subnet's allocation pool.
pub const OUTSIDE_ADDRESS: &str = "10.0.0.250";
/// The cluster's tag, security group and network name (the script's `CLUSTER`).
pub const CLUSTER: &str = "ocp4";
/// The provider network's physical network (`scripts/openstack/lib.sh`).
pub const PHYSNET: &str = "keelson";
/// The Heat stack the run creates from `keelson build`'s template.
pub const HEAT_STACK: &str = "keelson-heat";
/// The flavors `scripts/openstack/bootstrap.sh` makes.
pub const APPLIANCE_FLAVOR: &str = "keelson.appliance";
/// The RHCOS stand-in's flavor.
pub const RHCOS_FLAVOR: &str = "keelson.rhcos";

/// Runs the `openstack` client as the cloud's admin.
#[derive(Debug, Clone)]
pub struct Client {
    env: Vec<(String, String)>,
}

impl Client {
    /// Reads the credentials `up.sh` wrote.
    pub fn admin() -> Result<Self> {
        let text = std::fs::read_to_string(ADMIN_OPENRC).with_context(|| {
            format!("reading {ADMIN_OPENRC} (scripts/openstack/up.sh writes it)")
        })?;
        let env = text
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    v.trim_matches('"').trim_matches('\'').to_owned(),
                )
            })
            .collect();
        Ok(Client { env })
    }

    /// The environment the client and the README's script run with.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            // Debian's Python programs, not a user's Python environment.
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env_remove("VIRTUAL_ENV");
        cmd
    }

    /// `openstack ARGS`: its standard output, or an error with its standard error.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command("/usr/bin/openstack")
            .args(args)
            .output()
            .context("running /usr/bin/openstack (scripts/openstack/install.sh installs it)")?;
        if !out.status.success() {
            bail!(
                "openstack {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `openstack ARGS -f json`, parsed.
    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-f", "json"]);
        let text = self.run(&all)?;
        serde_json::from_str(&text)
            .with_context(|| format!("openstack {}: expected JSON", args.join(" ")))
    }
}

/// One server as the run knows it.
#[derive(Debug, Clone)]
struct Server {
    id: String,
    /// The libvirt domain (`OS-EXT-SRV-ATTR:instance_name`).
    domain: String,
    /// Where the console of the current boot starts in Nova's console log.
    console_from: usize,
    running: bool,
}

/// Who boots what and how in one run (the script's environment).
#[derive(Debug, Clone)]
pub struct Deployment {
    /// The masters' names.
    pub masters: Vec<String>,
    /// The workers' names.
    pub workers: Vec<String>,
    /// What the masters boot.
    pub master_image: ImageKind,
    /// Nodes booted with `--config-drive true`; the others read the metadata service.
    pub config_drive: Vec<String>,
}

impl Deployment {
    /// The nodes, in boot order, with the addresses and MACs still unknown (Neutron
    /// assigns them; [`OpenStackCluster::start_all`] fills them in).
    pub fn plan(&self) -> Vec<NodePlan> {
        let node = |name: &str, role: &'static str, image| NodePlan {
            name: name.to_owned(),
            role,
            address: Ipv4Addr::UNSPECIFIED,
            mac: String::new(),
            source: if self.config_drive.iter().any(|n| n == name) {
                MetadataSource::ConfigDrive(NetworkMode::Dhcp)
            } else {
                MetadataSource::Service(NetworkMode::Dhcp, ServiceFault::None)
            },
            image,
        };
        let mut plan = vec![node("bootstrap", "bootstrap", ImageKind::Appliance)];
        plan.extend(
            self.masters
                .iter()
                .map(|m| node(m, "master", self.master_image)),
        );
        plan.extend(
            self.workers
                .iter()
                .map(|w| node(w, "worker", ImageKind::Appliance)),
        );
        plan
    }
}

/// The cluster on the all-in-one OpenStack.
#[derive(Debug)]
pub struct OpenStackCluster {
    /// The admin's client.
    pub client: Client,
    /// The build output the script uploads and boots from.
    pub out: PathBuf,
    /// The RHCOS stand-in's disk, when masters boot it.
    pub rhcos_disk: Option<PathBuf>,
    /// Who boots what.
    pub deployment: Deployment,
    /// Where the script's output goes.
    pub work: PathBuf,
    plan: Vec<NodePlan>,
    outside: Netns,
    servers: BTreeMap<String, Server>,
    /// How long the script took, and the image uploads in it.
    pub timings: BTreeMap<&'static str, Duration>,
}

impl OpenStackCluster {
    /// Prepares the cloud for a run: removes what an earlier, interrupted run left, makes
    /// the flat provider network the script finds (an admin's job on a real cloud) and puts
    /// the outside participant on it.
    pub fn new(
        work: &Path,
        out: &Path,
        rhcos_disk: Option<PathBuf>,
        deployment: Deployment,
    ) -> Result<Self> {
        let client = Client::admin()?;
        let outside = Netns::existing(OUTSIDE_NETNS);
        outside
            .ip(&[
                "addr",
                "replace",
                &format!("{OUTSIDE_ADDRESS}/16"),
                "dev",
                OUTSIDE_IF,
            ])
            .with_context(|| {
                format!("{OUTSIDE_NETNS}/{OUTSIDE_IF} (scripts/openstack/up.sh makes it)")
            })?;
        let cluster = OpenStackCluster {
            client,
            out: out.to_path_buf(),
            rhcos_disk,
            plan: deployment.plan(),
            deployment,
            work: work.to_path_buf(),
            outside,
            servers: BTreeMap::new(),
            timings: BTreeMap::new(),
        };
        cluster.clean()?;
        cluster.client.run(&[
            "network",
            "create",
            "--provider-network-type",
            "flat",
            "--provider-physical-network",
            PHYSNET,
            "--tag",
            CLUSTER,
            CLUSTER,
        ])?;
        Ok(cluster)
    }

    /// Deletes every stack, server, port, security group, subnet, network and image of a
    /// run (what is already gone is no error). One `openstack` command per kind of resource
    /// (each costs seconds of client start-up here), one per resource again only when that
    /// fails, so that one already gone does not stop the others.
    pub fn clean(&self) -> Result<()> {
        let c = &self.client;
        let delete = |args: &[&str], ids: &[String]| -> Result<()> {
            if ids.is_empty() {
                return Ok(());
            }
            let mut all = args.to_vec();
            all.extend(ids.iter().map(String::as_str));
            if c.run(&all).is_ok() {
                return Ok(());
            }
            for id in ids {
                let mut one = args.to_vec();
                one.push(id);
                match c.run(&one) {
                    Err(e) if !e.to_string().contains("found") => return Err(e),
                    _ => {}
                }
            }
            Ok(())
        };
        let ids = |list: &[&str], names: &[&str]| -> Result<Vec<String>> {
            Ok(as_list(c.json(list)?)
                .into_iter()
                .filter(|v| {
                    names.is_empty()
                        || names
                            .iter()
                            .any(|n| v["Name"] == *n || v["Stack Name"] == *n)
                })
                .filter_map(|v| v["ID"].as_str().map(str::to_owned))
                .collect())
        };
        for id in ids(&["stack", "list"], &[HEAT_STACK])? {
            delete(&["stack", "delete", "--yes", "--wait"], &[id])?;
        }
        // Deleted together (`server delete --wait` waits for each in turn), then waited for
        // as `--wait` does: until the list no longer has them (its bound: 300 s).
        let servers = ids(&["server", "list", "-c", "ID", "-c", "Name"], &[])?;
        delete(&["server", "delete"], &servers)?;
        let t = Instant::now();
        loop {
            let left: Vec<String> = ids(&["server", "list", "-c", "ID", "-c", "Name"], &[])?
                .into_iter()
                .filter(|id| servers.contains(id))
                .collect();
            if left.is_empty() {
                break;
            }
            ensure!(
                t.elapsed() < Duration::from_secs(300),
                "servers {left:?} not deleted after 300 s"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        delete(
            &["port", "delete"],
            &ids(&["port", "list", "--tags", CLUSTER, "-c", "ID"], &[])?,
        )?;
        delete(
            &["security", "group", "delete"],
            &ids(
                &["security", "group", "list", "-c", "ID", "-c", "Name"],
                &[CLUSTER],
            )?,
        )?;
        delete(
            &["network", "delete"],
            &ids(&["network", "list", "--name", CLUSTER, "-c", "ID"], &[])?,
        )?;
        delete(
            &["image", "delete"],
            &ids(
                &["image", "list", "-c", "ID", "-c", "Name"],
                &["keelson", "rhcos"],
            )?,
        )?;
        Ok(())
    }

    /// The script's environment for this run.
    fn script_env(&self) -> Vec<(&'static str, String)> {
        let d = &self.deployment;
        let mut env = vec![
            ("OUT", self.out.display().to_string()),
            ("CLUSTER", CLUSTER.to_owned()),
            ("MASTERS", d.masters.join(" ")),
            ("WORKERS", d.workers.join(" ")),
            ("FLAVOR", APPLIANCE_FLAVOR.to_owned()),
            ("WORKER_FLAVOR", APPLIANCE_FLAVOR.to_owned()),
            ("WORKER_IMAGE", "keelson".to_owned()),
            ("CONFIG_DRIVE", d.config_drive.join(" ")),
        ];
        match (&self.rhcos_disk, d.master_image) {
            (Some(disk), ImageKind::Standin) => {
                env.push(("RHCOS_QCOW2", disk.display().to_string()));
                env.push(("MASTER_FLAVOR", RHCOS_FLAVOR.to_owned()));
            }
            _ => {
                env.push(("RHCOS_IMAGE", "keelson".to_owned()));
                env.push(("MASTER_FLAVOR", APPLIANCE_FLAVOR.to_owned()));
            }
        }
        env
    }

    /// The server's record, fetched again.
    fn show(&self, name: &str) -> Result<Value> {
        self.client.json(&["server", "show", name])
    }

    /// Waits until `name`'s status is `status` (`ACTIVE`, `SHUTOFF`).
    fn wait_status(&self, name: &str, status: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let s = self.show(name)?;
            let now = s["status"].as_str().unwrap_or("").to_owned();
            if now == status {
                return Ok(());
            }
            ensure!(now != "ERROR", "{name} went to ERROR: {}", s["fault"]);
            if start.elapsed() > timeout {
                bail!("{name} is {now} after {timeout:?}, expected {status}");
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// Nova's serial log of the server (what `openstack console log show` reads).
    fn console_path(&self, name: &str) -> Option<PathBuf> {
        self.servers
            .get(name)
            .map(|s| PathBuf::from(format!("/var/lib/nova/instances/{}/console.log", s.id)))
    }

    fn console_all(&self, name: &str) -> String {
        self.console_path(name)
            .and_then(|p| std::fs::read(p).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// One field of `openstack server show NAME`.
    pub fn show_field(&self, name: &str, field: &str) -> Result<String> {
        let v = self.show(name)?;
        v[field]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("server {name}: no {field}"))
    }

    /// The ID of the node's port.
    pub fn port_id(&self, name: &str) -> Result<String> {
        self.ports()?
            .remove(name)
            .map(|(id, _, _)| id)
            .with_context(|| format!("no port {CLUSTER}-{name}"))
    }

    /// `openstack console log show NAME`.
    pub fn console_log_show(&self, name: &str) -> Result<String> {
        self.client.run(&["console", "log", "show", name])
    }

    /// The ports of the cluster: name (without the cluster prefix) to (ID, MAC, address).
    pub fn ports(&self) -> Result<BTreeMap<String, (String, String, Ipv4Addr)>> {
        let mut ports = BTreeMap::new();
        for p in as_list(
            self.client
                .json(&["port", "list", "--tags", CLUSTER, "--long"])?,
        ) {
            let name = p["Name"].as_str().unwrap_or_default();
            let Some(node) = name.strip_prefix(&format!("{CLUSTER}-")) else {
                continue;
            };
            let address = p["Fixed IP Addresses"]
                .as_array()
                .and_then(|a| a.first())
                .and_then(|f| f["ip_address"].as_str())
                .with_context(|| format!("port {name}: no fixed address"))?
                .parse()?;
            ports.insert(
                node.to_owned(),
                (
                    p["ID"].as_str().unwrap_or_default().to_owned(),
                    p["MAC Address"].as_str().unwrap_or_default().to_lowercase(),
                    address,
                ),
            );
        }
        Ok(ports)
    }
}

/// The PIDs of the processes running now (`/proc`).
pub fn pids() -> Result<Vec<u32>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect())
}

/// The PID of the QEMU process libvirt runs for `domain` (`-name guest=<domain>,...`).
fn qemu_pid(domain: &str) -> Result<u32> {
    let needle = format!("guest={domain},");
    for pid in pids()? {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg.starts_with(needle.as_bytes()))
        {
            return Ok(pid);
        }
    }
    bail!("no QEMU process runs libvirt domain {domain}")
}

/// A JSON list, or nothing.
fn as_list(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        _ => Vec::new(),
    }
}

impl Testbed for OpenStackCluster {
    fn plan(&self) -> &[NodePlan] {
        &self.plan
    }

    fn out_dir(&self) -> &std::path::Path {
        &self.out
    }

    fn outside(&self) -> Outside<'_> {
        Outside {
            netns: &self.outside,
            iface: OUTSIDE_IF,
            address: OUTSIDE_ADDRESS
                .parse()
                .expect("OUTSIDE_ADDRESS is an address"),
        }
    }

    /// Runs the README's script as it is, then learns each node's port (MAC and address,
    /// which Neutron chose) and server.
    fn start_all(&mut self) -> Result<()> {
        let script = crate::payload::workspace().join("examples/openstack/create-cluster.sh");
        let log = self.work.join("create-cluster.log");
        let start = Instant::now();
        let status = self
            .client
            .command("sh")
            .arg("-x")
            .arg(&script)
            .envs(self.script_env())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(&log)?.try_clone()?)
            .status()
            .context("running examples/openstack/create-cluster.sh")?;
        self.timings.insert("create-cluster.sh", start.elapsed());
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            bail!(
                "examples/openstack/create-cluster.sh failed ({status}); its last lines ({}):\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let ports = self.ports()?;
        for node in &mut self.plan {
            let (_, mac, address) = ports
                .get(&node.name)
                .with_context(|| format!("no port {CLUSTER}-{} after the script", node.name))?;
            node.mac = mac.clone();
            node.address = *address;
        }
        for node in self.plan.clone() {
            let s = self.show(&node.name)?;
            self.servers.insert(
                node.name.clone(),
                Server {
                    id: s["id"].as_str().unwrap_or_default().to_owned(),
                    domain: s["OS-EXT-SRV-ATTR:instance_name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    console_from: 0,
                    running: true,
                },
            );
        }
        for node in self.plan.clone() {
            self.wait_status(&node.name, "ACTIVE", Duration::from_secs(300))?;
        }
        Ok(())
    }

    /// `openstack server start`: the same disk boots again.
    fn restart(&mut self, name: &str) -> Result<()> {
        let from = self.console_all(name).len();
        self.client.run(&["server", "start", name])?;
        self.wait_status(name, "ACTIVE", Duration::from_secs(120))?;
        // Nova's console log starts anew with each boot or goes on; either way only what
        // follows the old end belongs to this boot.
        let now = self.console_all(name).len();
        if let Some(s) = self.servers.get_mut(name) {
            s.console_from = if now < from { 0 } else { from };
            s.running = true;
        }
        Ok(())
    }

    /// `openstack server delete`: the node is gone for good.
    fn power_off(&mut self, name: &str) -> Result<()> {
        self.client.run(&["server", "delete", "--wait", name])?;
        if let Some(s) = self.servers.get_mut(name) {
            s.running = false;
        }
        Ok(())
    }

    /// `openstack server stop`, which this cloud's Nova carries out as a failing host
    /// would: it powers the guest off at once (`shutdown_timeout = 0`,
    /// scripts/openstack/configure.sh; with Nova's default the guest gets 60 s to shut down
    /// and the agent says goodbye). The command reaches the guest seconds after it starts,
    /// and its QEMU process exits a while after the guest stopped (libvirt's destroy: QEMU
    /// pauses the CPUs, then flushes and closes its disks): the node went down at its last
    /// answer to a TCP connection attempt every 20 ms from the outside ([`LastAnswer`]), or
    /// at the exit if it answered none.
    fn kill(&mut self, name: &str) -> Result<Instant> {
        let domain = self
            .servers
            .get(name)
            .map(|s| s.domain.clone())
            .with_context(|| format!("{name}: no server"))?;
        let pid = qemu_pid(&domain)?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let watcher = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(150);
            while Instant::now() < deadline {
                if !proc_dir.exists() {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        });
        let address = self
            .plan
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.address)
            .with_context(|| format!("{name}: not in the plan"))?;
        let pings = LastAnswer::start(&self.outside, address)?;
        let requested = Instant::now();
        self.client.run(&["server", "stop", name])?;
        self.wait_status(name, "SHUTOFF", Duration::from_secs(120))?;
        if let Some(s) = self.servers.get_mut(name) {
            s.running = false;
        }
        let exited = watcher.join().ok().flatten().with_context(|| {
            format!("{name} is SHUTOFF but its QEMU process {pid} ({domain}) did not exit")
        })?;
        let last = pings.stop().filter(|&t| t >= requested && t <= exited);
        eprintln!(
            "openstack-cluster: {name}: `server stop` took {} to end QEMU; its last answer on :6443 {}",
            crate::report::secs(exited - requested),
            last.map_or("none after the request".to_owned(), |t| format!(
                "{} ms after the request, {} ms before QEMU exited",
                (t - requested).as_millis(),
                (exited - t).as_millis()
            ))
        );
        Ok(last.unwrap_or(exited))
    }

    fn is_running(&self, name: &str) -> bool {
        self.servers.get(name).is_some_and(|s| s.running)
    }

    fn console_text(&self, name: &str) -> String {
        let all = self.console_all(name);
        let from = self.servers.get(name).map(|s| s.console_from).unwrap_or(0);
        all.get(from..).unwrap_or(&all).to_owned()
    }

    fn wait_console(&mut self, name: &str, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.console_text(name).lines().find(|l| l.contains(needle)) {
                return Ok(line.to_owned());
            }
            if Instant::now() > deadline {
                bail!("{name}: no console line with {needle:?} within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn guest(&self, name: &str) -> Option<GuestAgent> {
        let s = self.servers.get(name)?;
        (self.is_standin(name) && s.running).then(|| GuestAgent {
            channel: GuestChannel::Libvirt(s.domain.clone()),
        })
    }
}

/// A TCP connection attempt every 20 ms from the outside namespace to a node's port 6443
/// (the security group lets it in on every node; ICMP it does not), for the moment the
/// node last answered: a connection or a refusal (RST) both come from a running guest.
struct LastAnswer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Option<Instant>>,
}

impl LastAnswer {
    fn start(outside: &Netns, address: Ipv4Addr) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let path = format!("/run/netns/{}", outside.name);
        let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        let target = std::net::SocketAddr::from((address, 6443));
        let thread = std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            let mut last = None;
            while !flag.load(Ordering::Relaxed) {
                match std::net::TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
                    Ok(_) => last = Some(Instant::now()),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        last = Some(Instant::now());
                    }
                    Err(_) => {}
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last
        });
        Ok(Self { stop, thread })
    }

    /// Stops the attempts; when the last answer arrived, if any did.
    fn stop(self) -> Option<Instant> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}
