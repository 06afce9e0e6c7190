//! Backend health checks: TCP connect, or TLS `GET /readyz` without certificate
//! verification (haproxy's `check-ssl verify none`: the API servers' serving certificate is
//! signed by a CA this node may not have, and the check is about liveness, not identity).

use std::net::SocketAddr;
use std::time::Duration;

use keelson_cluster::cluster::BackendCheck;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The check did not finish in time.
    #[error("check timed out after {0:?}")]
    Timeout(Duration),
    /// Connecting or talking failed.
    #[error("{stage}: {source}")]
    Io {
        /// What the check was doing.
        stage: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The backend answered something that is not an HTTP status line.
    #[error("expected an HTTP/1.x status line, got {0:?}")]
    Garbage(String),
    /// The backend answered a status other than 200.
    #[error("/readyz answered {0}, expected 200")]
    Status(u16),
}

/// Parses the status code out of the start of an HTTP/1.x response.
pub fn parse_status(head: &[u8]) -> Result<u16, CheckError> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = &head[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let garbage =
        || CheckError::Garbage(String::from_utf8_lossy(&line[..line.len().min(64)]).into());
    let mut parts = line.splitn(3, |&b| b == b' ');
    let version = parts.next().ok_or_else(garbage)?;
    if !(version == b"HTTP/1.1" || version == b"HTTP/1.0") {
        return Err(garbage());
    }
    let code = parts.next().ok_or_else(garbage)?;
    if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
        return Err(garbage());
    }
    // Three ASCII digits always parse.
    std::str::from_utf8(code)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(garbage)
}

/// Runs health checks of one kind.
#[derive(Clone)]
pub struct Checker {
    kind: BackendCheck,
    timeout: Duration,
    tls: Option<tokio_rustls::TlsConnector>,
    user_agent: &'static str,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("kind", &self.kind)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Checker {
    /// A checker; each check gives up after `timeout`.
    pub fn new(kind: BackendCheck, timeout: Duration) -> Self {
        let tls = (kind == BackendCheck::TlsReadyz)
            .then(|| tokio_rustls::TlsConnector::from(crate::net::http_client::any_certificate()));
        Self {
            kind,
            timeout,
            tls,
            user_agent: "keelson-proxy-check",
        }
    }

    /// The same checker sending another `User-Agent` (so an apiserver's log tells the
    /// proxy's checks from VRRP's).
    pub fn user_agent(mut self, user_agent: &'static str) -> Self {
        self.user_agent = user_agent;
        self
    }

    /// The check kind.
    pub fn kind(&self) -> BackendCheck {
        self.kind
    }

    /// Checks `addr` once.
    pub async fn check(&self, addr: SocketAddr) -> Result<(), CheckError> {
        match tokio::time::timeout(self.timeout, self.check_inner(addr)).await {
            Ok(r) => r,
            Err(_) => Err(CheckError::Timeout(self.timeout)),
        }
    }

    async fn check_inner(&self, addr: SocketAddr) -> Result<(), CheckError> {
        let io = |stage| move |source| CheckError::Io { stage, source };
        if self.kind == BackendCheck::None {
            return Ok(());
        }
        let tcp = TcpStream::connect(addr).await.map_err(io("connect"))?;
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let name = ServerName::IpAddress(addr.ip().into());
        let mut s = tls.connect(name, tcp).await.map_err(io("TLS handshake"))?;
        let req = format!(
            "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {}\r\nConnection: close\r\n\r\n",
            self.user_agent
        );
        s.write_all(req.as_bytes()).await.map_err(io("send"))?;
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 256];
        while !head.contains(&b'\n') && head.len() < 1024 {
            let n = s.read(&mut buf).await.map_err(io("receive"))?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        match parse_status(&head)? {
            200 => Ok(()),
            code => Err(CheckError::Status(code)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n\r\n").unwrap(), 200);
        assert_eq!(
            parse_status(b"HTTP/1.0 503 Service Unavailable\r\n").unwrap(),
            503
        );
        assert_eq!(parse_status(b"HTTP/1.1 200").unwrap(), 200);
        for bad in [
            &b""[..],
            b"garbage\r\n",
            b"HTTP/2 200 OK\r\n",
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 20x",
        ] {
            assert!(
                matches!(parse_status(bad), Err(CheckError::Garbage(_))),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn status_round_trip(code in 100u16..1000, reason in "[ -~]{0,20}") {
            let line = format!("HTTP/1.1 {code} {reason}\r\n");
            prop_assert_eq!(parse_status(line.as_bytes()).unwrap(), code);
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_status(&bytes);
        }
    }
}
