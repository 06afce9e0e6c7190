//! The systemd unit that runs the agent on RHCOS (the one `keelson build` puts into the
//! master and worker configs): the capabilities the agent needs and nothing more.
//!
//! - `CAP_NET_ADMIN`: VIPs and routes over netlink, `SO_BINDTODEVICE`.
//! - `CAP_NET_RAW`: VRRP (IP protocol 112) raw sockets, gratuitous ARP / unsolicited NA.
//! - `CAP_NET_BIND_SERVICE`: DNS on :53.
//!
//! It runs as root only because RHCOS has no dedicated user for it; the bounding set keeps
//! every other capability away, and the file system is read-only except its state directory
//! and the interfaces' IPv4 settings (`/proc/sys/net/ipv4/conf`: the VRRP interface's
//! `arp_announce` 2, docs/vrrp.md). Without that path `ProtectKernelTunables` left them
//! read-only and the setting failed on every RHCOS node (the QEMU cluster's journals:
//! "arp_announce: Read-only file system").
//!
//! `KillMode=mixed`: a stop sends SIGTERM to the agent alone, which then takes its time
//! (at most 10 s) to hand the VIP over, drain the proxy and stop the processes it
//! supervises itself; only what is left when it exits is killed. With the default
//! (`control-group`) systemd's SIGTERM also reached the `nft` the stopping agent was
//! running to rewrite its redirect, and the redirect failed ("nft -f - failed (signal: 15)").

/// Where RHCOS configs install the agent binary.
pub const AGENT_PATH: &str = "/usr/local/bin/keelson-agent";
/// The unit's name.
pub const AGENT_UNIT_NAME: &str = "keelson-agent.service";

/// The unit file contents.
pub fn agent_unit() -> String {
    format!(
        "[Unit]
Description=keelson agent: VIPs (VRRP), API load balancer, cluster DNS, Ignition server
Documentation=https://github.com/keelson/keelson
Wants=network-online.target
After=network-online.target
ConditionPathExists=/etc/keelson/cluster.json

[Service]
Type=simple
ExecStart={AGENT_PATH} run --cluster /etc/keelson/cluster.json
Restart=always
RestartSec=2
KillMode=mixed
CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE
AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ReadWritePaths=/run/keelson /var/lib/keelson /proc/sys/net/ipv4/conf
RuntimeDirectory=keelson
StateDirectory=keelson
ProtectKernelModules=yes
ProtectKernelTunables=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_grants_only_the_network_capabilities() {
        let unit = agent_unit();
        let caps: Vec<&str> = unit
            .lines()
            .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            caps,
            ["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE"]
        );
        assert!(unit.contains(&format!("ExecStart={AGENT_PATH} run")));
        assert!(unit.contains("WantedBy=multi-user.target"));
        // A stop's SIGTERM for the agent only: its own nft and services finish their stop.
        assert!(unit.lines().any(|l| l == "KillMode=mixed"), "{unit}");
        // The one tunable it writes (arp_announce), past ProtectKernelTunables.
        let rw = unit
            .lines()
            .find_map(|l| l.strip_prefix("ReadWritePaths="))
            .unwrap();
        assert!(
            rw.split_whitespace()
                .any(|p| p == "/proc/sys/net/ipv4/conf"),
            "{rw}"
        );
    }

    #[test]
    fn systemd_analyze_accepts_it_when_available() {
        if !keelson_testkit::require("systemd-analyze") {
            return;
        }
        // The agent is not installed here, and `verify` fails a unit whose ExecStart is not
        // executable: this copy starts this test's own binary instead (the path in the
        // unit is checked above); nothing else differs.
        let me = std::env::current_exe().unwrap();
        let unit = agent_unit().replace(
            &format!("ExecStart={AGENT_PATH} "),
            &format!("ExecStart={} ", me.display()),
        );
        assert_ne!(unit, agent_unit(), "ExecStart not found in the unit");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AGENT_UNIT_NAME);
        std::fs::write(&path, unit).unwrap();
        // Judge our unit only: `verify` also loads whatever the host's targets pull in and
        // warns about those units (Debian's keystone.service: "Dependency
        // After=keystone.service is dropped"); `--recursive-errors=no` keeps their errors
        // out of the exit status, which then speaks for our unit alone.
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", "--recursive-errors=no"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "systemd-analyze verify failed ({}):\n{err}",
            out.status
        );
        // And nothing said about it either: every line about our unit names it or its
        // file first.
        let path_prefix = format!("{}:", path.display());
        let unit_prefix = format!("{AGENT_UNIT_NAME}:");
        for line in err.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                !(line.starts_with(&unit_prefix) || line.starts_with(&path_prefix)),
                "systemd-analyze: {line}"
            );
            eprintln!("systemd-analyze (about the host's units, ignored): {line}");
        }
    }
}
