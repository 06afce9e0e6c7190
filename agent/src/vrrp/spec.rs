//! What one VRRP instance is, resolved from `cluster.json` and `node.json`, and the checks
//! every received packet passes before it counts as an advert (pure).

use std::net::IpAddr;
use std::time::Duration;

use keelson_cluster::cluster::{VrrpInstanceConfig, VrrpTransport, VrrpVersion};

use super::codec::{self, Advert, Auth, CodecError, Version};
use super::socket::Received;

/// The drop reason of a codec error.
pub fn drop_reason(e: &CodecError) -> &'static str {
    match e {
        CodecError::Short { .. } | CodecError::Long { .. } => "length",
        CodecError::Version(_) | CodecError::V2OverIpv6 => "version",
        CodecError::Type(_) => "type",
        CodecError::NoAddresses => "address_count",
        CodecError::Checksum { .. } => "checksum",
        CodecError::AuthType(_) => "auth",
        CodecError::ZeroInterval => "interval",
        CodecError::MixedFamilies { .. } => "family",
    }
}

/// Everything an instance needs, resolved from cluster.json and node.json.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The instance's config.
    pub config: VrrpInstanceConfig,
    /// This node's base priority in it.
    pub base: u8,
    /// Interface.
    pub iface: String,
    /// Source of our adverts.
    pub primary: IpAddr,
    /// All our own addresses (adverts from any of them are ours).
    pub own: Vec<IpAddr>,
}

impl Spec {
    /// The protocol version.
    pub fn version(&self) -> Version {
        match self.config.version {
            VrrpVersion::V2 => Version::V2,
            VrrpVersion::V3 => Version::V3,
        }
    }

    /// The authentication adverts carry (VRRPv2 `PASS` only).
    pub fn auth(&self) -> Auth {
        match &self.config.auth_pass {
            Some(p) if self.config.version == VrrpVersion::V2 => Auth::pass(p),
            _ => Auth::None,
        }
    }

    /// Our advert interval, centiseconds.
    pub fn interval_cs(&self) -> u16 {
        (self.config.advert_interval_ms / 10).clamp(1, 0x0fff) as u16
    }

    /// Checks a received packet; `Err(reason)` to drop it.
    pub fn validate(&self, r: &Received) -> Result<Advert, &'static str> {
        if r.ttl != 255 {
            return Err("ttl");
        }
        if self.own.contains(&r.src) {
            return Err("own_address");
        }
        let a = codec::parse(&r.payload, r.src, r.dst).map_err(|e| drop_reason(&e))?;
        if a.vrid != self.config.vrid {
            return Err("vrid");
        }
        if a.version != self.version() {
            return Err("version");
        }
        if a.version == Version::V2 {
            if a.auth != self.auth() {
                return Err("auth");
            }
            // RFC 3768 §7.1: drop adverts whose interval differs from ours.
            if a.interval_cs != self.interval_cs() {
                return Err("interval");
            }
        }
        if a.addresses.len() != 1 {
            return Err("address_count");
        }
        if a.addresses[0] != self.config.vip {
            return Err("address");
        }
        Ok(a)
    }

    /// Our advert interval.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.interval_cs()) * 10)
    }

    /// Whether adverts go to unicast peers.
    pub fn unicast(&self) -> bool {
        self.config.transport == VrrpTransport::Unicast
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::GROUP_V4;
    use super::*;
    use keelson_cluster::cluster::RolePriorities;

    fn spec(version: VrrpVersion, pass: Option<&str>) -> Spec {
        Spec {
            config: VrrpInstanceConfig {
                name: "api".into(),
                vip: "10.0.0.5".parse().unwrap(),
                vrid: 7,
                version,
                advert_interval_ms: 1000,
                transport: VrrpTransport::Multicast,
                unicast_peers: vec![],
                claim_grace_ms: None,
                auth_pass: pass.map(Into::into),
                preempt: true,
                garp_refresh_secs: 60,
                handback_secs: 0,
                priorities: RolePriorities::default(),
                checks: vec![],
                required_checks: vec![],
            },
            base: 40,
            iface: "eth0".into(),
            primary: "10.0.0.11".parse().unwrap(),
            own: vec!["10.0.0.11".parse().unwrap()],
        }
    }

    fn packet(a: &Advert, src: &str, ttl: u8) -> Received {
        let src: IpAddr = src.parse().unwrap();
        Received {
            src,
            dst: GROUP_V4.into(),
            ttl,
            payload: codec::encode(a, src, GROUP_V4.into()).unwrap(),
            age: Duration::ZERO,
        }
    }

    fn advert(version: Version, auth: Auth) -> Advert {
        Advert {
            version,
            vrid: 7,
            priority: 100,
            interval_cs: 100,
            addresses: vec!["10.0.0.5".parse().unwrap()],
            auth,
        }
    }

    #[test]
    fn validation_drops_by_reason() {
        let s = spec(VrrpVersion::V3, None);
        let good = advert(Version::V3, Auth::None);
        assert!(s.validate(&packet(&good, "10.0.0.12", 255)).is_ok());
        assert_eq!(s.validate(&packet(&good, "10.0.0.12", 254)), Err("ttl"));
        assert_eq!(
            s.validate(&packet(&good, "10.0.0.11", 255)),
            Err("own_address")
        );
        let mut a = good.clone();
        a.vrid = 8;
        assert_eq!(s.validate(&packet(&a, "10.0.0.12", 255)), Err("vrid"));
        let mut a = good.clone();
        a.addresses.push("10.0.0.6".parse().unwrap());
        assert_eq!(
            s.validate(&packet(&a, "10.0.0.12", 255)),
            Err("address_count")
        );
        let mut a = good.clone();
        a.addresses = vec!["10.0.0.6".parse().unwrap()];
        assert_eq!(s.validate(&packet(&a, "10.0.0.12", 255)), Err("address"));
        let mut p = packet(&good, "10.0.0.12", 255);
        p.payload[7] ^= 0xff;
        assert_eq!(s.validate(&p), Err("checksum"));
        p.payload.push(0);
        assert_eq!(s.validate(&p), Err("length"));
        let v2 = advert(Version::V2, Auth::None);
        assert_eq!(s.validate(&packet(&v2, "10.0.0.12", 255)), Err("version"));
    }

    #[test]
    fn v2_auth_and_interval_must_match() {
        let s = spec(VrrpVersion::V2, Some("secret"));
        let ok = advert(Version::V2, Auth::pass("secret"));
        assert!(s.validate(&packet(&ok, "10.0.0.12", 255)).is_ok());
        let wrong = advert(Version::V2, Auth::pass("nope"));
        assert_eq!(s.validate(&packet(&wrong, "10.0.0.12", 255)), Err("auth"));
        let none = advert(Version::V2, Auth::None);
        assert_eq!(s.validate(&packet(&none, "10.0.0.12", 255)), Err("auth"));
        let mut slow = ok.clone();
        slow.interval_cs = 200;
        assert_eq!(
            s.validate(&packet(&slow, "10.0.0.12", 255)),
            Err("interval")
        );
    }
}
