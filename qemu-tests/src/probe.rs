//! What the host-side participant does on the segment: `curl` and `dig` inside the harness's
//! namespace, and a client loop that records when requests through a VIP failed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns::{HarnessNetns, Netns};

/// `curl -sk` of `url` from the namespace with an overall `timeout`: the body on a 2xx.
pub fn curl(ns: &Netns, url: &str, timeout: Duration) -> Option<String> {
    curl_with(ns, url, timeout, &[])
}

/// [`curl`] with extra arguments (headers...).
pub fn curl_with(ns: &Netns, url: &str, timeout: Duration, extra: &[&str]) -> Option<String> {
    let out = ns
        .command("curl")
        // Straight to the address: no proxy the machine's environment may name.
        .args(["-sk", "--noproxy", "*", "--fail", "--max-time"])
        .arg(format!("{:.1}", timeout.as_secs_f64()))
        .args(extra)
        .arg(url)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The HTTP status of `url` (0 when no answer), without `--fail`.
pub fn http_status(ns: &Netns, url: &str, timeout: Duration, extra: &[&str]) -> u16 {
    ns.command("curl")
        .args([
            "-sk",
            "--noproxy",
            "*",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--max-time")
        .arg(format!("{:.1}", timeout.as_secs_f64()))
        .args(extra)
        .arg(url)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// One DNS answer as `dig` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigAnswer {
    /// `NOERROR`, `NXDOMAIN`, ... (empty when no answer came).
    pub status: String,
    /// The answer section's record data, sorted.
    pub records: Vec<String>,
}

/// `dig @server name type` from the namespace (UDP, one try, 2 s).
pub fn dig(ns: &Netns, server: &str, name: &str, rtype: &str) -> DigAnswer {
    let out = ns
        .command("dig")
        .args(["+time=2", "+tries=1", "+noall", "+comments", "+answer"])
        .arg(format!("@{server}"))
        .args([name, rtype])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("")
        .to_owned();
    let mut records: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .collect();
    records.sort();
    DigAnswer { status, records }
}

/// One request of a [`ClientLoop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was sent.
    pub sent: Instant,
    /// When it answered or gave up.
    pub done: Instant,
    /// Whether it answered.
    pub ok: bool,
}

/// Requests through a VIP every `period`, recording when each answered or failed.
#[derive(Debug)]
pub struct ClientLoop {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<JoinHandle<()>>,
}

impl ClientLoop {
    /// Starts GETting `url` from the namespace `ns` every `period` with a `timeout` each, one
    /// request at a time (a request that waits out its timeout delays the next).
    pub fn start(ns: &str, url: &str, period: Duration, timeout: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            let ns = Netns::existing(ns);
            let url = url.to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let ok = curl(&ns, &url, timeout).is_some();
                    let done = Instant::now();
                    samples
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Sample { sent, done, ok });
                    if let Some(rest) = period.checked_sub(sent.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        };
        ClientLoop {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Starts GETting `url` from the namespace `ns` every `period` whether or not the
    /// requests before have answered, each with a `timeout`: as many clients do, and so the
    /// moment a service answers again is seen to within `period`, not within a timeout
    /// (with one request at a time, the one sent just before an outage waits out its
    /// timeout, and the next goes only then).
    pub fn start_overlapping(ns: &str, url: &str, period: Duration, timeout: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            let ns = ns.to_owned();
            let url = url.to_owned();
            std::thread::spawn(move || {
                let mut requests = Vec::new();
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let (ns, url, samples) = (Netns::existing(&ns), url.clone(), samples.clone());
                    requests.push(std::thread::spawn(move || {
                        let sent = Instant::now();
                        let ok = curl(&ns, &url, timeout).is_some();
                        let done = Instant::now();
                        samples
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Sample { sent, done, ok });
                    }));
                    requests.retain(|r: &JoinHandle<()>| !r.is_finished());
                    next += period;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                for r in requests {
                    let _ = r.join();
                }
            })
        };
        ClientLoop {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// The samples so far, in the order they were sent.
    pub fn samples(&self) -> Vec<Sample> {
        let mut s = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.sort_by_key(|s| s.sent);
        s
    }

    /// Waits until a request sent after `after` answered; returns when it was sent.
    pub fn wait_success_after(&self, after: Instant, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.samples().into_iter().find(|s| s.ok && s.sent > after) {
                return Some(s.sent);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// Waits (up to `timeout`) until the requests of the last `steady` all answered;
    /// returns when the first of that run was sent.
    pub fn wait_steady(&self, steady: Duration, timeout: Duration) -> Option<Instant> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            let samples = self.samples();
            let since = samples
                .iter()
                .rev()
                .take_while(|s| s.ok)
                .last()
                .map(|s| s.sent);
            if let Some(since) = since
                && samples
                    .last()
                    .is_some_and(|s| s.sent.duration_since(since) >= steady)
            {
                return Some(since);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        None
    }

    /// Stops the loop and returns every sample.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.samples()
    }
}

impl Drop for ClientLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where the failures of a client loop lie relative to an event at `event`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outage {
    /// Failed requests that gave up before the event (should be none).
    pub failures_before: usize,
    /// Failed requests still under way at the event or sent after it.
    pub failures_after: usize,
    /// From the event to the last failed request sent after it.
    pub last_failure: Option<Duration>,
    /// From the event to the first request after it that answered, if one did.
    pub first_success: Option<Duration>,
    /// Requests sent after the event.
    pub requests_after: usize,
    /// Failed requests sent after the service answered again (the first answer to a
    /// request sent after the event): what bench/api_outage.sh's bar forbids.
    pub failures_after_back: usize,
}

/// Summarises `samples` around `event`. A request under way when the event happened
/// (sent before, finished after) counts as after it: the event is what it ran into.
pub fn outage(samples: &[Sample], event: Instant) -> Outage {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.done >= event).collect();
    Outage {
        failures_before: samples.iter().filter(|s| s.done < event && !s.ok).count(),
        failures_after: after.iter().filter(|s| !s.ok).count(),
        last_failure: after
            .iter()
            .filter(|s| !s.ok)
            .map(|s| s.sent.saturating_duration_since(event))
            .max(),
        first_success: after
            .iter()
            .find(|s| s.ok && s.sent >= event)
            .map(|s| s.sent.duration_since(event)),
        requests_after: after.len(),
        failures_after_back: match after
            .iter()
            .filter(|s| s.ok && s.sent >= event)
            .map(|s| s.done)
            .min()
        {
            Some(back) => after.iter().filter(|s| !s.ok && s.sent > back).count(),
            None => 0,
        },
    }
}

/// Every MAC that answers an ARP request for `target` on `iface` of namespace `ns` within
/// `wait` (lowercase, sorted, deduplicated): more than one means several hosts hold the
/// address. The request is broadcast from `iface`'s own MAC and `sender` address.
pub fn arp_answers(
    ns: &Netns,
    iface: &str,
    sender: std::net::Ipv4Addr,
    target: std::net::Ipv4Addr,
    wait: Duration,
) -> anyhow::Result<Vec<String>> {
    use anyhow::Context;
    use std::os::fd::AsRawFd;
    let out = ns.try_ip(&["-j", "link", "show", "dev", iface])?;
    let link: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let index = link[0]["ifindex"].as_i64().context("ifindex")? as i32;
    let mac_text = link[0]["address"]
        .as_str()
        .context("MAC address")?
        .to_string();
    let mut mac = [0u8; 6];
    for (m, part) in mac.iter_mut().zip(mac_text.split(':')) {
        *m = u8::from_str_radix(part, 16)?;
    }
    crate::netns::try_in_netns(ns.name(), move || -> anyhow::Result<Vec<String>> {
        const ETH_P_ARP: u16 = 0x0806;
        let sock = socket2::Socket::new(
            socket2::Domain::PACKET,
            socket2::Type::RAW,
            Some(socket2::Protocol::from(i32::from(ETH_P_ARP.to_be()))),
        )?;
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before we fill it in.
        let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        ll.sll_family = libc::AF_PACKET as u16;
        ll.sll_protocol = ETH_P_ARP.to_be();
        ll.sll_ifindex = index;
        ll.sll_halen = 6;
        ll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `ll` is a valid sockaddr_ll of `len` bytes; the fd is open.
        if unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&ll as *const libc::sockaddr_ll).cast(),
                len,
            )
        } < 0
        {
            return Err(std::io::Error::last_os_error().into());
        }
        let mut frame = [0u8; 42];
        frame[0..6].copy_from_slice(&[0xff; 6]);
        frame[6..12].copy_from_slice(&mac);
        frame[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
        frame[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
        frame[22..28].copy_from_slice(&mac);
        frame[28..32].copy_from_slice(&sender.octets());
        frame[38..42].copy_from_slice(&target.octets());
        // SAFETY: the frame and `ll` are live buffers of the lengths passed.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&ll as *const libc::sockaddr_ll).cast(),
                len,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let deadline = Instant::now() + wait;
        let mut macs = std::collections::BTreeSet::new();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 128];
        while Instant::now() < deadline {
            let Ok(n) = sock.recv(&mut buf) else { continue };
            // SAFETY: recv initialised the first `n` bytes.
            let f = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
            if n >= 42
                && f[12..14] == ETH_P_ARP.to_be_bytes()
                && f[20..22] == [0, 2]
                && f[28..32] == target.octets()
            {
                macs.insert(
                    f[22..28]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(":"),
                );
            }
        }
        Ok(macs.into_iter().collect())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("ARP probe thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_splits_failures_around_the_event() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Each request takes 50 ms; the one sent at 120 is under way at the event (150).
        let s = |sent: u64, ok| Sample {
            sent: at(sent),
            done: at(sent + 50),
            ok,
        };
        let samples = vec![
            s(0, true),
            s(120, false),
            s(200, false),
            s(300, false),
            s(400, true),
            s(500, false),
            s(600, true),
        ];
        let o = outage(&samples, at(150));
        assert_eq!(o.failures_before, 0, "the one under way counts as after");
        assert_eq!(o.failures_after, 4);
        assert_eq!(o.last_failure, Some(Duration::from_millis(350)));
        assert_eq!(o.first_success, Some(Duration::from_millis(250)));
        assert_eq!(o.requests_after, 6);
        // The first answer after the event came at 450; the one sent at 500 failed after it.
        assert_eq!(o.failures_after_back, 1);
        // At 250 the one sent at 120 had given up; the one sent at 200 was still under way.
        let o = outage(&samples, at(250));
        assert_eq!(o.failures_before, 1);
    }
}
