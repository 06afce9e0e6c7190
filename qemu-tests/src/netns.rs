//! The harness's own network namespace, the host-side participant on the test segment:
//! testkit's [`Netns`], with what the harness adds to it (programs looked up on the
//! machine first, a listener bound with an error instead of a panic, the neighbour table).
//! Created and removed by the harness; nothing in it reaches any other network.

use std::process::{Command, Output};

use anyhow::{Context, Result};

pub use keelson_testkit::Netns;
pub use keelson_testkit::netns::{enter, try_in_netns};

/// What the harness does with a [`Netns`] beyond testkit's own methods.
pub trait HarnessNetns {
    /// A command run inside the namespace (`ip netns exec`), by its absolute path so that
    /// a missing program is found missing here (the harness checks
    /// [`crate::tools::COMMANDS`] before it starts) rather than as `ip`'s exit status 255
    /// later.
    fn command(&self, program: &str) -> Command;

    /// A TCP listener bound to `addr` inside the namespace (the socket keeps its namespace
    /// whichever thread uses it afterwards).
    fn bind_tcp(&self, addr: std::net::SocketAddr) -> Result<std::net::TcpListener>;

    /// The MAC address the namespace's neighbour table holds for `ip`, if any.
    fn neighbour_mac(&self, ip: &str) -> Option<String>;

    /// Forgets the neighbour entry for `ip`, so the next packet ARPs afresh.
    fn flush_neighbour(&self, ip: &str);
}

impl HarnessNetns for Netns {
    fn command(&self, program: &str) -> Command {
        match crate::tools::find(program) {
            Some(path) => self.exec(path),
            None => self.exec(program),
        }
    }

    fn bind_tcp(&self, addr: std::net::SocketAddr) -> Result<std::net::TcpListener> {
        try_in_netns(self.name(), move || -> Result<std::net::TcpListener> {
            std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
    }

    fn neighbour_mac(&self, ip: &str) -> Option<String> {
        let out = self.try_ip(&["neigh", "show", ip]).ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        words.get(at + 1).map(|m| m.to_ascii_lowercase())
    }

    fn flush_neighbour(&self, ip: &str) {
        let _ = self.try_ip(&["neigh", "flush", "to", ip]);
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
