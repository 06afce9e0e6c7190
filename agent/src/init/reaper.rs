//! Reaping orphans as PID 1. The supervisor's own children are left to tokio (which waits on
//! their pids); anything else that dies with PID 1 as parent is reaped here, found by
//! scanning `/proc` on SIGCHLD and every few seconds, so no zombie outlives a second or two.

use std::time::Duration;

/// The pids of zombie children of PID 1 in a `/proc` listing: `(pid, stat line)` pairs.
pub fn zombie_orphans<'a>(stats: impl Iterator<Item = (i32, &'a str)>) -> Vec<i32> {
    stats
        .filter_map(|(pid, stat)| {
            // "pid (comm) S ppid ...": comm may contain spaces and parens; split after the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid: i32 = fields.next()?.parse().ok()?;
            (state == "Z" && ppid == 1).then_some(pid)
        })
        .collect()
}

fn reap_once() {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let stats: Vec<(i32, String)> = entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            Some((pid, std::fs::read_to_string(e.path().join("stat")).ok()?))
        })
        .collect();
    for pid in zombie_orphans(stats.iter().map(|(p, s)| (*p, s.as_str()))) {
        if !crate::supervisor::is_supervised(pid) {
            let _ = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
    }
}

/// Starts the reaper task.
pub fn spawn() {
    tokio::spawn(async {
        let mut sigchld =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        loop {
            match sigchld.as_mut() {
                Some(s) => {
                    let _ = tokio::time::timeout(Duration::from_secs(5), s.recv()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(2)).await,
            }
            let _ = tokio::task::spawn_blocking(reap_once).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_zombies_of_pid_1_only() {
        let stats = [
            (10, "10 (sleep) S 1 10 10 0"),
            (11, "11 (a (weird) name) Z 1 11 11 0"),
            (12, "12 (child) Z 5 12 12 0"),
            (13, "garbage"),
        ];
        assert_eq!(zombie_orphans(stats.iter().map(|(p, s)| (*p, *s))), [11]);
    }
}
