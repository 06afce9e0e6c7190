//! OpenStack metadata: config drive and the HTTP metadata service, behind one trait (docs/architecture.md, "Metadata").
//!
//! The types here are the contract the rest of the agent (init, net, node identity) uses;
//! each source (`config_drive`, `http`) lives in its own module and yields a [`Metadata`].

pub mod config_drive;
pub mod fat;
pub mod http;
pub mod iso9660;
pub mod network;
pub mod network_plan;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dns_label::DnsLabel;

pub use network::NetworkData;

/// The largest metadata document (`meta_data.json`, `network_data.json`, the EC2 fields) the
/// agent reads from any source; a longer one is refused with an error naming the limit.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// The largest `user_data` the agent reads. Nova caps it at 65535 bytes of base64; other
/// clouds allow more, so this leaves room while keeping a hostile service from filling memory.
pub const MAX_USER_DATA_BYTES: usize = 4 << 20;

/// Everything a metadata source gave us.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Where it came from, for logs: `config-drive:/dev/sr0`, `http://169.254.169.254`.
    pub source: String,
    /// `openstack/latest/meta_data.json`.
    pub meta_data: MetaData,
    /// `openstack/latest/network_data.json`, when the source has one.
    pub network_data: Option<NetworkData>,
    /// `openstack/latest/user_data` (an Ignition config for keelson nodes), raw bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "user_data_text"
    )]
    pub user_data: Option<Vec<u8>>,
}

/// `meta_data.json`: the fields keelson uses; the rest are kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaData {
    /// Instance UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Instance name as the user gave it (`openstack server create NAME`).
    #[serde(default)]
    pub name: Option<String>,
    /// Host name Nova derived (may carry a domain suffix such as `.novalocal`).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Availability zone.
    #[serde(default)]
    pub availability_zone: Option<String>,
    /// User-set properties (`--property keelson-role=master`).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// SSH public keys by key name.
    #[serde(default)]
    pub public_keys: BTreeMap<String, String>,
    /// Fields keelson does not use, kept for `keelson-agent metadata` output.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Serialises user_data as text when it is UTF-8 (the usual case: Ignition JSON).
mod user_data_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => s.serialize_str(&String::from_utf8_lossy(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(String::into_bytes))
    }
}

/// `keelson-agent metadata`: print the parsed metadata as JSON.
#[derive(Debug, clap::Args)]
pub struct MetadataArgs {
    /// Which source to read.
    #[arg(long, value_enum, default_value = "auto")]
    pub source: SourceChoice,
    /// Metadata service base URL.
    #[arg(long)]
    pub url: Option<String>,
    /// A config-drive device or image file.
    #[arg(long)]
    pub device: Option<std::path::PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value = "30")]
    pub timeout: u64,
}

/// Runs `keelson-agent metadata`.
pub async fn cli(args: MetadataArgs) -> anyhow::Result<()> {
    let md = discover(&DiscoverOptions {
        source: args.source,
        device: args.device,
        url: args.url,
        timeout: Some(std::time::Duration::from_secs(args.timeout)),
    })
    .await?;
    println!("{}", serde_json::to_string_pretty(&md)?);
    Ok(())
}

/// Which source(s) [`discover`] may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceChoice {
    /// Config drive and HTTP service raced; the first complete answer wins.
    #[default]
    Auto,
    /// Config drive only.
    ConfigDrive,
    /// HTTP metadata service only.
    Http,
}

/// Options for [`discover`].
#[derive(Debug, Clone, Default)]
pub struct DiscoverOptions {
    /// Which sources to try.
    pub source: SourceChoice,
    /// A config-drive image or block device to read instead of searching by label.
    pub device: Option<std::path::PathBuf>,
    /// Base URL of the metadata service (default `http://169.254.169.254`).
    pub url: Option<String>,
    /// Give up after this long (`None`: retry forever, as PID 1 does).
    pub timeout: Option<std::time::Duration>,
}

/// Errors from metadata discovery.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// No source answered (yet).
    #[error("no metadata source answered: {0}")]
    Unavailable(String),
    /// A source answered with something unusable (the message names the file and field).
    #[error("metadata from {origin}: {message}")]
    Invalid {
        /// Which source.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// A place metadata comes from (one module per source, as afterburn's providers).
pub trait Source: Send + Sync {
    /// For logs: `config-drive:/dev/sr0`, `http://169.254.169.254`.
    fn describe(&self) -> String;
    /// Reads the metadata once.
    fn read(&self) -> impl std::future::Future<Output = Result<Metadata, MetadataError>> + Send;
}

/// The config drive: a given device, or every block device labelled `config-2`.
#[derive(Debug, Clone, Default)]
pub struct ConfigDriveSource {
    /// A device or image file instead of searching by label.
    pub device: Option<std::path::PathBuf>,
}

impl Source for ConfigDriveSource {
    fn describe(&self) -> String {
        match &self.device {
            Some(d) => format!("config-drive:{}", d.display()),
            None => "config drive (by label)".into(),
        }
    }

    async fn read(&self) -> Result<Metadata, MetadataError> {
        let devices = match &self.device {
            Some(device) => vec![device.clone()],
            None => tokio::task::spawn_blocking(config_drive::find_devices)
                .await
                .unwrap_or_default(),
        };
        let mut failures = Vec::new();
        for device in devices {
            let path = device.clone();
            match tokio::task::spawn_blocking(move || config_drive::read(&path)).await {
                Ok(Ok(md)) => return Ok(md),
                Ok(Err(e @ MetadataError::Invalid { .. })) => return Err(e),
                Ok(Err(e)) => failures.push(e.to_string()),
                Err(e) => failures.push(format!("{}: {e}", device.display())),
            }
        }
        if failures.is_empty() {
            failures.push("no block device labelled config-2".into());
        }
        Err(MetadataError::Unavailable(failures.join("; ")))
    }
}

/// The HTTP metadata service.
#[derive(Debug, Clone)]
pub struct HttpSource {
    /// Base URL.
    pub url: String,
}

impl Source for HttpSource {
    fn describe(&self) -> String {
        self.url.clone()
    }

    async fn read(&self) -> Result<Metadata, MetadataError> {
        http::read(&self.url).await
    }
}

/// One attempt over the chosen sources, raced: the first complete answer wins; when one
/// source fails the other still gets its chance.
async fn attempt(opts: &DiscoverOptions) -> Result<Metadata, MetadataError> {
    let drive = ConfigDriveSource {
        device: opts.device.clone(),
    };
    let service = HttpSource {
        url: opts.url.clone().unwrap_or_else(|| http::DEFAULT_URL.into()),
    };
    match opts.source {
        SourceChoice::ConfigDrive => drive.read().await,
        SourceChoice::Http => service.read().await,
        SourceChoice::Auto => {
            let a = drive.read();
            let b = service.read();
            tokio::pin!(a, b);
            let (first, rest_is_drive) = tokio::select! {
                r = &mut a => (r, false),
                r = &mut b => (r, true),
            };
            match first {
                Ok(md) => Ok(md),
                Err(first_err) => {
                    let second = if rest_is_drive { a.await } else { b.await };
                    second.map_err(|second_err| match (first_err, second_err) {
                        (e @ MetadataError::Invalid { .. }, _)
                        | (_, e @ MetadataError::Invalid { .. }) => e,
                        (e1, e2) => MetadataError::Unavailable(format!("{e1}; {e2}")),
                    })
                }
            }
        }
    }
}

impl crate::retry::Transient for MetadataError {
    fn is_transient(&self) -> bool {
        matches!(self, MetadataError::Unavailable(_))
    }
}

/// Reads the node's metadata from the chosen sources (docs/architecture.md, "Metadata"), retrying with the agent's
/// retry policy (0.5 s doubling to 10 s, with jitter) until one answers or `timeout` passes.
/// Invalid metadata is returned at once: retrying would not fix it.
pub async fn discover(opts: &DiscoverOptions) -> Result<Metadata, MetadataError> {
    let backoff = crate::retry::Backoff::new(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(10),
    );
    crate::retry::retry("metadata not available yet", backoff, opts.timeout, || {
        attempt(opts)
    })
    .await
}

impl Metadata {
    /// The node name: `meta_data.name` when it is a DNS label, else the first label of
    /// `hostname` when that is one (Nova derives the host name from the display name, which
    /// may hold spaces or capitals, and makes it a label).
    pub fn node_name(&self) -> Option<DnsLabel> {
        let from_hostname = self
            .meta_data
            .hostname
            .as_deref()
            .and_then(|h| h.split('.').next());
        self.meta_data
            .name
            .as_deref()
            .into_iter()
            .chain(from_hostname)
            .find_map(|n| DnsLabel::new(n).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/openstack-metadata"
    );

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap()
    }

    #[test]
    fn every_fixture_parses() {
        let mut seen = 0;
        for entry in std::fs::read_dir(FIXTURES).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let bytes = fixture(&name);
            if name.ends_with("network_data.json") {
                let net: NetworkData = serde_json::from_slice(&bytes).unwrap();
                assert!(!net.links.is_empty() && !net.networks.is_empty(), "{name}");
                seen += 1;
            } else if name.ends_with("meta_data.json") {
                let md: MetaData = serde_json::from_slice(&bytes).unwrap();
                assert!(md.uuid.is_some() && md.name.is_some(), "{name}");
                seen += 1;
            } else if name.ends_with("meta-data.json") {
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                assert!(v.is_object(), "{name}");
                seen += 1;
            }
        }
        assert_eq!(seen, 5);
    }

    /// Found by the `meta_data_json` fuzz target: a number too large for an integer came back
    /// from a serialise/parse round trip (what `keelson-agent metadata` prints) as another
    /// float, because serde_json's default float parsing is not correctly rounded; the
    /// workspace turns on its `float_roundtrip` feature.
    #[test]
    fn fuzz_crash_big_number_round_trips() {
        let text = br#"{"instancelaunch-index": 12222222222222222222222222222222222222222222222222222220}"#;
        let md: MetaData = serde_json::from_slice(text).unwrap();
        let again: MetaData = serde_json::from_slice(&serde_json::to_vec(&md).unwrap()).unwrap();
        assert_eq!(again, md);
    }

    #[test]
    fn fixture_fields_that_matter() {
        let ibm: NetworkData =
            serde_json::from_slice(&fixture("ibmcloud-classic_network_data.json")).unwrap();
        assert_eq!(ibm.links[0].kind, network::LinkKind::Phy);
        assert_eq!(ibm.links[0].mtu, None, "mtu: null");
        let private = &ibm.networks[0];
        assert_eq!(private.kind, network::NetworkKind::Ipv4);
        assert_eq!(private.ip_address.as_deref(), Some("10.135.202.146"));
        assert_eq!(private.netmask.as_deref(), Some("255.255.255.192"));
        assert_eq!(private.routes.len(), 3);
        assert_eq!(private.routes[0].gateway, "10.135.202.129");
        assert_eq!(ibm.services.len(), 2);

        let kubevirt: NetworkData = serde_json::from_slice(&fixture(
            "kubevirt_config_drive_openstack_latest_network_data.json",
        ))
        .unwrap();
        assert_eq!(kubevirt.links[0].name.as_deref(), Some("eth0"));
        assert_eq!(kubevirt.networks[0].routes[0].network, "0.0.0.0");
        assert!(
            kubevirt
                .services
                .iter()
                .any(|s| s.address == "2001:4860:4860::8888")
        );

        let old: MetaData = serde_json::from_slice(&fixture(
            "openstack-metadata_openstack_2012-08-10_meta_data.json",
        ))
        .unwrap();
        let md = Metadata {
            meta_data: old,
            ..Metadata::default()
        };
        assert_eq!(md.node_name().as_deref(), Some("mule"));
        assert!(!md.meta_data.public_keys.is_empty());
    }

    /// The node name is a DNS label: a display name that is not one gives way to the host
    /// name Nova made of it; neither being one, there is none.
    #[test]
    fn node_name_is_the_first_dns_label_offered() {
        let md = |name: Option<&str>, hostname: Option<&str>| Metadata {
            meta_data: MetaData {
                name: name.map(str::to_owned),
                hostname: hostname.map(str::to_owned),
                ..MetaData::default()
            },
            ..Metadata::default()
        };
        let name = |m: Metadata| m.node_name().map(String::from);
        assert_eq!(
            name(md(Some("xn--bcher-kva"), Some("x.novalocal"))).as_deref(),
            Some("xn--bcher-kva")
        );
        assert_eq!(
            name(md(Some("Master 0"), Some("master-0.novalocal"))).as_deref(),
            Some("master-0")
        );
        assert_eq!(name(md(Some("Master 0"), Some("_bad.example"))), None);
        assert_eq!(name(md(None, None)), None);
    }
}
