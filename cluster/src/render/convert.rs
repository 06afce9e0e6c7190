//! An Ignition config from one spec version to another, where that loses nothing, and a
//! clear refusal naming the field where it would (docs/own-ignition.md, "Spec versions").
//!
//! - **3.x to 3.y.** The 3.x specs only add to one another, so a config goes up by its
//!   version string alone, and down when it uses nothing the lower spec lacks: the fields
//!   of [`ADDED_IN`] (checked against the specs' JSON schemas by a test) and the values
//!   of [`value_needs`] (sha256 hashes, `gs://` and `arn:` sources, ...).
//! - **2.2 and 3.x.** Spec 3.0 reshaped 2.x (coreos/ignition, docs/migrating-configs.md):
//!   `config.append` became `config.merge`, files lost their named filesystem and default
//!   to `overwrite: false` instead of true, a file's appends became a list. [`v2_to_v3`]
//!   and [`v3_to_v2`] translate files, directories, links, units, users, groups, config
//!   references, CAs and timeouts with those semantics kept explicit; disks, RAID, file
//!   systems and networkd have no faithful translation and are refused.
//!
//! Works on JSON values (no typed model drops a field on the way), pure, and small enough
//! for the agent, whose Ignition server converts an operator's config to the spec each
//! client asks for.

use serde_json::{Map, Value};

use crate::version::SpecVersion;

/// Why a config could not be read or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// Not JSON at all.
    #[error("expected an Ignition config (JSON): {0}")]
    NotJson(String),
    /// JSON, but no `ignition.version`.
    #[error(
        "expected an Ignition config: no ignition.version (a Butane file? run `butane` on it first)"
    )]
    NotIgnition,
    /// A version keelson does not read.
    #[error("ignition.version: expected 2.2.0 or 3.0.0 to 3.6.0, got {0:?}")]
    Version(String),
    /// A field or value the target spec cannot say.
    #[error("{path}: {why}")]
    Lossy {
        /// The field, e.g. `storage.files[2].contents.httpHeaders`.
        path: String,
        /// Why it cannot be converted.
        why: String,
    },
}

/// Fields each 3.x spec added to the one before, as paths (`[]` for every entry of a
/// list). A test derives the same list from the JSON schemas of 3.0 to 3.5.
pub const ADDED_IN: &[(SpecVersion, &str)] = &[
    (SpecVersion::V3_1, "ignition.config.merge[].compression"),
    (SpecVersion::V3_1, "ignition.config.merge[].httpHeaders"),
    (SpecVersion::V3_1, "ignition.config.replace.compression"),
    (SpecVersion::V3_1, "ignition.config.replace.httpHeaders"),
    (SpecVersion::V3_1, "ignition.proxy"),
    (
        SpecVersion::V3_1,
        "ignition.security.tls.certificateAuthorities[].compression",
    ),
    (
        SpecVersion::V3_1,
        "ignition.security.tls.certificateAuthorities[].httpHeaders",
    ),
    (SpecVersion::V3_1, "storage.files[].append[].httpHeaders"),
    (SpecVersion::V3_1, "storage.files[].contents.httpHeaders"),
    (SpecVersion::V3_1, "storage.filesystems[].mountOptions"),
    (SpecVersion::V3_2, "passwd.groups[].shouldExist"),
    (SpecVersion::V3_2, "passwd.users[].shouldExist"),
    (SpecVersion::V3_2, "storage.disks[].partitions[].resize"),
    (SpecVersion::V3_2, "storage.luks"),
    (SpecVersion::V3_3, "kernelArguments"),
    (
        SpecVersion::V3_4,
        "storage.luks[].clevis.tang[].advertisement",
    ),
    (SpecVersion::V3_4, "storage.luks[].discard"),
    (SpecVersion::V3_4, "storage.luks[].openOptions"),
    (SpecVersion::V3_5, "storage.luks[].cex"),
];

/// Reads an operator's config: its spec and its JSON. Spec 3.6.0 (which keelson does not
/// write) comes back as 3.5.0 when nothing in it needs 3.6 (the setuid, setgid and sticky
/// bits of a mode).
pub fn read(bytes: &[u8]) -> Result<(SpecVersion, Value), ConvertError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ConvertError::NotJson(e.to_string()))?;
    let version = value
        .get("ignition")
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .ok_or(ConvertError::NotIgnition)?
        .to_owned();
    if version == "3.6.0" {
        if let Some(path) = special_mode_bits(&value) {
            return Err(ConvertError::Lossy {
                path,
                why: "a mode with setuid, setgid or sticky bits needs spec 3.6.0, which keelson does not write (the specs before it ignore those bits)".into(),
            });
        }
        return Ok((SpecVersion::V3_5, with_version(&value, SpecVersion::V3_5)));
    }
    let spec: SpecVersion = version
        .parse()
        .map_err(|_| ConvertError::Version(version.clone()))?;
    Ok((spec, value))
}

/// The lowest 3.x spec that can say everything `config` (a 3.x config) says, and the
/// first field or value that needs it (`None` for 3.0).
pub fn min_v3(config: &Value) -> (SpecVersion, Option<String>) {
    let mut best = (SpecVersion::V3_0, None);
    let mut consider = |needs: SpecVersion, path: String| {
        if needs > best.0 {
            best = (needs, Some(path));
        }
    };
    walk(config, "", "", &mut |pattern, path, value| {
        for (spec, field) in ADDED_IN {
            if pattern == *field {
                consider(*spec, path.to_owned());
            }
        }
        if let Some((spec, _)) = value_needs(pattern, value) {
            consider(spec, path.to_owned());
        }
    });
    best
}

/// A value only some specs accept: `(the spec that introduced it, what it is)`.
fn value_needs(pattern: &str, value: &Value) -> Option<(SpecVersion, &'static str)> {
    let s = value.as_str()?;
    if pattern.ends_with("verification.hash") && s.starts_with("sha256-") {
        return Some((SpecVersion::V3_1, "a sha256 hash"));
    }
    if pattern.ends_with("source") || pattern.ends_with(".url") {
        if s.starts_with("gs://") {
            return Some((SpecVersion::V3_2, "a gs:// source"));
        }
        if s.starts_with("arn:") {
            return Some((SpecVersion::V3_4, "an S3 access point ARN"));
        }
    }
    if pattern == "storage.filesystems[].format" && s == "none" {
        return Some((SpecVersion::V3_3, "format \"none\""));
    }
    None
}

/// Calls `f(pattern, path, value)` for every field under `value` (`pattern` has `[]` where
/// `path` has `[i]`).
fn walk(value: &Value, pattern: &str, path: &str, f: &mut dyn FnMut(&str, &str, &Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let (p, q) = if pattern.is_empty() {
                    (k.clone(), k.clone())
                } else {
                    (format!("{pattern}.{k}"), format!("{path}.{k}"))
                };
                f(&p, &q, v);
                walk(v, &p, &q, f);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let (p, q) = (format!("{pattern}[]"), format!("{path}[{i}]"));
                if !v.is_object() && !v.is_array() {
                    f(&p, &q, v);
                }
                walk(v, &p, &q, f);
            }
        }
        _ => {}
    }
}

fn special_mode_bits(config: &Value) -> Option<String> {
    let mut found = None;
    walk(config, "", "", &mut |pattern, path, value| {
        if found.is_none()
            && (pattern == "storage.files[].mode" || pattern == "storage.directories[].mode")
            && value.as_u64().is_some_and(|m| m > 0o777)
        {
            found = Some(path.to_owned());
        }
    });
    found
}

fn with_version(config: &Value, spec: SpecVersion) -> Value {
    let mut out = config.clone();
    if let Some(ign) = out.get_mut("ignition").and_then(Value::as_object_mut) {
        ign.insert("version".into(), Value::String(spec.as_str().into()));
    }
    out
}

/// `config`, of spec `from`, in spec `to`; refused, naming the first field in the way,
/// where that would lose or change something.
pub fn convert(config: &Value, from: SpecVersion, to: SpecVersion) -> Result<Value, ConvertError> {
    match (from.is_v2(), to.is_v2()) {
        (true, true) => Ok(config.clone()),
        (false, false) => {
            if to < from {
                let (needs, path) = min_v3(config);
                if needs > to {
                    let path = path.unwrap_or_default();
                    return Err(ConvertError::Lossy {
                        why: format!(
                            "needs spec {needs} or later (the config is {from}, the target {to})"
                        ),
                        path,
                    });
                }
            }
            Ok(with_version(config, to))
        }
        (true, false) => {
            let v3 = v2_to_v3(config)?;
            convert(&v3, SpecVersion::V3_0, to)
        }
        (false, true) => {
            let (needs, path) = min_v3(config);
            if needs > SpecVersion::V3_0 {
                return Err(ConvertError::Lossy {
                    path: path.unwrap_or_default(),
                    why: format!("needs spec {needs}; spec 2.2 has no counterpart"),
                });
            }
            v3_to_v2(config)
        }
    }
}

/// Reads an object's fields one by one, so that whatever the translation does not take
/// is an error naming it rather than a field silently dropped.
struct Fields<'a> {
    map: Map<String, Value>,
    path: &'a str,
}

impl<'a> Fields<'a> {
    fn of(value: &Value, path: &'a str) -> Result<Self, ConvertError> {
        match value {
            Value::Object(m) => Ok(Self {
                map: m.clone(),
                path,
            }),
            Value::Null => Ok(Self {
                map: Map::new(),
                path,
            }),
            _ => Err(ConvertError::Lossy {
                path: path.into(),
                why: "expected an object".into(),
            }),
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn sub(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.into()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Errors on the first field left, with `why`.
    fn done(self, why: &str) -> Result<(), ConvertError> {
        match self.map.into_iter().find(|(_, v)| !is_empty(v)) {
            Some((k, _)) => Err(ConvertError::Lossy {
                path: if self.path.is_empty() {
                    k
                } else {
                    format!("{}.{k}", self.path)
                },
                why: why.into(),
            }),
            None => Ok(()),
        }
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.values().all(|v| v.is_null() || is_empty(v)),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

fn list<'v>(value: &'v Option<Value>, path: &str) -> Result<&'v [Value], ConvertError> {
    match value {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(ConvertError::Lossy {
            path: path.into(),
            why: "expected a list".into(),
        }),
    }
}

fn put(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        map.insert(key.into(), v);
    }
}

const NO_V3: &str = "has no counterpart in spec 3";
const NO_V2: &str = "has no counterpart in spec 2.2";

/// A resource (`source`, `verification`, and for file contents `compression`) in either
/// direction (hashes spec 2.2 cannot check never get here: [`min_v3`] sends them to 3.1).
fn resource(value: &Value, path: &str, compression: bool) -> Result<Value, ConvertError> {
    let mut f = Fields::of(value, path)?;
    let mut out = Map::new();
    if let Some(source) = f.take("source") {
        if let Some(s) = source.as_str()
            && s.starts_with("oem://")
        {
            return Err(ConvertError::Lossy {
                path: f.sub("source"),
                why: "oem:// sources were dropped in spec 3".into(),
            });
        }
        out.insert("source".into(), source);
    }
    if compression {
        put(&mut out, "compression", f.take("compression"));
    }
    if let Some(v) = f.take("verification") {
        let vpath = f.sub("verification");
        let mut vf = Fields::of(&v, &vpath)?;
        let mut vout = Map::new();
        put(&mut vout, "hash", vf.take("hash"));
        vf.done("is not a field of verification")?;
        if !vout.is_empty() {
            out.insert("verification".into(), Value::Object(vout));
        }
    }
    f.done("is not a field every spec's resources share")?;
    Ok(Value::Object(out))
}

fn owner(value: &Value, path: &str) -> Result<Value, ConvertError> {
    let mut f = Fields::of(value, path)?;
    let mut out = Map::new();
    put(&mut out, "id", f.take("id"));
    put(&mut out, "name", f.take("name"));
    f.done("is not a field of an owner")?;
    Ok(Value::Object(out))
}

/// `filesystem` of a 2.2 node: only `root` has a 3.x counterpart (a path under `/`).
fn root_filesystem(f: &mut Fields<'_>) -> Result<(), ConvertError> {
    match f.take("filesystem") {
        Some(Value::String(s)) if s == "root" => Ok(()),
        None => Err(ConvertError::Lossy {
            path: f.sub("filesystem"),
            why: "missing: spec 2.2 names the filesystem of every node".into(),
        }),
        Some(other) => Err(ConvertError::Lossy {
            path: f.sub("filesystem"),
            why: format!(
                "{other}: spec 3 has no named filesystems; only \"root\" translates (put the node's path under the filesystem's mount point)"
            ),
        }),
    }
}

/// The node fields 2.2 and 3.x share (`path`, `overwrite`, `user`, `group`).
fn node_common(f: &mut Fields<'_>, out: &mut Map<String, Value>) -> Result<(), ConvertError> {
    put(out, "path", f.take("path"));
    for key in ["user", "group"] {
        if let Some(v) = f.take(key) {
            let o = owner(&v, &f.sub(key))?;
            if !is_empty(&o) {
                out.insert(key.into(), o);
            }
        }
    }
    Ok(())
}

/// Spec 2.2 to 3.0, semantics kept: files say `overwrite` explicitly (2.x wrote over by
/// default, 3.x does not), one file's `append: true` entries become its `append` list.
pub fn v2_to_v3(config: &Value) -> Result<Value, ConvertError> {
    let mut top = Fields::of(config, "")?;
    let mut out = Map::new();
    let ign = top.take("ignition").unwrap_or(Value::Null);
    out.insert("ignition".into(), v2_ignition_to_v3(&ign)?);
    if let Some(storage) = top.take("storage") {
        let s = v2_storage_to_v3(&storage)?;
        if !is_empty(&s) {
            out.insert("storage".into(), s);
        }
    }
    if let Some(systemd) = top.take("systemd") {
        let s = systemd_either(&systemd, "systemd", true)?;
        if !is_empty(&s) {
            out.insert("systemd".into(), s);
        }
    }
    if let Some(passwd) = top.take("passwd") {
        let p = passwd_either(&passwd, true)?;
        if !is_empty(&p) {
            out.insert("passwd".into(), p);
        }
    }
    if let Some(networkd) = top.take("networkd")
        && !is_empty(&networkd)
    {
        return Err(ConvertError::Lossy {
            path: "networkd".into(),
            why: "spec 3 removed networkd: write its units as files under /etc/systemd/network/"
                .into(),
        });
    }
    top.done(NO_V3)?;
    Ok(Value::Object(out))
}

fn v2_ignition_to_v3(ign: &Value) -> Result<Value, ConvertError> {
    let mut f = Fields::of(ign, "ignition")?;
    let mut out = Map::new();
    out.insert("version".into(), Value::String("3.0.0".into()));
    f.take("version");
    if let Some(config) = f.take("config") {
        let mut cf = Fields::of(&config, "ignition.config")?;
        let mut cout = Map::new();
        let append = cf.take("append");
        let items = list(&append, "ignition.config.append")?;
        if !items.is_empty() {
            let merged = items
                .iter()
                .enumerate()
                .map(|(i, r)| resource(r, &format!("ignition.config.append[{i}]"), false))
                .collect::<Result<Vec<_>, _>>()?;
            cout.insert("merge".into(), Value::Array(merged));
        }
        if let Some(r) = cf.take("replace") {
            let r = resource(&r, "ignition.config.replace", false)?;
            if !is_empty(&r) {
                cout.insert("replace".into(), r);
            }
        }
        cf.done(NO_V3)?;
        if !cout.is_empty() {
            out.insert("config".into(), Value::Object(cout));
        }
    }
    ignition_common(&mut f, &mut out)?;
    f.done(NO_V3)?;
    Ok(Value::Object(out))
}

/// `security` and `timeouts`, which 2.2 and 3.0 write alike.
fn ignition_common(f: &mut Fields<'_>, out: &mut Map<String, Value>) -> Result<(), ConvertError> {
    if let Some(sec) = f.take("security") {
        let mut sf = Fields::of(&sec, "ignition.security")?;
        if let Some(tls) = sf.take("tls") {
            let mut tf = Fields::of(&tls, "ignition.security.tls")?;
            let cas = tf.take("certificateAuthorities");
            let items = list(&cas, "ignition.security.tls.certificateAuthorities")?;
            if !items.is_empty() {
                let cas = items
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        resource(
                            r,
                            &format!("ignition.security.tls.certificateAuthorities[{i}]"),
                            false,
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert(
                    "security".into(),
                    serde_json::json!({"tls": {"certificateAuthorities": cas}}),
                );
            }
            tf.done("is not a field of tls in both specs")?;
        }
        sf.done("is not a field of security in both specs")?;
    }
    if let Some(t) = f.take("timeouts") {
        let mut tf = Fields::of(&t, "ignition.timeouts")?;
        let mut tout = Map::new();
        put(
            &mut tout,
            "httpResponseHeaders",
            tf.take("httpResponseHeaders"),
        );
        put(&mut tout, "httpTotal", tf.take("httpTotal"));
        tf.done("is not a field of timeouts in both specs")?;
        if !tout.is_empty() {
            out.insert("timeouts".into(), Value::Object(tout));
        }
    }
    Ok(())
}

fn refuse_layout(f: &mut Fields<'_>) -> Result<(), ConvertError> {
    for key in ["disks", "raid", "filesystems"] {
        if let Some(v) = f.take(key)
            && !is_empty(&v)
        {
            return Err(ConvertError::Lossy {
                    path: f.sub(key),
                    why: "disk layout is not translated between spec 2.2 and 3 (file systems are named in one and mounted by path in the other): write the config in the build's spec".into(),
                });
        }
    }
    Ok(())
}

fn v2_storage_to_v3(storage: &Value) -> Result<Value, ConvertError> {
    let mut f = Fields::of(storage, "storage")?;
    refuse_layout(&mut f)?;
    let mut out = Map::new();
    // Files: one 3.x entry per path, its contents from the entry that writes it and its
    // appends, in order, from the entries with `append: true`.
    let files = f.take("files");
    let mut by_path: Vec<Map<String, Value>> = Vec::new();
    for (i, file) in list(&files, "storage.files")?.iter().enumerate() {
        let path = format!("storage.files[{i}]");
        let mut ff = Fields::of(file, &path)?;
        root_filesystem(&mut ff)?;
        let mut entry = Map::new();
        node_common(&mut ff, &mut entry)?;
        put(&mut entry, "mode", ff.take("mode"));
        let append = ff.take("append").and_then(|v| v.as_bool()).unwrap_or(false);
        let overwrite = ff.take("overwrite").and_then(|v| v.as_bool());
        let contents = match ff.take("contents") {
            Some(c) => Some(resource(&c, &format!("{path}.contents"), true)?),
            None => None,
        };
        ff.done(NO_V3)?;
        let key = entry.get("path").cloned();
        let existing = by_path.iter_mut().find(|e| e.get("path") == key.as_ref());
        match (existing, append) {
            (Some(e), true) => {
                let list = e
                    .entry("append")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let (Value::Array(l), Some(c)) = (list, contents) {
                    l.push(c);
                }
            }
            (Some(_), false) => {
                return Err(ConvertError::Lossy {
                    path,
                    why: "a second entry that writes this path: spec 3 allows one".into(),
                });
            }
            (None, true) => {
                entry.insert("overwrite".into(), Value::Bool(false));
                entry.insert(
                    "append".into(),
                    Value::Array(contents.into_iter().collect()),
                );
                by_path.push(entry);
            }
            (None, false) => {
                // Spec 2.x wrote over whatever was there unless told not to.
                entry.insert("overwrite".into(), Value::Bool(overwrite.unwrap_or(true)));
                put(&mut entry, "contents", contents.filter(|c| !is_empty(c)));
                by_path.push(entry);
            }
        }
    }
    if !by_path.is_empty() {
        out.insert(
            "files".into(),
            Value::Array(by_path.into_iter().map(Value::Object).collect()),
        );
    }
    nodes_either(&mut f, &mut out, true)?;
    f.done(NO_V3)?;
    Ok(Value::Object(out))
}

/// Directories and links, either way (`to_v3`: from 2.2, else to 2.2).
fn nodes_either(
    f: &mut Fields<'_>,
    out: &mut Map<String, Value>,
    to_v3: bool,
) -> Result<(), ConvertError> {
    for (key, extra) in [
        ("directories", &["mode"][..]),
        ("links", &["target", "hard"][..]),
    ] {
        let items = f.take(key);
        let mut converted = Vec::new();
        for (i, node) in list(&items, &f.sub(key))?.iter().enumerate() {
            let path = format!("storage.{key}[{i}]");
            let mut nf = Fields::of(node, &path)?;
            let mut entry = Map::new();
            if to_v3 {
                root_filesystem(&mut nf)?;
            } else {
                entry.insert("filesystem".into(), Value::String("root".into()));
            }
            node_common(&mut nf, &mut entry)?;
            put(&mut entry, "overwrite", nf.take("overwrite"));
            for x in extra {
                put(&mut entry, x, nf.take(x));
            }
            nf.done(if to_v3 { NO_V3 } else { NO_V2 })?;
            converted.push(Value::Object(entry));
        }
        if !converted.is_empty() {
            out.insert(key.into(), Value::Array(converted));
        }
    }
    Ok(())
}

/// `systemd` either way: units with `enabled` (2.x's deprecated `enable` read as it),
/// `mask`, contents and drop-ins.
fn systemd_either(systemd: &Value, path: &str, from_v2: bool) -> Result<Value, ConvertError> {
    let mut f = Fields::of(systemd, path)?;
    let units = f.take("units");
    let mut out_units = Vec::new();
    for (i, unit) in list(&units, "systemd.units")?.iter().enumerate() {
        let upath = format!("systemd.units[{i}]");
        let mut uf = Fields::of(unit, &upath)?;
        let mut u = Map::new();
        put(&mut u, "name", uf.take("name"));
        let mut enabled = uf.take("enabled");
        if from_v2 && let Some(Value::Bool(true)) = uf.take("enable") {
            enabled = Some(Value::Bool(true));
        }
        put(&mut u, "enabled", enabled);
        put(&mut u, "mask", uf.take("mask"));
        put(&mut u, "contents", uf.take("contents"));
        let dropins = uf.take("dropins");
        let mut ds = Vec::new();
        for (j, d) in list(&dropins, &format!("{upath}.dropins"))?
            .iter()
            .enumerate()
        {
            let dpath = format!("{upath}.dropins[{j}]");
            let mut df = Fields::of(d, &dpath)?;
            let mut dout = Map::new();
            put(&mut dout, "name", df.take("name"));
            put(&mut dout, "contents", df.take("contents"));
            df.done(if from_v2 { NO_V3 } else { NO_V2 })?;
            ds.push(Value::Object(dout));
        }
        if !ds.is_empty() {
            u.insert("dropins".into(), Value::Array(ds));
        }
        uf.done(if from_v2 { NO_V3 } else { NO_V2 })?;
        out_units.push(Value::Object(u));
    }
    f.done(if from_v2 { NO_V3 } else { NO_V2 })?;
    let mut out = Map::new();
    if !out_units.is_empty() {
        out.insert("units".into(), Value::Array(out_units));
    }
    Ok(Value::Object(out))
}

const USER_FIELDS: &[&str] = &[
    "name",
    "passwordHash",
    "sshAuthorizedKeys",
    "uid",
    "gecos",
    "homeDir",
    "noCreateHome",
    "primaryGroup",
    "groups",
    "noUserGroup",
    "noLogInit",
    "shell",
    "system",
];
const GROUP_FIELDS: &[&str] = &["name", "gid", "passwordHash", "system"];

/// `passwd` either way: the user and group fields both specs have (2.x's deprecated
/// `create` is refused).
fn passwd_either(passwd: &Value, from_v2: bool) -> Result<Value, ConvertError> {
    let mut f = Fields::of(passwd, "passwd")?;
    let mut out = Map::new();
    for (key, fields) in [("users", USER_FIELDS), ("groups", GROUP_FIELDS)] {
        let items = f.take(key);
        let mut converted = Vec::new();
        for (i, item) in list(&items, &format!("passwd.{key}"))?.iter().enumerate() {
            let path = format!("passwd.{key}[{i}]");
            let mut pf = Fields::of(item, &path)?;
            let mut entry = Map::new();
            for field in fields {
                put(&mut entry, field, pf.take(field));
            }
            pf.done(if from_v2 {
                "has no counterpart in spec 3 (2.x's `create` was deprecated: use the user's own fields)"
            } else {
                NO_V2
            })?;
            converted.push(Value::Object(entry));
        }
        if !converted.is_empty() {
            out.insert(key.into(), Value::Array(converted));
        }
    }
    f.done(if from_v2 { NO_V3 } else { NO_V2 })?;
    Ok(Value::Object(out))
}

/// Spec 3.0 to 2.2, semantics kept: every node on filesystem `root`, files saying
/// `overwrite` explicitly (3.x's default is false, 2.x's true), a file's `append` list as
/// `append: true` entries after the one that writes it.
pub fn v3_to_v2(config: &Value) -> Result<Value, ConvertError> {
    let mut top = Fields::of(config, "")?;
    let mut out = Map::new();
    let ign = top.take("ignition").unwrap_or(Value::Null);
    {
        let mut f = Fields::of(&ign, "ignition")?;
        let mut iout = Map::new();
        f.take("version");
        iout.insert("version".into(), Value::String("2.2.0".into()));
        if let Some(config) = f.take("config") {
            let mut cf = Fields::of(&config, "ignition.config")?;
            let mut cout = Map::new();
            let merge = cf.take("merge");
            let items = list(&merge, "ignition.config.merge")?;
            if !items.is_empty() {
                let appended = items
                    .iter()
                    .enumerate()
                    .map(|(i, r)| resource(r, &format!("ignition.config.merge[{i}]"), false))
                    .collect::<Result<Vec<_>, _>>()?;
                cout.insert("append".into(), Value::Array(appended));
            }
            if let Some(r) = cf.take("replace") {
                let r = resource(&r, "ignition.config.replace", false)?;
                if !is_empty(&r) {
                    cout.insert("replace".into(), r);
                }
            }
            cf.done(NO_V2)?;
            if !cout.is_empty() {
                iout.insert("config".into(), Value::Object(cout));
            }
        }
        ignition_common(&mut f, &mut iout)?;
        f.done(NO_V2)?;
        out.insert("ignition".into(), Value::Object(iout));
    }
    if let Some(storage) = top.take("storage") {
        let mut f = Fields::of(&storage, "storage")?;
        refuse_layout(&mut f)?;
        let mut sout = Map::new();
        let files = f.take("files");
        let mut converted = Vec::new();
        for (i, file) in list(&files, "storage.files")?.iter().enumerate() {
            let path = format!("storage.files[{i}]");
            let mut ff = Fields::of(file, &path)?;
            let mut entry = Map::new();
            entry.insert("filesystem".into(), Value::String("root".into()));
            node_common(&mut ff, &mut entry)?;
            put(&mut entry, "mode", ff.take("mode"));
            let overwrite = ff
                .take("overwrite")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            let contents = match ff.take("contents") {
                Some(c) => Some(resource(&c, &format!("{path}.contents"), true)?),
                None => None,
            };
            let appends = ff.take("append");
            let appends = list(&appends, &format!("{path}.append"))?.to_vec();
            ff.done(NO_V2)?;
            // The entry that writes (or, with nothing to write, makes sure of) the file.
            if contents.is_some() || appends.is_empty() || overwrite {
                let mut first = entry.clone();
                first.insert("overwrite".into(), Value::Bool(overwrite));
                put(&mut first, "contents", contents.filter(|c| !is_empty(c)));
                converted.push(Value::Object(first));
            }
            for (j, a) in appends.iter().enumerate() {
                let mut e = entry.clone();
                e.insert("append".into(), Value::Bool(true));
                e.insert(
                    "contents".into(),
                    resource(a, &format!("{path}.append[{j}]"), true)?,
                );
                converted.push(Value::Object(e));
            }
        }
        if !converted.is_empty() {
            sout.insert("files".into(), Value::Array(converted));
        }
        nodes_either(&mut f, &mut sout, false)?;
        f.done(NO_V2)?;
        if !sout.is_empty() {
            out.insert("storage".into(), Value::Object(sout));
        }
    }
    if let Some(systemd) = top.take("systemd") {
        let s = systemd_either(&systemd, "systemd", false)?;
        if !is_empty(&s) {
            out.insert("systemd".into(), s);
        }
    }
    if let Some(passwd) = top.take("passwd") {
        let p = passwd_either(&passwd, false)?;
        if !is_empty(&p) {
            out.insert("passwd".into(), p);
        }
    }
    top.done(NO_V2)?;
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests;
