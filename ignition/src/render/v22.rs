//! Ignition spec 2.2 (RHCOS 4.2–4.5): the `ignition-config` crate starts at 3.0, so these
//! types are ours — only the parts keelson writes. Differences from 3.x: `config.append`
//! instead of `merge`, `filesystem: "root"` on every file, `overwrite` absent.

use serde::Serialize;

use super::{Contents, Model, RenderError, data_url, plain_data_url, sha512_hash};

/// A 2.2 config.
#[derive(Debug, Serialize)]
pub struct Config {
    /// `ignition`.
    pub ignition: Ignition,
    /// `storage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
    /// `systemd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub systemd: Option<Systemd>,
    /// `passwd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passwd: Option<Passwd>,
}

/// `ignition`.
#[derive(Debug, Serialize)]
pub struct Ignition {
    /// Always `2.2.0`.
    pub version: &'static str,
    /// Configs to append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigReferences>,
    /// TLS trust.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security: Option<Security>,
}

/// `ignition.config`.
#[derive(Debug, Serialize)]
pub struct ConfigReferences {
    /// Appended configs.
    pub append: Vec<Resource>,
}

/// A fetched resource.
#[derive(Debug, Serialize)]
pub struct Resource {
    /// URL.
    pub source: String,
    /// Verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

/// `verification`.
#[derive(Debug, Serialize)]
pub struct Verification {
    /// `sha512-<hex>` (2.2 knows only sha512).
    pub hash: String,
}

/// `ignition.security`.
#[derive(Debug, Serialize)]
pub struct Security {
    /// `tls`.
    pub tls: Tls,
}

/// `ignition.security.tls`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tls {
    /// CAs.
    pub certificate_authorities: Vec<Resource>,
}

/// `storage`.
#[derive(Debug, Serialize)]
pub struct Storage {
    /// Files.
    pub files: Vec<File>,
}

/// A file.
#[derive(Debug, Serialize)]
pub struct File {
    /// Always `root`.
    pub filesystem: &'static str,
    /// Path.
    pub path: String,
    /// Mode (decimal in JSON).
    pub mode: u32,
    /// Contents.
    pub contents: FileContents,
}

/// File contents.
#[derive(Debug, Serialize)]
pub struct FileContents {
    /// URL.
    pub source: String,
    /// `gzip` when compressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<&'static str>,
    /// Verification.
    pub verification: Verification,
}

/// `systemd`.
#[derive(Debug, Serialize)]
pub struct Systemd {
    /// Units.
    pub units: Vec<Unit>,
}

/// A unit.
#[derive(Debug, Serialize)]
pub struct Unit {
    /// Name.
    pub name: String,
    /// Enabled.
    pub enabled: bool,
    /// Contents.
    pub contents: String,
}

/// `passwd`.
#[derive(Debug, Serialize)]
pub struct Passwd {
    /// Users.
    pub users: Vec<User>,
}

/// A user.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// Name.
    pub name: String,
    /// SSH keys.
    pub ssh_authorized_keys: Vec<String>,
}

/// Writes `model` as a 2.2 config.
pub fn write(model: &Model) -> Result<Vec<u8>, RenderError> {
    let config = Config {
        ignition: Ignition {
            version: "2.2.0",
            config: model.merge.as_ref().map(|url| ConfigReferences {
                append: vec![Resource {
                    source: url.clone(),
                    verification: None,
                }],
            }),
            security: (!model.tls_cas.is_empty()).then(|| Security {
                tls: Tls {
                    certificate_authorities: model
                        .tls_cas
                        .iter()
                        .map(|pem| Resource {
                            source: plain_data_url(pem.as_bytes()),
                            verification: None,
                        })
                        .collect(),
                },
            }),
        },
        storage: (!model.files.is_empty()).then(|| Storage {
            files: model
                .files
                .iter()
                .map(|f| {
                    let contents = match &f.contents {
                        Contents::Inline(data) => {
                            let (source, compression) = data_url(data);
                            FileContents {
                                source,
                                compression,
                                verification: Verification {
                                    hash: sha512_hash(data),
                                },
                            }
                        }
                        Contents::Remote { url, sha512 } => FileContents {
                            source: url.clone(),
                            compression: None,
                            verification: Verification {
                                hash: format!("sha512-{sha512}"),
                            },
                        },
                    };
                    File {
                        filesystem: "root",
                        path: f.path.clone(),
                        mode: f.mode,
                        contents,
                    }
                })
                .collect(),
        }),
        systemd: (!model.units.is_empty()).then(|| Systemd {
            units: model
                .units
                .iter()
                .map(|u| Unit {
                    name: u.name.clone(),
                    enabled: u.enabled,
                    contents: u.contents.clone(),
                })
                .collect(),
        }),
        passwd: (!model.ssh_keys.is_empty()).then(|| Passwd {
            users: vec![User {
                name: "core".into(),
                ssh_authorized_keys: model.ssh_keys.clone(),
            }],
        }),
    };
    serde_json::to_vec(&config).map_err(|e| RenderError::Typed {
        spec: crate::SpecVersion::V2_2,
        message: e.to_string(),
    })
}
