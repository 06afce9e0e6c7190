//! `dig`, the real DNS client, on the host or in a namespace, and its output read back.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use crate::netns::exec_in;

/// `dig @server -p port ARGS` on the host; its stdout (empty when it could not run).
pub fn dig(server: SocketAddr, args: &[&str]) -> String {
    run(Command::new("dig"), server.ip(), Some(server.port()), args)
}

/// `dig @server ARGS` inside namespace `ns` (port 53).
pub fn dig_in(ns: &str, server: IpAddr, args: &[&str]) -> String {
    run(exec_in(ns, "dig"), server, None, args)
}

fn run(mut cmd: Command, server: IpAddr, port: Option<u16>, args: &[&str]) -> String {
    cmd.arg(format!("@{server}"));
    if let Some(p) = port {
        cmd.args(["-p", &p.to_string()]);
    }
    let out = cmd
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("dig {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The response code in `dig` output (`NOERROR`, `NXDOMAIN`, ...; empty when none came).
pub fn status(out: &str) -> &str {
    out.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("")
}

/// The answer section as `name ttl type data` lines (the class left out).
pub fn answers(out: &str) -> Vec<String> {
    section(out, "ANSWER")
}

/// Section `name` (`ANSWER`, `AUTHORITY`, `ADDITIONAL`) as `name ttl type data` lines.
pub fn section(out: &str, name: &str) -> Vec<String> {
    let head = format!(";; {name} SECTION");
    out.lines()
        .skip_while(|l| !l.starts_with(&head))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{} {} {} {}", f[0], f[1], f[3], f[4..].join(" "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "\n; <<>> DiG 9.18 <<>> @127.0.0.1 api.ocp4.example.com A\n\
;; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: 1\n\
;; flags: qr aa rd; QUERY: 1, ANSWER: 1, AUTHORITY: 0, ADDITIONAL: 1\n\n\
;; ANSWER SECTION:\napi.ocp4.example.com.\t60\tIN\tA\t10.0.0.5\n\n\
;; Query time: 0 msec\n";

    #[test]
    fn status_and_answers_are_read_back() {
        assert_eq!(status(OUT), "NOERROR");
        assert_eq!(answers(OUT), ["api.ocp4.example.com. 60 A 10.0.0.5"]);
        assert_eq!(status(""), "");
        assert!(answers("").is_empty());
        assert!(section(OUT, "ADDITIONAL").is_empty());
    }
}
