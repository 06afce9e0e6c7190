//! An operator's Ignition config against keelson's, as `keelson build --merge` and the
//! Ignition servers take it: `OperatorConfig::parse` (reading, the reference checks, the
//! conversion to the build's spec), then `operator::merge_into` keelson's own config, then
//! the operator's config in every spec the servers serve. Checks: a merge that succeeds
//! reads back as an Ignition config of the build's spec, with the operator's units and
//! users in it.
#![no_main]

use keelson_cluster::SpecVersion;
use keelson_cluster::render::operator::{self, OperatorConfig};
use libfuzzer_sys::fuzz_target;

const KEELSON: &[u8] = br#"{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/keelson/cluster.json","mode":420,"overwrite":true,"contents":{"source":"data:,%7B%7D"}}]},"systemd":{"units":[{"name":"keelson-agent.service","enabled":true,"contents":"[Service]\n"}]},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAA core"]}]}}"#;

fuzz_target!(|data: &[u8]| {
    for spec in [SpecVersion::V3_2, SpecVersion::V2_2] {
        let Ok(op) = OperatorConfig::parse("--merge master=fuzz.ign", data, spec) else {
            continue;
        };
        let keelson = if spec.is_v2() {
            let v: serde_json::Value = serde_json::from_slice(KEELSON).unwrap();
            serde_json::to_vec(
                &keelson_cluster::render::convert::convert(&v, SpecVersion::V3_2, spec).unwrap(),
            )
            .unwrap()
        } else {
            KEELSON.to_vec()
        };
        let Ok(merged) = operator::merge_into(&keelson, "keelson's master config", &op, spec)
        else {
            continue;
        };
        let (read, _) = keelson_cluster::render::convert::read(&merged)
            .unwrap_or_else(|e| panic!("a merge does not read back: {e}"));
        assert_eq!(read, spec, "merged in another spec");
        let merged: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        for list in [["systemd", "units"], ["passwd", "users"]] {
            for entry in op.config[list[0]][list[1]].as_array().into_iter().flatten() {
                let named = merged[list[0]][list[1]]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["name"] == entry["name"]);
                assert!(named, "{} {} lost in the merge", list[1], entry["name"]);
            }
        }
        for other in SpecVersion::ALL {
            let _ = op.in_spec(other);
        }
    }
});
