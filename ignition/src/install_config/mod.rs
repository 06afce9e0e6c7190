//! OpenShift's `install-config.yaml` (apiVersion v1), as users already have it: the current
//! form (`platform.openstack.apiVIPs`/`ingressVIPs`, `networking.machineNetwork`) and the
//! 4.2-era one (`apiVIP`/`ingressVIP`, `lbFloatingIP`, `networking.machineCIDR`, ...).
//!
//! Read field by field from the YAML tree (not derived with serde) so every error names the
//! field path and what was expected: `controlPlane.replicas: expected an integer >= 1, got
//! "three"`. Fields keelson does not use are kept out of the way and listed as notes.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_norway::Value;

use crate::cluster::{
    ApiSettings, BackendCheck, CLUSTER_JSON_VERSION, ClusterConfig, DnsSettings, HealthCheckConfig,
    HealthCheckKind, IgnitionServerSettings, MembersSettings, MembersTransport, RolePriorities,
    VrrpInstanceConfig, VrrpSettings, VrrpTransport, VrrpVersion, default_vrids,
};

/// An install-config error: the field path and what was expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallConfigError {
    /// Not YAML at all.
    #[error("not valid YAML: {0}")]
    Yaml(String),
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
    /// `platform.openstack.lbFloatingIP` / `apiFloatingIP`, if any (documentation only: the
    /// floating IP is Neutron's business, attached to the API VIP's port).
    pub api_floating_ip: Option<IpAddr>,
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

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping()?
        .get(Value::String(key.into()))
        .filter(|v| !v.is_null())
}

fn req_str(v: &Value, path: &str, key: &str) -> Result<String, InstallConfigError> {
    let field = join(path, key);
    match get(v, key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
        Some(other) => Err(field_err(&field, "a non-empty string", other)),
        None => Err(field_err(&field, "a non-empty string", &Value::Null)),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn replicas(v: Option<&Value>, field: &str, min: u64) -> Result<u32, InstallConfigError> {
    match v {
        None => Ok(if min == 0 { 0 } else { 3 }),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= min && n <= 1000) => {
            Ok(n.as_u64().unwrap_or(0) as u32)
        }
        Some(other) => Err(field_err(field, &format!("an integer >= {min}"), other)),
    }
}

fn ip_list(v: &Value, field: &str) -> Result<Vec<IpAddr>, InstallConfigError> {
    match v {
        Value::Sequence(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| ip_of(item, &format!("{field}[{i}]")))
            .collect(),
        other => Err(field_err(field, "a list of IP addresses", other)),
    }
}

fn ip_of(v: &Value, field: &str) -> Result<IpAddr, InstallConfigError> {
    match v {
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| field_err(field, "an IP address", v)),
        other => Err(field_err(field, "an IP address", other)),
    }
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

impl InstallConfig {
    /// Parses install-config.yaml text.
    pub fn parse(text: &str) -> Result<Self, InstallConfigError> {
        let doc: Value =
            serde_norway::from_str(text).map_err(|e| InstallConfigError::Yaml(e.to_string()))?;
        if !doc.is_mapping() {
            return Err(field_err("(top level)", "a mapping", &doc));
        }
        let mut notes = Vec::new();
        if let Some(map) = doc.as_mapping() {
            for key in map.keys().filter_map(Value::as_str) {
                if !USED_TOP.contains(&key) {
                    notes.push(format!("{key}: not used by keelson, ignored"));
                }
            }
        }
        if let Some(v) = get(&doc, "apiVersion")
            && v.as_str() != Some("v1")
        {
            return Err(field_err("apiVersion", "\"v1\"", v));
        }
        let base_domain = req_str(&doc, "", "baseDomain")?;
        let metadata = get(&doc, "metadata")
            .ok_or_else(|| field_err("metadata", "a mapping with name", &Value::Null))?;
        let name = req_str(metadata, "metadata", "name")?;
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
        let masters = replicas(
            get(&doc, "controlPlane").and_then(|c| get(c, "replicas")),
            "controlPlane.replicas",
            1,
        )?;
        let mut workers = 0;
        match get(&doc, "compute") {
            None => workers = 3,
            Some(Value::Sequence(pools)) => {
                for (i, pool) in pools.iter().enumerate() {
                    workers +=
                        replicas(get(pool, "replicas"), &format!("compute[{i}].replicas"), 0)?;
                }
            }
            Some(other) => return Err(field_err("compute", "a list of machine pools", other)),
        }

        // Machine networks: current `machineNetwork[].cidr`, or 4.2's `machineCIDR`.
        let networking = get(&doc, "networking");
        let mut machine_networks = Vec::new();
        if let Some(list) = networking.and_then(|n| get(n, "machineNetwork")) {
            let Value::Sequence(items) = list else {
                return Err(field_err(
                    "networking.machineNetwork",
                    "a list of {cidr: ...}",
                    list,
                ));
            };
            for (i, item) in items.iter().enumerate() {
                let field = format!("networking.machineNetwork[{i}].cidr");
                let cidr =
                    get(item, "cidr").ok_or_else(|| field_err(&field, "a CIDR", &Value::Null))?;
                machine_networks.push(
                    cidr.as_str()
                        .and_then(|s| s.trim().parse::<IpNet>().ok())
                        .ok_or_else(|| field_err(&field, "a CIDR such as 10.0.0.0/16", cidr))?
                        .trunc(),
                );
            }
        } else if let Some(cidr) = networking.and_then(|n| get(n, "machineCIDR")) {
            machine_networks.push(
                cidr.as_str()
                    .and_then(|s| s.trim().parse::<IpNet>().ok())
                    .ok_or_else(|| {
                        field_err("networking.machineCIDR", "a CIDR such as 10.0.0.0/16", cidr)
                    })?
                    .trunc(),
            );
        }
        if machine_networks.is_empty() {
            return Err(field_err(
                "networking.machineNetwork",
                "at least one machine network CIDR",
                &Value::Null,
            ));
        }

        // VIPs: the platform that has them (openstack, baremetal, vsphere, ovirt all use the
        // same names).
        let platform = get(&doc, "platform").ok_or_else(|| {
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
        let vips = |plural: &str, singular: &str| -> Result<Vec<IpAddr>, InstallConfigError> {
            if let Some(v) = get(p, plural) {
                return ip_list(v, &format!("{base}.{plural}"));
            }
            if let Some(v) = get(p, singular) {
                return Ok(vec![ip_of(v, &format!("{base}.{singular}"))?]);
            }
            Err(field_err(
                &format!("{base}.{plural}"),
                "a list with the VIP",
                &Value::Null,
            ))
        };
        let api_vips = vips("apiVIPs", "apiVIP")?;
        let ingress_vips = vips("ingressVIPs", "ingressVIP")?;
        for (field, list) in [("apiVIPs", &api_vips), ("ingressVIPs", &ingress_vips)] {
            if list.is_empty()
                || list.len() > 2
                || (list.len() == 2 && list[0].is_ipv4() == list[1].is_ipv4())
            {
                return Err(InstallConfigError::Field {
                    field: format!("{base}.{field}"),
                    expected: "one VIP, or one IPv4 and one IPv6".into(),
                    got: format!("{list:?}"),
                });
            }
            for (i, vip) in list.iter().enumerate() {
                if !machine_networks.iter().any(|n| n.contains(vip)) {
                    return Err(InstallConfigError::Field {
                        field: format!("{base}.{field}[{i}]"),
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
                field: format!("{base}.ingressVIPs"),
                expected: "a VIP different from the API VIP".into(),
                got: same.to_string(),
            });
        }
        let api_floating_ip = match get(p, "apiFloatingIP").or_else(|| get(p, "lbFloatingIP")) {
            Some(v) => Some(ip_of(v, &format!("{base}.apiFloatingIP"))?),
            None => None,
        };
        for key in p
            .as_mapping()
            .map(|m| m.keys().filter_map(Value::as_str).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            if ![
                "apiVIPs",
                "apiVIP",
                "ingressVIPs",
                "ingressVIP",
                "apiFloatingIP",
                "lbFloatingIP",
            ]
            .contains(&key)
            {
                notes.push(format!("{base}.{key}: not used by keelson, ignored"));
            }
        }
        let ssh_keys = match get(&doc, "sshKey") {
            None => vec![],
            Some(Value::String(s)) => s
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(other) => return Err(field_err("sshKey", "an SSH public key string", other)),
        };
        Ok(InstallConfig {
            name,
            base_domain,
            masters,
            workers,
            machine_networks,
            api_vips,
            ingress_vips,
            ssh_keys,
            api_floating_ip,
            notes,
        })
    }

    /// The agent's `cluster.json` with OpenShift's defaults (docs/vrrp.md): VRIDs from
    /// Fletcher-8 of `<name>-api`/`-ingress`, API priorities bootstrap 70 / masters 40 with
    /// the proxy and Ignition checks, ingress on the workers at 20, 1 s adverts, VRRPv3
    /// unicast with unicast members (OpenShift's default since 4.11; docs/decisions.md),
    /// garp refresh 60 s.
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
                vip: *vip,
                vrid: api_vrid,
                version: VrrpVersion::V3,
                advert_interval_ms: 1000,
                transport: VrrpTransport::Unicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: None,
                preempt: true,
                garp_refresh_secs: 60,
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
                    },
                    HealthCheckConfig {
                        name: "ignition-server".into(),
                        check: HealthCheckKind::IgnitionServer,
                        interval_ms: 1000,
                        rise: 1,
                        fall: 3,
                        weight: 10,
                    },
                ],
            });
        }
        for (i, vip) in self.ingress_vips.iter().enumerate() {
            instances.push(VrrpInstanceConfig {
                name: if i == 0 {
                    "ingress".into()
                } else {
                    "ingress-v6".into()
                },
                vip: *vip,
                vrid: ingress_vrid,
                version: VrrpVersion::V3,
                advert_interval_ms: 1000,
                transport: VrrpTransport::Unicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: None,
                preempt: true,
                garp_refresh_secs: 60,
                priorities: RolePriorities {
                    bootstrap: None,
                    master: if self.workers == 0 { Some(20) } else { None },
                    worker: Some(20),
                },
                // As OpenShift's keepalived: the node whose router answers its readiness
                // probe (the router's stats port) gets the ingress VIP.
                checks: vec![HealthCheckConfig {
                    name: "ingress-router".into(),
                    check: HealthCheckKind::Http {
                        url: "http://127.0.0.1:1936/healthz/ready".into(),
                        expect_status: 200,
                    },
                    interval_ms: 1000,
                    rise: 1,
                    fall: 3,
                    weight: 50,
                }],
            });
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
            },
            metrics: crate::cluster::MetricsSettings::default(),
            ssh_authorized_keys: self.ssh_keys.clone(),
            bgp: None,
            services: vec![],
        }
    }
}

#[cfg(test)]
mod tests;
