//! VRRP router IDs: `keelson vrids` (the IDs a cluster gets, and the common cluster names
//! that get the same ones), `--vrid NAME=N` (explicit IDs for `build`, `render` and
//! `vrids`), and `keelson vrids --scan IFACE` (listen on a segment before installing and list
//! the virtual routers already there). docs/vrrp.md, "VRIDs".
//!
//! OpenShift derives the IDs from the cluster name (Fletcher-8 of `<name>-api` and
//! `<name>-ingress`, plus one), which gives few distinct values: `lab` and `ocp8` get the
//! same two (51 and 146), `test` and `cluster5` too (13 and 28). Two clusters on one segment
//! with a VRID in common take each other's adverts for their own.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use keelson_agent::vrrp::codec;
use keelson_agent::vrrp::socket::VrrpSocket;
use keelson_cluster::ClusterConfig;
use keelson_cluster::cluster::default_vrids;

/// Cluster names people often give (OpenShift's documentation and examples, and numbered
/// labs): a cluster whose VRIDs meet one of these risks meeting that cluster on its segment.
pub const COMMON_NAMES: &[&str] = &[
    "ocp",
    "ocp4",
    "openshift",
    "okd",
    "cluster",
    "mycluster",
    "test",
    "lab",
    "dev",
    "prod",
    "demo",
    "staging",
    "sno",
    "poc",
    "ocp1",
    "ocp2",
    "ocp3",
    "ocp5",
    "ocp6",
    "ocp7",
    "ocp8",
    "ocp9",
    "cluster1",
    "cluster2",
    "cluster3",
    "cluster4",
    "cluster5",
    "test1",
    "test2",
    "lab1",
    "lab2",
];

/// `--vrid NAME=N`: an explicit VRID for the `api` or `ingress` instances (and their
/// `-v6` siblings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VridArg {
    /// `api` or `ingress`.
    pub role: String,
    /// 1..=255.
    pub vrid: u8,
}

impl std::str::FromStr for VridArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (role, n) = s
            .split_once('=')
            .ok_or_else(|| format!("expected api=N or ingress=N, got {s:?}"))?;
        if role != "api" && role != "ingress" {
            return Err(format!(
                "expected api=N or ingress=N, got {role:?} before '='"
            ));
        }
        let vrid = n
            .trim()
            .parse::<i64>()
            .ok()
            .and_then(|v| u8::try_from(v).ok())
            .filter(|v| *v >= 1)
            .ok_or_else(|| format!("{role}: expected a VRID 1..=255, got {n:?}"))?;
        Ok(VridArg {
            role: role.to_owned(),
            vrid,
        })
    }
}

/// `cluster` with the explicit VRIDs set, checked (equal VRIDs of one family are an error
/// naming the instance).
pub fn apply(mut cluster: ClusterConfig, vrids: &[VridArg]) -> anyhow::Result<ClusterConfig> {
    for arg in vrids {
        let mut any = false;
        for inst in &mut cluster.vrrp.instances {
            if inst.name.trim_end_matches("-v6") == arg.role {
                inst.vrid = arg.vrid;
                any = true;
            }
        }
        anyhow::ensure!(
            any || cluster.vrrp.instances.is_empty(),
            "--vrid {}={}: the cluster has no {} instance",
            arg.role,
            arg.vrid,
            arg.role
        );
    }
    cluster
        .check()
        .context("--vrid (or the patch) gave two instances one VRID")?;
    Ok(cluster)
}

/// The common names (other than `name` itself) whose derived VRIDs meet `vrids`, with the
/// VRIDs they share.
pub fn collisions(name: &str, vrids: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    COMMON_NAMES
        .iter()
        .filter(|n| **n != name)
        .filter_map(|n| {
            let (a, i) = default_vrids(n);
            let shared: Vec<u8> = vrids
                .iter()
                .copied()
                .filter(|v| *v == a || *v == i)
                .collect();
            (!shared.is_empty()).then_some((*n, shared))
        })
        .collect()
}

/// The VRIDs `cluster` uses (once each).
fn used(cluster: &ClusterConfig) -> Vec<u8> {
    let mut v: Vec<u8> = cluster.vrrp.instances.iter().map(|i| i.vrid).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The warning `keelson build` prints when the cluster's derived VRIDs are those of a common
/// name; `None` when there is none or the IDs were chosen (not derived).
pub fn warning(cluster: &ClusterConfig, explicit: &[VridArg]) -> Option<String> {
    if !explicit.is_empty() {
        return None;
    }
    let (api, ingress) = default_vrids(&cluster.name);
    let mine = used(cluster);
    if mine.iter().any(|v| *v != api && *v != ingress) {
        // Set by a patch: chosen, not derived.
        return None;
    }
    let hits = collisions(&cluster.name, &mine);
    if hits.is_empty() {
        return None;
    }
    let list = hits
        .iter()
        .map(|(n, v)| {
            format!(
                "\"{n}\" ({})",
                v.iter().map(u8::to_string).collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "the VRIDs derived from the cluster name \"{}\" (api {api}, ingress {ingress}) are also those of clusters named {list}; \
         on a segment such a cluster shares, each takes the other's adverts for its own. \
         Look first (keelson vrids --scan IFACE), and choose free ones with --vrid api=N --vrid ingress=M",
        cluster.name
    ))
}

/// `keelson vrids`.
#[derive(Debug, clap::Args)]
pub struct VridsArgs {
    /// install-config.yaml (its cluster's VRIDs are printed, and marked in a scan).
    #[arg(long, required_unless_present = "scan")]
    pub config: Option<PathBuf>,
    /// A cluster.json merge patch (as for build).
    #[arg(long, value_name = "PATCH.json")]
    pub cluster_patch: Option<PathBuf>,
    /// An explicit VRID, `api=N` or `ingress=N` (repeatable; as for build).
    #[arg(long = "vrid", value_name = "ROLE=N")]
    pub vrids: Vec<VridArg>,
    /// Listen for VRRP adverts on this interface and list the virtual routers heard.
    #[arg(long, value_name = "IFACE")]
    pub scan: Option<String>,
    #[command(flatten)]
    pub vips: crate::payloads::VipArgs,
    /// How long to listen (several advert intervals: 1 s is the common one).
    #[arg(long, default_value = "4", value_name = "SECONDS")]
    pub seconds: f64,
}

/// Runs `keelson vrids`.
pub fn run(args: VridsArgs) -> anyhow::Result<()> {
    let cluster = match &args.config {
        Some(path) => {
            let ic = crate::payloads::load_install_config(path, &args.vips.given())?;
            let cluster = crate::payloads::cluster_config(
                &ic,
                keelson_cluster::SpecVersion::DEFAULT,
                &crate::compose::Composition::default(),
                args.cluster_patch.as_deref(),
                &[],
            )?;
            Some(apply(cluster, &args.vrids)?)
        }
        None => None,
    };
    if let Some(cluster) = &cluster {
        for inst in &cluster.vrrp.instances {
            println!(
                "{:<11} vrid {:>3}  vip {:<15} ({})",
                inst.name,
                inst.vrid,
                inst.vip,
                if args.vrids.is_empty() {
                    format!(
                        "Fletcher-8 of \"{}-{}\" + 1",
                        cluster.name,
                        inst.name.trim_end_matches("-v6")
                    )
                } else {
                    "chosen".to_owned()
                }
            );
        }
        if let Some(w) = warning(cluster, &args.vrids) {
            eprintln!("keelson: warning: {w}");
        }
    }
    let Some(iface) = &args.scan else {
        return Ok(());
    };
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds: expected more than 0 and at most 600, got {}",
        args.seconds
    );
    let heard = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(scan(iface, Duration::from_secs_f64(args.seconds)))?;
    let ours = cluster.as_ref().map(used).unwrap_or_default();
    print!("{}", report(iface, args.seconds, &heard, &ours));
    Ok(())
}

/// One virtual router heard: by family and VRID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// The routers advertising it, with the last priority heard from each.
    pub routers: BTreeMap<IpAddr, u8>,
    /// The virtual addresses they advertise.
    pub vips: Vec<IpAddr>,
    /// VRRP version (2 or 3).
    pub version: u8,
    /// Advert interval, centiseconds.
    pub interval_cs: u16,
    /// Adverts heard.
    pub adverts: u64,
}

/// Adverts heard, by (IPv6?, VRID).
pub type Scan = BTreeMap<(bool, u8), Heard>;

/// Records one received advert.
pub fn record(heard: &mut Scan, src: IpAddr, advert: &codec::Advert) {
    let h = heard.entry((src.is_ipv6(), advert.vrid)).or_default();
    h.routers.insert(src, advert.priority);
    for a in &advert.addresses {
        if !h.vips.contains(a) {
            h.vips.push(*a);
        }
    }
    h.version = match advert.version {
        codec::Version::V2 => 2,
        codec::Version::V3 => 3,
    };
    h.interval_cs = advert.interval_cs;
    h.adverts += 1;
}

/// The scan's table; the VRIDs of `ours` that were heard are marked.
pub fn report(iface: &str, seconds: f64, heard: &Scan, ours: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{iface}: {} virtual router(s) heard in {seconds} s",
        heard.len()
    );
    for ((v6, vrid), h) in heard {
        let routers = h
            .routers
            .iter()
            .map(|(a, p)| format!("{a} (priority {p})"))
            .collect::<Vec<_>>()
            .join(", ");
        let vips = h
            .vips
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "vrid {vrid:>3} {} v{} every {} ms: vips {vips}; routers {routers}; {} adverts{}",
            if *v6 { "IPv6" } else { "IPv4" },
            h.version,
            u32::from(h.interval_cs) * 10,
            h.adverts,
            if ours.contains(vrid) {
                "  <- this cluster's VRID: taken"
            } else {
                ""
            }
        );
    }
    let free_of_ours: Vec<String> = ours
        .iter()
        .filter(|v| !heard.keys().any(|(_, h)| h == *v))
        .map(u8::to_string)
        .collect();
    if !ours.is_empty() {
        let _ = writeln!(
            out,
            "this cluster's VRIDs not heard: {}",
            if free_of_ours.is_empty() {
                "none".to_owned()
            } else {
                free_of_ours.join(", ")
            }
        );
    }
    out
}

/// Listens on `iface` for `listen`: VRRP adverts of both families to the VRRP groups (and
/// unicast adverts that reach this host), parsed and checked as the agent checks them.
async fn scan(iface: &str, listen: Duration) -> anyhow::Result<Scan> {
    let index = nix::net::if_::if_nametoindex(iface)
        .with_context(|| format!("--scan {iface}: no such interface"))?;
    let v4 = VrrpSocket::open(iface, index, IpAddr::V4(Ipv4Addr::UNSPECIFIED), true)
        .with_context(|| format!("--scan {iface}: a raw IPv4 VRRP socket (root needed)"))?;
    // A link without IPv6 has nothing to hear there.
    let v6 = VrrpSocket::open(iface, index, IpAddr::V6(Ipv6Addr::UNSPECIFIED), true).ok();
    let mut heard = Scan::new();
    let until = tokio::time::Instant::now() + listen;
    let started = Instant::now();
    loop {
        let pkt = tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            r = v4.recv() => r,
            r = recv_opt(v6.as_ref()) => r,
        };
        let Ok(pkt) = pkt else { continue };
        if let Ok(advert) = codec::parse(&pkt.payload, pkt.src, pkt.dst) {
            record(&mut heard, pkt.src, &advert);
        }
    }
    tracing::debug!("scanned {iface} for {:?}", started.elapsed());
    Ok(heard)
}

async fn recv_opt(
    sock: Option<&VrrpSocket>,
) -> std::io::Result<keelson_agent::vrrp::socket::Received> {
    match sock {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_to_collide_are_found() {
        assert_eq!(default_vrids("lab"), (51, 146));
        assert_eq!(default_vrids("ocp8"), (51, 146));
        assert_eq!(default_vrids("test"), default_vrids("cluster5"));
        let hits = collisions("lab", &[51, 146]);
        assert!(hits.contains(&("ocp8", vec![51, 146])), "{hits:?}");
        let taken: Vec<u8> = COMMON_NAMES
            .iter()
            .flat_map(|n| {
                let (a, i) = default_vrids(n);
                [a, i]
            })
            .collect();
        let free = (1..=255u8).find(|v| !taken.contains(v)).unwrap();
        assert!(collisions("lab", &[free]).is_empty());
        // A name never collides with itself.
        assert!(
            collisions("ocp8", &[51, 146])
                .iter()
                .all(|(n, _)| *n != "ocp8")
        );
    }

    #[test]
    fn explicit_vrids_are_parsed_and_checked() {
        assert_eq!(
            "api=7".parse::<VridArg>().unwrap(),
            VridArg {
                role: "api".into(),
                vrid: 7
            }
        );
        for (bad, says) in [
            ("api=0", "api: expected a VRID 1..=255, got \"0\""),
            (
                "ingress=256",
                "ingress: expected a VRID 1..=255, got \"256\"",
            ),
            ("api=x", "expected a VRID 1..=255"),
            ("dns=3", "expected api=N or ingress=N"),
            ("7", "expected api=N or ingress=N"),
        ] {
            let e = bad.parse::<VridArg>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    fn example(name: &str) -> ClusterConfig {
        let text = include_str!("../../examples/install-config.yaml")
            .replace("name: ocp4", &format!("name: {name}"));
        keelson_cluster::install_config::InstallConfig::parse(&text)
            .unwrap()
            .cluster_config()
    }

    #[test]
    fn build_warns_of_derived_vrids_a_common_name_has_and_takes_chosen_ones() {
        let lab = example("lab");
        let w = warning(&lab, &[]).expect("lab meets ocp8");
        assert!(
            w.contains("\"ocp8\" (51, 146)") && w.contains("--vrid api=N"),
            "{w}"
        );
        let chosen = apply(
            lab.clone(),
            &["api=201".parse().unwrap(), "ingress=202".parse().unwrap()],
        )
        .unwrap();
        assert_eq!(chosen.instance("api").unwrap().vrid, 201);
        assert_eq!(chosen.instance("ingress").unwrap().vrid, 202);
        assert!(warning(&chosen, &["api=201".parse().unwrap()]).is_none());
        // Equal between roles: the error names the instance.
        let e = format!(
            "{:#}",
            apply(
                lab,
                &["api=9".parse().unwrap(), "ingress=9".parse().unwrap()]
            )
            .unwrap_err()
        );
        assert!(
            e.contains("vrrp.instances[1].vrid") && e.contains("api's"),
            "{e}"
        );
    }

    #[test]
    fn the_scan_report_marks_this_clusters_vrids() {
        let mut heard = Scan::new();
        let advert = codec::Advert {
            version: codec::Version::V3,
            vrid: 51,
            priority: 120,
            interval_cs: 100,
            addresses: vec!["10.0.0.5".parse().unwrap()],
            auth: codec::Auth::None,
        };
        record(&mut heard, "10.0.0.11".parse().unwrap(), &advert);
        record(&mut heard, "10.0.0.12".parse().unwrap(), &advert);
        let text = report("eth0", 4.0, &heard, &[51, 146]);
        assert!(text.contains("vrid  51 IPv4 v3 every 1000 ms: vips 10.0.0.5; routers 10.0.0.11 (priority 120), 10.0.0.12 (priority 120); 2 adverts  <- this cluster's VRID: taken"), "{text}");
        assert!(
            text.contains("this cluster's VRIDs not heard: 146"),
            "{text}"
        );
    }
}
