//! [`ClusterConfig::check`]: the invariants of `cluster.json` that serde cannot express,
//! each error naming its field and what was expected.

use super::*;

impl ClusterConfig {
    /// Checks the invariants serde cannot express.
    // Over 100 lines on purpose: a flat list of independent checks, each naming its field and what was expected; there is no shared step to take out.
    pub fn check(&self) -> Result<(), ClusterConfigError> {
        fn invalid(field: String, expected: &str, got: impl ToString) -> ClusterConfigError {
            ClusterConfigError::Invalid {
                field,
                expected: expected.into(),
                got: got.to_string(),
            }
        }
        if self.version != CLUSTER_JSON_VERSION {
            return Err(invalid(
                "version".into(),
                &format!("{CLUSTER_JSON_VERSION}"),
                self.version,
            ));
        }
        if self.name.is_empty() {
            return Err(invalid("name".into(), "a non-empty cluster name", "\"\""));
        }
        if self.base_domain.is_empty() {
            return Err(invalid("baseDomain".into(), "a non-empty domain", "\"\""));
        }
        for (i, inst) in self.vrrp.instances.iter().enumerate() {
            let field = |f: &str| format!("vrrp.instances[{i}].{f}");
            if inst.vrid == 0 {
                return Err(invalid(field("vrid"), "1..=255", inst.vrid));
            }
            if inst.advert_interval_ms < 10 || inst.advert_interval_ms > 40_950 {
                return Err(invalid(
                    field("advertIntervalMs"),
                    "10..=40950",
                    inst.advert_interval_ms,
                ));
            }
            if inst.version == VrrpVersion::V2 {
                if inst.vip.is_ipv6() {
                    return Err(invalid(field("version"), "3 for an IPv6 VIP", "2"));
                }
                if inst.advert_interval_ms % 1000 != 0 || inst.advert_interval_ms > 255_000 {
                    return Err(invalid(
                        field("advertIntervalMs"),
                        "whole seconds (1000..=255000) for VRRPv2",
                        inst.advert_interval_ms,
                    ));
                }
            } else if inst.auth_pass.is_some() {
                return Err(invalid(
                    field("authPass"),
                    "no password with VRRPv3 (RFC 5798 removed authentication)",
                    "a password",
                ));
            }
            if let Some(pass) = &inst.auth_pass
                && (pass.is_empty() || pass.len() > 8)
            {
                return Err(invalid(field("authPass"), "1 to 8 bytes", pass.len()));
            }
            for check in inst.checks.iter().chain(&inst.required_checks) {
                if check.rise == 0 || check.fall == 0 || check.interval_ms == 0 {
                    return Err(invalid(
                        field(&format!("checks[{}]", check.name)),
                        "rise, fall and intervalMs >= 1",
                        format!(
                            "rise={} fall={} intervalMs={}",
                            check.rise, check.fall, check.interval_ms
                        ),
                    ));
                }
                if let Some(ms) = check.timeout_ms
                    && !(100..=60_000).contains(&ms)
                {
                    return Err(invalid(
                        field(&format!("checks[{}].timeoutMs", check.name)),
                        "100 to 60000",
                        ms,
                    ));
                }
            }
        }
        self.check_vrids()?;
        self.check_follows()?;
        self.check_node_address()?;
        if let Some(id) = &self.members.key_id
            && !crate::membership::valid_key_id(id)
        {
            return Err(invalid(
                "members.keyId".into(),
                "16 lowercase hex digits (the ID keelson build writes)",
                id,
            ));
        }
        if let Some(secs) = self.members.max_clock_skew_secs
            && !(1..=3600).contains(&secs)
        {
            return Err(invalid(
                "members.maxClockSkewSecs".into(),
                "1 to 3600 seconds",
                secs,
            ));
        }
        if let Some(secs) = self.members.forget_after_secs
            && secs < self.members.expiry_secs
        {
            return Err(invalid(
                "members.forgetAfterSecs".into(),
                "at least members.expirySecs",
                secs,
            ));
        }
        if let Some(etcd) = &self.dns.etcd
            && !(1..=1000).contains(&etcd.masters)
        {
            return Err(invalid(
                "dns.etcd.masters".into(),
                "1 to 1000 (controlPlane.replicas)",
                etcd.masters,
            ));
        }
        if self.api.fall == 0 || self.api.rise == 0 {
            return Err(invalid("api.fall/api.rise".into(), ">= 1", 0));
        }
        for (i, svc) in self.services.iter().enumerate() {
            if !svc.path.starts_with('/') {
                return Err(invalid(
                    format!("services[{i}].path"),
                    "an absolute path",
                    &svc.path,
                ));
            }
            if self.services[..i].iter().any(|s| s.name == svc.name) {
                return Err(invalid(
                    format!("services[{i}].name"),
                    "a name no other service has",
                    &svc.name,
                ));
            }
            if let Some(asset) = &svc.asset {
                if !is_asset_name(&asset.name) || asset.name == "keelson-agent" {
                    return Err(invalid(
                        format!("services[{i}].asset.name"),
                        "a plain file name ([A-Za-z0-9._-], not keelson-agent)",
                        &asset.name,
                    ));
                }
                if asset.sha512.len() != 128
                    || !asset
                        .sha512
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(invalid(
                        format!("services[{i}].asset.sha512"),
                        "128 lowercase hex digits",
                        &asset.sha512,
                    ));
                }
            }
        }
        if let Some(bgp) = &self.bgp {
            bgp.check(self)?;
        }
        Ok(())
    }

    /// Two virtual routers of one address family on one segment must not share a VRID
    /// (each would take the other's adverts for its own); the families are separate.
    fn check_vrids(&self) -> Result<(), ClusterConfigError> {
        let instances = &self.vrrp.instances;
        for (i, inst) in instances.iter().enumerate() {
            if let Some(other) = instances[..i]
                .iter()
                .find(|o| o.vrid == inst.vrid && o.vip.is_ipv6() == inst.vip.is_ipv6())
            {
                return Err(ClusterConfigError::Invalid {
                    field: format!("vrrp.instances[{i}].vrid"),
                    expected: format!(
                        "a VRID other than {}'s (two virtual routers of one family on one segment)",
                        other.name
                    ),
                    got: inst.vrid.to_string(),
                });
            }
        }
        Ok(())
    }

    /// `follows` names another instance, one that decides for itself and is announced the
    /// same way (both by BGP or neither: otherwise nothing would hold the follower's VIP).
    fn check_follows(&self) -> Result<(), ClusterConfigError> {
        let instances = &self.vrrp.instances;
        for (i, inst) in instances.iter().enumerate() {
            let Some(leader) = &inst.follows else {
                continue;
            };
            let found = instances.iter().find(|o| &o.name == leader);
            if leader == &inst.name || found.is_none_or(|o| o.follows.is_some()) {
                return Err(ClusterConfigError::Invalid {
                    field: format!("vrrp.instances[{i}].follows"),
                    expected: "the name of another instance, one without follows".into(),
                    got: format!("{leader:?}"),
                });
            }
            if self.bgp_mode(leader) != self.bgp_mode(&inst.name) {
                return Err(ClusterConfigError::Invalid {
                    field: format!("vrrp.instances[{i}].follows"),
                    expected: format!(
                        "an instance announced as {} is (both in bgp.vips or neither)",
                        inst.name
                    ),
                    got: format!("{leader:?}"),
                });
            }
        }
        Ok(())
    }

    fn check_node_address(&self) -> Result<(), ClusterConfigError> {
        let na = &self.node_address;
        if let Some(hint) = &na.hint
            && !hint.within(&self.machine_networks)
        {
            return Err(ClusterConfigError::Invalid {
                field: "nodeAddress.hint".into(),
                expected: format!(
                    "an address or network inside the machine networks ({})",
                    self.machine_networks
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                got: hint.to_string(),
            });
        }
        if let Some(name) = &na.interface
            && !is_interface_name(name)
        {
            return Err(ClusterConfigError::Invalid {
                field: "nodeAddress.interface".into(),
                expected: "a Linux interface name (1 to 15 bytes, no '/', ':' or white space)"
                    .into(),
                got: format!("{name:?}"),
            });
        }
        Ok(())
    }
}
