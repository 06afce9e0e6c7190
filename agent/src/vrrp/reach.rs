//! The I/O of the holder's port check ([`super::portsec`]): TCP connects to a few targets,
//! each once from the node's own address and once from the VIP.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::portsec::{Paths, Reach};

/// How long a connect may take before its target counts as silent.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Tries every target from `node`, then from `vip` (after the first connect the node has the
/// target's MAC, so the second does not wait on an ARP request sent from the VIP, which
/// port security would drop too). Targets are tried concurrently.
pub async fn round(node: IpAddr, vip: IpAddr, targets: &[SocketAddr]) -> Vec<Paths> {
    let tries = targets.iter().map(|t| async move {
        let from_node = connect_from(node, *t).await;
        let from_vip = connect_from(vip, *t).await;
        Paths {
            from_node,
            from_vip,
        }
    });
    futures::future::join_all(tries).await
}

/// One connect from `src` to `dst`: answered (connected or refused), silent (timed out, or
/// the host unreachable: its ARP went unanswered), or unknown (could not be tried).
pub async fn connect_from(src: IpAddr, dst: SocketAddr) -> Reach {
    if src.is_ipv4() != dst.is_ipv4() {
        return Reach::Unknown;
    }
    let socket = match if dst.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    } {
        Ok(s) => s,
        Err(_) => return Reach::Unknown,
    };
    if socket.bind(SocketAddr::new(src, 0)).is_err() {
        return Reach::Unknown;
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(dst)).await {
        Err(_) => Reach::Silent,
        Ok(Ok(_)) => Reach::Answered,
        Ok(Err(e)) => match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Reach::Answered,
            std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::TimedOut => Reach::Silent,
            _ => Reach::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answered_refused_and_untried() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(connect_from(lo, open).await, Reach::Answered);
        drop(listener);
        // Nothing listens there now: refused is an answer.
        assert_eq!(connect_from(lo, open).await, Reach::Answered);
        // A source address this host does not have cannot be bound.
        let foreign: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(connect_from(foreign, open).await, Reach::Unknown);
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(connect_from(lo, v6).await, Reach::Unknown);
    }
}
