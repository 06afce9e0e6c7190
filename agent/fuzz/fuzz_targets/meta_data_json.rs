//! `meta_data.json` (config drive or metadata service) into `metadata::MetaData`, as both
//! sources parse it, then the node name the agent derives from it. Checks: what parses
//! serialises and parses back to the same value (the agent prints it as JSON with
//! `keelson-agent metadata`), and the node name is a non-empty part of name or hostname.
#![no_main]

use keelson_agent::metadata::{MetaData, Metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(meta_data) = serde_json::from_slice::<MetaData>(data) else {
        return;
    };
    let text = serde_json::to_vec(&meta_data).expect("serialises");
    let back: MetaData = serde_json::from_slice(&text).expect("own output parses");
    assert_eq!(back, meta_data, "round trip");
    let md = Metadata {
        meta_data,
        ..Metadata::default()
    };
    if let Some(name) = md.node_name() {
        let from_name = md.meta_data.name.as_deref() == Some(name.as_str());
        let from_host = md
            .meta_data
            .hostname
            .as_deref()
            .is_some_and(|h| h.starts_with(name.as_str()));
        assert!(from_name || from_host, "node name {name:?}");
    }
    let whole = serde_json::to_vec(&md).expect("serialises");
    let back: Metadata = serde_json::from_slice(&whole).expect("own output parses");
    assert_eq!(back, md, "Metadata round trip");
});
