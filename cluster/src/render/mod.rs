//! Ignition configs as data (docs/architecture.md, "From install-config to a running node"):
//! the full configs each role boots from and the pointer configs given as user_data, for spec
//! 2.2 (RHCOS 4.2–4.5, our own types) and 3.0–3.5 (typed by the `ignition-config` crate).
//!
//! One version-neutral model ([`Model`]) is built per role, rendered as one typed 3.x config
//! ([`v3_config`]) and written in the asked spec; the same inputs give the same bytes (keys in
//! struct order, no timestamps), which is what lets a node's Ignition server serve exactly
//! what `keelson render` prints.

pub mod convert;
pub mod hosted;
pub mod merge;
pub mod openshift;
pub mod operator;
pub mod v22;

use std::io::Write;

use base64::Engine;
use sha2::{Digest, Sha512};

use crate::cluster::{ClusterConfig, Role};
use crate::paths;
use crate::unit;
use crate::version::SpecVersion;

/// Nova's cap on user_data: the length of its base64 form (the compute API's schema says
/// `maxLength: 65535` of the base64 text the client sends).
pub const USER_DATA_MAX: usize = 65_535;
/// The largest config whose base64 form fits in [`USER_DATA_MAX`]: 16,383 groups of three
/// bytes, 49,149 bytes.
pub const USER_DATA_MAX_RAW: usize = USER_DATA_MAX / 4 * 3;

/// The length of the base64 form (padded, as clients send it) of `len` bytes.
pub fn base64_len(len: usize) -> usize {
    len.div_ceil(3) * 4
}

/// What a full config needs besides cluster.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAssets {
    /// Cluster root CA certificate (PEM).
    pub ca_pem: String,
    /// Ignition server certificate (PEM).
    pub server_cert_pem: String,
    /// Ignition server key (PEM).
    pub server_key_pem: String,
    /// sha512 (hex) of the agent binary.
    pub agent_sha512: String,
    /// Where nodes fetch the agent; `None` for the appliance (the image already has it).
    pub agent_url: Option<String>,
    /// The agent itself, written inline into the bootstrap's config when it has no
    /// `agent_url` yet is not the appliance: the RHCOS bootstrap beside openshift-install,
    /// whose config is hosted anyway (docs/own-ignition.md).
    pub agent_inline: Option<std::sync::Arc<[u8]>>,
    /// Membership key files by name (`membership.key`, and during a rotation
    /// `membership.previous.key` / `membership.next.key`), written to every node's
    /// `/etc/keelson/tls/` (mode 0600).
    pub membership_keys: std::collections::BTreeMap<String, String>,
    /// The operator's own configs by role (`keelson build --merge`), merged into that
    /// role's full config; the master and worker ones also travel to the nodes that serve
    /// them (docs/own-ignition.md).
    pub operator: operator::OperatorConfigs,
}

/// Errors rendering a config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The typed config rejected the document (a bug, reported with the version).
    #[error("spec {spec}: {message}")]
    Typed {
        /// The spec version.
        spec: SpecVersion,
        /// What serde said.
        message: String,
    },
    /// The cluster has no API VIP to point at.
    #[error("cluster.json apiVips: expected at least one VIP")]
    NoVip,
    /// A user_data config is over Nova's cap.
    #[error(
        "{what} is {size} bytes, {base64} in base64, over Nova's user_data limit of {USER_DATA_MAX} bytes of base64 ({USER_DATA_MAX_RAW} bytes of config): {why}"
    )]
    TooLarge {
        /// Which config.
        what: String,
        /// Its size.
        size: usize,
        /// The size of its base64 form, which Nova measures.
        base64: usize,
        /// What to do.
        why: String,
    },
    /// The operator's config for the role cannot be merged into keelson's.
    #[error(transparent)]
    Operator(#[from] operator::OperatorConfigError),
}

/// A file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// Inline bytes (written as a data: URL).
    Inline(Vec<u8>),
    /// Fetched from `url`, verified against the sha512 (hex).
    Remote {
        /// Source URL.
        url: String,
        /// sha512 hex of the contents.
        sha512: String,
    },
}

/// A file in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Absolute path.
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// Contents.
    pub contents: Contents,
}

/// A systemd unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// Unit name.
    pub name: String,
    /// Enable it.
    pub enabled: bool,
    /// Unit file.
    pub contents: String,
}

/// A version-neutral config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    /// Files, in order.
    pub files: Vec<FileSpec>,
    /// Units.
    pub units: Vec<UnitSpec>,
    /// `core`'s SSH keys.
    pub ssh_keys: Vec<String>,
    /// Pointer: the config to merge (3.x) / append (2.2).
    pub merge: Option<String>,
    /// CAs trusted for HTTPS fetches (PEM).
    pub tls_cas: Vec<String>,
}

/// The URL of a role's config on the Ignition server behind the API VIP.
pub fn config_url(cluster: &ClusterConfig, role: Role) -> Result<String, RenderError> {
    let vip = cluster.api_vips.first().ok_or(RenderError::NoVip)?;
    let host = match vip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    };
    Ok(format!(
        "https://{host}:{}/config/{}",
        cluster.ignition.tls_port,
        role.as_str()
    ))
}

/// The URL of the agent binary on the Ignition server behind the API VIP.
pub fn agent_asset_url(cluster: &ClusterConfig) -> Result<String, RenderError> {
    asset_url(cluster, "keelson-agent")
}

/// The URL of asset `name` on the Ignition server behind the API VIP.
pub fn asset_url(cluster: &ClusterConfig, name: &str) -> Result<String, RenderError> {
    let url = config_url(cluster, Role::Master)?;
    Ok(url.replace("/config/master", &format!("/assets/{name}")))
}

/// The full model for `role`.
// Over 100 lines on purpose: the files of a full config in the order they are written, each role's differences beside the file they concern.
pub fn full_model(cluster: &ClusterConfig, role: Role, assets: &NodeAssets) -> Model {
    let inline = |path: &str, mode: u32, data: &[u8]| FileSpec {
        path: path.into(),
        mode,
        contents: Contents::Inline(data.to_vec()),
    };
    let mut files = vec![
        inline(paths::CLUSTER_JSON, 0o644, &cluster.to_json()),
        inline(
            paths::ROLE,
            0o644,
            format!("{}\n", role.as_str()).as_bytes(),
        ),
        inline(paths::CA, 0o644, assets.ca_pem.as_bytes()),
        inline(paths::TRUST_ANCHOR, 0o644, assets.ca_pem.as_bytes()),
        // The node's resolver asks the local agent first, through NetworkManager (RHCOS);
        // the appliance writes its own resolv.conf and never reads this file.
        inline(
            crate::resolver::PROFILE_PATH,
            0o600,
            crate::resolver::networkmanager_profile(&cluster.zone()).as_bytes(),
        ),
    ];
    // Every node signs its member records (workers too).
    for (name, text) in &assets.membership_keys {
        files.push(inline(
            &format!("{}/{name}", crate::paths::TLS_DIR),
            0o600,
            text.as_bytes(),
        ));
    }
    // The bootstrap serves configs now and masters after the pivot; workers never do, so
    // they never hold the server key.
    if role != Role::Worker {
        files.push(inline(
            paths::SERVER_CERT,
            0o644,
            assets.server_cert_pem.as_bytes(),
        ));
        files.push(inline(
            paths::SERVER_KEY,
            0o600,
            assets.server_key_pem.as_bytes(),
        ));
    }
    // The nodes that serve configs keep the operator's master and worker configs, which
    // their Ignition server merges into what it renders (docs/own-ignition.md).
    if role != Role::Worker {
        for pool in [Role::Master, Role::Worker] {
            if let Some(op) = assets.operator.get(&pool) {
                files.push(inline(&operator::merge_path(pool), 0o600, &op.to_bytes()));
            }
        }
    }
    let mut units = Vec::new();
    // Masters and workers fetch the agent from the Ignition server; the RHCOS bootstrap from
    // `--agent-url`; the appliance bootstrap (no URL) already runs it as PID 1.
    let agent_url = match role {
        Role::Bootstrap => assets.agent_url.clone(),
        _ => agent_asset_url(cluster).ok(),
    };
    let agent_contents = match (agent_url, role, &assets.agent_inline) {
        (Some(url), _, _) => Some(Contents::Remote {
            url,
            sha512: assets.agent_sha512.clone(),
        }),
        (None, Role::Bootstrap, Some(bytes)) => Some(Contents::Inline(bytes.to_vec())),
        _ => None,
    };
    if let Some(contents) = agent_contents {
        files.push(FileSpec {
            path: unit::AGENT_PATH.into(),
            mode: 0o755,
            contents,
        });
        units.push(UnitSpec {
            name: unit::AGENT_UNIT_NAME.into(),
            enabled: true,
            contents: unit::agent_unit(),
        });
    }
    // Operator services' executables, fetched like the agent. Not for the bootstrap: the
    // server they come from is the one the bootstrap itself is about to start.
    if role != Role::Bootstrap {
        for svc in cluster.services.iter().filter(|s| s.runs_on(role)) {
            // Two services may run one executable (one asset, one path): fetched once.
            if let Some(asset) = &svc.asset
                && let Ok(url) = asset_url(cluster, &asset.name)
                && !files.iter().any(|f| f.path == svc.path)
            {
                files.push(FileSpec {
                    path: svc.path.clone(),
                    mode: 0o755,
                    contents: Contents::Remote {
                        url,
                        sha512: asset.sha512.clone(),
                    },
                });
            }
        }
    }
    // Masters serve every asset after the pivot, workers' too: a worker-only service's
    // executable (the ingress router's, say) is fetched into the assets directory, from
    // where the master's Ignition server hands it to the workers. Without it the workers'
    // first boot would stop at a 404 once the bootstrap is gone.
    if role == Role::Master {
        let mut served: Vec<&str> = Vec::new();
        for svc in &cluster.services {
            let Some(asset) = &svc.asset else { continue };
            if svc.runs_on(Role::Master) || served.contains(&asset.name.as_str()) {
                continue;
            }
            let installed = cluster.services.iter().any(|o| {
                o.runs_on(Role::Master) && o.asset.as_ref().is_some_and(|a| a.name == asset.name)
            });
            if installed {
                continue;
            }
            if let Ok(url) = asset_url(cluster, &asset.name) {
                files.push(FileSpec {
                    path: format!("{}/{}", paths::ASSETS_DIR, asset.name),
                    mode: 0o644,
                    contents: Contents::Remote {
                        url,
                        sha512: asset.sha512.clone(),
                    },
                });
                served.push(&asset.name);
            }
        }
    }
    Model {
        files,
        units,
        ssh_keys: cluster.ssh_authorized_keys.clone(),
        merge: None,
        tls_cas: vec![assets.ca_pem.clone()],
    }
}

/// The pointer model for `role`: merge the full config from the API VIP's Ignition server,
/// trusting the cluster CA.
pub fn pointer_model(
    cluster: &ClusterConfig,
    role: Role,
    ca_pem: &str,
) -> Result<Model, RenderError> {
    Ok(Model {
        merge: Some(config_url(cluster, role)?),
        tls_cas: vec![ca_pem.to_owned()],
        ..Model::default()
    })
}

/// Renders the full config of `role` in `spec`: keelson's own, with the operator's config
/// for the role merged in when the build has one.
pub fn render_full(
    cluster: &ClusterConfig,
    role: Role,
    spec: SpecVersion,
    assets: &NodeAssets,
) -> Result<Vec<u8>, RenderError> {
    let own = write(&full_model(cluster, role, assets), spec)?;
    match assets.operator.get(&role) {
        None => Ok(own),
        Some(op) => Ok(operator::merge_into(
            &own,
            &format!("keelson's {role} config"),
            op,
            spec,
        )?),
    }
}

/// Renders the pointer config of `role` in `spec`.
pub fn render_pointer(
    cluster: &ClusterConfig,
    role: Role,
    spec: SpecVersion,
    ca_pem: &str,
) -> Result<Vec<u8>, RenderError> {
    write(&pointer_model(cluster, role, ca_pem)?, spec)
}

/// Refuses a config meant as user_data that Nova would not take: its base64 form over
/// [`USER_DATA_MAX`].
pub fn check_user_data(what: &str, bytes: &[u8]) -> Result<(), RenderError> {
    let base64 = base64_len(bytes.len());
    if base64 > USER_DATA_MAX {
        return Err(RenderError::TooLarge {
            what: what.into(),
            size: bytes.len(),
            base64,
            why: "host it and boot from a small pointer to it (`keelson pointer`, docs/openstack.md), \
                  or fetch its large files by URL"
                .into(),
        });
    }
    Ok(())
}

/// An inline resource: the shortest of a percent-encoded, a base64 and a gzip+base64 data
/// URL; returns (url, compression). Only for resources whose schema has `compression`.
pub fn data_url(data: &[u8]) -> (String, Option<&'static str>) {
    let mut best = (plain_data_url(data), None);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    let gzipped = gz.write_all(data).and_then(|_| gz.finish()).ok();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    if let Some(g) = gzipped {
        let url = format!("data:;base64,{}", b64(&g));
        if url.len() < best.0.len() {
            best = (url, Some("gzip"));
        }
    }
    best
}

/// The shorter of a percent-encoded and a base64 data URL: for resources that cannot say
/// `compression` (certificate authorities in spec 2.2 and 3.0), and CAs everywhere, so
/// every client reads them the same way.
pub fn plain_data_url(data: &[u8]) -> String {
    let plain = format!("data:,{}", percent_encode(data));
    let base = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    );
    if plain.len() <= base.len() {
        plain
    } else {
        base
    }
}

/// RFC 3986 percent-encoding of everything but unreserved characters.
fn percent_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len());
    for &b in data {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `sha512-<hex>` of `data`.
pub fn sha512_hash(data: &[u8]) -> String {
    format!("sha512-{}", hex::encode(Sha512::digest(data)))
}

/// A config as read ([`read`]): typed 3.x, whatever spec it was written in.
#[derive(Debug, Clone)]
pub struct ReadConfig {
    /// The config (a 2.x one translated by [`v22::to_v3`]).
    pub config: V3Config,
    /// It was written in spec 2.x (its pointers are `ignition.config.append`).
    pub v2: bool,
    /// 2.x disk layout sections present, which have no counterpart in the translation.
    pub layout_v2: Vec<&'static str>,
}

/// Errors reading a config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Not JSON.
    #[error("expected Ignition JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// No `ignition.version` string.
    #[error("expected ignition.version")]
    NoVersion,
    /// A version the agent does not read.
    #[error("ignition.version: expected 2.2.x or 3.x, got {0:?}")]
    Version(String),
    /// A field has the wrong form; `path` names it (`storage.files[2].mode`).
    #[error("{path}: {source}")]
    Field {
        /// The field's path.
        path: String,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a config of spec 2.2, 2.3 or 3.x (any minor: the 3.x specs only add to one another,
/// and what a newer one adds is ignored) as the typed 3.x config.
pub fn read(bytes: &[u8]) -> Result<ReadConfig, ReadError> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        ignition: Option<HeadIgnition>,
    }
    #[derive(serde::Deserialize)]
    struct HeadIgnition {
        #[serde(default)]
        version: Option<serde_json::Value>,
    }
    fn typed<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ReadError> {
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes)).map_err(
            |e| ReadError::Field {
                path: e.path().to_string(),
                source: e.into_inner(),
            },
        )
    }
    let head: Head = serde_json::from_slice(bytes).map_err(ReadError::NotJson)?;
    let version = head
        .ignition
        .and_then(|i| i.version)
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or(ReadError::NoVersion)?;
    if version.starts_with("2.2.") || version.starts_with("2.3.") {
        let v2: v22::Config = typed(bytes)?;
        return Ok(ReadConfig {
            config: v22::to_v3(&v2),
            v2: true,
            layout_v2: v2
                .storage
                .as_ref()
                .map(v22::Storage::layout_sections)
                .unwrap_or_default(),
        });
    }
    if !version.starts_with("3.") {
        return Err(ReadError::Version(version));
    }
    Ok(ReadConfig {
        config: typed(bytes)?,
        v2: false,
        layout_v2: Vec::new(),
    })
}

/// The typed 3.x config every spec is written from: the newest spec keelson writes. The 3.x
/// specs only add to one another, so an older one is this config in that spec's own types
/// ([`in_spec`]), and 2.2 is one translation away ([`v22::from_v3`]).
pub type V3Config = ignition_config::v3_5::Config;

/// Writes a model in `spec`.
pub fn write(model: &Model, spec: SpecVersion) -> Result<Vec<u8>, RenderError> {
    use ignition_config::{v3_0, v3_1, v3_2, v3_3, v3_4};
    let config = v3_config(model, spec);
    match spec {
        SpecVersion::V2_2 => to_bytes(&v22::from_v3(&config), spec),
        SpecVersion::V3_0 => in_spec::<v3_0::Config>(&config, spec),
        SpecVersion::V3_1 => in_spec::<v3_1::Config>(&config, spec),
        SpecVersion::V3_2 => in_spec::<v3_2::Config>(&config, spec),
        SpecVersion::V3_3 => in_spec::<v3_3::Config>(&config, spec),
        SpecVersion::V3_4 => in_spec::<v3_4::Config>(&config, spec),
        SpecVersion::V3_5 => to_bytes(&config, spec),
    }
}

fn to_bytes(config: &impl serde::Serialize, spec: SpecVersion) -> Result<Vec<u8>, RenderError> {
    serde_json::to_vec(config).map_err(|e| RenderError::Typed {
        spec,
        message: e.to_string(),
    })
}

/// `config` in the types of an older 3.x spec `T`: what that spec defines (its fields, and
/// its way of writing the ones left out), through the `ignition-config` crate's types.
fn in_spec<T>(config: &V3Config, spec: SpecVersion) -> Result<Vec<u8>, RenderError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let typed_err = |e: serde_json::Error| RenderError::Typed {
        spec,
        message: e.to_string(),
    };
    let value = serde_json::to_value(config).map_err(typed_err)?;
    to_bytes(
        &serde_json::from_value::<T>(value).map_err(typed_err)?,
        spec,
    )
}

/// The model as a typed 3.x config whose version is `spec`'s.
pub fn v3_config(model: &Model, spec: SpecVersion) -> V3Config {
    use ignition_config::v3_5::{
        File, IgnitionConfig, Passwd, Resource, Security, SecurityTls, Storage, Systemd, Unit,
        User, Verification,
    };
    let resource = |source: String, hash: Option<String>| Resource {
        source: Some(source),
        verification: hash.map(|h| Verification { hash: Some(h) }),
        ..Resource::default()
    };
    let mut config = V3Config::default();
    config.ignition.version = spec.as_str().to_owned();
    if let Some(url) = &model.merge {
        config.ignition.config = Some(IgnitionConfig {
            merge: Some(vec![resource(url.clone(), None)]),
            ..IgnitionConfig::default()
        });
    }
    if !model.tls_cas.is_empty() {
        // CAs never compressed: 3.0 cannot say so, and every client reads them alike.
        let cas = model
            .tls_cas
            .iter()
            .map(|pem| resource(plain_data_url(pem.as_bytes()), None))
            .collect();
        config.ignition.security = Some(Security {
            tls: Some(SecurityTls {
                certificate_authorities: Some(cas),
            }),
        });
    }
    if !model.files.is_empty() {
        let files = model
            .files
            .iter()
            .map(|f| {
                let contents = match &f.contents {
                    Contents::Inline(data) => {
                        let (source, compression) = data_url(data);
                        Resource {
                            compression: compression.map(str::to_owned),
                            ..resource(source, Some(sha512_hash(data)))
                        }
                    }
                    Contents::Remote { url, sha512 } => {
                        resource(url.clone(), Some(format!("sha512-{sha512}")))
                    }
                };
                let mut file = File::new(f.path.clone());
                file.mode = Some(i64::from(f.mode));
                file.overwrite = Some(true);
                file.contents = Some(contents);
                file
            })
            .collect();
        config.storage = Some(Storage {
            files: Some(files),
            ..Storage::default()
        });
    }
    if !model.units.is_empty() {
        let units = model
            .units
            .iter()
            .map(|u| {
                let mut unit = Unit::new(u.name.clone());
                unit.enabled = Some(u.enabled);
                unit.contents = Some(u.contents.clone());
                unit
            })
            .collect();
        config.systemd = Some(Systemd { units: Some(units) });
    }
    if !model.ssh_keys.is_empty() {
        let mut core = User::new("core".into());
        core.ssh_authorized_keys = Some(model.ssh_keys.clone());
        config.passwd = Some(Passwd {
            users: Some(vec![core]),
            ..Passwd::default()
        });
    }
    config
}

#[cfg(test)]
mod tests;
