//! Appliance mode: apply the Ignition subset the agent needs from user_data (docs/architecture.md, "From install-config to a running node"):
//! fetch and verify pointer configs, write files (cluster.json, TLS, the role, operator files),
//! directories and `core`'s SSH keys, and refuse, with a clear line, what it cannot honour
//! (systemd units, disks, file systems: the appliance has neither systemd nor a root disk).
//!
//! Works on the typed 3.x config (`keelson_cluster::render::read`): a 2.x user_data is
//! translated to it first, so one path applies every spec.

pub mod dataurl;
pub mod fetch;

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use ignition_config::v3_5::{File, Resource};
use keelson_cluster::render::{ReadConfig, ReadError, V3Config};
use sha2::{Digest, Sha256, Sha512};

/// What applying user_data did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written, as absolute paths under the root.
    pub files_written: Vec<PathBuf>,
    /// Parts of the config not honoured, one line each (logged on the console).
    pub refused: Vec<String>,
    /// Pointer configs followed, by URL.
    pub fetched: Vec<String>,
}

/// Errors applying user_data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// user_data is not an Ignition config.
    #[error("user_data: {0}")]
    NotIgnition(String),
    /// A field is unusable; names it.
    #[error("user_data {field}: {message}")]
    Invalid {
        /// JSON path of the field.
        field: String,
        /// What was expected.
        message: String,
    },
    /// Fetching a pointer config or remote file failed for good.
    #[error(transparent)]
    Fetch(#[from] crate::net::http_client::HttpError),
    /// A file's contents are larger than [`MAX_FILE_BYTES`] (fetched, or once decompressed).
    #[error("user_data {field}: larger than the limit of {limit} bytes{how}")]
    TooLarge {
        /// JSON path of the file.
        field: String,
        /// The limit.
        limit: usize,
        /// `` or ` once decompressed`.
        how: &'static str,
    },
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The largest Ignition config (user_data's, or one it points at) the agent takes. The
/// configs keelson writes are tens of KiB; Ignition itself has no smaller cap.
pub const MAX_CONFIG_BYTES: usize = 4 << 20;
/// The largest file the agent writes from a config, fetched or after decompression (the
/// agent binary, ~12 MiB, is the largest keelson serves). The appliance runs from memory;
/// this keeps a gzip bomb or an endless download from taking PID 1 with it.
pub const MAX_FILE_BYTES: usize = 64 << 20;

/// How to apply.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Give up fetching after this long (None: retry transient failures forever).
    pub fetch_timeout: Option<Duration>,
}

/// Applies an Ignition config given as user_data, writing files under `root` (`/` on a node).
pub async fn apply_user_data(user_data: &[u8], root: &Path) -> Result<Applied, ApplyError> {
    apply_user_data_with(user_data, root, &ApplyOptions::default()).await
}

/// [`apply_user_data`] with options.
pub async fn apply_user_data_with(
    user_data: &[u8],
    root: &Path,
    opts: &ApplyOptions,
) -> Result<Applied, ApplyError> {
    if user_data.len() > MAX_CONFIG_BYTES {
        return Err(ApplyError::NotIgnition(format!(
            "{} bytes, larger than the limit of {MAX_CONFIG_BYTES} bytes for a config",
            user_data.len()
        )));
    }
    let mut applied = Applied::default();
    let read = parse(user_data)?;
    for section in &read.layout_v2 {
        applied.refused.push(layout_refusal(section));
    }
    let config = resolve(read, opts, &mut applied, 0).await?;
    let cas = certificate_authorities(&config)?;
    write_config(&config, root, &cas, opts, &mut applied).await?;
    Ok(applied)
}

fn parse(bytes: &[u8]) -> Result<ReadConfig, ApplyError> {
    keelson_cluster::render::read(bytes).map_err(|e| match e {
        ReadError::Version(_) => ApplyError::Invalid {
            field: "ignition.version".into(),
            message: e.to_string(),
        },
        ReadError::Field { path, source } => ApplyError::Invalid {
            field: path,
            message: source.to_string(),
        },
        other => ApplyError::NotIgnition(other.to_string()),
    })
}

fn layout_refusal(section: &str) -> String {
    format!(
        "storage.{section}: the appliance runs from memory and does not partition or format disks"
    )
}

/// The CAs the config trusts (`ignition.security.tls.certificateAuthorities[].source`).
fn certificate_authorities(config: &V3Config) -> Result<Vec<Vec<u8>>, ApplyError> {
    let list = config
        .ignition
        .security
        .as_ref()
        .and_then(|s| s.tls.as_ref())
        .and_then(|t| t.certificate_authorities.as_deref())
        .unwrap_or_default();
    let mut cas = Vec::new();
    for (i, ca) in list.iter().enumerate() {
        let field = format!("ignition.security.tls.certificateAuthorities[{i}].source");
        let source = ca.source.as_deref().ok_or_else(|| ApplyError::Invalid {
            field: field.clone(),
            message: "expected a data: URL".into(),
        })?;
        let raw = dataurl::decode(source).map_err(|e| ApplyError::Invalid {
            field: field.clone(),
            message: e.to_string(),
        })?;
        // Spec 3.1+ lets a CA say `compression` (keelson never writes one; others may).
        cas.push(decompress(
            raw,
            ca.compression.as_deref(),
            &field.replace(".source", ".compression"),
        )?);
    }
    Ok(cas)
}

/// Follows `replace` / `merge` (3.x) or `append` (2.2) pointers; returns the config to apply.
async fn resolve(
    read: ReadConfig,
    opts: &ApplyOptions,
    applied: &mut Applied,
    depth: usize,
) -> Result<V3Config, ApplyError> {
    if depth > 4 {
        return Err(ApplyError::Invalid {
            field: "ignition.config".into(),
            message: "pointer configs nested more than 4 deep".into(),
        });
    }
    let config = read.config;
    let cas = certificate_authorities(&config)?;
    let pointers = config.ignition.config.clone().unwrap_or_default();
    if let Some(replace) = pointers.replace.filter(|r| r.source.is_some()) {
        let child = fetch_config(&replace, "ignition.config.replace", &cas, opts, applied).await?;
        return Box::pin(resolve(child, opts, applied, depth + 1)).await;
    }
    let key = if read.v2 { "append" } else { "merge" };
    let mut result = config;
    for (i, reference) in pointers.merge.unwrap_or_default().iter().enumerate() {
        let field = format!("ignition.config.{key}[{i}]");
        let child = fetch_config(reference, &field, &cas, opts, applied).await?;
        let child = Box::pin(resolve(child, opts, applied, depth + 1)).await?;
        merge(&mut result, child);
    }
    Ok(result)
}

async fn fetch_config(
    reference: &Resource,
    field: &str,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<ReadConfig, ApplyError> {
    let source = reference
        .source
        .as_deref()
        .ok_or_else(|| ApplyError::Invalid {
            field: format!("{field}.source"),
            message: "expected a URL".into(),
        })?;
    let bytes = if source.starts_with("data:") {
        dataurl::decode(source).map_err(|e| ApplyError::Invalid {
            field: format!("{field}.source"),
            message: e.to_string(),
        })?
    } else {
        tracing::info!("fetching config {source}");
        let headers = http_headers(reference, field)?;
        let body =
            fetch::get_with_retry(source, &headers, cas, MAX_CONFIG_BYTES, opts.fetch_timeout)
                .await?;
        applied.fetched.push(source.to_owned());
        body
    };
    verify(&bytes, hash_of(reference), field)?;
    let read = parse(&bytes)?;
    for section in &read.layout_v2 {
        applied.refused.push(layout_refusal(section));
    }
    Ok(read)
}

/// A resource's `httpHeaders` (spec 3.1 and later: a hosted config's credentials, such as
/// Glance's `X-Auth-Token`), checked as HTTP names and values.
fn http_headers(
    r: &Resource,
    field: &str,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, ApplyError> {
    let mut out = Vec::new();
    for (i, h) in r.http_headers.iter().flatten().enumerate() {
        let invalid = |message: &str| ApplyError::Invalid {
            field: format!("{field}.httpHeaders[{i}]"),
            message: message.into(),
        };
        let name = http::HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| invalid("expected an HTTP header name"))?;
        let value = http::HeaderValue::from_str(h.value.as_deref().unwrap_or(""))
            .map_err(|_| invalid("expected an HTTP header value"))?;
        out.push((name, value));
    }
    Ok(out)
}

/// A resource's `verification.hash`.
fn hash_of(r: &Resource) -> Option<&str> {
    r.verification.as_ref().and_then(|v| v.hash.as_deref())
}

/// Merges `child` into `parent`: child's files, directories, users and units replace the
/// parent's entries with the same path or name; the child's TLS trust replaces the parent's.
fn merge(parent: &mut V3Config, child: V3Config) {
    fn by_key<T>(parent: &mut Option<Vec<T>>, child: Option<Vec<T>>, key: impl Fn(&T) -> &str) {
        let Some(child) = child else { return };
        let items = parent.get_or_insert_with(Vec::new);
        for item in child {
            items.retain(|existing| key(existing) != key(&item));
            items.push(item);
        }
    }
    if let Some(storage) = child.storage {
        let p = parent.storage.get_or_insert_with(Default::default);
        by_key(&mut p.files, storage.files, |f| &f.path);
        by_key(&mut p.directories, storage.directories, |d| &d.path);
    }
    if let Some(passwd) = child.passwd {
        let p = parent.passwd.get_or_insert_with(Default::default);
        by_key(&mut p.users, passwd.users, |u| &u.name);
    }
    if let Some(systemd) = child.systemd {
        let p = parent.systemd.get_or_insert_with(Default::default);
        by_key(&mut p.units, systemd.units, |u| &u.name);
    }
    if let Some(security) = child.ignition.security {
        parent.ignition.security = Some(security);
    }
}

/// Checks `sha512-<hex>` / `sha256-<hex>` when given.
fn verify(bytes: &[u8], hash: Option<&str>, field: &str) -> Result<(), ApplyError> {
    let Some(hash) = hash else {
        return Ok(());
    };
    let (algorithm, expected) = hash.split_once('-').ok_or_else(|| ApplyError::Invalid {
        field: format!("{field}.verification.hash"),
        message: format!("expected sha512-<hex> or sha256-<hex>, got {hash:?}"),
    })?;
    let actual = match algorithm {
        "sha512" => hex::encode(Sha512::digest(bytes)),
        "sha256" => hex::encode(Sha256::digest(bytes)),
        other => {
            return Err(ApplyError::Invalid {
                field: format!("{field}.verification.hash"),
                message: format!("unsupported hash {other:?}, expected sha512 or sha256"),
            });
        }
    };
    if !actual.eq_ignore_ascii_case(expected) {
        return Err(ApplyError::Invalid {
            field: format!("{field}.verification.hash"),
            message: format!("content {algorithm} is {actual}, expected {expected}"),
        });
    }
    Ok(())
}

/// `raw` decompressed as a resource's `compression` field (at `field`) says: none or gzip,
/// never to more than [`MAX_FILE_BYTES`].
fn decompress(raw: Vec<u8>, compression: Option<&str>, field: &str) -> Result<Vec<u8>, ApplyError> {
    match compression {
        None | Some("") => Ok(raw),
        Some("gzip") => {
            let mut out = Vec::new();
            // Read one byte past the limit to tell "exactly the limit" from "more".
            flate2::read::GzDecoder::new(&raw[..])
                .take(MAX_FILE_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| ApplyError::Invalid {
                    field: field.to_owned(),
                    message: format!("gzip: {e}"),
                })?;
            if out.len() > MAX_FILE_BYTES {
                return Err(ApplyError::TooLarge {
                    field: field.trim_end_matches(".compression").to_owned(),
                    limit: MAX_FILE_BYTES,
                    how: " once decompressed",
                });
            }
            Ok(out)
        }
        Some(other) => Err(ApplyError::Invalid {
            field: field.to_owned(),
            message: format!("expected gzip, got {other:?}"),
        }),
    }
}

/// A file already on the node with exactly the verified contents of a remote source: the
/// target itself (a second boot) or the running agent (the appliance runs the agent as
/// `/init`, and the config wants the same binary at the RHCOS path). Saves downloading
/// megabytes through the API VIP at every boot. Only for uncompressed sources with a hash.
fn local_copy(target: &Path, contents: &Resource) -> Option<Vec<u8>> {
    let hash = hash_of(contents)?;
    if contents
        .compression
        .as_deref()
        .is_some_and(|c| !c.is_empty())
    {
        return None;
    }
    let candidates = [Some(target.to_path_buf()), std::env::current_exe().ok()];
    candidates.into_iter().flatten().find_map(|path| {
        let bytes = std::fs::read(&path).ok()?;
        verify(&bytes, Some(hash), "local").ok()?;
        Some(bytes)
    })
}

/// `root` joined with an absolute config path; refuses `..` and relative paths.
fn under_root(root: &Path, path: &str, field: &str) -> Result<PathBuf, ApplyError> {
    let p = Path::new(path);
    let bad = || ApplyError::Invalid {
        field: field.to_owned(),
        message: format!("expected an absolute path without `..`, got {path:?}"),
    };
    if !p.is_absolute() {
        return Err(bad());
    }
    let mut out = root.to_path_buf();
    for component in p.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => out.push(part),
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

async fn write_config(
    config: &V3Config,
    root: &Path,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<(), ApplyError> {
    let storage = config.storage.clone().unwrap_or_default();
    for (i, dir) in storage.directories.iter().flatten().enumerate() {
        let field = format!("storage.directories[{i}].path");
        let target = under_root(root, &dir.path, &field)?;
        std::fs::create_dir_all(&target).map_err(|source| ApplyError::Write {
            path: dir.path.clone(),
            source,
        })?;
        set_mode(&target, dir.mode)?;
    }
    for (i, file) in storage.files.iter().flatten().enumerate() {
        match write_file(file, i, root, cas, opts, applied).await {
            // One oversized file (a gzip bomb, an endless download) is refused on its own;
            // the rest of the config, and the node, still come up.
            Err(e @ ApplyError::TooLarge { .. }) => applied.refused.push(e.to_string()),
            other => other?,
        }
    }
    let users = config.passwd.as_ref().and_then(|p| p.users.as_deref());
    for user in users.unwrap_or_default() {
        let keys = user.ssh_authorized_keys.as_deref().unwrap_or_default();
        if user.name == "core" && !keys.is_empty() {
            let dir = root.join("home/core/.ssh/authorized_keys.d");
            let path = dir.join("ignition");
            let write = std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(&path, format!("{}\n", keys.join("\n"))));
            write.map_err(|source| ApplyError::Write {
                path: path.display().to_string(),
                source,
            })?;
            applied.files_written.push(path);
        } else if !keys.is_empty() || user.password_hash.is_some() {
            applied.refused.push(format!(
                "passwd.users {:?}: the appliance has only core's keys",
                user.name
            ));
        }
    }
    let units = config.systemd.as_ref().and_then(|s| s.units.as_deref());
    for unit in units.unwrap_or_default() {
        if unit.name == keelson_cluster::unit::AGENT_UNIT_NAME {
            // The RHCOS unit that starts the agent: here the agent is already PID 1.
            continue;
        }
        applied.refused.push(format!(
            "systemd.units {}: the appliance has no systemd (the agent is PID 1); \
             declare extra processes as cluster.json services",
            unit.name
        ));
    }
    let layout = [
        (
            "disks",
            storage.disks.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        ("raid", storage.raid.as_ref().is_some_and(|v| !v.is_empty())),
        (
            "filesystems",
            storage.filesystems.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "links",
            storage.links.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        ("luks", storage.luks.as_ref().is_some_and(|v| !v.is_empty())),
    ];
    for (section, _) in layout.iter().filter(|(_, present)| *present) {
        applied.refused.push(layout_refusal(section));
    }
    Ok(())
}

/// The bytes of one file resource: decoded from a data URL, found on the node already, or
/// fetched; decompressed and verified.
async fn resource_bytes(
    contents: &Resource,
    target: &Path,
    field: &str,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
) -> Result<Vec<u8>, ApplyError> {
    let raw = match contents.source.as_deref() {
        None | Some("") => Vec::new(),
        Some(url) if url.starts_with("data:") => {
            dataurl::decode(url).map_err(|e| ApplyError::Invalid {
                field: format!("{field}.source"),
                message: e.to_string(),
            })?
        }
        Some(url) => match local_copy(target, contents) {
            Some(bytes) => {
                tracing::info!(path = %target.display(), %url, "already here with the verified hash; not fetched");
                bytes
            }
            None => fetch::get_with_retry(
                url,
                &http_headers(contents, field)?,
                cas,
                MAX_FILE_BYTES,
                opts.fetch_timeout,
            )
            .await
            .map_err(|e| match e {
                crate::net::http_client::HttpError::TooLarge { limit, .. } => {
                    ApplyError::TooLarge {
                        field: format!("{field}.source"),
                        limit,
                        how: "",
                    }
                }
                other => other.into(),
            })?,
        },
    };
    let data = decompress(
        raw,
        contents.compression.as_deref(),
        &format!("{field}.compression"),
    )?;
    // Ignition: "if compression is specified, the hash describes the decompressed file".
    verify(&data, hash_of(contents), field)?;
    Ok(data)
}

async fn write_file(
    file: &File,
    index: usize,
    root: &Path,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<(), ApplyError> {
    let field = format!("storage.files[{index}]");
    let path = file.path.as_str();
    let target = under_root(root, path, &format!("{field}.path"))?;
    let remote = |r: &Resource| {
        r.source
            .as_deref()
            .is_some_and(|s| !s.is_empty() && !s.starts_with("data:"))
    };
    // The running agent itself (the appliance's /init at the RHCOS path): never rewritten.
    if file.contents.as_ref().is_some_and(remote)
        && target.exists()
        && std::env::current_exe().is_ok_and(|exe| exe == target)
    {
        return Ok(());
    }
    let werr = |source| ApplyError::Write {
        path: path.to_owned(),
        source,
    };
    let contents = file.contents.clone().unwrap_or_default();
    let data = resource_bytes(&contents, &target, &format!("{field}.contents"), cas, opts).await?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(werr)?;
    }
    // A file that only appends (2.x `append: true`, 3.x `append` without `contents`) keeps
    // what is there.
    if file.contents.is_some() || file.append.is_none() {
        std::fs::write(&target, &data).map_err(werr)?;
    }
    for (i, piece) in file.append.iter().flatten().enumerate() {
        // A 2.x append is the file's own contents, and named so.
        let at = if file.contents.is_none() && i == 0 {
            format!("{field}.contents")
        } else {
            format!("{field}.append[{i}]")
        };
        let data = resource_bytes(piece, &target, &at, cas, opts).await?;
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&target)
            .and_then(|mut f| f.write_all(&data))
            .map_err(werr)?;
    }
    set_mode(&target, file.mode)?;
    applied.files_written.push(target);
    Ok(())
}

fn set_mode(path: &Path, mode: Option<i64>) -> Result<(), ApplyError> {
    if let Some(mode) = mode.and_then(|m| u32::try_from(m).ok()) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(
            |source| ApplyError::Write {
                path: path.display().to_string(),
                source,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
