//! The cluster on a real OpenStack (`make openstack-cluster`, docs/openstack.md): the
//! all-in-one cloud `scripts/openstack/up.sh` runs on this machine, and the README's scripts
//! (`examples/openstack/create-cluster.sh` and `delete-cluster.sh`, run as they are) make and
//! remove the images, the tenant network and its router to the external network, the
//! security group, the VIP ports with their floating IPs, the nodes' ports and the servers.
//! The scenarios check the cluster from two places: a namespace on the machine network (a
//! bastion's view: ARP, DNS, the Ignition and metrics ports), whose veth the harness plugs
//! into the tenant network's bridge, and the external network (the world's view: the
//! floating IPs), from the host and from the namespace holding the external network's
//! gateway.
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
/// The namespace on the machine network (a bastion's view), made by the harness.
pub const MACHINE_NETNS: &str = "kos-machine";
/// Its interface there; the other end of the veth is in the tenant network's bridge.
pub const MACHINE_IF: &str = "kos-m";
/// The veth's end in the bridge.
pub const MACHINE_HOST_IF: &str = "kos-mach";
/// Its address: on the machine network, below the allocation pool (openstack.json's starts
/// at .10), not a VIP (.5, .7) nor the router (.1).
pub const MACHINE_ADDRESS: &str = "10.0.0.9";
/// The namespace holding the external network's gateway (`scripts/openstack/lib.sh`): the
/// world's view of the floating IPs.
pub const EXTERNAL_NETNS: &str = "kos-outside";
/// The external network an admin made (`scripts/openstack/bootstrap.sh`).
pub const EXTERNAL_NETWORK: &str = "public";
/// The host's address on it (`OS_PUBLIC_API`): where `keelson status` runs from, the only
/// source the run lets reach the status port.
pub const HOST_PUBLIC: &str = "172.24.4.2";
/// The floating IPs the run creates as an operator would before writing install-config:
/// the API's, the ingress's, and one attached elsewhere (the "in use" case).
pub const API_FIP: &str = "172.24.4.50";
/// See [`API_FIP`].
pub const INGRESS_FIP: &str = "172.24.4.51";
/// See [`API_FIP`].
pub const SPARE_FIP: &str = "172.24.4.52";
/// The cluster's name, tag and resource prefix (install-config's metadata.name).
pub const CLUSTER: &str = "ocp4";
/// Another cluster in the same project (a network and a security group of its own), which
/// the delete must leave alone and whose name a create must refuse.
pub const OTHER_CLUSTER: &str = "ocp4-other";
/// The Heat stack the run previews from `keelson build`'s template.
pub const HEAT_STACK: &str = "keelson-heat";
/// The flavors `scripts/openstack/bootstrap.sh` makes.
pub const APPLIANCE_FLAVOR: &str = "keelson.appliance";
/// The RHCOS stand-in's flavor.
pub const RHCOS_FLAVOR: &str = "keelson.rhcos";

/// The tag of cluster `name` (what `keelson build` writes in openstack.json).
pub fn tag(name: &str) -> String {
    format!("keelson-cluster={name}")
}

/// The install-config the run builds from: the example's, with the floating IPs and the
/// external network as an operator writes them.
pub fn install_config(example: &str) -> String {
    example.replacen(
        "    cloud: openstack\n",
        &format!(
            "    cloud: openstack\n    externalNetwork: {EXTERNAL_NETWORK}\n    apiFloatingIP: {API_FIP}\n    ingressFloatingIP: {INGRESS_FIP}\n"
        ),
        1,
    )
}

/// Runs every job at once (each `openstack` command costs seconds of start-up); their
/// results in order.
pub fn parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> Result<T> + Send + '_>>) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.into_iter().map(|j| s.spawn(j)).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a job panicked"))?)
            .collect()
    })
}

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
    /// The bootstrap boots from a pointer to its config hosted in Glance
    /// (`HOST_BOOTSTRAP=always`), whatever its size.
    pub hosted_bootstrap: bool,
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
    /// Where the scripts' output goes.
    pub work: PathBuf,
    plan: Vec<NodePlan>,
    /// The machine network's namespace (the scenarios' outside participant).
    outside: Netns,
    /// The external network's namespace.
    pub external: Netns,
    servers: BTreeMap<String, Server>,
    /// The floating IPs' IDs by address.
    pub floating_ips: BTreeMap<String, String>,
    /// How long the scripts took, and the image uploads in them.
    pub timings: BTreeMap<&'static str, Duration>,
}

/// What a run of one of the README's scripts did.
#[derive(Debug)]
pub struct ScriptRun {
    /// Whether it exited 0.
    pub success: bool,
    /// Its standard output and error (with `sh -x`'s trace).
    pub log: String,
    /// How long it took.
    pub took: Duration,
}

impl ScriptRun {
    /// Its own lines (not the trace), for a report.
    pub fn said(&self) -> Vec<&str> {
        self.log
            .lines()
            .filter(|l| {
                l.starts_with("create-cluster:")
                    || l.starts_with("delete-cluster:")
                    || l.starts_with("DNS")
                    || l.starts_with("  ")
            })
            .collect()
    }
}

impl OpenStackCluster {
    /// Prepares the cloud for a run: removes what an earlier, interrupted run left (with the
    /// delete script), then makes what an operator has before running the create script —
    /// the floating IPs install-config names (and a spare one) — and another cluster in the
    /// same project, which the run must leave alone.
    pub fn new(
        work: &Path,
        out: &Path,
        rhcos_disk: Option<PathBuf>,
        deployment: Deployment,
    ) -> Result<Self> {
        let client = Client::admin()?;
        let mut cluster = OpenStackCluster {
            client,
            out: out.to_path_buf(),
            rhcos_disk,
            plan: deployment.plan(),
            deployment,
            work: work.to_path_buf(),
            outside: Netns::try_named(MACHINE_NETNS)?,
            external: Netns::existing(EXTERNAL_NETNS),
            servers: BTreeMap::new(),
            floating_ips: BTreeMap::new(),
            timings: BTreeMap::new(),
        };
        cluster.clean()?;
        let c = &cluster.client;
        let other = tag(OTHER_CLUSTER);
        let fip =
            |address: &'static str| -> Box<dyn FnOnce() -> Result<(String, String)> + Send + '_> {
                Box::new(move || {
                    let v = c.json(&[
                        "floating",
                        "ip",
                        "create",
                        "--floating-ip-address",
                        address,
                        EXTERNAL_NETWORK,
                    ])?;
                    Ok((
                        address.to_owned(),
                        v["id"].as_str().unwrap_or_default().to_owned(),
                    ))
                })
            };
        let made = parallel(vec![
            fip(API_FIP),
            fip(INGRESS_FIP),
            fip(SPARE_FIP),
            Box::new(|| {
                c.run(&[
                    "network",
                    "create",
                    "--tag",
                    &other,
                    "--tag",
                    "keelson-zone=other.example",
                    OTHER_CLUSTER,
                ])?;
                Ok((String::new(), String::new()))
            }),
            Box::new(|| {
                c.run(&[
                    "security",
                    "group",
                    "create",
                    "--tag",
                    &other,
                    OTHER_CLUSTER,
                ])?;
                Ok((String::new(), String::new()))
            }),
        ])?;
        cluster.floating_ips = made.into_iter().filter(|(a, _)| !a.is_empty()).collect();
        Ok(cluster)
    }

    /// Runs `examples/openstack/<script>` as it is (`sh -x`), with this run's environment and
    /// `extra` over it; its output is also kept in the work directory as `<log>.log`.
    pub fn script(&self, script: &str, log: &str, extra: &[(&str, String)]) -> Result<ScriptRun> {
        let path = crate::payload::workspace()
            .join("examples/openstack")
            .join(script);
        let log_path = self.work.join(format!("{log}.log"));
        let start = Instant::now();
        let out = self
            .client
            .command("sh")
            .arg("-x")
            .arg(&path)
            .envs(self.script_env())
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .with_context(|| format!("running {}", path.display()))?;
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&log_path, &log)?;
        Ok(ScriptRun {
            success: out.status.success(),
            log,
            took: start.elapsed(),
        })
    }

    /// Removes what a run leaves: both clusters (with the delete script), the stack preview's
    /// leftovers, the floating IPs, the machine network's veth.
    pub fn clean(&self) -> Result<()> {
        let c = &self.client;
        let _ = self.outside.try_ip(&["link", "del", MACHINE_IF]);
        let jobs: Vec<Box<dyn FnOnce() -> Result<()> + Send + '_>> = vec![
            Box::new(|| self.delete_cluster(CLUSTER).map(|_| ())),
            Box::new(|| self.delete_cluster(OTHER_CLUSTER).map(|_| ())),
            Box::new(|| {
                let ids: Vec<String> = as_list(c.json(&["floating", "ip", "list"])?)
                    .into_iter()
                    .filter(|v| {
                        [API_FIP, INGRESS_FIP, SPARE_FIP]
                            .contains(&v["Floating IP Address"].as_str().unwrap_or(""))
                    })
                    .filter_map(|v| v["ID"].as_str().map(str::to_owned))
                    .collect();
                if !ids.is_empty() {
                    let mut args = vec!["floating", "ip", "delete"];
                    args.extend(ids.iter().map(String::as_str));
                    c.run(&args)?;
                }
                Ok(())
            }),
            Box::new(|| {
                for v in as_list(c.json(&["stack", "list"])?) {
                    if v["Stack Name"] == HEAT_STACK
                        && let Some(id) = v["ID"].as_str()
                    {
                        c.run(&["stack", "delete", "--yes", "--wait", id])?;
                    }
                }
                Ok(())
            }),
        ];
        parallel(jobs)?;
        Ok(())
    }

    /// Deletes the floating IPs the run made (an operator's, not the cluster's: the delete
    /// script leaves them).
    pub fn delete_floating_ips(&self) -> Result<()> {
        let mut args = vec!["floating", "ip", "delete"];
        args.extend(self.floating_ips.values().map(String::as_str));
        if args.len() > 3 {
            self.client.run(&args)?;
        }
        Ok(())
    }

    /// `examples/openstack/delete-cluster.sh` for cluster `name`.
    pub fn delete_cluster(&self, name: &str) -> Result<ScriptRun> {
        let run = self.script(
            "delete-cluster.sh",
            &format!("delete-cluster-{name}"),
            &[("CLUSTER", name.to_owned())],
        )?;
        if !run.success {
            bail!(
                "delete-cluster.sh CLUSTER={name} failed; its last lines:\n{}",
                tail(&run.log, 20)
            );
        }
        Ok(run)
    }

    /// Marks every server gone (after the delete script).
    pub fn forget_servers(&mut self) {
        for s in self.servers.values_mut() {
            s.running = false;
        }
    }

    /// The script's environment for this run.
    pub fn script_env(&self) -> Vec<(&'static str, String)> {
        let d = &self.deployment;
        let keelson = crate::payload::env_path("KEELSON_BIN", "target/debug/keelson");
        let mut env = vec![
            ("OUT", self.out.display().to_string()),
            ("KEELSON", keelson.display().to_string()),
            ("MASTERS", d.masters.join(" ")),
            ("WORKERS", d.workers.join(" ")),
            ("FLAVOR", APPLIANCE_FLAVOR.to_owned()),
            ("WORKER_FLAVOR", APPLIANCE_FLAVOR.to_owned()),
            ("WORKER_IMAGE", "appliance".to_owned()),
            ("CONFIG_DRIVE", d.config_drive.join(" ")),
            // `keelson status` runs on the host: its address alone reaches the status port.
            ("STATUS_SOURCE", format!("{HOST_PUBLIC}/32")),
            (
                "HOST_BOOTSTRAP",
                if d.hosted_bootstrap { "always" } else { "auto" }.to_owned(),
            ),
        ];
        match (&self.rhcos_disk, d.master_image) {
            (Some(disk), ImageKind::Standin) => {
                env.push(("RHCOS_QCOW2", disk.display().to_string()));
                env.push(("MASTER_FLAVOR", RHCOS_FLAVOR.to_owned()));
            }
            _ => {
                env.push(("RHCOS_IMAGE", "appliance".to_owned()));
                env.push(("MASTER_FLAVOR", APPLIANCE_FLAVOR.to_owned()));
            }
        }
        env
    }

    /// Plugs the machine network's namespace into the tenant network's bridge (the
    /// linuxbridge agent names it `brq` and the network ID's first 11 characters, and makes
    /// it when the network's first port is bound), with the network's MTU.
    fn attach_machine_view(&self) -> Result<()> {
        let id = self
            .client
            .run(&["network", "show", CLUSTER, "-f", "value", "-c", "id"])?
            .trim()
            .to_owned();
        let bridge = format!("brq{}", id.get(..11).unwrap_or(&id));
        let start = Instant::now();
        while !Path::new(&format!("/sys/class/net/{bridge}")).exists() {
            ensure!(
                start.elapsed() < Duration::from_secs(120),
                "no bridge {bridge} for network {CLUSTER} ({id}) after 120 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{bridge}/mtu"))?
            .trim()
            .to_owned();
        let _ = Command::new("ip")
            .args(["link", "del", MACHINE_HOST_IF])
            .output();
        let ip = |args: &[&str]| -> Result<()> {
            let out = Command::new("ip").args(args).output()?;
            ensure!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(())
        };
        ip(&[
            "link",
            "add",
            MACHINE_HOST_IF,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            MACHINE_IF,
            "mtu",
            &mtu,
            "netns",
            MACHINE_NETNS,
        ])?;
        ip(&["link", "set", MACHINE_HOST_IF, "master", &bridge, "up"])?;
        self.outside.try_ip(&[
            "addr",
            "replace",
            &format!("{MACHINE_ADDRESS}/16"),
            "dev",
            MACHINE_IF,
        ])?;
        self.outside.try_ip(&["link", "set", MACHINE_IF, "up"])?;
        Ok(())
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
                .json(&["port", "list", "--tags", &tag(CLUSTER), "--long"])?,
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

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A JSON list, or nothing.
pub fn as_list(v: Value) -> Vec<Value> {
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
            iface: MACHINE_IF,
            address: MACHINE_ADDRESS
                .parse()
                .expect("MACHINE_ADDRESS is an address"),
        }
    }

    /// Runs the README's script as it is, plugs the machine network's namespace in, then
    /// learns each node's port (MAC and address, which Neutron chose) and server.
    fn start_all(&mut self) -> Result<()> {
        let run = self.script("create-cluster.sh", "create-cluster", &[])?;
        self.timings.insert("create-cluster.sh", run.took);
        if !run.success {
            bail!(
                "examples/openstack/create-cluster.sh failed; its last lines ({}):\n{}",
                self.work.join("create-cluster.log").display(),
                tail(&run.log, 20)
            );
        }
        self.attach_machine_view()?;
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
    thread: std::thread::JoinHandle<std::io::Result<Option<Instant>>>,
}

impl LastAnswer {
    fn start(outside: &Netns, address: Ipv4Addr) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let target = std::net::SocketAddr::from((address, 6443));
        let thread = crate::netns::try_in_netns(outside.name(), move || {
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
            Ok(last)
        });
        Ok(Self { stop, thread })
    }

    /// Stops the attempts; when the last answer arrived, if any did.
    fn stop(self) -> Option<Instant> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().ok().and_then(Result::ok).flatten()
    }
}
