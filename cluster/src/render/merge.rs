//! Merging an operator's Ignition config into keelson's, as Ignition itself would and with
//! no side silently winning (docs/own-ignition.md, "How configs are merged").
//!
//! Ignition's own rules (coreos/ignition `config/merge`, and spec 2.x's `config.append`):
//! lists of keyed entries (files, directories and links by path, units and users by name,
//! disks by device...) are merged by key, other lists are concatenated, and where both
//! sides set a value the child's wins. That last rule is what keelson refuses: an entry or
//! a value that both configs set differently is a [`MergeError::Clash`] naming it and both
//! sources, so what a node applies never depends on which config Ignition took as the
//! child. An entry both define identically is kept once (the same CA in both, the same
//! `core` user); everything else is the union of the two, which is what Ignition's merge
//! (3.x) and append (2.x) produce for configs that do not clash.
//!
//! Works on JSON values, so every field of every spec is carried, including the ones
//! keelson's typed model does not know. Both configs must be of the same spec version
//! (`convert` brings them there first).

use serde_json::{Map, Value};

/// Why two configs could not be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// Both configs define the same thing differently.
    #[error("{what}: defined by {first} and by {second}, differently ({detail}); {hint}")]
    Clash {
        /// What both define, e.g. `storage.files path "/etc/motd"`.
        what: String,
        /// The first config's name.
        first: String,
        /// The second config's name.
        second: String,
        /// How they differ.
        detail: String,
        /// What to do about it.
        hint: String,
    },
    /// The configs are of different spec versions.
    #[error(
        "{first} is spec {first_version} and {second} is spec {second_version}: convert one first"
    )]
    Versions {
        /// The first config's name.
        first: String,
        /// Its `ignition.version`.
        first_version: String,
        /// The second config's name.
        second: String,
        /// Its `ignition.version`.
        second_version: String,
    },
    /// A field has the wrong JSON type.
    #[error("{config} {path}: expected {expected}")]
    Shape {
        /// The config's name.
        config: String,
        /// The field.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
}

/// How a list is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListRule {
    /// Entries with the same value of these fields are the same entry; lists that share a
    /// handle are one key space (a file and a link at one path are one path).
    Keyed {
        key: &'static [&'static str],
        handle: &'static str,
        noun: &'static str,
    },
    /// A set of strings (each kept once); lists that share a handle must not name one
    /// string in both (a kernel argument that should exist and should not).
    Set { handle: &'static str },
}

/// The lists Ignition 3.x merges by key or as sets (its types' `Key()`, `MergedKeys()`).
const LISTS_V3: &[(&str, ListRule)] = &[
    (
        "ignition.config.merge",
        ListRule::Keyed {
            key: &["source"],
            handle: "merge",
            noun: "source",
        },
    ),
    (
        "ignition.security.tls.certificateAuthorities",
        ListRule::Keyed {
            key: &["source"],
            handle: "ca",
            noun: "source",
        },
    ),
    (
        "ignition.proxy.noProxy",
        ListRule::Set { handle: "noProxy" },
    ),
    (
        "storage.files",
        ListRule::Keyed {
            key: &["path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.directories",
        ListRule::Keyed {
            key: &["path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.links",
        ListRule::Keyed {
            key: &["path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.disks",
        ListRule::Keyed {
            key: &["device"],
            handle: "disk",
            noun: "device",
        },
    ),
    (
        "storage.raid",
        ListRule::Keyed {
            key: &["name"],
            handle: "raid",
            noun: "name",
        },
    ),
    (
        "storage.filesystems",
        ListRule::Keyed {
            key: &["device"],
            handle: "filesystem",
            noun: "device",
        },
    ),
    (
        "storage.luks",
        ListRule::Keyed {
            key: &["name"],
            handle: "luks",
            noun: "name",
        },
    ),
    (
        "systemd.units",
        ListRule::Keyed {
            key: &["name"],
            handle: "unit",
            noun: "name",
        },
    ),
    (
        "passwd.users",
        ListRule::Keyed {
            key: &["name"],
            handle: "user",
            noun: "name",
        },
    ),
    (
        "passwd.groups",
        ListRule::Keyed {
            key: &["name"],
            handle: "group",
            noun: "name",
        },
    ),
    (
        "kernelArguments.shouldExist",
        ListRule::Set { handle: "karg" },
    ),
    (
        "kernelArguments.shouldNotExist",
        ListRule::Set { handle: "karg" },
    ),
];

/// The lists of spec 2.2 (`config.append` concatenates every list; these are the ones whose
/// entries name something a second entry could contradict).
const LISTS_V2: &[(&str, ListRule)] = &[
    (
        "ignition.config.append",
        ListRule::Keyed {
            key: &["source"],
            handle: "append",
            noun: "source",
        },
    ),
    (
        "ignition.security.tls.certificateAuthorities",
        ListRule::Keyed {
            key: &["source"],
            handle: "ca",
            noun: "source",
        },
    ),
    (
        "storage.files",
        ListRule::Keyed {
            key: &["filesystem", "path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.directories",
        ListRule::Keyed {
            key: &["filesystem", "path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.links",
        ListRule::Keyed {
            key: &["filesystem", "path"],
            handle: "node",
            noun: "path",
        },
    ),
    (
        "storage.disks",
        ListRule::Keyed {
            key: &["device"],
            handle: "disk",
            noun: "device",
        },
    ),
    (
        "storage.raid",
        ListRule::Keyed {
            key: &["name"],
            handle: "raid",
            noun: "name",
        },
    ),
    (
        "storage.filesystems",
        ListRule::Keyed {
            key: &["name"],
            handle: "filesystem",
            noun: "name",
        },
    ),
    (
        "systemd.units",
        ListRule::Keyed {
            key: &["name"],
            handle: "unit",
            noun: "name",
        },
    ),
    (
        "networkd.units",
        ListRule::Keyed {
            key: &["name"],
            handle: "networkd unit",
            noun: "name",
        },
    ),
    (
        "passwd.users",
        ListRule::Keyed {
            key: &["name"],
            handle: "user",
            noun: "name",
        },
    ),
    (
        "passwd.groups",
        ListRule::Keyed {
            key: &["name"],
            handle: "group",
            noun: "name",
        },
    ),
];

/// A config and the name errors give it (`keelson's master config`, `--merge master=a.ign`).
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    /// The config.
    pub config: &'a Value,
    /// Its name in errors.
    pub name: &'a str,
}

/// `base` and `add` merged: the union of what both define, an entry both define identically
/// once. Both must be of one spec version. The result is [`normalize`]d.
pub fn merge(base: Named<'_>, add: Named<'_>) -> Result<Value, MergeError> {
    let base_version = version_of(base)?;
    let add_version = version_of(add)?;
    if base_version != add_version {
        return Err(MergeError::Versions {
            first: base.name.into(),
            first_version: base_version,
            second: add.name.into(),
            second_version: add_version,
        });
    }
    let lists = if base_version.starts_with("2.") {
        LISTS_V2
    } else {
        LISTS_V3
    };
    let a = normalize(base.config);
    let b = normalize(add.config);
    let merger = Merger {
        lists,
        first: base.name,
        second: add.name,
    };
    let mut out = merger.value("", &a, &b)?;
    merger.check_handles(&out)?;
    // Normalizing drops nothing that matters, but `ignition.version` must stay.
    if let Some(ign) = out.get_mut("ignition").and_then(Value::as_object_mut) {
        ign.insert("version".into(), Value::String(base_version));
    }
    Ok(out)
}

fn version_of(named: Named<'_>) -> Result<String, MergeError> {
    named
        .config
        .get("ignition")
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| MergeError::Shape {
            config: named.name.into(),
            path: "ignition.version".into(),
            expected: "a version string",
        })
}

/// `value` without what Ignition reads as unset: `null`, and objects and lists left empty
/// once theirs are gone (`"verification": {}`, `"networkd": {}`, as openshift-install
/// writes them). Scalars are kept as they are, `false` and `0` included.
pub fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let v = normalize(v);
                if !is_unset(&v) {
                    out.insert(k.clone(), v);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

struct Merger<'a> {
    lists: &'static [(&'static str, ListRule)],
    first: &'a str,
    second: &'a str,
}

impl Merger<'_> {
    fn rule(&self, path: &str) -> Option<ListRule> {
        self.lists.iter().find(|(p, _)| *p == path).map(|(_, r)| *r)
    }

    fn clash(&self, what: String, detail: String) -> MergeError {
        MergeError::Clash {
            hint: hint_for(&what),
            what,
            first: self.first.into(),
            second: self.second.into(),
            detail,
        }
    }

    fn value(&self, path: &str, a: &Value, b: &Value) -> Result<Value, MergeError> {
        match (a, b) {
            (Value::Object(ma), Value::Object(mb)) => {
                let mut out = ma.clone();
                for (k, vb) in mb {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    let merged = match ma.get(k) {
                        Some(va) => self.value(&sub, va, vb)?,
                        None => vb.clone(),
                    };
                    out.insert(k.clone(), merged);
                }
                Ok(Value::Object(out))
            }
            (Value::Array(la), Value::Array(lb)) => self.list(path, la, lb),
            _ if a == b => Ok(a.clone()),
            _ => Err(self.clash(
                path.to_owned(),
                format!("{} against {}", short(a), short(b)),
            )),
        }
    }

    fn list(&self, path: &str, a: &[Value], b: &[Value]) -> Result<Value, MergeError> {
        match self.rule(path) {
            Some(ListRule::Set { .. }) => {
                let mut out = a.to_vec();
                for v in b {
                    if !out.contains(v) {
                        out.push(v.clone());
                    }
                }
                Ok(Value::Array(out))
            }
            Some(ListRule::Keyed { key, noun, .. }) => {
                let mut out = a.to_vec();
                for vb in b {
                    let kb = entry_key(vb, key);
                    let Some(ia) = out.iter().position(|va| entry_key(va, key) == kb) else {
                        out.push(vb.clone());
                        continue;
                    };
                    let va = &out[ia];
                    if va == vb {
                        continue;
                    }
                    if path == "storage.files"
                        && let Some(joined) = join_appends(va, vb)
                    {
                        match joined {
                            Appends::Merged(v) => out[ia] = v,
                            Appends::Both => out.push(vb.clone()),
                        }
                        continue;
                    }
                    return Err(self.clash(
                        format!("{path} {noun} {}", display_key(&kb)),
                        differing_field(va, vb),
                    ));
                }
                Ok(Value::Array(out))
            }
            // A list Ignition has no key for (a field of a newer spec, say): the same list
            // on both sides is fine, two different ones would leave the result to the
            // child.
            None if a == b => Ok(Value::Array(a.to_vec())),
            None => Err(self.clash(
                path.to_owned(),
                format!("{} entries against {}", a.len(), b.len()),
            )),
        }
    }

    /// Lists that share a key space: a path that is a file in one config and a link in the
    /// other, a kernel argument one config wants and the other does not.
    fn check_handles(&self, merged: &Value) -> Result<(), MergeError> {
        let mut seen: Vec<(&'static str, String, &'static str)> = Vec::new();
        for (path, rule) in self.lists {
            let Some(list) = lookup(merged, path).and_then(Value::as_array) else {
                continue;
            };
            for entry in list {
                let (handle, key, noun) = match rule {
                    ListRule::Keyed { key, handle, noun } => {
                        (*handle, display_key(&entry_key(entry, key)), *noun)
                    }
                    ListRule::Set { handle } => (*handle, short(entry), "value"),
                };
                if let Some((_, _, other)) = seen
                    .iter()
                    .find(|(h, k, p)| *h == handle && *k == key && *p != *path)
                {
                    return Err(self.clash(
                        format!("{noun} {key}"),
                        format!("it is in {other} and in {path}"),
                    ));
                }
                seen.push((handle, key, path));
            }
        }
        Ok(())
    }
}

/// Two entries for one file that both only append to it (`/etc/motd`, which
/// openshift-install's bootstrap appends to): both appends happen, the first config's first,
/// as Ignition does them. 3.x: one entry, its `append` lists joined (every other field must
/// agree); 2.x: both `append: true` entries kept.
enum Appends {
    Merged(Value),
    Both,
}

fn join_appends(a: &Value, b: &Value) -> Option<Appends> {
    let (ma, mb) = (a.as_object()?, b.as_object()?);
    if ma.get("append") == Some(&Value::Bool(true)) && mb.get("append") == Some(&Value::Bool(true))
    {
        return Some(Appends::Both);
    }
    let (la, lb) = (ma.get("append")?.as_array()?, mb.get("append")?.as_array()?);
    if ma.contains_key("contents") || mb.contains_key("contents") {
        return None;
    }
    let rest = |m: &Map<String, Value>| {
        let mut m = m.clone();
        m.remove("append");
        m
    };
    if rest(ma) != rest(mb) {
        return None;
    }
    let mut out = ma.clone();
    out.insert(
        "append".into(),
        Value::Array(la.iter().chain(lb).cloned().collect()),
    );
    Some(Appends::Merged(Value::Object(out)))
}

fn lookup<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn entry_key(entry: &Value, key: &[&str]) -> Vec<Value> {
    key.iter()
        .map(|k| entry.get(*k).cloned().unwrap_or(Value::Null))
        .collect()
}

fn display_key(key: &[Value]) -> String {
    key.iter()
        .filter(|v| !v.is_null())
        .map(short)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A short rendering of a value for an error message (data URLs cut).
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 72 {
        let cut: String = s.chars().take(64).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// The first field two entries with one key disagree on.
fn differing_field(a: &Value, b: &Value) -> String {
    fn walk(path: &str, a: &Value, b: &Value) -> Option<String> {
        match (a, b) {
            (Value::Object(ma), Value::Object(mb)) => {
                let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
                keys.sort();
                keys.dedup();
                keys.into_iter().find_map(|k| {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match (ma.get(k), mb.get(k)) {
                        (Some(x), Some(y)) => walk(&sub, x, y),
                        (Some(_), None) => Some(format!("{sub} set in the first only")),
                        (None, Some(_)) => Some(format!("{sub} set in the second only")),
                        (None, None) => None,
                    }
                })
            }
            _ if a == b => None,
            _ => Some(format!(
                "{}: {} against {}",
                if path.is_empty() { "value" } else { path },
                short(a),
                short(b)
            )),
        }
    }
    walk("", a, b).unwrap_or_else(|| "they differ".into())
}

/// What the operator can do about a clash on `what`.
fn hint_for(what: &str) -> String {
    if what.contains("/etc/keelson") || what.contains("keelson-agent") {
        "keelson owns that path; move yours elsewhere".into()
    } else if what.starts_with("passwd.users") {
        "define the user in one config only (keelson's `core` user carries install-config.yaml's sshKey: drop it there or here)".into()
    } else {
        "keep one definition".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn named(v: &Value, name: &'static str) -> Named<'static> {
        Named {
            config: Box::leak(Box::new(v.clone())),
            name,
        }
    }

    fn m(a: Value, b: Value) -> Result<Value, MergeError> {
        merge(named(&a, "A"), named(&b, "B"))
    }

    #[test]
    fn disjoint_configs_are_the_union_in_order() {
        let a = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/a", "mode": 420}]},
            "systemd": {"units": [{"name": "a.service", "enabled": true}]}});
        let b = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/b"}], "links": [{"path": "/l", "target": "/a"}]},
            "passwd": {"users": [{"name": "op"}]}});
        let out = m(a, b).unwrap();
        assert_eq!(out["storage"]["files"][0]["path"], "/a");
        assert_eq!(out["storage"]["files"][1]["path"], "/b");
        assert_eq!(out["storage"]["links"][0]["path"], "/l");
        assert_eq!(out["systemd"]["units"][0]["name"], "a.service");
        assert_eq!(out["passwd"]["users"][0]["name"], "op");
        assert_eq!(out["ignition"]["version"], "3.2.0");
    }

    #[test]
    fn a_path_both_define_differently_names_it_and_both_sources() {
        let a = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/motd", "mode": 420}]}});
        let b = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/motd", "mode": 384}]}});
        let e = m(a, b).unwrap_err().to_string();
        assert!(e.contains("storage.files path \"/etc/motd\""), "{e}");
        assert!(e.contains("defined by A and by B"), "{e}");
        assert!(e.contains("mode: 420 against 384"), "{e}");
    }

    #[test]
    fn one_path_as_a_file_and_a_link_clashes() {
        let a = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/x"}]}});
        let b = json!({"ignition": {"version": "3.2.0"},
            "storage": {"links": [{"path": "/x", "target": "/y"}]}});
        let e = m(a, b).unwrap_err().to_string();
        assert!(e.contains("path \"/x\""), "{e}");
        assert!(
            e.contains("storage.files") && e.contains("storage.links"),
            "{e}"
        );
    }

    #[test]
    fn units_users_groups_disks_clash_by_their_keys() {
        for (section, list, key) in [
            ("systemd", "units", "name"),
            ("passwd", "users", "name"),
            ("passwd", "groups", "name"),
            ("storage", "disks", "device"),
            ("storage", "filesystems", "device"),
            ("storage", "raid", "name"),
            ("storage", "luks", "name"),
        ] {
            let a = json!({"ignition": {"version": "3.2.0"},
                section: {list: [{key: "k", "x": 1}]}});
            let b = json!({"ignition": {"version": "3.2.0"},
                section: {list: [{key: "k", "x": 2}]}});
            let e = m(a, b).unwrap_err().to_string();
            assert!(e.contains(&format!("{section}.{list} {key} \"k\"")), "{e}");
        }
    }

    #[test]
    fn identical_entries_are_kept_once() {
        let ca = json!({"source": "data:,ca"});
        let user = json!({"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]});
        let a = json!({"ignition": {"version": "3.2.0", "security": {"tls": {"certificateAuthorities": [ca]}}},
            "passwd": {"users": [user]}});
        let b = a.clone();
        let out = m(a, b).unwrap();
        assert_eq!(
            out["ignition"]["security"]["tls"]["certificateAuthorities"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(out["passwd"]["users"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn empty_objects_and_nulls_are_unset() {
        // openshift-install's 2.2 pointers write `"verification": {}` and empty sections.
        let a = json!({"ignition": {"version": "2.2.0", "config": {"append": [
            {"source": "https://a/config/master", "verification": {}}]}, "timeouts": {}},
            "networkd": {}, "storage": {}});
        let b = json!({"ignition": {"version": "2.2.0", "config": {"append": [
            {"source": "https://a/config/master"}]}}});
        let out = m(a, b).unwrap();
        assert_eq!(
            out,
            json!({"ignition": {"version": "2.2.0", "config": {"append": [
                {"source": "https://a/config/master"}]}}})
        );
    }

    #[test]
    fn sets_are_unions_and_contradictions_clash() {
        let a = json!({"ignition": {"version": "3.3.0"},
            "kernelArguments": {"shouldExist": ["a", "b"]}});
        let b = json!({"ignition": {"version": "3.3.0"},
            "kernelArguments": {"shouldExist": ["b", "c"]}});
        let out = m(a.clone(), b).unwrap();
        assert_eq!(
            out["kernelArguments"]["shouldExist"],
            json!(["a", "b", "c"])
        );
        let c = json!({"ignition": {"version": "3.3.0"},
            "kernelArguments": {"shouldNotExist": ["a"]}});
        let e = m(a, c).unwrap_err().to_string();
        assert!(e.contains("value \"a\""), "{e}");
    }

    #[test]
    fn scalars_set_differently_clash() {
        let a = json!({"ignition": {"version": "3.1.0", "timeouts": {"httpTotal": 10}}});
        let b = json!({"ignition": {"version": "3.1.0", "timeouts": {"httpTotal": 20}}});
        let e = m(a, b).unwrap_err().to_string();
        assert!(e.contains("ignition.timeouts.httpTotal"), "{e}");
    }

    #[test]
    fn versions_must_match() {
        let a = json!({"ignition": {"version": "3.1.0"}});
        let b = json!({"ignition": {"version": "3.2.0"}});
        assert!(matches!(m(a, b), Err(MergeError::Versions { .. })));
    }

    #[test]
    fn spec_2_files_are_keyed_by_filesystem_and_path() {
        let a = json!({"ignition": {"version": "2.2.0"},
            "storage": {"files": [{"filesystem": "root", "path": "/x", "mode": 420}]}});
        let b = json!({"ignition": {"version": "2.2.0"},
            "storage": {"files": [{"filesystem": "root", "path": "/x", "mode": 384}]}});
        assert!(m(a.clone(), b).is_err());
        let c = json!({"ignition": {"version": "2.2.0"},
            "storage": {"files": [{"filesystem": "var", "path": "/x", "mode": 384}]}});
        assert_eq!(
            m(a, c).unwrap()["storage"]["files"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn appends_to_one_file_from_both_sides_both_happen() {
        let a = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/motd", "mode": 420, "append": [{"source": "data:,a"}]}]}});
        let b = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/motd", "mode": 420, "append": [{"source": "data:,b"}]}]}});
        let out = m(a, b).unwrap();
        assert_eq!(
            out["storage"]["files"][0]["append"],
            json!([{"source": "data:,a"}, {"source": "data:,b"}])
        );
        let a2 = json!({"ignition": {"version": "2.2.0"},
            "storage": {"files": [{"filesystem": "root", "path": "/etc/motd", "append": true, "contents": {"source": "data:,a"}}]}});
        let b2 = json!({"ignition": {"version": "2.2.0"},
            "storage": {"files": [{"filesystem": "root", "path": "/etc/motd", "append": true, "contents": {"source": "data:,b"}}]}});
        assert_eq!(
            m(a2, b2).unwrap()["storage"]["files"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn a_keelson_path_says_keelson_owns_it() {
        let a = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/keelson/cluster.json", "mode": 420}]}});
        let b = json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [{"path": "/etc/keelson/cluster.json", "mode": 384}]}});
        let e = m(a, b).unwrap_err().to_string();
        assert!(e.contains("keelson owns that path"), "{e}");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// A 3.x config of a few files, links, units and users whose keys come from small sets,
    /// so two of them often share one.
    fn config() -> impl Strategy<Value = Value> {
        let file = ("[a-c]", 0u32..3).prop_map(|(p, m)| {
            json!({"path": format!("/etc/{p}"), "mode": 420 + m,
                   "contents": {"source": format!("data:,{m}")}})
        });
        let link = "[c-d]".prop_map(|p| json!({"path": format!("/etc/{p}"), "target": "/x"}));
        let unit = ("[a-c]", any::<bool>())
            .prop_map(|(n, e)| json!({"name": format!("{n}.service"), "enabled": e}));
        let user = ("[a-b]", 0u8..2)
            .prop_map(|(n, k)| json!({"name": n, "sshAuthorizedKeys": [format!("key{k}")]}));
        (
            proptest::collection::vec(file, 0..3),
            proptest::collection::vec(link, 0..2),
            proptest::collection::vec(unit, 0..3),
            proptest::collection::vec(user, 0..2),
        )
            .prop_map(|(files, links, units, users)| {
                // One entry per key within a config, as Ignition requires of one config.
                let dedup = |v: Vec<Value>, k: &str| {
                    let mut seen = Vec::new();
                    v.into_iter()
                        .filter(|e| {
                            let key = e[k].clone();
                            let fresh = !seen.contains(&key);
                            seen.push(key);
                            fresh
                        })
                        .collect::<Vec<_>>()
                };
                let files = dedup(files, "path");
                let links: Vec<Value> = dedup(links, "path")
                    .into_iter()
                    .filter(|l| !files.iter().any(|f| f["path"] == l["path"]))
                    .collect();
                json!({"ignition": {"version": "3.2.0"},
                       "storage": {"files": files, "links": links},
                       "systemd": {"units": dedup(units, "name")},
                       "passwd": {"users": dedup(users, "name")}})
            })
    }

    /// Every keyed entry of `v` as (list, key, entry).
    fn entries(v: &Value) -> Vec<(String, Value, Value)> {
        let mut out = Vec::new();
        for (list, key) in [
            ("storage.files", "path"),
            ("storage.links", "path"),
            ("systemd.units", "name"),
            ("passwd.users", "name"),
        ] {
            for e in lookup(v, list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.push((list.to_owned(), e[key].clone(), e.clone()));
            }
        }
        out
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]

        /// A merge is the union of both sides, each key once, or a clash that really is one:
        /// a key both define differently.
        #[test]
        fn a_merge_is_the_union_or_a_real_clash(a in config(), b in config()) {
            let merged = merge(Named { config: &a, name: "a" }, Named { config: &b, name: "b" });
            let (ea, eb) = (entries(&normalize(&a)), entries(&normalize(&b)));
            let node_key = |l: &str| if l.starts_with("storage.") { "node".to_owned() } else { l.to_owned() };
            let clashes = ea.iter().any(|(la, ka, va)| eb.iter().any(|(lb, kb, vb)| {
                node_key(la) == node_key(lb) && ka == kb && (la != lb || va != vb)
            }));
            match merged {
                Ok(m) => {
                    prop_assert!(!clashes);
                    let em = entries(&m);
                    for e in ea.iter().chain(&eb) {
                        prop_assert_eq!(em.iter().filter(|x| x.0 == e.0 && x.1 == e.1).count(), 1);
                        prop_assert!(em.contains(e));
                    }
                    prop_assert_eq!(em.len(), {
                        let mut all = ea.clone();
                        all.extend(eb.iter().filter(|e| !ea.contains(e)).cloned());
                        all.len()
                    });
                }
                Err(MergeError::Clash { .. }) => prop_assert!(clashes),
                Err(other) => prop_assert!(false, "{other}"),
            }
        }

        /// A config merged with itself is itself.
        #[test]
        fn merging_a_config_with_itself_changes_nothing(a in config()) {
            let m = merge(Named { config: &a, name: "a" }, Named { config: &a, name: "a" }).unwrap();
            prop_assert_eq!(m, normalize(&a));
        }

        /// Whatever the JSON, merging answers without panicking.
        #[test]
        fn any_json_merges_or_says_why(a in any_json(), b in any_json()) {
            let _ = merge(Named { config: &a, name: "a" }, Named { config: &b, name: "b" });
        }
    }

    /// Arbitrary JSON under `ignition`/`storage`/`systemd` keys, three levels deep.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (0u32..5).prop_map(|n| json!(n)),
            "[a-c/]{0,3}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("files".to_owned()),
                        Just("path".to_owned()),
                        Just("units".to_owned()),
                        Just("name".to_owned()),
                        Just("append".to_owned()),
                        "[a-c]".prop_map(String::from)
                    ],
                    inner,
                    0..3
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        (tree.clone(), tree).prop_map(|(storage, systemd)| {
            json!({"ignition": {"version": "3.2.0"}, "storage": storage, "systemd": systemd})
        })
    }
}
