//! The fabric's routers (spine and ToRs): their BGP sessions, each written as a BIRD 2 or
//! an FRR configuration, and the daemons started with it (FRR's also for the masters).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::topology::run_ok;
use super::{BFD_MS, Daemon, Fabric, SPINE};

/// One router of the fabric and its BGP sessions.
pub(super) struct Router {
    ns: &'static str,
    asn: u32,
    router_id: &'static str,
    /// (local v4, peer v4, local v6, peer v6, peer asn, name)
    peers: Vec<(String, String, String, String, u32, String)>,
}

impl Fabric {
    pub(super) fn routers(&self) -> Vec<Router> {
        let mut spine = Router {
            ns: SPINE,
            asn: 65000,
            router_id: "10.71.10.1",
            peers: vec![],
        };
        let mut tors = Vec::new();
        for (rack, (ns, asn)) in [("kbg-ta", 65001), ("kbg-tb", 65002)]
            .into_iter()
            .enumerate()
        {
            let n = rack + 1;
            spine.peers.push((
                format!("10.71.{n}0.1"),
                format!("10.71.{n}0.2"),
                format!("fd71:{n}0::1"),
                format!("fd71:{n}0::2"),
                asn,
                format!("tor{n}"),
            ));
            let mut tor = Router {
                ns,
                asn,
                router_id: if rack == 0 {
                    "10.71.10.2"
                } else {
                    "10.71.20.2"
                },
                peers: vec![(
                    format!("10.71.{n}0.2"),
                    format!("10.71.{n}0.1"),
                    format!("fd71:{n}0::2"),
                    format!("fd71:{n}0::1"),
                    65000,
                    "spine".into(),
                )],
            };
            for m in self.masters.iter().filter(|m| m.rack == rack) {
                tor.peers.push((
                    format!("10.71.{n}.1"),
                    m.v4.clone(),
                    format!("fd71:{n}::1"),
                    m.v6.clone(),
                    64512,
                    m.name.clone(),
                ));
            }
            tors.push(tor);
        }
        let mut all = vec![spine];
        all.extend(tors);
        all
    }

    fn bird_router_conf(r: &Router) -> String {
        let mut s = format!(
            "router id {};\nlog stderr {{ info, remote, warning, error, auth, fatal, bug }};\n\
             protocol device {{ }}\n\
             protocol kernel {{ merge paths on; ipv4 {{ import none; export all; }}; }}\n\
             protocol kernel {{ merge paths on; ipv6 {{ import none; export all; }}; }}\n\
             protocol bfd {{ interface \"*\" {{ min rx interval {BFD_MS} ms; min tx interval {BFD_MS} ms; multiplier 3; }}; }}\n\
             template bgp fabric {{ direct; bfd on; hold time 9; keepalive time 3; connect retry time 5; error wait time 1, 10; }}\n",
            r.router_id
        );
        for (l4, p4, l6, p6, asn, name) in &r.peers {
            s.push_str(&format!(
                "protocol bgp {name}_4 from fabric {{ local {l4} as {me}; neighbor {p4} as {asn}; ipv4 {{ import all; export all; }}; }}\n\
                 protocol bgp {name}_6 from fabric {{ local {l6} as {me}; neighbor {p6} as {asn}; ipv6 {{ import all; export all; }}; }}\n",
                me = r.asn
            ));
        }
        s
    }

    fn frr_router_conf(r: &Router) -> String {
        // IPv6 routes via the peer's global address, as BIRD installs them (FRR prefers the
        // link-local next hop a peer sends beside it).
        let mut s = format!(
            "frr defaults datacenter\nhostname {ns}\nlog stdout informational\n!\n\
             bfd\n profile fabric\n  detect-multiplier 3\n  receive-interval {BFD_MS}\n  transmit-interval {BFD_MS}\n exit\nexit\n!\n\
             route-map prefer-global permit 10\n set ipv6 next-hop prefer-global\nexit\n!\n\
             router bgp {asn}\n bgp router-id {rid}\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax\n",
            ns = r.ns,
            asn = r.asn,
            rid = r.router_id
        );
        for (_, p4, _, p6, asn, _) in &r.peers {
            for p in [p4, p6] {
                s.push_str(&format!(
                    " neighbor {p} remote-as {asn}\n neighbor {p} timers 3 9\n neighbor {p} timers connect 5\n neighbor {p} bfd profile fabric\n"
                ));
            }
        }
        s.push_str(" address-family ipv4 unicast\n  maximum-paths 16\n");
        for (_, p4, ..) in &r.peers {
            s.push_str(&format!("  neighbor {p4} activate\n"));
        }
        s.push_str(" exit-address-family\n address-family ipv6 unicast\n  maximum-paths 16\n");
        for (_, _, _, p6, ..) in &r.peers {
            s.push_str(&format!(
                "  neighbor {p6} activate\n  neighbor {p6} route-map prefer-global in\n"
            ));
        }
        s.push_str(" exit-address-family\nexit\n!\n");
        s
    }

    /// Starts FRR's zebra, bgpd and bfdd in `ns` (pathspace `ns`) and loads `conf` into
    /// them with vtysh.
    pub(super) fn start_frr(&self, ns: &str, conf: &Path) -> Result<()> {
        let run = PathBuf::from(format!("/var/run/frr/{ns}"));
        let etc = PathBuf::from(format!("/etc/frr/{ns}"));
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run)?;
        std::fs::create_dir_all(&etc)?;
        std::fs::write(etc.join("vtysh.conf"), "")?;
        run_ok(&["chown", "-R", "frr:frr", &run.display().to_string()])?;
        // One after the other, each once the one before answers: bgpd registers its BFD
        // peers with bfdd through zebra, and FRR 8.4 loses registrations made before
        // that path is up (the sessions never appear).
        for (d, ready) in [
            ("zebra", "zserv.api"),
            ("bfdd", "bfdd.vty"),
            ("bgpd", "bgpd.vty"),
        ] {
            self.spawn(
                ns,
                &format!("{ns}-{d}.log"),
                Path::new(&format!("/usr/lib/frr/{d}")),
                &["-N", ns],
            )?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !run.join(ready).exists() {
                if Instant::now() > deadline {
                    bail!(
                        "FRR {d} in {ns} did not start (logs in {})",
                        self.work.path().display()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let out = Command::new("vtysh")
            .args(["-N", ns, "-f"])
            .arg(conf)
            .output()?;
        if !out.status.success() {
            bail!(
                "vtysh -N {ns} -f {}: {}{}",
                conf.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub(super) fn start_router(&self, r: &Router) -> Result<()> {
        match self.daemon {
            Daemon::Bird => {
                let conf = self.work.path().join(format!("{}.bird.conf", r.ns));
                std::fs::write(&conf, Self::bird_router_conf(r))?;
                let sock = self.work.path().join(format!("{}.ctl", r.ns));
                self.spawn(
                    r.ns,
                    &format!("{}-bird.log", r.ns),
                    Path::new("bird"),
                    &[
                        "-f",
                        "-c",
                        &conf.display().to_string(),
                        "-s",
                        &sock.display().to_string(),
                    ],
                )
            }
            Daemon::Frr => {
                let conf = self.work.path().join(format!("{}.frr.conf", r.ns));
                std::fs::write(&conf, Self::frr_router_conf(r))?;
                self.start_frr(r.ns, &conf)
            }
        }
    }
}
