//! Appliance mode: apply the Ignition subset the agent needs from user_data (docs/architecture.md, "From install-config to a running node"):
//! fetch and verify pointer configs, write files (cluster.json, TLS, the role, operator files),
//! directories and `core`'s SSH keys, and refuse, with a clear line, what it cannot honour
//! (systemd units, disks, file systems: the appliance has neither systemd nor a root disk).
//!
//! Works on the JSON tree rather than typed configs so one path reads spec 2.2 and 3.x alike;
//! the differences it cares about (`append` vs `merge`, 2.2's `filesystem`) are handled here.

pub mod dataurl;
pub mod fetch;

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
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
    let config = resolve(parse(user_data)?, opts, &mut applied, 0).await?;
    let cas = certificate_authorities(&config)?;
    write_config(&config, root, &cas, opts, &mut applied).await?;
    Ok(applied)
}

fn parse(bytes: &[u8]) -> Result<Value, ApplyError> {
    let config: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApplyError::NotIgnition(format!("expected Ignition JSON: {e}")))?;
    let version = config
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .ok_or_else(|| ApplyError::NotIgnition("expected ignition.version".into()))?;
    if !(version.starts_with("2.2.") || version.starts_with("2.3.") || version.starts_with("3.")) {
        return Err(ApplyError::Invalid {
            field: "ignition.version".into(),
            message: format!("expected 2.2.x or 3.x, got {version:?}"),
        });
    }
    Ok(config)
}

fn is_v2(config: &Value) -> bool {
    config
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with("2."))
}

/// The CAs the config trusts (`ignition.security.tls.certificateAuthorities[].source`).
fn certificate_authorities(config: &Value) -> Result<Vec<Vec<u8>>, ApplyError> {
    let mut cas = Vec::new();
    if let Some(list) = config
        .pointer("/ignition/security/tls/certificateAuthorities")
        .and_then(Value::as_array)
    {
        for (i, ca) in list.iter().enumerate() {
            let field = format!("ignition.security.tls.certificateAuthorities[{i}].source");
            let source =
                ca.get("source")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApplyError::Invalid {
                        field: field.clone(),
                        message: "expected a data: URL".into(),
                    })?;
            let raw = dataurl::decode(source).map_err(|e| ApplyError::Invalid {
                field: field.clone(),
                message: e.to_string(),
            })?;
            // Spec 3.1+ lets a CA say `compression` (keelson never writes one; others may).
            let pem = decompress(
                raw,
                ca.get("compression"),
                &field.replace(".source", ".compression"),
            )?;
            cas.push(pem);
        }
    }
    Ok(cas)
}

/// Follows `replace` / `merge` (3.x) or `append` (2.2) pointers; returns the config to apply.
async fn resolve(
    config: Value,
    opts: &ApplyOptions,
    applied: &mut Applied,
    depth: usize,
) -> Result<Value, ApplyError> {
    if depth > 4 {
        return Err(ApplyError::Invalid {
            field: "ignition.config".into(),
            message: "pointer configs nested more than 4 deep".into(),
        });
    }
    let cas = certificate_authorities(&config)?;
    if let Some(replace) = config.pointer("/ignition/config/replace")
        && replace.get("source").and_then(Value::as_str).is_some()
    {
        let child = fetch_config(replace, "ignition.config.replace", &cas, opts, applied).await?;
        return Box::pin(resolve(child, opts, applied, depth + 1)).await;
    }
    let key = if is_v2(&config) { "append" } else { "merge" };
    let mut result = config.clone();
    if let Some(list) = config
        .pointer(&format!("/ignition/config/{key}"))
        .and_then(Value::as_array)
    {
        for (i, reference) in list.iter().enumerate() {
            let field = format!("ignition.config.{key}[{i}]");
            let child = fetch_config(reference, &field, &cas, opts, applied).await?;
            let child = Box::pin(resolve(child, opts, applied, depth + 1)).await?;
            merge(&mut result, child);
        }
    }
    Ok(result)
}

async fn fetch_config(
    reference: &Value,
    field: &str,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<Value, ApplyError> {
    let source = reference
        .get("source")
        .and_then(Value::as_str)
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
        let body = fetch::get_with_retry(source, cas, MAX_CONFIG_BYTES, opts.fetch_timeout).await?;
        applied.fetched.push(source.to_owned());
        body
    };
    verify(&bytes, reference.pointer("/verification/hash"), field)?;
    parse(&bytes)
}

/// Merges `child` into `parent`: child's files, directories and users replace the parent's
/// entries with the same path or name; everything else from the child wins.
fn merge(parent: &mut Value, child: Value) {
    for (section, list, key) in [
        ("storage", "files", "path"),
        ("storage", "directories", "path"),
        ("passwd", "users", "name"),
        ("systemd", "units", "name"),
    ] {
        let Some(child_list) = child
            .pointer(&format!("/{section}/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        let parent_section = parent.as_object_mut().map(|o| {
            o.entry(section)
                .or_insert_with(|| Value::Object(Default::default()))
        });
        let Some(Value::Object(sec)) = parent_section else {
            continue;
        };
        let entry = sec.entry(list).or_insert_with(|| Value::Array(vec![]));
        let Value::Array(items) = entry else { continue };
        for item in child_list {
            let id = item.get(key).cloned();
            items.retain(|existing| existing.get(key) != id.as_ref());
            items.push(item.clone());
        }
    }
    if let (Some(p), Some(c)) = (parent.get_mut("ignition"), child.get("ignition"))
        && let (Some(p), Some(c)) = (p.as_object_mut(), c.as_object())
        && let Some(sec) = c.get("security")
    {
        p.insert("security".into(), sec.clone());
    }
}

/// Checks `sha512-<hex>` / `sha256-<hex>` when given.
fn verify(bytes: &[u8], hash: Option<&Value>, field: &str) -> Result<(), ApplyError> {
    let Some(hash) = hash.and_then(Value::as_str) else {
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
fn decompress(
    raw: Vec<u8>,
    compression: Option<&Value>,
    field: &str,
) -> Result<Vec<u8>, ApplyError> {
    match compression.and_then(Value::as_str) {
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
fn local_copy(target: &Path, hash: Option<&Value>, contents: Option<&Value>) -> Option<Vec<u8>> {
    let hash = hash?.as_str()?;
    if contents
        .and_then(|c| c.get("compression"))
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        return None;
    }
    let candidates = [Some(target.to_path_buf()), std::env::current_exe().ok()];
    candidates.into_iter().flatten().find_map(|path| {
        let bytes = std::fs::read(&path).ok()?;
        verify(&bytes, Some(&Value::String(hash.to_owned())), "local").ok()?;
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
    config: &Value,
    root: &Path,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<(), ApplyError> {
    let empty = Vec::new();
    let dirs = config
        .pointer("/storage/directories")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for (i, dir) in dirs.iter().enumerate() {
        let field = format!("storage.directories[{i}].path");
        let path = dir
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| ApplyError::Invalid {
                field: field.clone(),
                message: "expected a path".into(),
            })?;
        let target = under_root(root, path, &field)?;
        std::fs::create_dir_all(&target).map_err(|source| ApplyError::Write {
            path: path.into(),
            source,
        })?;
        set_mode(&target, dir.get("mode"))?;
    }
    let files = config
        .pointer("/storage/files")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for (i, file) in files.iter().enumerate() {
        match write_file(file, i, root, cas, opts, applied).await {
            // One oversized file (a gzip bomb, an endless download) is refused on its own;
            // the rest of the config, and the node, still come up.
            Err(e @ ApplyError::TooLarge { .. }) => applied.refused.push(e.to_string()),
            other => other?,
        }
    }
    if let Some(users) = config.pointer("/passwd/users").and_then(Value::as_array) {
        for user in users {
            let name = user.get("name").and_then(Value::as_str).unwrap_or("");
            let keys: Vec<&str> = user
                .get("sshAuthorizedKeys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if name == "core" && !keys.is_empty() {
                let dir = root.join("home/core/.ssh/authorized_keys.d");
                let path = dir.join("ignition");
                let write = std::fs::create_dir_all(&dir)
                    .and_then(|_| std::fs::write(&path, format!("{}\n", keys.join("\n"))));
                write.map_err(|source| ApplyError::Write {
                    path: path.display().to_string(),
                    source,
                })?;
                applied.files_written.push(path);
            } else if !keys.is_empty() || user.get("passwordHash").is_some() {
                applied.refused.push(format!(
                    "passwd.users {name:?}: the appliance has only core's keys"
                ));
            }
        }
    }
    if let Some(units) = config.pointer("/systemd/units").and_then(Value::as_array) {
        for unit in units {
            let name = unit.get("name").and_then(Value::as_str).unwrap_or("?");
            if name == keelson_ignition::unit::AGENT_UNIT_NAME {
                // The RHCOS unit that starts the agent: here the agent is already PID 1.
                continue;
            }
            applied.refused.push(format!(
                "systemd.units {name}: the appliance has no systemd (the agent is PID 1); \
                 declare extra processes as cluster.json services"
            ));
        }
    }
    for section in ["disks", "raid", "filesystems", "links", "luks"] {
        if config
            .pointer(&format!("/storage/{section}"))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            applied.refused.push(format!(
                "storage.{section}: the appliance runs from memory and does not partition or format disks"
            ));
        }
    }
    Ok(())
}

async fn write_file(
    file: &Value,
    index: usize,
    root: &Path,
    cas: &[Vec<u8>],
    opts: &ApplyOptions,
    applied: &mut Applied,
) -> Result<(), ApplyError> {
    let field = format!("storage.files[{index}]");
    let path = file
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| ApplyError::Invalid {
            field: format!("{field}.path"),
            message: "expected a path".into(),
        })?;
    let target = under_root(root, path, &format!("{field}.path"))?;
    let contents = file.get("contents");
    let source = contents
        .and_then(|c| c.get("source"))
        .and_then(Value::as_str);
    let raw = match source {
        None | Some("") => Vec::new(),
        Some(url) if url.starts_with("data:") => {
            dataurl::decode(url).map_err(|e| ApplyError::Invalid {
                field: format!("{field}.contents.source"),
                message: e.to_string(),
            })?
        }
        Some(url) => {
            if target.exists() && std::env::current_exe().is_ok_and(|exe| exe == target) {
                return Ok(());
            }
            let hash = contents.and_then(|c| c.pointer("/verification/hash"));
            match local_copy(&target, hash, contents) {
                Some(bytes) => {
                    tracing::info!(path, %url, "already here with the verified hash; not fetched");
                    bytes
                }
                None => fetch::get_with_retry(url, cas, MAX_FILE_BYTES, opts.fetch_timeout)
                    .await
                    .map_err(|e| match e {
                        crate::net::http_client::HttpError::TooLarge { limit, .. } => {
                            ApplyError::TooLarge {
                                field: format!("{field}.contents.source"),
                                limit,
                                how: "",
                            }
                        }
                        other => other.into(),
                    })?,
            }
        }
    };
    let data = decompress(
        raw,
        contents.and_then(|c| c.get("compression")),
        &format!("{field}.contents.compression"),
    )?;
    // Ignition: "if compression is specified, the hash describes the decompressed file".
    verify(
        &data,
        contents.and_then(|c| c.pointer("/verification/hash")),
        &format!("{field}.contents"),
    )?;
    let werr = |source| ApplyError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(werr)?;
    }
    let append_v2 = file.get("append").and_then(Value::as_bool) == Some(true);
    if append_v2 {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&target)
            .and_then(|mut f| f.write_all(&data))
            .map_err(werr)?;
    } else {
        std::fs::write(&target, &data).map_err(werr)?;
    }
    set_mode(&target, file.get("mode"))?;
    applied.files_written.push(target);
    Ok(())
}

fn set_mode(path: &Path, mode: Option<&Value>) -> Result<(), ApplyError> {
    if let Some(mode) = mode.and_then(Value::as_u64) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode((mode & 0o7777) as u32),
        )
        .map_err(|source| ApplyError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
