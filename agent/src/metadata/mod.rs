//! OpenStack metadata: config drive and the HTTP metadata service, behind one trait (DESIGN §4.2).
//!
//! The types here are the contract the rest of the agent (init, net, node identity) uses;
//! each source (`config_drive`, `http`) lives in its own module and yields a [`Metadata`].

pub mod network;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use network::NetworkData;

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
    /// No source answered in time.
    #[error("no metadata source answered: {0}")]
    Unavailable(String),
}

/// Reads the node's metadata from the chosen sources (DESIGN §4.2).
pub async fn discover(_opts: &DiscoverOptions) -> Result<Metadata, MetadataError> {
    Err(MetadataError::Unavailable("not implemented yet".into()))
}

impl Metadata {
    /// The node name: `meta_data.name`, else the first label of `hostname`.
    pub fn node_name(&self) -> Option<String> {
        self.meta_data.name.clone().or_else(|| {
            self.meta_data
                .hostname
                .as_deref()
                .and_then(|h| h.split('.').next())
                .map(str::to_owned)
        })
    }
}
