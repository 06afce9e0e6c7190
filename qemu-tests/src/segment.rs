//! The test segments, and a host-side participant on each.
//!
//! - [`Segment`]: QEMU's `-netdev socket,mcast=` network, where multicast passes. Every VM's
//!   NIC is a QEMU multicast socket: each Ethernet frame travels as one UDP datagram to
//!   `group:port`, sent from `localaddr` 127.0.0.1 so nothing leaves the host's loopback. To
//!   test from outside the VMs, [`TapBridge`] joins the same group and copies frames to and
//!   from a tap device inside a network namespace the harness creates; `dig` and `curl` then
//!   run in that namespace as a seventh node on the segment.
//! - [`BridgeSegment`]: a network that blocks multicast, as many OpenStack networks do. A
//!   Linux bridge in the harness's namespace, one tap per VM on it (opened in that namespace,
//!   handed to QEMU as `-netdev tap,fd=3`), and an nftables bridge rule that drops every
//!   multicast frame and counts it. The namespace itself is the host-side participant, on
//!   the bridge device.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::{enter, try_in_netns};

/// One QEMU multicast segment.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    /// The multicast group (administratively scoped, never routed off the host).
    pub group: Ipv4Addr,
    /// The UDP port; distinct per run so concurrent runs never share a segment.
    pub port: u16,
}

impl Segment {
    /// A segment on 239.255.x.y with a port derived from this process id.
    pub fn for_this_process() -> Self {
        let pid = std::process::id();
        Segment {
            group: Ipv4Addr::new(239, 255, ((pid >> 8) & 0xff) as u8, (pid & 0xff) as u8),
            port: 20000 + (pid % 20000) as u16,
        }
    }

    /// The `n`th segment of this process (several tests in one process each get their own).
    pub fn nth_for_this_process(n: u16) -> Self {
        let base = Self::for_this_process();
        Segment {
            group: base.group,
            port: 20000 + (base.port - 20000 + n * 1000) % 20000,
        }
    }

    /// The `-netdev` argument for a VM NIC on this segment.
    pub fn qemu_netdev(&self, id: &str) -> String {
        format!(
            "socket,id={id},mcast={}:{},localaddr=127.0.0.1",
            self.group, self.port
        )
    }
}

/// Copies frames between a [`Segment`] and a tap device in a network namespace.
#[derive(Debug)]
pub struct TapBridge {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Opens tap `name` inside network namespace `netns` (created with the fd, gone when the
/// last copy of the fd closes).
pub fn open_tap_in_netns(netns: &str, name: &str) -> Result<File> {
    // The tap fd keeps its namespace afterwards, so it is opened on a short-lived thread
    // inside `netns` and the harness's own threads stay where they are.
    let name = name.to_string();
    try_in_netns(netns, move || -> Result<File> {
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun")?;
        // struct ifreq: 16 bytes of name, then a short of flags, padded to 40 bytes.
        let mut ifreq = [0u8; 40];
        if name.len() >= 16 {
            bail!("tap name {name:?} is longer than 15 bytes");
        }
        ifreq[..name.len()].copy_from_slice(name.as_bytes());
        let flags = (libc::IFF_TAP | libc::IFF_NO_PI) as i16;
        ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `ifreq` is large enough
        // to hold; the fd is a valid open /dev/net/tun.
        let rc = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, ifreq.as_mut_ptr()) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error()).context("TUNSETIFF");
        }
        Ok(tun)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("tap thread panicked"))?
}

impl TapBridge {
    /// Creates tap `tap_name` in `netns` and starts copying frames both ways.
    pub fn start(segment: Segment, netns: &str, tap_name: &str) -> Result<Self> {
        let tap = open_tap_in_netns(netns, tap_name)?;
        let recv = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        recv.set_reuse_address(true)?;
        recv.set_reuse_port(true)?;
        recv.bind(&SocketAddrV4::new(segment.group, segment.port).into())?;
        recv.join_multicast_v4(&segment.group, &Ipv4Addr::LOCALHOST)?;
        recv.set_read_timeout(Some(std::time::Duration::from_millis(200)))?;
        let recv: UdpSocket = recv.into();

        // Sent from its own port so the copy of our frames the group loops back is recognised.
        let send = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        send.set_multicast_if_v4(&Ipv4Addr::LOCALHOST)?;
        send.set_multicast_loop_v4(true)?;
        send.bind(&SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0).into())?;
        let send: UdpSocket = send.into();
        let own_port = send.local_addr()?.port();

        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        {
            let mut tap = tap.try_clone()?;
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    match recv.recv_from(&mut buf) {
                        Ok((n, from)) if from.port() != own_port => {
                            let _ = tap.write(&buf[..n]);
                        }
                        Ok(_) => {}
                        Err(_) => continue,
                    }
                }
            }));
        }
        {
            let raw = tap.as_raw_fd();
            // Poll the tap with a timeout so the thread notices `stop`.
            let mut tap = tap;
            let stop = stop.clone();
            let dest = SocketAddrV4::new(segment.group, segment.port);
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let mut fds = [libc::pollfd {
                        fd: raw,
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
                    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 200) };
                    if ready <= 0 {
                        continue;
                    }
                    match tap.read(&mut buf) {
                        Ok(n) if n > 0 => {
                            let _ = send.send_to(&buf[..n], dest);
                        }
                        _ => {}
                    }
                }
            }));
        }
        Ok(TapBridge { stop, threads })
    }
}

impl Drop for TapBridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Datagrams the host dropped at the UDP sockets process `pid` holds (the `drops` column of
/// `/proc/net/udp`, summed): for a QEMU on a [`Segment`], frames of the segment its NIC
/// never saw because its socket's receive buffer was full. `None` when the process is gone.
pub fn udp_drops_of(pid: u32) -> Option<u64> {
    let inodes: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).ok()?;
    Some(udp_drops_in(&table, &inodes))
}

/// The sum of the `drops` column (the last) of the rows of a `/proc/net/udp` table whose
/// inode (the tenth column) is one of `inodes`.
fn udp_drops_in(table: &str, inodes: &std::collections::BTreeSet<String>) -> u64 {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let inode = cols.get(9)?;
            inodes
                .contains(*inode)
                .then(|| cols.last()?.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// Frames tap `tap` in `netns` could not queue towards its reader (its QEMU): the TX drops
/// of the tap (`ip -s link`), the [`BridgeSegment`] counterpart of [`udp_drops_of`].
pub fn tap_drops(netns: &str, tap: &str) -> Result<u64> {
    let out = run_in(netns, &["ip", "-s", "-j", "link", "show", "dev", tap], None)?;
    let doc: serde_json::Value = serde_json::from_str(&out)?;
    doc[0]["stats64"]["tx"]["dropped"]
        .as_u64()
        .with_context(|| format!("no TX drop counter for {tap}: {out}"))
}

/// How a VM's NIC reaches its segment.
#[derive(Debug)]
pub enum NicLink {
    /// A QEMU multicast socket segment.
    Mcast(Segment),
    /// A tap device (on a [`BridgeSegment`]), handed to QEMU as file descriptor 3.
    Tap(File),
}

impl From<Segment> for NicLink {
    fn from(s: Segment) -> Self {
        NicLink::Mcast(s)
    }
}

impl NicLink {
    /// The fd number QEMU finds the tap at.
    pub const TAP_FD: i32 = 3;

    /// The `-netdev` argument for NIC `id`.
    pub fn qemu_netdev(&self, id: &str) -> String {
        match self {
            NicLink::Mcast(s) => s.qemu_netdev(id),
            NicLink::Tap(_) => format!("tap,id={id},fd={}", Self::TAP_FD),
        }
    }
}

/// The nftables table of a [`BridgeSegment`]: every multicast frame that enters the bridge
/// from a port, or leaves the host-side participant through it, is dropped and counted.
const DROP_MULTICAST: &str = "table bridge kqnomcast {
  chain pre {
    type filter hook prerouting priority 0; policy accept;
    meta pkttype multicast counter drop
  }
  chain out {
    type filter hook output priority 0; policy accept;
    ether daddr & 01:00:00:00:00:00 == 01:00:00:00:00:00 ether daddr != ff:ff:ff:ff:ff:ff counter drop
  }
}
";

/// A bridge of taps in a network namespace: one that drops multicast (see the module docs),
/// or a plain learning switch ([`BridgeSegment::create_switch`]).
#[derive(Debug)]
pub struct BridgeSegment {
    netns: String,
    /// The bridge device, which carries the host-side participant's address.
    pub bridge: String,
    /// Whether the nftables rule drops multicast on it.
    drops_multicast: bool,
}

fn run_in(netns: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {args:?} in {netns}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{args:?} in {netns} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl BridgeSegment {
    /// Creates bridge `bridge` in `netns` with the multicast drop rule, and checks that the
    /// rule really drops multicast entering from a port (a probe namespace on a veth sends
    /// datagrams to a group the bridge device has joined: none may arrive, all must be
    /// counted).
    pub fn create(netns: &str, bridge: &str) -> Result<Self> {
        let seg = Self::bridge(netns, bridge, &[], true)?;
        run_in(netns, &["nft", "-f", "-"], Some(DROP_MULTICAST))?;
        seg.check_multicast_blocked()?;
        Ok(seg)
    }

    /// Bridge `bridge` in `netns` with `options` (`ip link add ... type bridge <options>`),
    /// up, without IPv6 on the bridge device: the host-side participant speaks IPv4 only
    /// (and on the multicast-dropping bridge its router solicitations would be dropped
    /// anyway).
    fn bridge(netns: &str, bridge: &str, options: &[&str], drops_multicast: bool) -> Result<Self> {
        let mut add = vec!["ip", "link", "add", bridge, "type", "bridge"];
        add.extend_from_slice(options);
        run_in(netns, &add, None)?;
        run_in(
            netns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{bridge}.disable_ipv6=1"),
            ],
            None,
        )?;
        run_in(netns, &["ip", "link", "set", bridge, "up"], None)?;
        Ok(BridgeSegment {
            netns: netns.to_string(),
            bridge: bridge.to_string(),
            drops_multicast,
        })
    }

    /// Creates bridge `bridge` in `netns` as a plain learning switch where multicast passes:
    /// a unicast frame goes to the one port its destination MAC was learnt on, multicast and
    /// broadcast to every port, as a real switch does. Unlike [`Segment`] (a hub: every frame
    /// one UDP datagram to every QEMU), a bulk transfer between two VMs then costs the other
    /// VMs' QEMUs nothing, and no burst of it fills their receive queues ahead of a VRRP
    /// advert (docs/qemu-cluster.md). Multicast snooping is off: every group floods, with no
    /// IGMP/MLD querier needed (VRRP's 224.0.0.18 and ff02::12, mDNS).
    pub fn create_switch(netns: &str, bridge: &str) -> Result<Self> {
        Self::bridge(netns, bridge, &["mcast_snooping", "0"], false)
    }

    /// The frames the kernel could not queue towards tap `tap` of this bridge.
    pub fn tap_drops(&self, tap: &str) -> Result<u64> {
        tap_drops(&self.netns, tap)
    }

    /// Whether this bridge drops multicast ([`BridgeSegment::create`]).
    pub fn drops_multicast(&self) -> bool {
        self.drops_multicast
    }

    /// Multicast frames the rule dropped so far.
    pub fn multicast_dropped(&self) -> Result<u64> {
        let out = run_in(
            &self.netns,
            &["nft", "-j", "list", "table", "bridge", "kqnomcast"],
            None,
        )?;
        let doc: serde_json::Value = serde_json::from_str(&out)?;
        Ok(doc["nftables"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["rule"]["expr"].as_array())
                    .flatten()
                    .filter_map(|e| e["counter"]["packets"].as_u64())
                    .sum()
            })
            .unwrap_or(0))
    }

    /// Opens a tap named `name` in the namespace and puts it on the bridge, up.
    pub fn tap(&self, name: &str) -> Result<NicLink> {
        let file = open_tap_in_netns(&self.netns, name)?;
        run_in(
            &self.netns,
            &["ip", "link", "set", name, "master", &self.bridge, "up"],
            None,
        )?;
        Ok(NicLink::Tap(file))
    }

    fn check_multicast_blocked(&self) -> Result<()> {
        let probe_ns = format!("{}p", self.netns);
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &probe_ns])
            .output();
        let ip = |args: &[&str]| -> Result<()> {
            let out = std::process::Command::new("ip").args(args).output()?;
            if !out.status.success() {
                bail!(
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        };
        ip(&["netns", "add", &probe_ns])?;
        let result = (|| -> Result<()> {
            ip(&[
                "-n",
                &self.netns,
                "link",
                "add",
                "kqprobe0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &probe_ns,
            ])?;
            ip(&[
                "-n",
                &self.netns,
                "link",
                "set",
                "kqprobe0",
                "master",
                &self.bridge,
                "up",
            ])?;
            ip(&[
                "-n",
                &probe_ns,
                "addr",
                "add",
                "192.0.2.2/24",
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &probe_ns, "link", "set", "eth0", "up"])?;
            ip(&[
                "-n",
                &self.netns,
                "addr",
                "add",
                "192.0.2.1/24",
                "dev",
                &self.bridge,
            ])?;
            let before = self.multicast_dropped()?;
            let group = Ipv4Addr::new(239, 255, 77, 1);
            // A receiver on the bridge device (the host-side participant), joined to the group.
            let listen_ns = self.netns.clone();
            let receiver = std::thread::spawn(move || -> Result<bool> {
                enter(&listen_ns)?;
                let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5998))?;
                sock.join_multicast_v4(&group, &Ipv4Addr::new(192, 0, 2, 1))?;
                sock.set_read_timeout(Some(std::time::Duration::from_millis(1500)))?;
                let mut buf = [0u8; 64];
                Ok(sock.recv(&mut buf).is_ok())
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            let send_ns = probe_ns.clone();
            std::thread::spawn(move || -> Result<()> {
                enter(&send_ns)?;
                let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
                sock.set_multicast_if_v4(&Ipv4Addr::new(192, 0, 2, 2))?;
                let to = SocketAddrV4::new(group, 5998).into();
                for _ in 0..5 {
                    sock.send_to(b"multicast?", &to)?;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Ok(())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("probe sender panicked"))??;
            let got = receiver
                .join()
                .map_err(|_| anyhow::anyhow!("probe receiver panicked"))??;
            let dropped = self.multicast_dropped()? - before;
            if got {
                bail!(
                    "multicast crossed the bridge {}: the segment does not block it",
                    self.bridge
                );
            }
            if dropped < 5 {
                bail!("the multicast rule counted {dropped} of 5 probe datagrams");
            }
            Ok(())
        })();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &probe_ns])
            .output();
        let _ = std::process::Command::new("ip")
            .args([
                "-n",
                &self.netns,
                "addr",
                "del",
                "192.0.2.1/24",
                "dev",
                &self.bridge,
            ])
            .output();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_drops_are_summed_over_the_process_sockets_only() {
        // /proc/net/udp as Linux 6 writes it (drops last, inode tenth).
        let table = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  12: 0100007F:4E21 00000000:0000 07 00000000:00034000 00:00000000 00000000     0        0 81234 2 0000000000000000 17\n\
  13: 0100007F:4E22 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 81235 2 0000000000000000 5\n\
  14: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 99999 2 0000000000000000 400\n";
        let ours: std::collections::BTreeSet<String> =
            ["81234".to_string(), "81235".to_string()].into();
        assert_eq!(udp_drops_in(table, &ours), 22);
        assert_eq!(udp_drops_in(table, &Default::default()), 0);
    }
}
