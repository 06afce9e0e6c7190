//! install-config.yaml text into `install_config::InstallConfig::parse`, the first thing
//! `keelson build` and `keelson validate` do, then the cluster.json it derives. Checks: a
//! config that parses always gives a cluster.json the agent accepts
//! (`ClusterConfig::from_json` of its output), that survives the round trip unchanged and
//! serialises to the same bytes every time.
#![no_main]

use keelson_cluster::ClusterConfig;
use keelson_cluster::install_config::InstallConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = InstallConfig::parse(text) else {
        return;
    };
    let cluster = config.cluster_config();
    let json = cluster.to_json();
    let back = ClusterConfig::from_json(&json)
        .unwrap_or_else(|e| panic!("a parsed install-config gives an invalid cluster.json: {e}"));
    assert_eq!(back, cluster, "round trip");
    assert_eq!(back.to_json(), json, "stable bytes");
});
