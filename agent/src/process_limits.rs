//! The process's resource limits the agent raises for itself at start.

/// Raises the soft limit of open files to the hard limit, and says what it is.
///
/// A control-plane node's member registry keeps a connection open to every node of the
/// cluster (each keeps its registrations' connection across renewals), on top of the
/// proxy's and DNS's sockets: the soft limit systemd and the
/// kernel give a service or PID 1 (1024) is below what a cluster of a thousand nodes holds.
/// The hard limit is what the operator allows; nothing above it is asked for.
pub fn raise_open_files() -> Option<libc::rlim_t> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct given, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    Some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let now = raise_open_files().expect("getrlimit");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max, "soft raised to hard");
        assert_eq!(now, lim.rlim_cur);
    }
}
