//! OpenShift's `install-config.yaml` (apiVersion v1), as users already have it: the current
//! form (`platform.openstack.apiVIPs`/`ingressVIPs`, `networking.machineNetwork`) and the
//! 4.2-era one (`apiVIP`/`ingressVIP`, `lbFloatingIP`, `networking.machineCIDR`, ...).
//!
//! Read through serde into the fields keelson uses; every error names the field path
//! (`serde_path_to_error`) and what was expected: `controlPlane.replicas: expected an
//! integer >= 1, got "three"`. Fields keelson does not use are listed as notes.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use serde_norway::Value;

use crate::MAX_NODES;
use crate::cluster::{
    ApiSettings, BackendCheck, CLUSTER_JSON_VERSION, ClusterConfig, DnsSettings, HealthCheckConfig,
    HealthCheckKind, IgnitionServerSettings, LoadBalancerSettings, LoadBalancerType,
    MembersSettings, MembersTransport, RolePriorities, VrrpInstanceConfig, VrrpSettings,
    VrrpTransport, VrrpVersion, default_vrids,
};

/// An install-config error: the field path and what was expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallConfigError {
    /// Not YAML at all.
    #[error("not valid YAML: {0}")]
    Yaml(String),
    /// A field has the wrong form, as serde found it (`message` says what was expected).
    #[error("{path}: {message}")]
    Invalid {
        /// Dotted path, e.g. `platform.openstack.apiVIPs[1]`.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// A field is missing or has the wrong form.
    #[error("{field}: expected {expected}, got {got}")]
    Field {
        /// Dotted path, e.g. `platform.openstack.apiVIPs[0]`.
        field: String,
        /// What was expected.
        expected: String,
        /// What was there.
        got: String,
    },
}

/// The parts of install-config.yaml keelson uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallConfig {
    /// `metadata.name`.
    pub name: String,
    /// `baseDomain`.
    pub base_domain: String,
    /// `controlPlane.replicas`.
    pub masters: u32,
    /// Sum of `compute[].replicas`.
    pub workers: u32,
    /// `networking.machineNetwork[].cidr` (or 4.2's `machineCIDR`).
    pub machine_networks: Vec<IpNet>,
    /// API VIPs (`apiVIPs`, or 4.2's `apiVIP`).
    pub api_vips: Vec<IpAddr>,
    /// Ingress VIPs (`ingressVIPs`, or 4.2's `ingressVIP`).
    pub ingress_vips: Vec<IpAddr>,
    /// `sshKey` (may hold several keys, one per line).
    pub ssh_keys: Vec<String>,
    /// `platform.openstack.apiFloatingIP` (4.2: `lbFloatingIP`): the floating IP the
    /// OpenStack deployment attaches to the API VIP's port (docs/openstack.md); keelson's
    /// payloads do not use it.
    pub api_floating_ip: Option<IpAddr>,
    /// `platform.openstack.ingressFloatingIP`: the same for the ingress VIP's port.
    pub ingress_floating_ip: Option<IpAddr>,
    /// `platform.openstack.externalNetwork`: the network the cluster's router reaches the
    /// world by, where the floating IPs live.
    pub external_network: Option<String>,
    /// The platform's key (`openstack`, `baremetal`, `none`...).
    pub platform: String,
    /// `platform.<name>.loadBalancer.type`: `UserManaged` means an external load balancer
    /// owns the VIPs (docs/cluster-json.md, "`loadBalancer`").
    pub load_balancer: LoadBalancerType,
    /// Fields present but not used by keelson, one line each.
    pub notes: Vec<String>,
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a tagged value {}", t.tag),
    }
}

fn field_err(field: &str, expected: &str, got: &Value) -> InstallConfigError {
    InstallConfigError::Field {
        field: field.into(),
        expected: expected.into(),
        got: describe(got),
    }
}

/// A value read as YAML first, then checked, so its error says what was expected and what
/// came (`expected an integer from 1 to 4096, got "three"`); the path in front comes from
/// `serde_path_to_error`.
trait Leaf: Sized {
    /// What a good value looks like.
    fn expected() -> String;
    /// The value, when it is one.
    fn from_value(v: &Value) -> Option<Self>;
}

/// A [`Leaf`] in a serde struct.
struct Checked<T>(T);

impl<'de, T: Leaf> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        T::from_value(&v).map(Checked).ok_or_else(|| {
            serde::de::Error::custom(format!("expected {}, got {}", T::expected(), describe(&v)))
        })
    }
}

/// A list of [`Leaf`]s; each item's error names its index.
struct List<T>(Vec<T>);

impl<'de, T: Leaf> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items<T>(std::marker::PhantomData<T>);
        impl<'de, T: Leaf> serde::de::Visitor<'de> for Items<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a list of {}", T::expected())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<List<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(Checked(item)) = seq.next_element::<Checked<T>>()? {
                    out.push(item);
                }
                Ok(List(out))
            }
        }
        d.deserialize_seq(Items(std::marker::PhantomData))
    }
}

/// A string with something in it (trimmed).
struct NonEmpty(String);
impl Leaf for NonEmpty {
    fn expected() -> String {
        "a non-empty string".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        v.as_str()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| NonEmpty(s.to_owned()))
    }
}

/// A replica count from `MIN` to [`MAX_NODES`].
struct Replicas<const MIN: u64>(u32);
impl<const MIN: u64> Leaf for Replicas<MIN> {
    fn expected() -> String {
        format!("an integer from {MIN} to {MAX_NODES}")
    }
    fn from_value(v: &Value) -> Option<Self> {
        v.as_u64()
            .filter(|n| (MIN..=u64::from(MAX_NODES)).contains(n))
            .map(|n| Replicas(n as u32))
    }
}

/// An IP address.
struct Ip(IpAddr);
impl Leaf for Ip {
    fn expected() -> String {
        "an IP address".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        v.as_str()?.trim().parse().ok().map(Ip)
    }
}

/// A CIDR, truncated to its network.
struct Cidr(IpNet);
impl Leaf for Cidr {
    fn expected() -> String {
        "a CIDR such as 10.0.0.0/16".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        v.as_str()?
            .trim()
            .parse::<IpNet>()
            .ok()
            .map(|n| Cidr(n.trunc()))
    }
}

/// `sshKey`: one or several keys, one per line.
struct SshKeys(Vec<String>);
impl Leaf for SshKeys {
    fn expected() -> String {
        "an SSH public key string".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        let keys = v.as_str()?.lines().map(str::trim).filter(|l| !l.is_empty());
        Some(SshKeys(keys.map(str::to_owned).collect()))
    }
}

/// `apiVersion`: `v1`.
struct ApiV1;
impl Leaf for ApiV1 {
    fn expected() -> String {
        "\"v1\"".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        (v.as_str() == Some("v1")).then_some(ApiV1)
    }
}

/// install-config.yaml as keelson reads it (the platform section apart: its name varies).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    /// Checked, not used.
    #[serde(default, rename = "apiVersion")]
    _api_version: Option<Checked<ApiV1>>,
    #[serde(default)]
    base_domain: Option<Checked<NonEmpty>>,
    #[serde(default)]
    metadata: Option<MetadataSection>,
    #[serde(default)]
    control_plane: Option<Pool<1>>,
    #[serde(default)]
    compute: Option<Vec<Pool<0>>>,
    #[serde(default)]
    networking: Option<Networking>,
    #[serde(default)]
    ssh_key: Option<Checked<SshKeys>>,
}

#[derive(Deserialize)]
struct MetadataSection {
    #[serde(default)]
    name: Option<Checked<NonEmpty>>,
}

/// A machine pool: `replicas` at least `MIN`.
#[derive(Deserialize)]
struct Pool<const MIN: u64> {
    #[serde(default)]
    replicas: Option<Checked<Replicas<MIN>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Networking {
    #[serde(default)]
    machine_network: Option<Vec<MachineNetwork>>,
    /// 4.2's single machine network.
    #[serde(default, rename = "machineCIDR")]
    machine_cidr: Option<Checked<Cidr>>,
}

#[derive(Deserialize)]
struct MachineNetwork {
    #[serde(default)]
    cidr: Option<Checked<Cidr>>,
}

/// A platform's VIPs (openstack, baremetal, vsphere, ovirt all use the same names).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlatformVips {
    #[serde(default, rename = "apiVIPs")]
    api_vips: Option<List<Ip>>,
    #[serde(default, rename = "apiVIP")]
    api_vip: Option<Checked<Ip>>,
    #[serde(default, rename = "ingressVIPs")]
    ingress_vips: Option<List<Ip>>,
    #[serde(default, rename = "ingressVIP")]
    ingress_vip: Option<Checked<Ip>>,
    #[serde(default, rename = "apiFloatingIP")]
    api_floating_ip: Option<Checked<Ip>>,
    #[serde(default, rename = "lbFloatingIP")]
    lb_floating_ip: Option<Checked<Ip>>,
    #[serde(default, rename = "loadBalancer")]
    load_balancer: Option<LoadBalancerSection>,
    #[serde(default, rename = "ingressFloatingIP")]
    ingress_floating_ip: Option<Checked<Ip>>,
    #[serde(default, rename = "externalNetwork")]
    external_network: Option<Checked<NonEmpty>>,
}

/// `platform.<name>.loadBalancer` (OpenShift 4.13+ on bare metal, OpenStack, vSphere...).
#[derive(Deserialize)]
struct LoadBalancerSection {
    #[serde(default, rename = "type")]
    kind: Option<Checked<LoadBalancerKind>>,
}

/// `loadBalancer.type`: `OpenShiftManagedDefault` or `UserManaged`.
struct LoadBalancerKind(LoadBalancerType);
impl Leaf for LoadBalancerKind {
    fn expected() -> String {
        "OpenShiftManagedDefault or UserManaged".into()
    }
    fn from_value(v: &Value) -> Option<Self> {
        match v.as_str()? {
            "OpenShiftManagedDefault" => Some(LoadBalancerKind(LoadBalancerType::Keelson)),
            "UserManaged" => Some(LoadBalancerKind(LoadBalancerType::UserManaged)),
            _ => None,
        }
    }
}

/// Weight of the API instance's `local-apiserver` check: a master whose own kube-apiserver
/// is dead (refused, failing, or silent for 10 s) falls 20 below the masters whose
/// apiservers answer, so one of them takes the VIP; below the bootstrap's lead over a master
/// (70 − 40 = 30), so the bootstrap keeps the VIP while it serves Ignition.
pub const LOCAL_APISERVER_WEIGHT: i32 = 20;

/// The advert interval `keelson build` writes for every VRRP instance: 100 ms. Between
/// keelson peers a backup then asks for a silent master's VIP by ARP 130 ms after its last
/// advert and claims at Master_Down (353 ms) if nobody answered, so a client sees the API
/// again 0.3-0.4 s after its holder died (docs/vrrp.md, "Fast failover without flapping");
/// at 1 s adverts it took 3.5 s. What keeps it from moving a live VIP is the confirmation,
/// not a slow timer. It costs 10 adverts a second from each master to each peer (a minimal
/// 60-byte frame: 4.8 kbit/s a peer). A keepalived router in the same VRID sets its own interval
/// (`advert_int`): set this to it (VRRPv2 drops adverts of another interval).
pub const ADVERT_INTERVAL_MS: u32 = 100;

/// The platform keys keelson reads.
const USED_PLATFORM: &[&str] = &[
    "apiVIPs",
    "apiVIP",
    "ingressVIPs",
    "ingressVIP",
    "apiFloatingIP",
    "lbFloatingIP",
    "loadBalancer",
    "ingressFloatingIP",
    "externalNetwork",
];

/// `T` from `v` through serde; an error names the field path below `prefix`.
fn typed<T: serde::de::DeserializeOwned>(v: Value, prefix: &str) -> Result<T, InstallConfigError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        InstallConfigError::Invalid {
            path: match (prefix.is_empty(), path.as_str()) {
                (true, _) => path,
                (false, ".") => prefix.to_owned(),
                (false, _) => format!("{prefix}.{path}"),
            },
            message: e.into_inner().to_string(),
        }
    })
}

/// The top-level and platform fields keelson reads; anything else is noted.
const USED_TOP: &[&str] = &[
    "apiVersion",
    "baseDomain",
    "metadata",
    "controlPlane",
    "compute",
    "networking",
    "platform",
    "sshKey",
    "pullSecret",
];

/// Names the keys of `map` that are not in `used`, as notes under `prefix`.
fn unused_keys(map: &Value, used: &[&str], prefix: &str) -> Vec<String> {
    map.as_mapping()
        .into_iter()
        .flat_map(|m| m.keys().filter_map(Value::as_str))
        .filter(|k| !used.contains(k))
        .map(|k| format!("{prefix}{k}: not used by keelson, ignored"))
        .collect()
}

/// The machine networks: current `machineNetwork[].cidr`, or 4.2's `machineCIDR`.
fn machine_networks(networking: Option<Networking>) -> Result<Vec<IpNet>, InstallConfigError> {
    let mut out = Vec::new();
    match networking {
        Some(Networking {
            machine_network: Some(list),
            ..
        }) => {
            for (i, item) in list.into_iter().enumerate() {
                let Checked(Cidr(net)) = item.cidr.ok_or_else(|| {
                    field_err(
                        &format!("networking.machineNetwork[{i}].cidr"),
                        "a CIDR",
                        &Value::Null,
                    )
                })?;
                out.push(net);
            }
        }
        Some(Networking {
            machine_cidr: Some(Checked(Cidr(net))),
            ..
        }) => out.push(net),
        _ => {}
    }
    if out.is_empty() {
        return Err(field_err(
            "networking.machineNetwork",
            "at least one machine network CIDR",
            &Value::Null,
        ));
    }
    Ok(out)
}

/// What [`platform`] reads.
struct PlatformFields {
    name: String,
    api_vips: Vec<IpAddr>,
    ingress_vips: Vec<IpAddr>,
    api_floating_ip: Option<IpAddr>,
    ingress_floating_ip: Option<IpAddr>,
    external_network: Option<String>,
    load_balancer: LoadBalancerType,
}

/// The floating IPs (`apiFloatingIP` or 4.2's `lbFloatingIP`, `ingressFloatingIP`), checked
/// as OpenShift's installer checks them: IPv4 (Neutron's floating IPs are), on the external
/// network and so outside the machine networks, distinct, and only with `externalNetwork`.
fn floating_ips(
    vips: &PlatformVips,
    base: &str,
    machine_networks: &[IpNet],
) -> Result<(Option<IpAddr>, Option<IpAddr>), InstallConfigError> {
    let ip = |f: &Option<Checked<Ip>>| f.as_ref().map(|Checked(Ip(a))| *a);
    let (api, lb, ingress) = (
        ip(&vips.api_floating_ip),
        ip(&vips.lb_floating_ip),
        ip(&vips.ingress_floating_ip),
    );
    if let (Some(a), Some(l)) = (api, lb)
        && a != l
    {
        return Err(InstallConfigError::Field {
            field: format!("{base}.lbFloatingIP"),
            expected: format!("the same address as apiFloatingIP ({a}), or only one of the two"),
            got: l.to_string(),
        });
    }
    let api_field = if api.is_some() {
        "apiFloatingIP"
    } else {
        "lbFloatingIP"
    };
    let api = api.or(lb);
    for (field, fip) in [(api_field, api), ("ingressFloatingIP", ingress)] {
        let Some(fip) = fip else { continue };
        let expected = if fip.is_ipv6() {
            Some("an IPv4 address (Neutron's floating IPs are IPv4)".to_owned())
        } else {
            machine_networks.iter().find(|n| n.contains(&fip)).map(|n| {
                format!("an address on the external network, outside the machine network {n}")
            })
        };
        if let Some(expected) = expected {
            return Err(InstallConfigError::Field {
                field: format!("{base}.{field}"),
                expected,
                got: fip.to_string(),
            });
        }
        if vips.external_network.is_none() {
            return Err(InstallConfigError::Field {
                field: format!("{base}.externalNetwork"),
                expected: format!(
                    "the external network's name, where {field} {fip} lives (floating IPs need a router to it)"
                ),
                got: "nothing".into(),
            });
        }
    }
    if let (Some(a), Some(i)) = (api, ingress)
        && a == i
    {
        return Err(InstallConfigError::Field {
            field: format!("{base}.ingressFloatingIP"),
            expected: format!("a floating IP other than {api_field}"),
            got: i.to_string(),
        });
    }
    Ok((api, ingress))
}

/// The key of the first platform with a mapping, its API and ingress VIPs checked against
/// the machine networks, the floating IP; notes for the platform keys keelson does not read.
fn platform(
    doc: &Value,
    machine_networks: &[IpNet],
    given: &GivenVips,
    notes: &mut Vec<String>,
) -> Result<PlatformFields, InstallConfigError> {
    let platform = doc
        .as_mapping()
        .and_then(|m| m.get(Value::String("platform".into())))
        .filter(|v| !v.is_null())
        .ok_or_else(|| {
            field_err(
                "platform",
                "a mapping with the VIPs (platform.openstack.apiVIPs)",
                &Value::Null,
            )
        })?;
    let (pname, p) = platform
        .as_mapping()
        .and_then(|m| m.iter().find(|(_, v)| v.is_mapping()))
        .and_then(|(k, v)| Some((k.as_str()?.to_owned(), v)))
        .ok_or_else(|| field_err("platform", "a mapping such as openstack: {...}", platform))?;
    let base = format!("platform.{pname}");
    let vips: PlatformVips = typed(p.clone(), &base)?;
    let (api_floating_ip, ingress_floating_ip) = floating_ips(&vips, &base, machine_networks)?;
    let pick = |list: Option<List<Ip>>,
                one: Option<Checked<Ip>>,
                given: &[IpAddr],
                plural: &str| match (list, one) {
        _ if !given.is_empty() => Ok(given.to_vec()),
        (Some(List(l)), _) => Ok(l.into_iter().map(|Ip(a)| a).collect::<Vec<_>>()),
        (None, Some(Checked(Ip(a)))) => Ok(vec![a]),
        (None, None) if pname == "none" => Err(InstallConfigError::Field {
            field: format!("{base}.{plural}"),
            expected: "the VIPs on keelson's command line (--api-vip, --ingress-vip): \
                       platform none has no VIP fields, and openshift-install refuses unknown ones"
                .into(),
            got: "nothing".into(),
        }),
        (None, None) => Err(field_err(
            &format!("{base}.{plural}"),
            "a list with the VIP",
            &Value::Null,
        )),
    };
    let api_vips = pick(vips.api_vips, vips.api_vip, &given.api, "apiVIPs")?;
    let ingress_vips = pick(
        vips.ingress_vips,
        vips.ingress_vip,
        &given.ingress,
        "ingressVIPs",
    )?;
    // Errors name where the VIPs came from: the command line's flag, or the platform's field.
    let label = |field: &str| match field {
        "apiVIPs" if !given.api.is_empty() => "--api-vip".to_owned(),
        "ingressVIPs" if !given.ingress.is_empty() => "--ingress-vip".to_owned(),
        _ => format!("{base}.{field}"),
    };
    for (field, list) in [("apiVIPs", &api_vips), ("ingressVIPs", &ingress_vips)] {
        if list.is_empty()
            || list.len() > 2
            || (list.len() == 2 && list[0].is_ipv4() == list[1].is_ipv4())
        {
            return Err(InstallConfigError::Field {
                field: label(field),
                expected: "one VIP, or one IPv4 and one IPv6".into(),
                got: format!("{list:?}"),
            });
        }
        for (i, vip) in list.iter().enumerate() {
            if !machine_networks.iter().any(|n| n.contains(vip)) {
                return Err(InstallConfigError::Field {
                    field: format!("{}[{i}]", label(field)),
                    expected: format!(
                        "an address inside the machine network ({})",
                        machine_networks
                            .iter()
                            .map(|n| n.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    got: vip.to_string(),
                });
            }
        }
    }
    if let Some(same) = api_vips.iter().find(|v| ingress_vips.contains(v)) {
        return Err(InstallConfigError::Field {
            field: label("ingressVIPs"),
            expected: "a VIP different from the API VIP".into(),
            got: same.to_string(),
        });
    }
    let load_balancer = vips
        .load_balancer
        .and_then(|l| l.kind)
        .map(|Checked(LoadBalancerKind(k))| k)
        .unwrap_or_default();
    notes.extend(unused_keys(p, USED_PLATFORM, &format!("{base}.")));
    Ok(PlatformFields {
        name: pname,
        api_vips,
        ingress_vips,
        api_floating_ip,
        ingress_floating_ip,
        external_network: vips.external_network.map(|Checked(NonEmpty(n))| n),
        load_balancer,
    })
}

/// VIPs given on keelson's command line (`--api-vip`, `--ingress-vip`): they take the place
/// of the platform's, and are how `platform: none` (OpenShift's UPI, whose install-config
/// has no VIP fields) gets them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenVips {
    /// API VIPs (one, or one per family).
    pub api: Vec<IpAddr>,
    /// Ingress VIPs.
    pub ingress: Vec<IpAddr>,
}

impl InstallConfig {
    /// Parses install-config.yaml text.
    pub fn parse(text: &str) -> Result<Self, InstallConfigError> {
        Self::parse_with(text, &GivenVips::default())
    }

    /// Parses install-config.yaml text with VIPs given on the command line.
    pub fn parse_with(text: &str, given: &GivenVips) -> Result<Self, InstallConfigError> {
        let doc: Value =
            serde_norway::from_str(text).map_err(|e| InstallConfigError::Yaml(e.to_string()))?;
        if !doc.is_mapping() {
            return Err(field_err("(top level)", "a mapping", &doc));
        }
        let mut notes = unused_keys(&doc, USED_TOP, "");
        let d: Document = typed(doc.clone(), "")?;
        let base_domain = match d.base_domain {
            Some(Checked(NonEmpty(s))) => s,
            None => return Err(field_err("baseDomain", "a non-empty string", &Value::Null)),
        };
        let name = match d.metadata {
            None => return Err(field_err("metadata", "a mapping with name", &Value::Null)),
            Some(MetadataSection { name: None }) => {
                return Err(field_err(
                    "metadata.name",
                    "a non-empty string",
                    &Value::Null,
                ));
            }
            Some(MetadataSection {
                name: Some(Checked(NonEmpty(n))),
            }) => n,
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            || name.starts_with('-')
            || name.len() > 63
        {
            return Err(field_err(
                "metadata.name",
                "a DNS label (lower-case letters, digits, '-')",
                &Value::String(name),
            ));
        }
        let masters = match d.control_plane.and_then(|c| c.replicas) {
            Some(Checked(Replicas(n))) => n,
            None => 3,
        };
        let workers: u32 = match d.compute {
            None => 3,
            Some(pools) => pools
                .into_iter()
                .filter_map(|p| p.replicas)
                .map(|Checked(Replicas(n))| n)
                .sum(),
        };
        if masters + workers > MAX_NODES {
            return Err(InstallConfigError::Invalid {
                path: "compute[].replicas".into(),
                message: format!(
                    "{masters} masters and {workers} workers are {} nodes; a keelson cluster \
                     holds at most {MAX_NODES} (every members registry keeps that many \
                     records; docs/scale.md)",
                    masters + workers
                ),
            });
        }
        let machine_networks = machine_networks(d.networking)?;
        let p = platform(&doc, &machine_networks, given, &mut notes)?;
        Ok(InstallConfig {
            name,
            base_domain,
            masters,
            workers,
            machine_networks,
            api_vips: p.api_vips,
            ingress_vips: p.ingress_vips,
            ssh_keys: d.ssh_key.map(|Checked(SshKeys(k))| k).unwrap_or_default(),
            api_floating_ip: p.api_floating_ip,
            ingress_floating_ip: p.ingress_floating_ip,
            external_network: p.external_network,
            platform: p.name,
            load_balancer: p.load_balancer,
            notes,
        })
    }

    /// How long a clean VRRP hand-over carries the old holder's connections
    /// ([`VrrpInstanceConfig::handback_secs`]): 30 s (the proxy's drain) where a node may
    /// send a client's frames on to another node; off on OpenStack, whose ports drop frames
    /// from addresses not their own (port security) — there a forwarded segment would be
    /// lost instead of reset, and the client would wait instead of reconnecting.
    pub fn handback_secs(&self) -> u32 {
        if self.platform == "openstack" { 0 } else { 30 }
    }

    /// The agent's `cluster.json` with OpenShift's defaults (docs/vrrp.md): VRIDs from
    /// Fletcher-8 of `<name>-api`/`-ingress`, API priorities bootstrap 70 / masters 40 with
    /// the proxy, Ignition and local-apiserver checks, ingress on the workers at 20, 100 ms adverts ([`ADVERT_INTERVAL_MS`]), VRRPv3
    /// unicast with unicast members (OpenShift's default since 4.11; docs/decisions.md),
    /// garp refresh 60 s.
    // Over 100 lines on purpose: one struct literal, OpenShift's defaults field by field, read top to bottom against docs/cluster-json.md.
    pub fn cluster_config(&self) -> ClusterConfig {
        let (api_vrid, ingress_vrid) = default_vrids(&self.name);
        let mut instances = Vec::new();
        for (i, vip) in self.api_vips.iter().enumerate() {
            instances.push(VrrpInstanceConfig {
                name: if i == 0 {
                    "api".into()
                } else {
                    "api-v6".into()
                },
                // One node holds both families' API VIPs (docs/decisions.md).
                follows: (i > 0).then(|| "api".into()),
                vip: *vip,
                vrid: api_vrid,
                version: VrrpVersion::V3,
                advert_interval_ms: ADVERT_INTERVAL_MS,
                transport: VrrpTransport::Unicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: None,
                preempt: true,
                garp_refresh_secs: 60,
                handback_secs: self.handback_secs(),
                priorities: RolePriorities {
                    bootstrap: Some(70),
                    master: Some(40),
                    worker: None,
                },
                checks: vec![
                    HealthCheckConfig {
                        name: "api-proxy".into(),
                        check: HealthCheckKind::ProxyHealthyBackend,
                        interval_ms: 1000,
                        rise: 1,
                        fall: 3,
                        weight: 50,
                        timeout_ms: None,
                    },
                    HealthCheckConfig {
                        name: "ignition-server".into(),
                        check: HealthCheckKind::IgnitionServer,
                        interval_ms: 1000,
                        rise: 1,
                        fall: 3,
                        weight: 10,
                        timeout_ms: None,
                    },
                    // Slow is not dead (docs/vrrp.md): an answer within 10 s passes
                    // (haproxy's `timeout check 10s`, OCPBUGS-43428), a refused or failed
                    // probe counts at once. Weight 20 < 30 (bootstrap minus master) so it
                    // never moves the VIP off the bootstrap by itself.
                    HealthCheckConfig {
                        name: "local-apiserver".into(),
                        check: HealthCheckKind::LocalApiserver,
                        interval_ms: 2000,
                        rise: 3,
                        fall: 2,
                        weight: LOCAL_APISERVER_WEIGHT,
                        timeout_ms: Some(10_000),
                    },
                ],
                required_checks: vec![],
            });
        }
        for (i, vip) in self.ingress_vips.iter().enumerate() {
            instances.push(VrrpInstanceConfig {
                name: if i == 0 {
                    "ingress".into()
                } else {
                    "ingress-v6".into()
                },
                follows: (i > 0).then(|| "ingress".into()),
                vip: *vip,
                vrid: ingress_vrid,
                version: VrrpVersion::V3,
                advert_interval_ms: ADVERT_INTERVAL_MS,
                transport: VrrpTransport::Unicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: None,
                preempt: true,
                garp_refresh_secs: 60,
                handback_secs: self.handback_secs(),
                // Every node that runs a router takes part, masters included (routers
                // are scheduled there when the cluster has no workers, or by the
                // operator's choice); a node whose router does not answer its readiness
                // probe (the router's stats port, as OpenShift's keepalived asks) never
                // holds the VIP (docs/vrrp.md, "Ingress follows the routers").
                priorities: RolePriorities {
                    bootstrap: None,
                    master: Some(20),
                    worker: Some(20),
                },
                checks: vec![],
                required_checks: vec![HealthCheckConfig {
                    name: "ingress-router".into(),
                    check: HealthCheckKind::Http {
                        url: "http://127.0.0.1:1936/healthz/ready".into(),
                        expect_status: 200,
                    },
                    interval_ms: 1000,
                    rise: 1,
                    fall: 3,
                    weight: 0,
                    timeout_ms: None,
                }],
            });
        }
        // An external load balancer owns the VIPs: no virtual routers (the operator may
        // still add some with a patch).
        if self.load_balancer == LoadBalancerType::UserManaged {
            instances.clear();
        }
        ClusterConfig {
            version: CLUSTER_JSON_VERSION,
            name: self.name.clone(),
            base_domain: self.base_domain.clone(),
            machine_networks: self.machine_networks.clone(),
            api_vips: self.api_vips.clone(),
            ingress_vips: self.ingress_vips.clone(),
            vrrp: VrrpSettings { instances },
            api: ApiSettings {
                frontend_port: 9445,
                vip_port: 6443,
                backend_port: 6443,
                monitor_port: 50936,
                static_backends: vec![],
                check: BackendCheck::TlsReadyz,
                check_interval_ms: 5000,
                fall: 3,
                rise: 1,
                fast_check_interval_ms: 1000,
                slowstart_ms: 10_000,
                shutdown_sessions: true,
                connect_timeout_ms: 10_000,
                idle_timeout_secs: 86_400,
                max_connections: 20_000,
            },
            dns: DnsSettings {
                port: 53,
                ttl: 60,
                upstreams: vec![],
                manage_resolv_conf: true,
                etcd: Some(crate::cluster::EtcdRecords::for_spec(
                    crate::SpecVersion::DEFAULT.as_str(),
                    self.masters,
                )),
            },
            ignition: IgnitionServerSettings {
                tls_port: 22623,
                plain_port: 22624,
                allowed_networks: self.machine_networks.clone(),
                spec: crate::SpecVersion::DEFAULT.as_str().into(),
            },
            members: MembersSettings {
                transport: MembersTransport::Unicast,
                renew_interval_secs: 10,
                expiry_secs: 35,
                key_id: None,
                max_clock_skew_secs: None,
                forget_after_secs: None,
            },
            metrics: crate::cluster::MetricsSettings::default(),
            ssh_authorized_keys: self.ssh_keys.clone(),
            bgp: None,
            services: vec![],
            node_address: Default::default(),
            load_balancer: LoadBalancerSettings {
                kind: self.load_balancer,
            },
        }
    }
}

#[cfg(test)]
mod tests;
