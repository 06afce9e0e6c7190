//! The agent process's own resources, from `/proc/self` (the standard Prometheus `process_*`
//! metrics). The parsers are pure and tested on captured files; reading is best effort: a
//! field that cannot be read is 0.

use std::time::{SystemTime, UNIX_EPOCH};

use super::model::ProcessStatus;

/// Clock ticks per second of `/proc/self/stat` times (`sysconf(_SC_CLK_TCK)`; 100 on Linux).
fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map(|t| t as f64)
        .unwrap_or(100.0)
}

/// Page size (`/proc/self/statm` counts pages).
fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .filter(|p| *p > 0)
        .map(|p| p as u64)
        .unwrap_or(4096)
}

/// `(virtual, resident)` bytes from `/proc/self/statm` (`size resident shared ...` in pages).
pub fn parse_statm(statm: &str, page: u64) -> Option<(u64, u64)> {
    let mut f = statm.split_ascii_whitespace();
    let size: u64 = f.next()?.parse().ok()?;
    let resident: u64 = f.next()?.parse().ok()?;
    Some((size * page, resident * page))
}

/// From `/proc/self/stat`: `(utime + stime ticks, threads, start time in ticks since boot)`.
/// The command name (field 2) is in parentheses and may hold spaces, so fields are counted
/// from the last `)`.
pub fn parse_stat(stat: &str) -> Option<(u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name: state is field 3, so field N is f[N - 3].
    let get = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some((get(14)? + get(15)?, get(20)?, get(22)?))
}

/// The soft "Max open files" limit from `/proc/self/limits` (`unlimited` as `u64::MAX`).
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// When the system booted, Unix seconds (`btime` of `/proc/stat`).
pub fn parse_btime(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Reads this process's figures now; `uptime_seconds` is filled in by the caller.
pub fn read() -> ProcessStatus {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut st = ProcessStatus::default();
    if let Some((virt, res)) = parse_statm(&read("/proc/self/statm"), page_size()) {
        st.virtual_memory_bytes = virt;
        st.resident_memory_bytes = res;
    }
    let tck = ticks_per_second();
    if let Some((cpu, threads, start)) = parse_stat(&read("/proc/self/stat")) {
        st.cpu_seconds = cpu as f64 / tck;
        st.threads = threads;
        if let Some(btime) = parse_btime(&read("/proc/stat")) {
            st.start_time_seconds = btime as f64 + start as f64 / tck;
        }
    }
    if st.start_time_seconds == 0.0 {
        st.start_time_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
    }
    st.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    st.max_fds = parse_max_fds(&read("/proc/self/limits")).unwrap_or(0);
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            parse_statm("3000 500 200 100 0 400 0\n", 4096),
            Some((3000 * 4096, 500 * 4096))
        );
        assert_eq!(parse_statm("", 4096), None);
        // A command name with spaces and a parenthesis must not shift the fields.
        let stat = "4242 (keelson (a) b) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 50 0 0 20 0 7 0 12345 100000 500 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((200, 7, 12345)));
        assert_eq!(parse_stat("garbage"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds("Max open files            unlimited            unlimited   files"),
            Some(u64::MAX)
        );
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn reads_this_process() {
        let st = read();
        assert!(
            st.resident_memory_bytes > 0 && st.virtual_memory_bytes >= st.resident_memory_bytes
        );
        assert!(st.open_fds >= 3 && st.max_fds >= st.open_fds, "{st:?}");
        assert!(st.threads >= 1);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            st.start_time_seconds <= now + 1.0 && st.start_time_seconds > now - 86400.0 * 365.0
        );
    }
}
