//! How an RHCOS node's resolver reaches the cluster DNS: a NetworkManager connection profile
//! the full configs install, so NetworkManager itself writes `/etc/resolv.conf` with the
//! local keelson DNS first (docs/dns.md).
//!
//! NetworkManager merges the DNS servers and search domains of every active connection,
//! ordered by `dns-priority` (lower first; the NIC's own profile has 100). The profile is a
//! dummy device whose only job is to carry `127.0.0.1` and the cluster zone at priority 10:
//! the node asks the agent first and still has the servers DHCP or the operator gave its NIC
//! behind it (glibc moves to the next server on a timeout or SERVFAIL), and nothing rewrites
//! `/etc/resolv.conf` behind NetworkManager's back. The profile names no NIC, so it works
//! whatever the NIC is called and however it is configured (DHCP, `ip=` arguments, keyfiles).

/// Where the profile goes (NetworkManager ignores keyfiles not owned by root with mode 0600).
pub const PROFILE_PATH: &str = "/etc/NetworkManager/system-connections/keelson-dns.nmconnection";
/// The dummy interface's name.
pub const INTERFACE: &str = "keelson-dns";
/// Its address: link-local, /32, outside every machine network, so neither routing nor the
/// agent's own address discovery ever picks it.
pub const ADDRESS: &str = "169.254.0.53/32";
/// The profile's DNS priority (NetworkManager's default for a NIC is 100, lower wins).
pub const DNS_PRIORITY: i32 = 10;

/// The keyfile for cluster `zone` (`<name>.<baseDomain>`).
pub fn networkmanager_profile(zone: &str) -> String {
    format!(
        "# keelson: the cluster DNS (the local agent) first for every name, and the search
# domain of the cluster; written by keelson's Ignition config.
[connection]
id=keelson-dns
uuid={uuid}
type=dummy
interface-name={INTERFACE}
autoconnect=true

[ipv4]
method=manual
address1={ADDRESS}
dns=127.0.0.1;
dns-search={zone};
dns-priority={DNS_PRIORITY}
never-default=true

[ipv6]
method=disabled
",
        uuid = profile_uuid(zone)
    )
}

/// A stable UUID for the profile (keyfiles need one; a random one would make the rendered
/// configs differ from build to build).
fn profile_uuid(zone: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = hex::encode(&Sha256::digest(format!("keelson-dns {zone}").as_bytes())[..16]);
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_puts_the_agent_first_for_the_zone() {
        let p = networkmanager_profile("ocp4.example.com");
        assert!(p.contains("\ndns=127.0.0.1;\n"));
        assert!(p.contains("\ndns-search=ocp4.example.com;\n"));
        assert!(p.contains("\ndns-priority=10\n"));
        assert!(p.contains("\ntype=dummy\n"));
        assert_eq!(p, networkmanager_profile("ocp4.example.com"), "stable");
        assert_ne!(profile_uuid("a.example.com"), profile_uuid("b.example.com"));
    }
}
