//! The harness's own network namespace: the host-side participant on the test segment.
//! Created and removed by the harness; nothing in it reaches any other network.

use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// A network namespace, deleted on drop when this handle created it.
#[derive(Debug)]
pub struct Netns {
    /// Its name (`ip netns`).
    pub name: String,
    owned: bool,
}

impl Netns {
    /// Creates `name` (removing a stale one of the same name first) with loopback up.
    pub fn create(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Netns {
            name: name.into(),
            owned: true,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on a namespace someone else created (not deleted on drop).
    pub fn existing(name: &str) -> Self {
        Netns {
            name: name.into(),
            owned: false,
        }
    }

    /// `ip -n <ns> ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command run inside the namespace (`ip netns exec`), by its absolute path so that a
    /// missing program is found missing here (the harness checks [`crate::tools::COMMANDS`]
    /// before it starts) rather than as `ip`'s exit status 255 later.
    pub fn command(&self, program: &str) -> Command {
        match crate::tools::find(program) {
            Some(path) => self.command_path(&path),
            None => self.command_path(std::path::Path::new(program)),
        }
    }

    /// [`Netns::command`] for a program given by path.
    pub fn command_path(&self, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// A TCP listener bound to `addr` inside the namespace (the socket keeps its namespace
    /// whichever thread uses it afterwards).
    pub fn bind_tcp(&self, addr: std::net::SocketAddr) -> Result<std::net::TcpListener> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || -> Result<std::net::TcpListener> {
            let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering {path}"))?;
            std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
    }

    /// The MAC address the namespace's neighbour table holds for `ip`, if any.
    pub fn neighbour_mac(&self, ip: &str) -> Option<String> {
        let out = self.ip(&["neigh", "show", ip]).ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        words.get(at + 1).map(|m| m.to_ascii_lowercase())
    }

    /// Forgets the neighbour entry for `ip`, so the next packet ARPs afresh.
    pub fn flush_neighbour(&self, ip: &str) {
        let _ = self.ip(&["neigh", "flush", "to", ip]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs `cmd` with `input` on its standard input; its output, whatever its exit status.
pub fn output_with_stdin(cmd: &mut Command, input: &str) -> Result<Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    Ok(child.wait_with_output()?)
}

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}
