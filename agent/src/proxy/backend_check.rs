//! One check of a backend: a TCP connect, or TLS `GET /readyz` without certificate
//! verification (haproxy's `check-ssl verify none`: the API servers' serving certificate is
//! signed by a CA this node may not have, and the check is about liveness, not identity),
//! through the agent's one HTTP client (`net/http_client.rs`), reading the status only.

use std::net::SocketAddr;
use std::time::Duration;

use keelson_cluster::cluster::BackendCheck;
use tokio::net::TcpStream;

use crate::net::http_client::{HttpClient, HttpError, Request, Trust};

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The check did not finish in time.
    #[error("check timed out after {0:?}")]
    Timeout(Duration),
    /// The TCP connect failed.
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    /// The `GET /readyz` brought no answer (connect, TLS, HTTP).
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The backend answered a status other than 200.
    #[error("/readyz answered {0}, expected 200")]
    Status(u16),
}

/// Runs health checks of one kind.
#[derive(Debug, Clone)]
pub struct Checker {
    kind: BackendCheck,
    timeout: Duration,
    client: HttpClient,
    user_agent: &'static str,
}

impl Checker {
    /// A checker; each check gives up after `timeout`.
    pub fn new(kind: BackendCheck, timeout: Duration) -> Self {
        Self {
            kind,
            timeout,
            // The check as a whole is bounded by `timeout` ([`Checker::check`]).
            client: HttpClient::new()
                .trust(Trust::Any)
                .timeouts(timeout, timeout, timeout),
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
        match self.kind {
            BackendCheck::None => Ok(()),
            BackendCheck::Tcp => TcpStream::connect(addr)
                .await
                .map(drop)
                .map_err(CheckError::Connect),
            BackendCheck::TlsReadyz => {
                let url = format!("https://{addr}/readyz");
                let req = Request::get(&url)
                    .header(http::header::USER_AGENT, self.user_agent)
                    .header(http::header::CONNECTION, "close");
                match self.client.status(req).await?.as_u16() {
                    200 => Ok(()),
                    code => Err(CheckError::Status(code)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that answers the first request on each connection with `answer` and
    /// records the request's head.
    async fn backend(answer: &'static str) -> (SocketAddr, tokio::sync::mpsc::Receiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let acceptor = keelson_testkit::tls::self_signed_acceptor();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 512];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).into_owned()).await;
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn a_ready_apiserver_passes_whatever_its_certificate() {
        let (addr, mut heads) = backend("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let c = Checker::new(BackendCheck::TlsReadyz, Duration::from_secs(5))
            .user_agent("keelson-vrrp-check");
        c.check(addr).await.unwrap();
        let head = heads.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /readyz http/1.1\r\n"), "{head}");
        assert_eq!(
            head.matches("user-agent:").count(),
            1,
            "one User-Agent, the check's: {head}"
        );
        assert!(
            head.contains("user-agent: keelson-vrrp-check\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_status_other_than_200_fails_and_names_it() {
        let (addr, _heads) =
            backend("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        let c = Checker::new(BackendCheck::TlsReadyz, Duration::from_secs(5));
        let e = c.check(addr).await.unwrap_err();
        assert!(matches!(e, CheckError::Status(503)), "{e}");
    }

    #[tokio::test]
    async fn garbage_instead_of_http_fails() {
        let (addr, _heads) = backend("garbage\r\n\r\n").await;
        let c = Checker::new(BackendCheck::TlsReadyz, Duration::from_secs(5));
        let e = c.check(addr).await.unwrap_err();
        assert!(matches!(e, CheckError::Http(_)), "{e}");
    }

    #[tokio::test]
    async fn tcp_checks_connect_only() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let c = Checker::new(BackendCheck::Tcp, Duration::from_secs(5));
        c.check(addr).await.unwrap();
        drop(l);
        let e = c.check(addr).await.unwrap_err();
        assert!(matches!(e, CheckError::Connect(_)), "{e}");
    }
}
