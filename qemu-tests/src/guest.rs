//! Running a command inside a stand-in node through the QEMU guest agent (`qemu-ga` on a
//! virtio-serial port, `guest-exec`): how the harness reads a node's own resolver, its
//! NetworkManager state, nftables and journal without SSH or a network path of its own.
//!
//! The protocol is QMP-shaped JSON, one object per line. On QEMU's own socket each call opens
//! it, sends `guest-sync-delimited` (the agent answers after a 0xFF byte, which resynchronises
//! a parser left mid-object by an earlier, abandoned call), then the command. A libvirt
//! domain's agent (Nova's guests) is libvirt's to talk to: `virsh qemu-agent-command`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};

/// Where a node's guest agent is reached.
#[derive(Debug, Clone)]
pub enum GuestChannel {
    /// The unix socket QEMU listens on (QEMU's side of the virtio-serial port).
    Socket(PathBuf),
    /// A libvirt domain (by name), whose agent socket libvirt holds.
    Libvirt(String),
}

/// One node's guest agent.
#[derive(Debug, Clone)]
pub struct GuestAgent {
    /// How to reach it.
    pub channel: GuestChannel,
}

/// One conversation with a guest agent.
enum Session {
    Socket(Conn),
    Libvirt(String),
}

impl Session {
    fn open(channel: &GuestChannel, timeout: Duration) -> Result<Self> {
        Ok(match channel {
            GuestChannel::Socket(path) => Session::Socket(Conn::open(path, timeout)?),
            GuestChannel::Libvirt(domain) => Session::Libvirt(domain.clone()),
        })
    }

    fn call(&mut self, v: &Value) -> Result<Value> {
        match self {
            Session::Socket(conn) => conn.call(v),
            Session::Libvirt(domain) => {
                let out = std::process::Command::new("virsh")
                    .args([
                        "-c",
                        "qemu:///system",
                        "qemu-agent-command",
                        "--timeout",
                        "10",
                    ])
                    .arg(&*domain)
                    .arg(v.to_string())
                    .output()
                    .context("running virsh qemu-agent-command")?;
                if !out.status.success() {
                    bail!(
                        "guest agent of {domain}: {} failed: {}",
                        v["execute"],
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                let answer: Value = serde_json::from_slice(&out.stdout)
                    .context("virsh qemu-agent-command: expected JSON")?;
                Ok(answer["return"].clone())
            }
        }
    }
}

/// What a command run in the guest gave back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i64>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// The QEMU arguments that give a VM a guest agent port on `socket`.
pub fn qemu_args(socket: &std::path::Path) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!(
            "socket,id=qga0,path={},server=on,wait=off",
            socket.display()
        ),
        "-device".into(),
        "virtio-serial-pci".into(),
        "-device".into(),
        "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0".into(),
    ]
}

struct Conn {
    reader: BufReader<UnixStream>,
}

impl Conn {
    fn open(socket: &std::path::Path, timeout: Duration) -> Result<Self> {
        let stream = UnixStream::connect(socket)
            .with_context(|| format!("connecting to the guest agent at {}", socket.display()))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = Conn {
            reader: BufReader::new(stream),
        };
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = (u64::from(std::process::id()) << 20)
            + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        conn.send(&json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}))?;
        // Skip to the delimiter, then to the answer carrying our id.
        let mut byte = [0u8; 1];
        loop {
            conn.reader
                .read_exact(&mut byte)
                .context("the guest agent did not answer guest-sync (not running yet?)")?;
            if byte[0] == 0xff {
                break;
            }
        }
        loop {
            let v = conn.recv()?;
            if v["return"].as_u64() == Some(id) {
                return Ok(conn);
            }
        }
    }

    fn send(&mut self, v: &Value) -> Result<()> {
        let mut line = serde_json::to_vec(v)?;
        line.push(b'\n');
        self.reader.get_mut().write_all(&line)?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Value> {
        loop {
            let mut line = String::new();
            if self
                .reader
                .read_line(&mut line)
                .context("reading from the guest agent")?
                == 0
            {
                bail!("the guest agent closed the connection");
            }
            let line = line.trim_matches(|c: char| c.is_whitespace() || c == '\u{ff}');
            if line.is_empty() {
                continue;
            }
            return serde_json::from_str(line)
                .with_context(|| format!("guest agent sent {line:?}, expected JSON"));
        }
    }

    fn call(&mut self, v: &Value) -> Result<Value> {
        self.send(v)?;
        let answer = self.recv()?;
        if let Some(err) = answer.get("error") {
            bail!("guest agent: {} failed: {err}", v["execute"]);
        }
        Ok(answer["return"].clone())
    }
}

impl GuestAgent {
    /// Runs `argv` in the guest and waits (up to `timeout`) for it to exit.
    pub fn exec(&self, argv: &[&str], timeout: Duration) -> Result<ExecOutput> {
        let (path, args) = argv.split_first().context("empty command")?;
        let start = Instant::now();
        let mut conn = Session::open(&self.channel, Duration::from_secs(5))?;
        let ret = conn.call(&json!({
            "execute": "guest-exec",
            "arguments": {"path": path, "arg": args, "capture-output": true}
        }))?;
        let pid = ret["pid"]
            .as_i64()
            .context("guest-exec: expected a pid in the answer")?;
        loop {
            let st =
                conn.call(&json!({"execute": "guest-exec-status", "arguments": {"pid": pid}}))?;
            if st["exited"].as_bool() == Some(true) {
                let text = |key: &str| {
                    st[key]
                        .as_str()
                        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default()
                };
                return Ok(ExecOutput {
                    code: st["exitcode"].as_i64(),
                    stdout: text("out-data"),
                    stderr: text("err-data"),
                });
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} did not exit within {timeout:?} in the guest",
                    argv.join(" ")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `argv` and returns its standard output if it exited 0.
    pub fn output(&self, argv: &[&str], timeout: Duration) -> Result<String> {
        let out = self.exec(argv, timeout)?;
        if out.code != Some(0) {
            bail!(
                "`{}` in the guest exited {:?}: {}{}",
                argv.join(" "),
                out.code,
                out.stderr.trim(),
                out.stdout.trim()
            );
        }
        Ok(out.stdout)
    }

    /// Waits until the agent answers (the guest has booted far enough).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let answered = Session::open(&self.channel, Duration::from_secs(2))
                .and_then(|mut s| s.call(&json!({"execute": "guest-ping"})));
            match answered {
                Ok(_) => return Ok(()),
                Err(e) if start.elapsed() > timeout => {
                    return Err(e.context(format!("guest agent not answering after {timeout:?}")));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}
