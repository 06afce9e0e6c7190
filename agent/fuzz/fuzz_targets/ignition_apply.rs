//! Ignition configs as user_data into `apply::apply_user_data_with`, the appliance's real
//! entry point: pointer configs, CAs, files (data URLs, gzip, hashes, modes), directories,
//! users, units and the refused sections, written under a scratch root.
//!
//! Inputs naming a non-`data:` source anywhere are skipped: those would be fetched over the
//! network, which a fuzzer must never do (`make fuzz` also runs every target in a network
//! namespace of its own when it can). Checks: every file reported written exists under the
//! root, and nothing at all appears outside it (no path escapes the root).
#![no_main]

use std::path::Path;
use std::time::Duration;

use keelson_agent::apply::{ApplyOptions, apply_user_data_with};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Whether some `source` field would be fetched rather than decoded in place.
fn names_remote_source(v: &Value) -> bool {
    match v {
        Value::Object(map) => map.iter().any(|(k, v)| {
            (k == "source"
                && v.as_str()
                    .is_some_and(|s| !s.is_empty() && !s.starts_with("data:")))
                || names_remote_source(v)
        }),
        Value::Array(items) => items.iter().any(names_remote_source),
        _ => false,
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<Value>(data)
        && names_remote_source(&v)
    {
        return;
    }
    let scratch = keelson_agent_fuzz::scratch_dir();
    let root = scratch.join("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir(&root).expect("scratch root");
    let opts = ApplyOptions {
        fetch_timeout: Some(Duration::from_millis(1)),
    };
    let result = keelson_agent_fuzz::runtime().block_on(apply_user_data_with(data, &root, &opts));
    if let Ok(applied) = &result {
        assert!(applied.fetched.is_empty(), "fetched {:?}", applied.fetched);
        for path in &applied.files_written {
            assert!(
                path.starts_with(&root),
                "{} outside the root",
                path.display()
            );
            assert!(path.is_file(), "{} reported written", path.display());
        }
    }
    assert_eq!(
        entries(scratch),
        ["root"],
        "something written outside the root"
    );
});
