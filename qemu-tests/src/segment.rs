//! The test segment: QEMU's `-netdev socket,mcast=` network, and a host-side participant.
//!
//! Every VM's NIC is a QEMU multicast socket: each Ethernet frame travels as one UDP datagram
//! to `group:port`, sent from `localaddr` 127.0.0.1 so nothing leaves the host's loopback.
//! To test from outside the VMs, [`TapBridge`] joins the same group and copies frames to and
//! from a tap device inside a network namespace the harness creates; `dig` and `curl` then run
//! in that namespace as a seventh node on the segment.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use socket2::{Domain, Protocol, Socket, Type};

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

fn open_tap_in_netns(netns: &str, name: &str) -> Result<File> {
    // setns only moves the calling thread; the tap fd keeps its namespace afterwards, so
    // open it on a short-lived thread and leave the harness's own threads where they are.
    let netns = netns.to_string();
    let name = name.to_string();
    std::thread::spawn(move || -> Result<File> {
        let ns = File::open(format!("/run/netns/{netns}"))
            .with_context(|| format!("opening network namespace {netns}"))?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering network namespace {netns}"))?;
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
