//! PID 1 in the appliance (docs/agent.md, "Appliance boot"): mount the kernel file systems, load the image's
//! modules, find metadata and configure the network as clouds provide them ([`cloud`]),
//! apply user_data, run the services under
//! the supervisor, reap orphans, and on SIGTERM / SIGPWR / ctrl-alt-del / the ACPI power
//! button stop everything in order and power off. PID 1 never exits: every failure is logged
//! on the console and retried.

pub mod assets;
pub mod cloud;
pub mod modules;
pub mod power;
pub mod reaper;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use keelson_cluster::ClusterConfig;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::context::AgentContext;
// The console line, under its short name for PID 1's many steps.
use crate::log::console as log;

/// Where the cluster settings land after user_data is applied.
pub use keelson_cluster::paths::CLUSTER_JSON;

/// The PID-1 entry point. Never returns.
pub fn main() -> ! {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("keelson-agent: panic: {info}");
    }));
    init_logging();
    log("starting as PID 1");
    mount_all();
    match modules::load_image_modules(Path::new("/lib/modules")) {
        Ok(n) => log(&format!("loaded {n} kernel modules")),
        Err(e) => log(&format!("loading kernel modules: {e:#}")),
    }
    loop {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build();
        let runtime = match runtime {
            Ok(rt) => rt,
            Err(e) => {
                log(&format!(
                    "cannot start the async runtime: {e}; retrying in 5 s"
                ));
                std::thread::sleep(Duration::from_secs(5));
                continue;
            }
        };
        let outcome = runtime.block_on(async {
            // Run boot on a task so a panic anywhere in it is caught here.
            tokio::spawn(boot()).await
        });
        match outcome {
            Ok(Ok(())) => power_off(),
            Ok(Err(e)) => log(&format!("boot failed: {e:#}; retrying in 5 s")),
            Err(e) => log(&format!("boot panicked: {e}; retrying in 5 s")),
        }
        drop(runtime);
        std::thread::sleep(Duration::from_secs(5));
    }
}

fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .with_target(false)
        .finish()
        .with(crate::log::filter(
            "info,hickory_proto=warn,hickory_server=warn",
        ))
        .try_init();
}

/// Mounts proc, sys, devtmpfs, /run and /tmp; already-mounted is fine.
fn mount_all() {
    use nix::mount::{MsFlags, mount};
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let table: [(&str, &str, &str, MsFlags, Option<&str>); 5] = [
        ("proc", "/proc", "proc", nosuid, None),
        ("sysfs", "/sys", "sysfs", nosuid, None),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        ),
        (
            "tmpfs",
            "/tmp",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        ),
    ];
    for (source, target, fstype, flags, data) in table {
        let _ = std::fs::create_dir_all(target);
        match mount(Some(source), target, Some(fstype), flags, data) {
            Ok(()) | Err(nix::errno::Errno::EBUSY) => {}
            Err(e) => log(&format!("mount {target}: {e}")),
        }
    }
}

/// Everything after the mounts; returns when the node should power off.
async fn boot() -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    power::watch(stop.clone());
    reaper::spawn();

    report_entropy();
    let netlink = crate::net::Netlink::connect().context("opening netlink")?;
    if let Err(e) = netlink.loopback_up().await {
        log(&format!("loopback: {e}"));
    }

    let Some((metadata, network)) =
        cloud::metadata_and_network(&netlink, &cloud::CloudSources::default(), &stop).await?
    else {
        return Ok(());
    };
    let name = metadata
        .node_name()
        .map(String::from)
        .unwrap_or_else(|| "keelson".into());
    if let Err(e) = nix::unistd::sethostname(&name) {
        log(&format!("sethostname {name}: {e}"));
    }
    let dns_rx = network.dns.clone();

    match &metadata.user_data {
        Some(user_data) => {
            // Pointers may name hosts: look them up through the network's servers until the
            // agent's own DNS takes resolv.conf over.
            let servers = dns_rx.borrow().clone();
            if !servers.is_empty()
                && let Err(e) = crate::dns::resolv::write_network_servers(
                    Path::new(crate::dns::resolv::RESOLV_CONF),
                    &servers,
                )
            {
                log(&format!("{}: {e}", crate::dns::resolv::RESOLV_CONF));
            }
            let applied = tokio::select! {
                a = crate::apply::apply_user_data(user_data, Path::new("/")) => a?,
                _ = stop.cancelled() => return Ok(()),
            };
            for url in &applied.fetched {
                log(&format!("fetched config {url}"));
            }
            for line in &applied.refused {
                log(&format!("user_data: not applied: {line}"));
            }
            log(&format!(
                "user_data: wrote {} files",
                applied.files_written.len()
            ));
        }
        None => log("no user_data"),
    }

    let cluster_bytes = std::fs::read(CLUSTER_JSON)
        .with_context(|| format!("{CLUSTER_JSON} (user_data must provide it)"))?;
    let cluster = ClusterConfig::from_json(&cluster_bytes).context(CLUSTER_JSON)?;
    let node = crate::node_address::from_system_waiting(
        &cluster,
        Path::new("/"),
        Some(&metadata),
        std::time::Duration::from_secs(60),
    )
    .await?;
    log(&format!(
        "node {} role {} on {}",
        node.name,
        node.role.as_str(),
        node.interface
    ));
    let assets = assets::install_from_image(&cluster, node.role, Path::new("/"));
    for path in &assets.installed {
        log(&format!("installed {} from the image", path.display()));
    }
    for line in &assets.missing {
        log(line);
    }
    let ctx = AgentContext::new(cluster, node);
    ctx.bus.dns_upstreams.send_replace(dns_rx.borrow().clone());
    {
        // Later DHCP leases may bring other DNS servers.
        let (bus, mut dns_rx) = (ctx.bus.clone(), dns_rx.clone());
        tokio::spawn(async move {
            while dns_rx.changed().await.is_ok() {
                let servers = dns_rx.borrow().clone();
                bus.dns_upstreams.send_replace(servers);
            }
        });
    }
    crate::run::run_node(ctx, &[], crate::status::SOCKET.into(), stop).await?;
    log("services stopped");
    // Leases are released (and their addresses removed) before power-off.
    for client in network.dhcp {
        client.stop(true).await;
    }
    Ok(())
}

/// Says on the console when the kernel's random number generator is not ready yet, and when
/// it becomes ready: until then everything that needs secret randomness (TLS to :22623, the
/// Ignition server) waits in `getrandom(2)`, and an operator should know why a node is slow.
fn report_entropy() {
    let mut byte = [0u8; 1];
    // SAFETY: getrandom writes at most `len` bytes into the valid one-byte buffer.
    let ready = unsafe { libc::getrandom(byte.as_mut_ptr().cast(), 1, libc::GRND_NONBLOCK) } == 1;
    if ready {
        return;
    }
    log(
        "the kernel's random number generator is not ready (no RDRAND, no virtio-rng): TLS \
         waits for it; give instances an RNG (openstack image set --property hw_rng_model=virtio)",
    );
    let start = std::time::Instant::now();
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        loop {
            // SAFETY: as above; without flags the call blocks until the CRNG is ready.
            if unsafe { libc::getrandom(byte.as_mut_ptr().cast(), 1, 0) } == 1 {
                break;
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
        log(&format!(
            "the kernel's random number generator is ready after {:.1} s",
            start.elapsed().as_secs_f64()
        ));
    });
}

/// Flushes file systems and powers the machine off. Never returns.
fn power_off() -> ! {
    log("powering off");
    nix::unistd::sync();
    loop {
        let Err(e) = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
        log(&format!("power off failed: {e}"));
        std::thread::sleep(Duration::from_secs(5));
    }
}
