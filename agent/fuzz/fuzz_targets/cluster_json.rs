//! `cluster.json` (written by `apply` from the Ignition config, read by every subsystem)
//! into `ClusterConfig::from_json`, the checked parse the agent does at start. Checks:
//! an accepted document re-serialises to one that is accepted and equal, with stable
//! bytes; the zone name and the DNS zone built from it never panic.
#![no_main]

use keelson_cluster::ClusterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(cluster) = ClusterConfig::from_json(data) else {
        return;
    };
    let json = cluster.to_json();
    let back =
        ClusterConfig::from_json(&json).unwrap_or_else(|e| panic!("own output refused: {e}"));
    assert_eq!(back, cluster, "round trip");
    assert_eq!(back.to_json(), json, "stable bytes");
    let _ = keelson_agent::dns::build_zone(&cluster, &[]);
});
