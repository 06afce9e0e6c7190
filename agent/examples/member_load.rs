//! The scale bench's load generator (`bench/scale.sh`, docs/scale.md): many simulated
//! cluster members, each speaking the unicast member protocol exactly as an agent does,
//! through the agent's own code: a registration signed afresh every round
//! ([`unicast::registration_body`], [`auth::Signer`]), sent from the member's own address to
//! every registry of its peer set ([`Seeds`], [`unicast::register_one`]: the API VIP first,
//! then every control-plane node the answers name), every renewal interval (every second
//! while it knows nobody), the answers read with the agent's parser, and a signed goodbye
//! to every registry that answered when it leaves. A member that stops silently is dropped
//! by the registries at the expiry.
//!
//! One process, one tokio runtime, one task per member; the members' addresses must be on
//! an interface of the namespace it runs in (consecutive from `--first`). Commands, one per
//! line on stdin:
//!
//! - `join K`: K more members start at once (a burst: a machine set adding K nodes);
//! - `stop K`: the K members started last stop renewing, silently (dead nodes);
//! - `leave K`: the K members started last say goodbye and stop;
//! - `flood K`: from the address of the first member, K registrations of K new names,
//!   signed, as fast as the registries answer (a member flood from one address);
//! - `quit`.
//!
//! Every second it prints a line: `stats t=<s> running=<n> ok=<registrations answered>
//! failed=<no answer> refused=<answered, not 200> p50_ms= p99_ms=<exchange time>
//! view_min= view_max=<entries in the members' last answers> adverts=<VRRP adverts
//! received/s> advert_dsts=<distinct members they were sent to>`; each command is
//! acknowledged with a line starting `ok`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use clap::Parser;
use keelson_agent::member::Member;
use keelson_agent::members::auth::{Keys, Signer};
use keelson_agent::members::seeds::Seeds;
use keelson_agent::members::table::Table;
use keelson_agent::members::unicast;
use keelson_cluster::{ClusterConfig, Role};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Args {
    /// The cluster.json `keelson build` wrote (zone, API VIPs, ports, timers, key ID).
    #[arg(long)]
    cluster: PathBuf,
    /// The directory with `ca.crt` and the membership keys.
    #[arg(long)]
    tls_dir: PathBuf,
    /// The first member's address; member i has this plus i.
    #[arg(long)]
    first: Ipv4Addr,
    /// Node names are this prefix and the member's number, five digits.
    #[arg(long, default_value = "worker-")]
    name_prefix: String,
    /// The members' role.
    #[arg(long, default_value = "worker")]
    role: Role,
}

/// What every member adds to, read by the stats line.
#[derive(Debug, Default)]
struct Stats {
    ok: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    running: AtomicUsize,
    /// Exchange times of the current second, ms.
    times: std::sync::Mutex<Vec<u32>>,
}

/// What every member shares.
#[derive(Debug)]
struct World {
    zone: String,
    vips: Vec<IpAddr>,
    configured: Vec<IpAddr>,
    port: u16,
    renew: Duration,
    expiry: Duration,
    forget_after: Duration,
    ca: PathBuf,
    keys: Option<Arc<Keys>>,
    stats: Stats,
}

/// One simulated member's handles.
#[derive(Debug)]
struct Handle {
    silent: CancellationToken,
    leave: CancellationToken,
    /// Entries in its last answer.
    view: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

async fn member(
    world: Arc<World>,
    me: Member,
    silent: CancellationToken,
    leave: CancellationToken,
    view: Arc<AtomicUsize>,
) {
    let tls = match unicast::client_config(&world.ca) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e:#}", me.name);
            return;
        }
    };
    let key_ids = world.keys.as_ref().map(|k| Arc::new(k.ids()));
    let signer = world
        .keys
        .clone()
        .map(|k| Signer::new(k, SystemTime::now()));
    let name = world.vips[0];
    let own = Arc::new(me.addresses.clone());
    let mut seeds = Seeds::new(world.configured.clone(), world.vips.clone())
        .forgetting(world.forget_after, SystemTime::now());
    // The control-plane members it learned, expiring as the agent's table does: they are
    // what its peer set grows from (the workers in an answer are only counted).
    let mut masters = Table::new(world.expiry);
    let mut exchanges: tokio::task::JoinSet<unicast::Exchange> = tokio::task::JoinSet::new();
    let mut in_flight: BTreeMap<tokio::task::Id, SocketAddr> = BTreeMap::new();
    let mut answered: BTreeSet<SocketAddr> = BTreeSet::new();
    // As the agent: per registry the link (connection and list tag) kept between
    // registrations, and what an "unchanged" answer refers to. Of a list only its length
    // and the control-plane entries are kept (all a simulated member uses), so that many
    // members fit in one process.
    let mut links: BTreeMap<SocketAddr, unicast::Link> = BTreeMap::new();
    let mut lists: BTreeMap<SocketAddr, (usize, Vec<unicast::Entry>)> = BTreeMap::new();
    let mut next_round = Instant::now();
    let held = BTreeSet::new();
    world.stats.running.fetch_add(1, Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = silent.cancelled() => break,
            _ = leave.cancelled() => {
                exchanges.abort_all();
                let byes = answered.iter().map(|addr| {
                    let body = unicast::goodbye_body(&world.zone, &me.name, signer.as_ref(), SystemTime::now());
                    let link = links.remove(addr).unwrap_or_default();
                    unicast::say_goodbye(tls.clone(), own.clone(), name, *addr, &me.name, body, link)
                });
                futures::future::join_all(byes).await;
                break;
            }
            _ = tokio::time::sleep_until(next_round.into()) => {
                let now = Instant::now();
                masters.expire(now);
                let body = unicast::registration_body(&world.zone, &me, signer.as_ref(), SystemTime::now());
                let busy: BTreeSet<SocketAddr> = in_flight.values().copied().collect();
                let reached: BTreeSet<IpAddr> = answered.iter().map(SocketAddr::ip).collect();
                for a in seeds.targets(&own, &held, &reached) {
                    let addr = SocketAddr::new(a, world.port);
                    if busy.contains(&addr) {
                        continue;
                    }
                    let mut link = links.remove(&addr).unwrap_or_default();
                    if !lists.contains_key(&addr) {
                        link.tag = None;
                    }
                    let call = unicast::register_one(tls.clone(), own.clone(), name, addr, body.clone(), key_ids.clone(), link);
                    let id = exchanges.spawn(async move {
                        match tokio::time::timeout(EXCHANGE_TIMEOUT, call).await {
                            Ok(x) => x,
                            Err(_) => unicast::Exchange {
                                addr,
                                started: now,
                                result: Err(unicast::RegistrationError::NoAnswer(EXCHANGE_TIMEOUT)),
                                link: unicast::Link::default(),
                            },
                        }
                    }).id();
                    in_flight.insert(id, addr);
                }
                let alone = masters.is_empty();
                next_round = now + if alone { Duration::from_secs(1) } else { world.renew };
            }
            Some(joined) = exchanges.join_next_with_id(), if !exchanges.is_empty() => {
                let Ok((id, unicast::Exchange { addr, started, result: res, link })) = joined else { continue };
                in_flight.remove(&id);
                links.insert(addr, link);
                let res = res.map(|answered| match answered {
                    unicast::Answered::List(entries) => {
                        let kept: Vec<unicast::Entry> =
                            entries.iter().filter(|e| e.member.role != Role::Worker).cloned().collect();
                        lists.insert(addr, (entries.len(), kept.clone()));
                        (entries.len(), kept)
                    }
                    unicast::Answered::Unchanged(fresh) => lists
                        .get(&addr)
                        .map(|(n, kept)| (*n, unicast::refreshed(kept, fresh)))
                        .unwrap_or_default(),
                });
                if res.is_err() {
                    lists.remove(&addr);
                }
                let ms = started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
                world.stats.times.lock().unwrap_or_else(|e| e.into_inner()).push(ms);
                match res {
                    Ok((listed, entries)) => {
                        world.stats.ok.fetch_add(1, Ordering::Relaxed);
                        answered.insert(addr);
                        view.store(listed, Ordering::Relaxed);
                        for e in entries {
                            if e.member.name != me.name {
                                masters.renew_aged(e.member, Duration::from_millis(e.age_ms), started);
                            }
                        }
                        seeds.update(&masters.list(), &me.name, SystemTime::now());
                    }
                    Err(e) => {
                        answered.remove(&addr);
                        if e.is_refusal() {
                            world.stats.refused.fetch_add(1, Ordering::Relaxed);
                        } else {
                            world.stats.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    }
    world.stats.running.fetch_sub(1, Ordering::Relaxed);
}

/// `flood K`: K registrations of K new names, each signed and listing the first member's
/// address, all sent from it, one after another to every registry the first member would
/// reach first (the API VIP and the configured peers).
async fn flood(world: Arc<World>, first: Ipv4Addr, args_prefix: String, k: usize) -> (u64, u64) {
    let tls = match unicast::client_config(&world.ca) {
        Ok(t) => t,
        Err(_) => return (0, 0),
    };
    let own = Arc::new(vec![IpAddr::V4(first)]);
    let signer = world
        .keys
        .clone()
        .map(|k| Signer::new(k, SystemTime::now()));
    let key_ids = world.keys.as_ref().map(|k| Arc::new(k.ids()));
    let (mut ok, mut refused) = (0, 0);
    let targets: Vec<SocketAddr> = Seeds::new(world.configured.clone(), world.vips.clone())
        .targets(&own, &BTreeSet::new(), &BTreeSet::new())
        .into_iter()
        .map(|a| SocketAddr::new(a, world.port))
        .collect();
    for i in 0..k {
        let Ok(name) = format!("{args_prefix}flood-{i:05}").parse() else {
            continue;
        };
        let me = Member {
            name,
            role: Role::Worker,
            addresses: vec![IpAddr::V4(first)],
            version: keelson_agent::VERSION.to_string(),
        };
        let body = unicast::registration_body(&world.zone, &me, signer.as_ref(), SystemTime::now());
        for addr in &targets {
            let call = unicast::register_one(
                tls.clone(),
                own.clone(),
                world.vips[0],
                *addr,
                body.clone(),
                key_ids.clone(),
                // A new connection for each: a flood pays the registry no handshake less.
                unicast::Link::default(),
            );
            match tokio::time::timeout(EXCHANGE_TIMEOUT, call).await {
                Ok(unicast::Exchange { result: Ok(_), .. }) => ok += 1,
                _ => refused += 1,
            }
        }
    }
    (ok, refused)
}

/// Counts the VRRP adverts that reach the members' addresses (IP protocol 112; with a
/// raw socket open the kernel answers none of them with "protocol unreachable"): per
/// second, how many and to how many distinct addresses.
fn count_adverts(adverts: Arc<AtomicU64>, dsts: Arc<std::sync::Mutex<HashSet<Ipv4Addr>>>) {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(112))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("no raw socket for VRRP (adverts not counted): {e}");
            return;
        }
    };
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
    loop {
        let Ok(n) = sock.recv(&mut buf) else { continue };
        if n < 20 {
            continue;
        }
        // SAFETY: recv initialised the first n bytes.
        let bytes: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        adverts.fetch_add(1, Ordering::Relaxed);
        let dst = Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19]);
        dsts.lock().unwrap_or_else(|e| e.into_inner()).insert(dst);
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bytes = std::fs::read(&args.cluster)
        .with_context(|| format!("reading {}", args.cluster.display()))?;
    let cluster = ClusterConfig::from_json(&bytes)?;
    let keys = match &cluster.members.key_id {
        Some(id) => Some(Arc::new(Keys::load(&args.tls_dir, id)?)),
        None => None,
    };
    let mut configured = Vec::new();
    for inst in &cluster.vrrp.instances {
        configured.extend(inst.unicast_peers.iter().copied());
    }
    anyhow::ensure!(
        !cluster.api_vips.is_empty(),
        "cluster.json apiVips: expected an API VIP"
    );
    let world = Arc::new(World {
        zone: cluster.zone(),
        vips: cluster.api_vips.clone(),
        configured,
        port: cluster.ignition.tls_port,
        renew: Duration::from_secs(u64::from(cluster.members.renew_interval_secs.max(1))),
        expiry: Duration::from_secs(u64::from(cluster.members.expiry_secs.max(1))),
        forget_after: cluster.members.forget_after(),
        ca: args.tls_dir.join(keelson_cluster::tls_files::CA_CERT),
        keys,
        stats: Stats::default(),
    });

    let adverts = Arc::new(AtomicU64::new(0));
    let dsts = Arc::new(std::sync::Mutex::new(HashSet::new()));
    {
        let (a, d) = (adverts.clone(), dsts.clone());
        std::thread::spawn(move || count_adverts(a, d));
    }

    let mut handles: Vec<Handle> = Vec::new();
    let mut started = 0usize;
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let mut times = std::mem::take(&mut *world.stats.times.lock().unwrap_or_else(|e| e.into_inner()));
                times.sort_unstable();
                let views: Vec<usize> = handles
                    .iter()
                    .filter(|h| !h.task.is_finished())
                    .map(|h| h.view.load(Ordering::Relaxed))
                    .collect();
                let s = &world.stats;
                println!(
                    "stats t={:.1} running={} ok={} failed={} refused={} p50_ms={} p99_ms={} view_min={} view_max={} adverts={} advert_dsts={}",
                    t0.elapsed().as_secs_f64(),
                    s.running.load(Ordering::Relaxed),
                    s.ok.swap(0, Ordering::Relaxed),
                    s.failed.swap(0, Ordering::Relaxed),
                    s.refused.swap(0, Ordering::Relaxed),
                    percentile(&times, 0.5),
                    percentile(&times, 0.99),
                    views.iter().min().copied().unwrap_or(0),
                    views.iter().max().copied().unwrap_or(0),
                    adverts.swap(0, Ordering::Relaxed),
                    std::mem::take(&mut *dsts.lock().unwrap_or_else(|e| e.into_inner())).len(),
                );
            }
            line = lines.next_line(), if stdin_open => {
                let line = match line {
                    Ok(Some(l)) => l,
                    _ => {
                        stdin_open = false;
                        continue;
                    }
                };
                let mut words = line.split_whitespace();
                let cmd = words.next().unwrap_or("");
                let k: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                match cmd {
                    "join" => {
                        for _ in 0..k {
                            let i = started;
                            started += 1;
                            let addr = Ipv4Addr::from(u32::from(args.first) + i as u32);
                            let me = Member {
                                name: format!("{}{i:05}", args.name_prefix).parse()?,
                                role: args.role,
                                addresses: vec![IpAddr::V4(addr)],
                                version: keelson_agent::VERSION.to_string(),
                            };
                            let (silent, leave) = (CancellationToken::new(), CancellationToken::new());
                            let view = Arc::new(AtomicUsize::new(0));
                            let task = tokio::spawn(member(world.clone(), me, silent.clone(), leave.clone(), view.clone()));
                            handles.push(Handle { silent, leave, view, task });
                        }
                        println!("ok join {k} started={started}");
                    }
                    "stop" | "leave" => {
                        let live: Vec<&Handle> = handles.iter().filter(|h| !h.task.is_finished() && !h.silent.is_cancelled() && !h.leave.is_cancelled()).collect();
                        let chosen: Vec<&Handle> = live.into_iter().rev().take(k).collect();
                        for h in &chosen {
                            if cmd == "stop" { h.silent.cancel() } else { h.leave.cancel() }
                        }
                        println!("ok {cmd} {}", chosen.len());
                    }
                    "flood" => {
                        let (ok, refused) = flood(world.clone(), args.first, args.name_prefix.clone(), k).await;
                        println!("ok flood {k} answered={ok} refused={refused}");
                    }
                    "quit" => break,
                    "" => {}
                    other => println!("error: unknown command {other:?}"),
                }
            }
        }
    }
    for h in &handles {
        h.leave.cancel();
    }
    for h in handles {
        let _ = tokio::time::timeout(Duration::from_secs(3), h.task).await;
    }
    Ok(())
}
