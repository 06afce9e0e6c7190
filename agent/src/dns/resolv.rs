//! `/etc/resolv.conf` on the appliance: the local server first, then the upstreams, so a
//! node whose agent is down still resolves.

use std::net::SocketAddr;
use std::path::Path;

/// Where the resolver configuration lives.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// glibc reads at most three `nameserver` lines (MAXNS).
const MAXNS: usize = 3;

/// Renders resolv.conf: `search <zone>`, `nameserver 127.0.0.1`, then the upstreams that
/// listen on port 53 (resolv.conf cannot name another port).
pub fn render(zone: &str, upstreams: &[SocketAddr]) -> String {
    let mut out = String::from("# Written by keelson-agent: the cluster DNS server first.\n");
    out.push_str(&format!("search {zone}\n"));
    out.push_str("nameserver 127.0.0.1\n");
    for up in upstreams.iter().filter(|u| u.port() == 53).take(MAXNS - 1) {
        out.push_str(&format!("nameserver {}\n", up.ip()));
    }
    out
}

/// Writes [`render`] to `path` atomically (temp file + rename).
pub fn write(path: &Path, zone: &str, upstreams: &[SocketAddr]) -> std::io::Result<()> {
    let tmp = path.with_extension("keelson-tmp");
    std::fs::write(&tmp, render(zone, upstreams))?;
    std::fs::rename(&tmp, path)
}

/// Writes a resolv.conf of the network's own servers (DHCP's or `network_data.json`'s),
/// for the boot before the agent's DNS runs: a pointer config that names a host (OpenShift's
/// `api-int.<cluster>.<baseDomain>`, a hosted config's server) is looked up through them.
pub fn write_network_servers(path: &Path, servers: &[std::net::IpAddr]) -> std::io::Result<()> {
    let mut out = String::from("# Written by keelson-agent at boot: the network's DNS servers.\n");
    for s in servers.iter().take(MAXNS) {
        out.push_str(&format!("nameserver {s}\n"));
    }
    let tmp = path.with_extension("keelson-tmp");
    std::fs::write(&tmp, out)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_first_then_upstreams() {
        let ups: Vec<SocketAddr> = vec![
            "192.0.2.1:53".parse().unwrap(),
            "192.0.2.2:5353".parse().unwrap(),
            "[2001:db8::1]:53".parse().unwrap(),
            "192.0.2.3:53".parse().unwrap(),
        ];
        let text = render("ocp4.example.com", &ups);
        assert_eq!(
            text,
            "# Written by keelson-agent: the cluster DNS server first.\nsearch ocp4.example.com\n\
             nameserver 127.0.0.1\nnameserver 192.0.2.1\nnameserver 2001:db8::1\n"
        );
    }

    #[test]
    fn writes_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("resolv.conf");
        write(&p, "c.example", &["192.0.2.1:53".parse().unwrap()]).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("nameserver 127.0.0.1\nnameserver 192.0.2.1\n"));
    }
}
