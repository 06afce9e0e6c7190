//! A real DHCPv4 server for the tests' namespaces: dnsmasq with DNS off, logging every
//! exchange to a file the test reads.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cmd::Proc;
use crate::wait::wait_for;

/// dnsmasq serving DHCPv4 on one interface of a namespace; stopped on drop.
#[derive(Debug)]
pub struct DhcpServer {
    /// The process.
    pub proc: Proc,
    log: PathBuf,
    leases: PathBuf,
    _dir: tempfile::TempDir,
}

impl DhcpServer {
    /// Starts dnsmasq in namespace `ns` on `interface` (which has an address in the range's
    /// subnet) handing out `range` (dnsmasq's `--dhcp-range`, for example
    /// `10.77.0.50,10.77.0.60,255.255.255.0,2m`) with `options` (each a `--dhcp-option`
    /// value); returns once it serves. Call [`crate::require`]`("dnsmasq")` first.
    pub fn start(ns: &str, interface: &str, range: &str, options: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (log, leases) = (dir.path().join("log"), dir.path().join("leases"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "dnsmasq", "--no-daemon"])
            .args(["--conf-file=/dev/null", "--bind-interfaces", "--port=0"])
            .args(["--log-dhcp", "--pid-file="])
            .arg(format!("--interface={interface}"))
            .arg(format!("--dhcp-range={range}"))
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--log-facility={}", log.display()));
        for o in options {
            cmd.arg(format!("--dhcp-option={o}"));
        }
        let server = DhcpServer {
            proc: Proc::spawn(cmd.stdout(Stdio::null()).stderr(Stdio::null())),
            log,
            leases,
            _dir: dir,
        };
        wait_for("dnsmasq to serve DHCP", Duration::from_secs(10), || {
            server.log().contains("DHCP, IP range")
        });
        server
    }

    /// Its log so far (every DHCP message it saw and sent).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its lease file now (one line a lease: expiry, MAC, address, host name, client id).
    pub fn leases(&self) -> String {
        std::fs::read_to_string(&self.leases).unwrap_or_default()
    }
}
