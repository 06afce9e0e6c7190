//! Ignition spec 2.2 (RHCOS 4.2–4.5): the `ignition-config` crate starts at 3.0, so these
//! types are ours — only the parts keelson writes — and [`from_v3`] is the one translation
//! from the typed 3.x config. Differences from 3.x: `config.append` instead of `merge`,
//! `filesystem: "root"` on every file, `overwrite` absent.

use serde::Serialize;

use super::V3Config;

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

/// The one translation between the specs: a typed 3.x config as 2.2 — `config.merge`
/// becomes `config.append`, every file gets `filesystem: "root"` and loses `overwrite` (2.2
/// has none), and only what keelson writes is carried (see the types above).
pub fn from_v3(config: &V3Config) -> Config {
    let resource = |r: &ignition_config::v3_5::Resource| Resource {
        source: r.source.clone().unwrap_or_default(),
        verification: r
            .verification
            .as_ref()
            .and_then(|v| v.hash.clone())
            .map(|hash| Verification { hash }),
    };
    let ignition = &config.ignition;
    Config {
        ignition: Ignition {
            version: "2.2.0",
            config: ignition
                .config
                .as_ref()
                .and_then(|c| c.merge.as_ref())
                .map(|merge| ConfigReferences {
                    append: merge.iter().map(resource).collect(),
                }),
            security: ignition
                .security
                .as_ref()
                .and_then(|s| s.tls.as_ref())
                .and_then(|t| t.certificate_authorities.as_ref())
                .map(|cas| Security {
                    tls: Tls {
                        certificate_authorities: cas.iter().map(resource).collect(),
                    },
                }),
        },
        storage: config
            .storage
            .as_ref()
            .and_then(|s| s.files.as_ref())
            .map(|files| Storage {
                files: files
                    .iter()
                    .map(|f| {
                        let contents = f.contents.clone().unwrap_or_default();
                        File {
                            filesystem: "root",
                            path: f.path.clone(),
                            mode: f.mode.and_then(|m| u32::try_from(m).ok()).unwrap_or(0o644),
                            contents: FileContents {
                                source: contents.source.unwrap_or_default(),
                                compression: contents.compression.is_some().then_some("gzip"),
                                verification: Verification {
                                    hash: contents
                                        .verification
                                        .and_then(|v| v.hash)
                                        .unwrap_or_default(),
                                },
                            },
                        }
                    })
                    .collect(),
            }),
        systemd: config
            .systemd
            .as_ref()
            .and_then(|s| s.units.as_ref())
            .map(|units| Systemd {
                units: units
                    .iter()
                    .map(|u| Unit {
                        name: u.name.clone(),
                        enabled: u.enabled.unwrap_or(false),
                        contents: u.contents.clone().unwrap_or_default(),
                    })
                    .collect(),
            }),
        passwd: config
            .passwd
            .as_ref()
            .and_then(|p| p.users.as_ref())
            .map(|users| Passwd {
                users: users
                    .iter()
                    .map(|u| User {
                        name: u.name.clone(),
                        ssh_authorized_keys: u.ssh_authorized_keys.clone().unwrap_or_default(),
                    })
                    .collect(),
            }),
    }
}
