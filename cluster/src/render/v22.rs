//! Ignition spec 2.2 (RHCOS 4.2–4.5): the `ignition-config` crate starts at 3.0, so these
//! types are ours — only the parts keelson writes — and [`from_v3`] is the one translation
//! from the typed 3.x config. Differences from 3.x: `config.append` instead of `merge`,
//! `filesystem: "root"` on every file, `overwrite` absent.

use serde::{Deserialize, Serialize};

use super::V3Config;

/// A 2.2 config: what keelson writes, and what the agent reads of a 2.x user_data (the
/// fields it applies, and the sections it refuses).
#[derive(Debug, Serialize, Deserialize)]
pub struct Config {
    /// `ignition`.
    pub ignition: Ignition,
    /// `storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
    /// `systemd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systemd: Option<Systemd>,
    /// `passwd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passwd: Option<Passwd>,
}

/// `ignition`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ignition {
    /// `2.2.0` (the agent also reads 2.3).
    pub version: String,
    /// Configs to append, or the one to replace this one with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigReferences>,
    /// TLS trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Security>,
}

/// `ignition.config`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConfigReferences {
    /// Appended configs.
    #[serde(default)]
    pub append: Vec<Resource>,
    /// The config that replaces this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<Resource>,
}

/// A fetched resource.
#[derive(Debug, Serialize, Deserialize)]
pub struct Resource {
    /// URL.
    #[serde(default)]
    pub source: String,
    /// Verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

/// `verification`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Verification {
    /// `sha512-<hex>` (2.2 knows only sha512).
    #[serde(default)]
    pub hash: String,
}

/// `ignition.security`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Security {
    /// `tls`.
    #[serde(default)]
    pub tls: Tls,
}

/// `ignition.security.tls`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tls {
    /// CAs.
    #[serde(default)]
    pub certificate_authorities: Vec<Resource>,
}

/// `storage`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Storage {
    /// Files.
    #[serde(default)]
    pub files: Vec<File>,
    /// Directories (read only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directories: Option<Vec<Directory>>,
    /// Disks (read only, to be refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<serde_json::Value>>,
    /// RAID arrays (read only, to be refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid: Option<Vec<serde_json::Value>>,
    /// File systems (read only, to be refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystems: Option<Vec<serde_json::Value>>,
    /// Links (read only, to be refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<serde_json::Value>>,
}

impl Storage {
    /// The disk layout sections present (non-empty), which the appliance refuses.
    pub fn layout_sections(&self) -> Vec<&'static str> {
        [
            ("disks", &self.disks),
            ("raid", &self.raid),
            ("filesystems", &self.filesystems),
            ("links", &self.links),
        ]
        .into_iter()
        .filter(|(_, v)| v.as_ref().is_some_and(|v| !v.is_empty()))
        .map(|(name, _)| name)
        .collect()
    }
}

/// A file.
#[derive(Debug, Serialize, Deserialize)]
pub struct File {
    /// Always `root` when keelson writes it.
    #[serde(default)]
    pub filesystem: String,
    /// Path.
    pub path: String,
    /// Mode (decimal in JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Contents.
    #[serde(default)]
    pub contents: FileContents,
    /// Append the contents instead of replacing the file (read only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<bool>,
}

/// A directory (read only).
#[derive(Debug, Serialize, Deserialize)]
pub struct Directory {
    /// Path.
    pub path: String,
    /// Mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// File contents.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FileContents {
    /// URL.
    #[serde(default)]
    pub source: String,
    /// `gzip` when compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Verification.
    #[serde(default)]
    pub verification: Verification,
}

/// `systemd`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Systemd {
    /// Units.
    #[serde(default)]
    pub units: Vec<Unit>,
}

/// A unit.
#[derive(Debug, Serialize, Deserialize)]
pub struct Unit {
    /// Name.
    pub name: String,
    /// Enabled.
    #[serde(default)]
    pub enabled: bool,
    /// Contents.
    #[serde(default)]
    pub contents: String,
}

/// `passwd`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Passwd {
    /// Users.
    #[serde(default)]
    pub users: Vec<User>,
}

/// A user.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// Name.
    pub name: String,
    /// SSH keys.
    #[serde(default)]
    pub ssh_authorized_keys: Vec<String>,
    /// A password (read only: the appliance refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
}

/// The translation between the specs, one way: a typed 3.x config as 2.2 — `config.merge`
/// becomes `config.append`, every file gets `filesystem: "root"` and loses `overwrite` (2.2
/// has none), and only what keelson writes is carried. [`to_v3`] is the other way.
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
            version: "2.2.0".into(),
            config: ignition
                .config
                .as_ref()
                .and_then(|c| c.merge.as_ref())
                .map(|merge| ConfigReferences {
                    append: merge.iter().map(resource).collect(),
                    replace: None,
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
                            filesystem: "root".into(),
                            path: f.path.clone(),
                            mode: f.mode.and_then(|m| u32::try_from(m).ok()),
                            append: None,
                            contents: FileContents {
                                source: contents.source.unwrap_or_default(),
                                compression: contents.compression,
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
                directories: None,
                disks: None,
                raid: None,
                filesystems: None,
                links: None,
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
                        password_hash: None,
                    })
                    .collect(),
            }),
    }
}

/// The translation the other way: a 2.x config as typed 3.x — `config.append` becomes
/// `config.merge`, a file that appends gets its contents as 3.x's `append` list, the
/// `filesystem` of files is dropped (the agent writes to its root). The disk layout sections
/// have no counterpart here: [`Storage::layout_sections`] names them for the caller to
/// refuse.
pub fn to_v3(config: &Config) -> V3Config {
    use ignition_config::v3_5::{
        Directory as Dir3, File as File3, IgnitionConfig, Passwd as Passwd3, Resource as Res3,
        Security as Security3, SecurityTls, Storage as Storage3, Systemd as Systemd3,
        Unit as Unit3, User as User3, Verification as Verification3,
    };
    let hash = |h: &str| {
        (!h.is_empty()).then(|| Verification3 {
            hash: Some(h.into()),
        })
    };
    let resource = |r: &Resource| Res3 {
        source: Some(r.source.clone()),
        verification: r.verification.as_ref().and_then(|v| hash(&v.hash)),
        ..Res3::default()
    };
    let mut out = V3Config::default();
    out.ignition.version = config.ignition.version.clone();
    out.ignition.config = config.ignition.config.as_ref().map(|c| IgnitionConfig {
        merge: Some(c.append.iter().map(resource).collect()),
        replace: c.replace.as_ref().map(resource),
    });
    out.ignition.security = config.ignition.security.as_ref().map(|s| Security3 {
        tls: Some(SecurityTls {
            certificate_authorities: Some(
                s.tls.certificate_authorities.iter().map(resource).collect(),
            ),
        }),
    });
    out.storage = config.storage.as_ref().map(|s| Storage3 {
        files: Some(
            s.files
                .iter()
                .map(|f| {
                    let contents = Res3 {
                        source: Some(f.contents.source.clone()),
                        compression: f.contents.compression.clone(),
                        verification: hash(&f.contents.verification.hash),
                        ..Res3::default()
                    };
                    let mut file = File3::new(f.path.clone());
                    file.mode = f.mode.map(i64::from);
                    if f.append == Some(true) {
                        file.append = Some(vec![contents]);
                    } else {
                        file.contents = Some(contents);
                    }
                    file
                })
                .collect(),
        ),
        directories: s.directories.as_ref().map(|dirs| {
            dirs.iter()
                .map(|d| {
                    let mut dir = Dir3::new(d.path.clone());
                    dir.mode = d.mode.map(i64::from);
                    dir
                })
                .collect()
        }),
        ..Storage3::default()
    });
    out.systemd = config.systemd.as_ref().map(|s| Systemd3 {
        units: Some(
            s.units
                .iter()
                .map(|u| {
                    let mut unit = Unit3::new(u.name.clone());
                    unit.enabled = Some(u.enabled);
                    unit.contents = Some(u.contents.clone());
                    unit
                })
                .collect(),
        ),
    });
    out.passwd = config.passwd.as_ref().map(|p| Passwd3 {
        users: Some(
            p.users
                .iter()
                .map(|u| {
                    let mut user = User3::new(u.name.clone());
                    user.ssh_authorized_keys = Some(u.ssh_authorized_keys.clone());
                    user.password_hash = u.password_hash.clone();
                    user
                })
                .collect(),
        ),
        ..Passwd3::default()
    });
    out
}
