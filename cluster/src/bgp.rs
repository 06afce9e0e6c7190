//! `cluster.json` `bgp`: VIPs announced by a routing daemon instead of held by VRRP
//! (`docs/bgp.md`).
//!
//! A VIP is in `bgp` mode when its `vrrp.instances[]` entry is named in `bgp.vips`; the
//! instance keeps saying which roles take part (`priorities`) and what is checked
//! (`checks`), the VRRP-only fields (VRID, interval...) are unused. Every node whose checks
//! pass announces the VIP (anycast); keelson never speaks BGP itself: it writes a host route
//! into its own kernel table and renders the configuration of a routing daemon (BIRD 2, or
//! an existing FRR) that redistributes that table to the peers, with BFD.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterConfig, ClusterConfigError, HealthCheckKind};

/// The kernel table keelson writes its VIP routes to unless told otherwise (as OpenShift's
/// BGP VIP management: a table of its own that the daemon redistributes).
pub const DEFAULT_TABLE: u32 = 198;

/// BGP settings for the VIPs in `bgp` mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpSettings {
    /// Names of `vrrp.instances[]` announced by BGP instead of VRRP (`api`, `api-v6`...).
    pub vips: Vec<String>,
    /// This cluster's AS number (every node uses it).
    pub local_asn: u32,
    /// The routers the nodes peer with. A node peers with those whose address is inside
    /// one of its own networks (its top-of-rack router), plus every multihop peer.
    pub peers: Vec<BgpPeer>,
    /// BFD on every session.
    #[serde(default)]
    pub bfd: BfdSettings,
    /// The kernel routing table the agent writes VIP host routes to, and nothing else does.
    #[serde(default = "default_table")]
    pub table: u32,
    /// Communities added to every announcement: `"ASN:VALUE"` (RFC 1997, 16-bit parts)
    /// or `"ASN:DATA1:DATA2"` (RFC 8092 large communities, 32-bit parts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    /// Seconds without a keepalive before a session is declared down (3..=65535), the
    /// fallback when BFD is off or the peer does not answer BFD.
    #[serde(default = "default_hold_time")]
    pub hold_time_secs: u16,
    /// The routing daemon.
    #[serde(default)]
    pub daemon: BgpDaemon,
}

/// One BGP neighbour (a top-of-rack router, or a route server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpPeer {
    /// The peer's address; its family is the family of the VIPs announced to it.
    pub address: IpAddr,
    /// The peer's AS number.
    pub asn: u32,
    /// TCP MD5 password (RFC 2385), printable ASCII without quotes or backslashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Not on a node's network: every node peers with it over up to this many hops
    /// (BFD multihop, RFC 5883).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multihop: Option<u8>,
}

/// BFD (RFC 5880): a session is down after `multiplier` intervals without a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BfdSettings {
    /// BFD on every BGP session (off: a dead peer is noticed by the hold timer only).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Transmit and receive interval, milliseconds.
    #[serde(default = "default_bfd_interval")]
    pub interval_ms: u32,
    /// Detection multiplier.
    #[serde(default = "default_bfd_multiplier")]
    pub multiplier: u8,
}

impl Default for BfdSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ms: default_bfd_interval(),
            multiplier: default_bfd_multiplier(),
        }
    }
}

/// Which routing daemon speaks BGP for the node, and who runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpDaemon {
    /// The daemon whose configuration the agent renders.
    #[serde(default)]
    pub kind: DaemonKind,
    /// Who starts it.
    #[serde(default)]
    pub run: DaemonRun,
    /// The daemon's executable (when the agent runs it).
    #[serde(default = "default_daemon_path")]
    pub path: String,
    /// Where the agent writes the rendered configuration and the daemon its control socket.
    #[serde(default = "default_run_dir")]
    pub run_dir: String,
}

impl Default for BgpDaemon {
    fn default() -> Self {
        Self {
            kind: DaemonKind::default(),
            run: DaemonRun::default(),
            path: default_daemon_path(),
            run_dir: default_run_dir(),
        }
    }
}

/// The routing daemons keelson renders configuration for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DaemonKind {
    /// BIRD 2 (`bird.conf`: a `kernel` protocol on the keelson table, `bgp` and `bfd`).
    #[default]
    Bird,
    /// FRR 8.4+ (`frr.conf`: `ip import-table` + `redistribute table`, `bfd`).
    Frr,
}

/// Who runs the routing daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DaemonRun {
    /// The agent starts and supervises it (the appliance, where the agent is PID 1).
    #[default]
    Agent,
    /// Someone else does (a systemd unit, an existing FRR); the agent only writes the
    /// configuration and the routes.
    External,
}

fn yes() -> bool {
    true
}

fn default_bfd_interval() -> u32 {
    300
}

fn default_bfd_multiplier() -> u8 {
    3
}

fn default_table() -> u32 {
    DEFAULT_TABLE
}

fn default_hold_time() -> u16 {
    9
}

fn default_daemon_path() -> String {
    "/usr/sbin/bird".into()
}

fn default_run_dir() -> String {
    "/run/keelson/bgp".into()
}

/// A community, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Community {
    /// RFC 1997 `ASN:VALUE`.
    Standard(u16, u16),
    /// RFC 8092 `ASN:DATA1:DATA2`.
    Large(u32, u32, u32),
}

impl std::str::FromStr for Community {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad =
            || format!("\"ASN:VALUE\" (16-bit parts) or \"ASN:DATA1:DATA2\" (32-bit), got {s:?}");
        match parts.as_slice() {
            [a, b] => Ok(Community::Standard(
                a.parse().map_err(|_| bad())?,
                b.parse().map_err(|_| bad())?,
            )),
            [a, b, c] => Ok(Community::Large(
                a.parse().map_err(|_| bad())?,
                b.parse().map_err(|_| bad())?,
                c.parse().map_err(|_| bad())?,
            )),
            _ => Err(bad()),
        }
    }
}

impl BgpSettings {
    /// Whether the `vrrp.instances[]` entry `name` is announced by BGP.
    pub fn announces(&self, name: &str) -> bool {
        self.vips.iter().any(|v| v == name)
    }

    /// The communities, parsed (checked by [`BgpSettings::check`]).
    pub fn parsed_communities(&self) -> Vec<Community> {
        self.communities
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect()
    }

    /// Checks the settings against the rest of `cluster`; errors name the field.
    // Over 100 lines on purpose: a flat list of independent checks, each naming its field and what was expected; there is no shared step to take out.
    pub fn check(&self, cluster: &ClusterConfig) -> Result<(), ClusterConfigError> {
        fn invalid(field: String, expected: &str, got: impl ToString) -> ClusterConfigError {
            ClusterConfigError::Invalid {
                field,
                expected: expected.into(),
                got: got.to_string(),
            }
        }
        for (i, name) in self.vips.iter().enumerate() {
            let field = format!("bgp.vips[{i}]");
            let Some(inst) = cluster.vrrp.instances.iter().find(|x| &x.name == name) else {
                return Err(invalid(
                    field,
                    &format!(
                        "the name of a vrrp.instances[] entry ({})",
                        cluster
                            .vrrp
                            .instances
                            .iter()
                            .map(|x| x.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    format!("{name:?}"),
                ));
            };
            if self.vips[..i].contains(name) {
                return Err(invalid(
                    field,
                    "each instance named once",
                    format!("{name:?}"),
                ));
            }
            for check in &inst.checks {
                if check.weight < 0 {
                    return Err(invalid(
                        format!("vrrp.instances[{name}].checks[{}].weight", check.name),
                        "a weight >= 0 on a bgp VIP (it is announced while every check passes)",
                        check.weight,
                    ));
                }
                if let HealthCheckKind::Http { url, .. } = &check.check
                    && !(url.starts_with("http://") || url.starts_with("https://"))
                {
                    return Err(invalid(
                        format!("vrrp.instances[{name}].checks[{}].check.url", check.name),
                        "http(s)://<ip or ${KEELSON_NODE_ADDRESS}>[:port]/path",
                        url,
                    ));
                }
            }
        }
        if self.local_asn == 0 || self.local_asn == u32::MAX || self.local_asn == 23456 {
            return Err(invalid(
                "bgp.localAsn".into(),
                "an AS number 1..=4294967294 other than 23456 (AS_TRANS)",
                self.local_asn,
            ));
        }
        if self.peers.is_empty() {
            return Err(invalid("bgp.peers".into(), "at least one peer", "none"));
        }
        for (i, peer) in self.peers.iter().enumerate() {
            let field = |f: &str| format!("bgp.peers[{i}].{f}");
            if peer.asn == 0 || peer.asn == u32::MAX || peer.asn == 23456 {
                return Err(invalid(
                    field("asn"),
                    "an AS number 1..=4294967294 other than 23456 (AS_TRANS)",
                    peer.asn,
                ));
            }
            let ip = peer.address;
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(invalid(field("address"), "a unicast peer address", ip));
            }
            if self.peers[..i].iter().any(|p| p.address == ip) {
                return Err(invalid(field("address"), "each peer listed once", ip));
            }
            if let Some(pass) = &peer.password
                && (pass.is_empty()
                    || pass.len() > 80
                    || !pass
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'))
            {
                return Err(invalid(
                    field("password"),
                    "1 to 80 printable ASCII characters without quotes, backslashes or spaces",
                    format!("{} characters", pass.chars().count()),
                ));
            }
            if peer.multihop == Some(0) {
                return Err(invalid(field("multihop"), "1..=255 hops", 0));
            }
        }
        if !(10..=60_000).contains(&self.bfd.interval_ms) {
            return Err(invalid(
                "bgp.bfd.intervalMs".into(),
                "10..=60000",
                self.bfd.interval_ms,
            ));
        }
        if self.bfd.multiplier == 0 {
            return Err(invalid("bgp.bfd.multiplier".into(), "1..=255", 0));
        }
        if matches!(self.table, 0 | 253..=255) {
            return Err(invalid(
                "bgp.table".into(),
                "a table of its own: not 0, 253 (default), 254 (main) or 255 (local)",
                self.table,
            ));
        }
        for (i, c) in self.communities.iter().enumerate() {
            if let Err(e) = c.parse::<Community>() {
                return Err(invalid(format!("bgp.communities[{i}]"), &e, c));
            }
        }
        if self.hold_time_secs < 3 {
            return Err(invalid(
                "bgp.holdTimeSecs".into(),
                "3..=65535 (RFC 4271)",
                self.hold_time_secs,
            ));
        }
        for (f, v) in [
            ("bgp.daemon.path", &self.daemon.path),
            ("bgp.daemon.runDir", &self.daemon.run_dir),
        ] {
            if !v.starts_with('/') || v.contains('"') || v.contains('\n') {
                return Err(invalid(f.into(), "an absolute path without quotes", v));
            }
        }
        if self.daemon.kind == DaemonKind::Frr && self.daemon.run == DaemonRun::Agent {
            return Err(invalid(
                "bgp.daemon.run".into(),
                "\"external\" with kind frr (the agent runs BIRD only; FRR runs beside it and reads the same table)",
                "\"agent\"",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterConfig {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/install-config.yaml"
        ))
        .unwrap();
        crate::install_config::InstallConfig::parse(&text)
            .unwrap()
            .cluster_config()
    }

    fn patched(bgp: serde_json::Value) -> Result<ClusterConfig, ClusterConfigError> {
        cluster().with_merge_patch(&serde_json::json!({ "bgp": bgp }))
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "vips": ["api"],
            "localAsn": 64512,
            "peers": [{"address": "10.0.0.1", "asn": 65001}]
        })
    }

    #[test]
    fn a_minimal_patch_gets_the_defaults_and_round_trips() {
        let c = patched(minimal()).unwrap();
        let bgp = c.bgp.as_ref().unwrap();
        assert_eq!(bgp.table, 198);
        assert_eq!(
            bgp.bfd,
            BfdSettings {
                enabled: true,
                interval_ms: 300,
                multiplier: 3
            }
        );
        assert_eq!(bgp.daemon.kind, DaemonKind::Bird);
        assert_eq!(bgp.daemon.run, DaemonRun::Agent);
        assert!(bgp.announces("api") && !bgp.announces("ingress"));
        let again = ClusterConfig::from_json(&c.to_json()).unwrap();
        assert_eq!(again, c);
        assert_eq!(again.to_json(), c.to_json(), "same config, same bytes");
    }

    #[test]
    fn bfd_can_be_turned_off_and_stays_off() {
        let mut p = minimal();
        p["bfd"] = serde_json::json!({"enabled": false});
        let c = patched(p).unwrap();
        assert!(!c.bgp.as_ref().unwrap().bfd.enabled);
        let again = ClusterConfig::from_json(&c.to_json()).unwrap();
        assert!(!again.bgp.unwrap().bfd.enabled);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                serde_json::json!({"vips": ["apii"]}),
                "bgp.vips[0]: expected the name of a vrrp.instances[] entry",
            ),
            (serde_json::json!({"vips": ["api", "api"]}), "bgp.vips[1]"),
            (serde_json::json!({"localAsn": 0}), "bgp.localAsn"),
            (
                serde_json::json!({"peers": []}),
                "bgp.peers: expected at least one peer",
            ),
            (
                serde_json::json!({"peers": [{"address": "10.0.0.1", "asn": 0}]}),
                "bgp.peers[0].asn",
            ),
            (
                serde_json::json!({"peers": [{"address": "10.0.0.1", "asn": 1, "password": "a\"b"}]}),
                "bgp.peers[0].password",
            ),
            (
                serde_json::json!({"peers": [{"address": "10.0.0.1", "asn": 1}, {"address": "10.0.0.1", "asn": 2}]}),
                "bgp.peers[1].address",
            ),
            (
                serde_json::json!({"peers": [{"address": "224.0.0.1", "asn": 1}]}),
                "bgp.peers[0].address",
            ),
            (
                serde_json::json!({"bfd": {"intervalMs": 1, "multiplier": 3}}),
                "bgp.bfd.intervalMs",
            ),
            (
                serde_json::json!({"bfd": {"intervalMs": 300, "multiplier": 0}}),
                "bgp.bfd.multiplier",
            ),
            (serde_json::json!({"table": 254}), "bgp.table"),
            (
                serde_json::json!({"communities": ["65000:70000"]}),
                "bgp.communities[0]",
            ),
            (serde_json::json!({"holdTimeSecs": 1}), "bgp.holdTimeSecs"),
            (
                serde_json::json!({"daemon": {"path": "bird"}}),
                "bgp.daemon.path",
            ),
            (
                serde_json::json!({"daemon": {"kind": "frr"}}),
                "bgp.daemon.run",
            ),
            (serde_json::json!({"peer": []}), "unknown field `peer`"),
            (
                serde_json::json!({"daemon": {"kind": "gobgp"}}),
                "unknown variant `gobgp`",
            ),
        ];
        for (over, want) in cases {
            let mut p = minimal();
            json_patch::merge(&mut p, &over);
            let e = patched(p).unwrap_err().to_string();
            assert!(e.contains(want), "{over}: {e}");
        }
    }

    #[test]
    fn negative_check_weights_make_no_sense_on_a_bgp_vip() {
        let mut c = cluster();
        c.vrrp.instances[0].checks[0].weight = -5;
        c.bgp = Some(serde_json::from_value(minimal()).unwrap());
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("vrrp.instances[api].checks[api-proxy].weight"),
            "{e}"
        );
    }

    #[test]
    fn communities_parse() {
        assert_eq!("65000:100".parse(), Ok(Community::Standard(65000, 100)));
        assert_eq!(
            "4200000000:1:2".parse(),
            Ok(Community::Large(4_200_000_000, 1, 2))
        );
        assert!("1".parse::<Community>().is_err());
        assert!("a:b".parse::<Community>().is_err());
        assert!("1:2:3:4".parse::<Community>().is_err());
    }

    #[test]
    fn frr_runs_beside_the_agent() {
        let mut p = minimal();
        p["daemon"] = serde_json::json!({"kind": "frr", "run": "external"});
        let c = patched(p).unwrap();
        assert_eq!(c.bgp.unwrap().daemon.kind, DaemonKind::Frr);
    }
}
