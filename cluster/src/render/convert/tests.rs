use super::*;
use serde_json::json;
use std::collections::BTreeSet;

/// Every field path a spec's JSON schema defines (`[]` for list entries).
fn schema_fields(minor: &str) -> BTreeSet<String> {
    let name = format!(
        "{}/../testdata/ignition-schemas/v{minor}.ignition.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let schema: Value = serde_json::from_str(&text).unwrap();
    fn resolve<'s>(root: &'s Value, node: &'s Value) -> &'s Value {
        match node.get("$ref").and_then(Value::as_str) {
            Some(r) => r
                .trim_start_matches("#/")
                .split('/')
                .fold(root, |n, k| &n[k]),
            None => node,
        }
    }
    fn walk(root: &Value, node: &Value, path: &str, out: &mut BTreeSet<String>) {
        let node = resolve(root, node);
        for sub in node
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(root, sub, path, out);
        }
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                out.insert(p.clone());
                walk(root, v, &p, out);
            }
        }
        if let Some(items) = node.get("items") {
            walk(root, items, &format!("{path}[]"), out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&schema, &schema, "", &mut out);
    out
}

#[test]
fn added_in_is_what_the_schemas_add() {
    let minors = ["3_0", "3_1", "3_2", "3_3", "3_4", "3_5"];
    let specs = [
        SpecVersion::V3_0,
        SpecVersion::V3_1,
        SpecVersion::V3_2,
        SpecVersion::V3_3,
        SpecVersion::V3_4,
        SpecVersion::V3_5,
    ];
    let mut expected = BTreeSet::new();
    for i in 1..minors.len() {
        let old = schema_fields(minors[i - 1]);
        let new = schema_fields(minors[i]);
        assert!(old.is_subset(&new), "{} removed fields", minors[i]);
        let added: BTreeSet<&String> = new.difference(&old).collect();
        // The outermost added field of each subtree: what a config of the older spec cannot have.
        for field in &added {
            let has_added_parent = added.iter().any(|other| {
                field.len() > other.len()
                    && field.starts_with(other.as_str())
                    && matches!(field.as_bytes()[other.len()], b'.' | b'[')
            });
            if !has_added_parent {
                expected.insert((specs[i], (*field).clone()));
            }
        }
    }
    let table: BTreeSet<(SpecVersion, String)> = ADDED_IN
        .iter()
        .map(|(s, f)| (*s, (*f).to_owned()))
        .collect();
    assert_eq!(table, expected);
}

#[test]
fn up_is_the_version_alone_and_down_names_what_is_in_the_way() {
    let c = json!({"ignition": {"version": "3.2.0", "config": {"merge": [
        {"source": "https://x/c", "httpHeaders": [{"name": "X-Auth-Token", "value": "t"}]}]}}});
    let up = convert(&c, SpecVersion::V3_2, SpecVersion::V3_5).unwrap();
    assert_eq!(up["ignition"]["version"], "3.5.0");
    assert_eq!(up["ignition"]["config"], c["ignition"]["config"]);
    assert_eq!(
        convert(&c, SpecVersion::V3_2, SpecVersion::V3_1).unwrap()["ignition"]["version"],
        "3.1.0"
    );
    let e = convert(&c, SpecVersion::V3_2, SpecVersion::V3_0)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("ignition.config.merge[0].httpHeaders: needs spec 3.1.0"),
        "{e}"
    );
}

#[test]
fn values_newer_specs_introduced_hold_a_config_up() {
    for (value, needs) in [
        (
            json!({"storage": {"files": [{"path": "/a", "contents": {"source": "data:,a",
                "verification": {"hash": "sha256-00"}}}]}}),
            SpecVersion::V3_1,
        ),
        (
            json!({"storage": {"files": [{"path": "/a", "contents": {"source": "gs://b/o"}}]}}),
            SpecVersion::V3_2,
        ),
        (
            json!({"storage": {"filesystems": [{"device": "/dev/vdb", "format": "none"}]}}),
            SpecVersion::V3_3,
        ),
        (
            json!({"storage": {"files": [{"path": "/a", "contents": {"source": "arn:aws:s3:x"}}]}}),
            SpecVersion::V3_4,
        ),
        (
            json!({"kernelArguments": {"shouldExist": ["a"]}}),
            SpecVersion::V3_3,
        ),
    ] {
        let mut c = value.clone();
        c["ignition"] = json!({"version": "3.5.0"});
        assert_eq!(min_v3(&c).0, needs, "{c}");
        assert!(convert(&c, SpecVersion::V3_5, needs).is_ok());
        let lower =
            SpecVersion::ALL[SpecVersion::ALL.iter().position(|s| *s == needs).unwrap() - 1];
        assert!(convert(&c, SpecVersion::V3_5, lower).is_err(), "{c}");
    }
}

#[test]
fn read_takes_3_6_without_special_bits_as_3_5() {
    let (spec, v) =
        read(br#"{"ignition":{"version":"3.6.0"},"storage":{"files":[{"path":"/a","mode":420}]}}"#)
            .unwrap();
    assert_eq!(spec, SpecVersion::V3_5);
    assert_eq!(v["ignition"]["version"], "3.5.0");
    let e = read(
        br#"{"ignition":{"version":"3.6.0"},"storage":{"files":[{"path":"/a","mode":2541}]}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("storage.files[0].mode:"), "{e}");
    assert!(matches!(
        read(b"variant: fcos\nversion: 1.5.0\n"),
        Err(ConvertError::NotJson(_))
    ));
    assert!(matches!(
        read(b"{\"storage\":{}}"),
        Err(ConvertError::NotIgnition)
    ));
    assert!(matches!(
        read(br#"{"ignition":{"version":"2.1.0"}}"#),
        Err(ConvertError::Version(_))
    ));
}

/// openshift-install 4.2's bootstrap.ign in miniature: named filesystem `root`, an appended
/// /etc/motd, units with `enabled`, `core` with the key, the empty sections it writes.
fn openshift_4_2_bootstrap() -> Value {
    json!({
        "ignition": {"config": {}, "security": {"tls": {}}, "timeouts": {}, "version": "2.2.0"},
        "networkd": {},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA core@x"]}]},
        "storage": {"files": [
            {"filesystem": "root", "path": "/etc/motd", "user": {"name": "root"}, "append": true,
             "contents": {"source": "data:text/plain;charset=utf-8;base64,VGhpcyBpcyB0aGUgYm9vdHN0cmFwCg==", "verification": {}},
             "mode": 420},
            {"filesystem": "root", "path": "/usr/local/bin/bootkube.sh", "user": {"name": "root"},
             "contents": {"source": "data:text/plain;charset=utf-8;base64,IyEvYmluL2Jhc2gK", "verification": {}},
             "mode": 365}
        ]},
        "systemd": {"units": [
            {"contents": "[Unit]\nDescription=Bootstrap\n", "enabled": true, "name": "bootkube.service"},
            {"dropins": [{"contents": "[Service]\nX=1\n", "name": "10-x.conf"}], "name": "kubelet.service"}
        ]}
    })
}

#[test]
fn spec_2_2_to_3_keeps_its_semantics_explicit() {
    let v3 = convert(
        &openshift_4_2_bootstrap(),
        SpecVersion::V2_2,
        SpecVersion::V3_2,
    )
    .unwrap();
    assert_eq!(v3["ignition"]["version"], "3.2.0");
    let files = v3["storage"]["files"].as_array().unwrap();
    assert_eq!(files[0]["path"], "/etc/motd");
    assert_eq!(files[0]["overwrite"], false);
    assert_eq!(
        files[0]["append"][0]["source"],
        "data:text/plain;charset=utf-8;base64,VGhpcyBpcyB0aGUgYm9vdHN0cmFwCg=="
    );
    assert!(files[0].get("filesystem").is_none());
    // 2.x wrote over what was there by default; 3.x does not unless told.
    assert_eq!(files[1]["overwrite"], true);
    assert_eq!(files[1]["mode"], 365);
    assert_eq!(v3["systemd"]["units"][1]["dropins"][0]["name"], "10-x.conf");
    assert!(v3.get("networkd").is_none());
}

#[test]
fn spec_3_to_2_2_and_back() {
    let v3 = json!({"ignition": {"version": "3.0.0",
            "config": {"merge": [{"source": "https://api-int.c.example:22623/config/master"}]},
            "security": {"tls": {"certificateAuthorities": [{"source": "data:,ca"}]}}},
        "storage": {
            "files": [
                {"path": "/etc/a", "mode": 420, "overwrite": true, "contents": {"source": "data:,a"}},
                {"path": "/etc/motd", "append": [{"source": "data:,1"}, {"source": "data:,2"}]}
            ],
            "directories": [{"path": "/var/lib/x", "mode": 493}],
            "links": [{"path": "/etc/l", "target": "/etc/a", "hard": false}]
        },
        "systemd": {"units": [{"name": "a.service", "enabled": true, "contents": "[Unit]\n"}]},
        "passwd": {"users": [{"name": "op", "groups": ["wheel"]}], "groups": [{"name": "g", "gid": 1200}]}
    });
    let v2 = convert(&v3, SpecVersion::V3_0, SpecVersion::V2_2).unwrap();
    assert_eq!(
        v2["ignition"]["config"]["append"][0]["source"],
        v3["ignition"]["config"]["merge"][0]["source"]
    );
    let files = v2["storage"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    assert!(files.iter().all(|f| f["filesystem"] == "root"));
    assert_eq!(files[1]["append"], true);
    assert_eq!(files[2]["contents"]["source"], "data:,2");
    assert_eq!(v2["storage"]["links"][0]["filesystem"], "root");
    let back = convert(&v2, SpecVersion::V2_2, SpecVersion::V3_0).unwrap();
    let mut expected = v3.clone();
    // The append-only file is said to not overwrite, explicitly.
    expected["storage"]["files"][1]["overwrite"] = json!(false);
    assert_eq!(
        crate::render::merge::normalize(&back),
        crate::render::merge::normalize(&expected)
    );
}

#[test]
fn what_has_no_counterpart_is_refused_by_name() {
    for (config, from, to, field) in [
        (
            json!({"ignition": {"version": "2.2.0"}, "networkd": {"units": [{"name": "a.network"}]}}),
            SpecVersion::V2_2,
            SpecVersion::V3_2,
            "networkd",
        ),
        (
            json!({"ignition": {"version": "2.2.0"}, "storage": {"files": [{"filesystem": "var", "path": "/x"}]}}),
            SpecVersion::V2_2,
            SpecVersion::V3_2,
            "storage.files[0].filesystem",
        ),
        (
            json!({"ignition": {"version": "2.2.0"}, "storage": {"filesystems": [{"name": "var", "mount": {"device": "/dev/vdb", "format": "xfs"}}]}}),
            SpecVersion::V2_2,
            SpecVersion::V3_2,
            "storage.filesystems",
        ),
        (
            json!({"ignition": {"version": "2.2.0"}, "passwd": {"users": [{"name": "u", "create": {"uid": 7}}]}}),
            SpecVersion::V2_2,
            SpecVersion::V3_2,
            "passwd.users[0].create",
        ),
        (
            json!({"ignition": {"version": "3.3.0"}, "kernelArguments": {"shouldExist": ["x"]}}),
            SpecVersion::V3_3,
            SpecVersion::V2_2,
            "kernelArguments",
        ),
        (
            json!({"ignition": {"version": "3.2.0"}, "storage": {"disks": [{"device": "/dev/vdb"}]}}),
            SpecVersion::V3_2,
            SpecVersion::V2_2,
            "storage.disks",
        ),
        (
            json!({"ignition": {"version": "2.2.0"}, "storage": {"files": [{"filesystem": "root", "path": "/x", "contents": {"source": "oem://x"}}]}}),
            SpecVersion::V2_2,
            SpecVersion::V3_0,
            "storage.files[0].contents.source",
        ),
    ] {
        let e = convert(&config, from, to).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{field}:")), "{field}: {e}");
    }
}

#[test]
fn two_writers_of_one_path_in_2_2_do_not_become_one_3_x_file() {
    let c = json!({"ignition": {"version": "2.2.0"}, "storage": {"files": [
        {"filesystem": "root", "path": "/x", "contents": {"source": "data:,a"}},
        {"filesystem": "root", "path": "/x", "contents": {"source": "data:,b"}}]}});
    let e = convert(&c, SpecVersion::V2_2, SpecVersion::V3_0)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("storage.files[1]:"), "{e}");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A 3.0 config of files (written or appended to), directories, links, units and users.
    fn config() -> impl Strategy<Value = Value> {
        // Keyed by path, name: one entry per key, as a 3.x config must have.
        let file = |p: String, (m, o, appends): (u32, bool, usize)| {
            let mut f = json!({"path": format!("/etc/{p}"), "mode": 420 + m, "overwrite": o});
            if o || appends == 0 {
                f["contents"] = json!({"source": format!("data:,{p}")});
            }
            if appends > 0 {
                f["append"] = Value::Array(
                    (0..appends)
                        .map(|i| json!({"source": format!("data:,{i}")}))
                        .collect(),
                );
            }
            f
        };
        (
            proptest::collection::btree_map("[a-d]", (0u32..2, any::<bool>(), 0usize..3), 0..3),
            proptest::collection::btree_set("[e-f]", 0..2),
            proptest::collection::btree_map("[a-c]", any::<bool>(), 0..2),
        )
            .prop_map(move |(files, dirs, units)| {
                let files: Vec<Value> = files.into_iter().map(|(p, f)| file(p, f)).collect();
                let dirs: Vec<Value> = dirs
                    .into_iter()
                    .map(|p| json!({"path": format!("/var/{p}"), "mode": 493}))
                    .collect();
                let units: Vec<Value> = units
                    .into_iter()
                    .map(|(n, e)| json!({"name": format!("{n}.service"), "enabled": e, "contents": "[Unit]\n"}))
                    .collect();
                json!({"ignition": {"version": "3.0.0"},
                       "storage": {"files": files, "directories": dirs},
                       "systemd": {"units": units}})
            })
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]

        /// 3.0 to 2.2 and back is the config itself, with 3.x's defaults said explicitly.
        #[test]
        fn spec_2_2_and_back_loses_nothing(c in config()) {
            let v2 = convert(&c, SpecVersion::V3_0, SpecVersion::V2_2).unwrap();
            let back = convert(&v2, SpecVersion::V2_2, SpecVersion::V3_0).unwrap();
            let mut want = c.clone();
            for f in want["storage"]["files"].as_array_mut().unwrap() {
                if f.get("contents").is_none() {
                    f["overwrite"] = json!(false);
                }
            }
            prop_assert_eq!(
                crate::render::merge::normalize(&back),
                crate::render::merge::normalize(&want)
            );
        }

        /// Up and down 3.x with nothing newer in it.
        #[test]
        fn up_and_down_3_x(c in config(), to in 1usize..7) {
            let spec = SpecVersion::ALL[to];
            let up = convert(&c, SpecVersion::V3_0, spec).unwrap();
            prop_assert_eq!(convert(&up, spec, SpecVersion::V3_0).unwrap(), c);
        }
    }
}
