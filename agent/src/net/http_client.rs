//! The agent's one HTTP/1.1 client, over hyper: the metadata service, Ignition pointer
//! configs and remote files, HTTP health checks and the unicast members' registrations all
//! go through [`HttpClient::send`]. One request per connection (every caller asks once in a
//! while, never in bulk), bounded in time (connect, answer, body) and size (body limit),
//! with one error type that says whether another try may help ([`HttpError::is_transient`],
//! what [`crate::retry::retry`] asks).
//!
//! URLs name IP literals (an IPv6 one may carry a zone: `http://[fe80::a9fe:a9fe%eth0]`), or
//! host names only where a caller allows it: the static agent does no name lookups of its
//! own on the paths that must work before DNS does.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The agent's User-Agent.
pub const USER_AGENT: &str = concat!("keelson-agent/", env!("CARGO_PKG_VERSION"));

/// A failed request. Each variant names the URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The URL is not one the client takes (scheme, host, port, zone).
    #[error("{url}: {expected}")]
    Url {
        /// The URL.
        url: String,
        /// What was expected.
        expected: String,
    },
    /// An `https` URL, but no certificate to trust was given (or none was usable).
    #[error("{url}: {message}")]
    Trust {
        /// The URL.
        url: String,
        /// What is wrong with the trust.
        message: String,
    },
    /// Connecting (TCP) failed.
    #[error("{url}: connect: {source}")]
    Connect {
        /// The URL.
        url: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("{url}: TLS: {source}")]
    Tls {
        /// The URL.
        url: String,
        /// The handshake's error (`InvalidData`: the certificate is not trusted).
        #[source]
        source: std::io::Error,
    },
    /// HTTP itself failed (handshake, request, body).
    #[error("{url}: {source}")]
    Http {
        /// The URL.
        url: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
    /// A step took longer than the client allows.
    #[error("{url}: {step} timed out after {after:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// `connect`, `answer` or `body`.
        step: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The server answered with a status the caller does not take.
    #[error("{url}: HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: StatusCode,
    },
    /// The body is longer than the caller's limit (never retried: it will not get shorter).
    #[error("{url}: longer than the limit of {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit.
        limit: usize,
    },
}

impl HttpError {
    /// Whether another try may succeed: connection failures, timeouts, a TLS handshake cut
    /// short, 5xx (workers get 500 until a master serves them). Not: bad URLs, missing or
    /// failed trust, 4xx, bodies over the limit.
    pub fn is_transient(&self) -> bool {
        match self {
            HttpError::Connect { .. } | HttpError::Http { .. } | HttpError::Timeout { .. } => true,
            // An untrusted certificate will not become trusted by retrying; a reset might.
            HttpError::Tls { source, .. } => source.kind() != std::io::ErrorKind::InvalidData,
            HttpError::Status { status, .. } => status.is_server_error(),
            HttpError::Url { .. } | HttpError::Trust { .. } | HttpError::TooLarge { .. } => false,
        }
    }
}

impl crate::retry::Transient for HttpError {
    fn is_transient(&self) -> bool {
        HttpError::is_transient(self)
    }
}

/// A parsed `http(s)://host[:port]/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// `https`.
    pub https: bool,
    /// The host as written, without brackets or zone (`10.0.0.5`, `fe80::1`, `example`).
    pub host: String,
    /// The host's address when it is an IP literal (with its zone's interface index).
    pub ip: Option<IpAddr>,
    /// The IPv6 zone's interface index (0: none).
    pub scope_id: u32,
    /// The port (80 or 443 when the URL has none).
    pub port: u16,
    /// Whether the URL named the port.
    pub explicit_port: bool,
    /// Path and query, `/` at least.
    pub path: String,
}

impl Url {
    /// Parses `url`. A zone (`%eth0`, or `%25eth0` as RFC 6874 writes it) is resolved to
    /// its interface index here.
    pub fn parse(url: &str) -> Result<Self, HttpError> {
        let bad = |expected: &str| HttpError::Url {
            url: url.to_owned(),
            expected: expected.to_owned(),
        };
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("expected an http:// or https:// URL"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (inside, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("expected a closing ] after the IPv6 host"))?;
            match after {
                "" => (inside, None),
                p => (
                    inside,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad("expected :port after the IPv6 host"))?,
                    ),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("expected a host"));
        }
        let explicit_port = port.is_some();
        let port: u16 = match port {
            Some(p) => p
                .parse()
                .map_err(|_| bad(&format!("expected a port number, got {p:?}")))?,
            None if https => 443,
            None => 80,
        };
        let (literal, zone) = match host.split_once('%') {
            Some((ip, zone)) => (ip, Some(zone.strip_prefix("25").unwrap_or(zone))),
            None => (host, None),
        };
        let ip: Option<IpAddr> = literal.parse().ok();
        let scope_id = match (ip, zone) {
            (Some(IpAddr::V6(_)), Some(zone)) => nix::net::if_::if_nametoindex(zone)
                .map_err(|e| bad(&format!("an interface as the zone, {zone:?}: {e}")))?,
            (_, Some(zone)) => {
                return Err(bad(&format!("an IPv6 address with the zone {zone:?}")));
            }
            _ => 0,
        };
        if ip.is_none()
            && !literal
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(bad(&format!(
                "expected an IP address or a host name, got {literal:?}"
            )));
        }
        Ok(Url {
            https,
            host: literal.to_owned(),
            ip,
            scope_id,
            port,
            explicit_port,
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
        })
    }

    /// The Host header: the host (bracketed when IPv6, without zone) and the port when the
    /// URL named one.
    pub fn host_header(&self) -> String {
        let host = match self.ip {
            Some(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => self.host.clone(),
        };
        if self.explicit_port {
            format!("{host}:{}", self.port)
        } else {
            host
        }
    }

    /// The socket address, when the host is an IP literal.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        Some(match self.ip? {
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, self.port, 0, self.scope_id)),
            ip => SocketAddr::new(ip, self.port),
        })
    }
}

/// How HTTPS servers are trusted.
#[derive(Debug, Clone, Default)]
pub enum Trust {
    /// No HTTPS: an `https` URL is an error.
    #[default]
    None,
    /// Certificates chaining to these roots (the cluster CA).
    Roots(Arc<rustls::ClientConfig>),
    /// Any certificate (health checks only: they ask whether a service answers, not who it
    /// is; haproxy's `verify none`).
    Any,
}

impl Trust {
    /// Trusts the PEM certificates in `pems` (each may hold several). No certificate at all
    /// gives [`Trust::None`].
    pub fn roots_from_pem(pems: &[impl AsRef<[u8]>]) -> Result<Self, TrustError> {
        let mut roots = rustls::RootCertStore::empty();
        for pem in pems {
            for cert in CertificateDer::pem_slice_iter(pem.as_ref()) {
                roots.add(cert?)?;
            }
        }
        if roots.is_empty() {
            return Ok(Trust::None);
        }
        Ok(Trust::Roots(Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
        )))
    }
}

/// A certificate that cannot be trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// Not PEM.
    #[error("CA certificate: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    /// Not a usable certificate.
    #[error("CA certificate: {0}")]
    Certificate(#[from] rustls::Error),
}

/// An HTTP/1.1 client: one request per connection, with the limits it was built with.
#[derive(Debug, Clone)]
pub struct HttpClient {
    trust: Trust,
    connect_timeout: Duration,
    answer_timeout: Duration,
    body_timeout: Duration,
    body_limit: usize,
    names: bool,
}

/// One request: a method, URL, headers of its own and a body.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Method.
    pub method: Method,
    /// URL.
    pub url: &'a str,
    /// Extra headers (Host is the client's; a User-Agent here replaces the agent's).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Body.
    pub body: Bytes,
    /// Connect from this address (a registry takes a registration only from an address it
    /// registers). One the host does not have is left to the kernel.
    pub source: Option<IpAddr>,
    /// The address the server's certificate must name, when not the URL's host (a member
    /// registry reached at a node's own address proves the API VIP's certificate).
    pub server_name: Option<IpAddr>,
}

impl<'a> Request<'a> {
    /// `GET url`.
    pub fn get(url: &'a str) -> Self {
        Request {
            method: Method::GET,
            url,
            headers: Vec::new(),
            body: Bytes::new(),
            source: None,
            server_name: None,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: http::HeaderName, value: &'static str) -> Self {
        self.headers
            .push((name, http::HeaderValue::from_static(value)));
        self
    }
}

/// An answer: status and the whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body (empty for HEAD).
    pub body: Bytes,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client for IP-literal URLs without HTTPS, 5 s to connect, 30 s for the answer,
    /// 60 s for the body, bodies up to 1 MiB.
    pub fn new() -> Self {
        HttpClient {
            trust: Trust::None,
            connect_timeout: Duration::from_secs(5),
            answer_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            body_limit: 1 << 20,
            names: false,
        }
    }

    /// Trusts HTTPS servers as `trust` says.
    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }

    /// Timeouts for the connection (TCP and TLS), the answer's head, and the body.
    pub fn timeouts(mut self, connect: Duration, answer: Duration, body: Duration) -> Self {
        self.connect_timeout = connect;
        self.answer_timeout = answer;
        self.body_timeout = body;
        self
    }

    /// The longest body taken.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Allows host names (looked up by the system resolver), for URLs an operator wrote.
    pub fn with_host_names(mut self) -> Self {
        self.names = true;
        self
    }

    /// `GET url`, any status.
    pub async fn get(&self, url: &str) -> Result<Response, HttpError> {
        self.send(Request::get(url)).await
    }

    /// Sends `req` and reads the whole answer, whatever its status.
    pub async fn send(&self, req: Request<'_>) -> Result<Response, HttpError> {
        self.send_reading(req, true).await
    }

    /// Sends `req` and returns the answer's status without reading the body (health checks:
    /// whether the service answers, not what).
    pub async fn status(&self, req: Request<'_>) -> Result<StatusCode, HttpError> {
        Ok(self.send_reading(req, false).await?.status)
    }

    async fn send_reading(&self, req: Request<'_>, body: bool) -> Result<Response, HttpError> {
        let mut conn = self.open(req.url, req.source, req.server_name).await?;
        self.send_on(&mut conn, req, body).await
    }

    /// Opens a connection to `url`'s server (TCP, and TLS for `https`: the certificate must
    /// name `server_name` when given, else the URL's host), from `source` when given, for
    /// [`HttpClient::send_on`].
    pub async fn open(
        &self,
        url: &str,
        source: Option<IpAddr>,
        server_name: Option<IpAddr>,
    ) -> Result<Connection, HttpError> {
        let parsed = Url::parse(url)?;
        let name = url.to_owned();
        let timeout = |step: &'static str, after: Duration| HttpError::Timeout {
            url: name.clone(),
            step,
            after,
        };
        let tcp = tokio::time::timeout(self.connect_timeout, self.connect(&parsed, source))
            .await
            .map_err(|_| timeout("connect", self.connect_timeout))?
            .map_err(|source| HttpError::Connect {
                url: name.clone(),
                source,
            })?;
        if !parsed.https {
            return Connection::handshake(TokioIo::new(tcp), &name).await;
        }
        let config = match &self.trust {
            Trust::None => {
                return Err(HttpError::Trust {
                    url: name,
                    message: "https, but no certificate authority to trust".into(),
                });
            }
            Trust::Roots(c) => c.clone(),
            Trust::Any => any_certificate(),
        };
        let server = match server_name.or(parsed.ip) {
            Some(ip) => ServerName::IpAddress(ip.into()),
            None => ServerName::try_from(parsed.host.clone()).map_err(|e| HttpError::Url {
                url: name.clone(),
                expected: format!("a server name: {e}"),
            })?,
        };
        let tls = tokio::time::timeout(
            self.connect_timeout,
            tokio_rustls::TlsConnector::from(config).connect(server, tcp),
        )
        .await
        .map_err(|_| timeout("TLS handshake", self.connect_timeout))?
        .map_err(|source| HttpError::Tls {
            url: name.clone(),
            source,
        })?;
        Connection::handshake(TokioIo::new(tls), &name).await
    }

    /// Sends `req` on `conn` (opened by [`HttpClient::open`] for the same server: `req`'s
    /// source and server name are not looked at) and reads the answer, the body only when
    /// `read_body`. The connection stays open for the next request when the server keeps
    /// it ([`Connection::is_open`]).
    pub async fn send_on(
        &self,
        conn: &mut Connection,
        req: Request<'_>,
        read_body: bool,
    ) -> Result<Response, HttpError> {
        let url = Url::parse(req.url)?;
        let name = req.url;
        let mut request = http::Request::builder()
            .method(req.method)
            .uri(url.path.as_str())
            .header(http::header::HOST, url.host_header());
        if !req
            .headers
            .iter()
            .any(|(k, _)| k == http::header::USER_AGENT)
        {
            request = request.header(http::header::USER_AGENT, USER_AGENT);
        }
        for (k, v) in req.headers {
            request = request.header(k, v);
        }
        let request = request
            .body(Full::new(req.body))
            .map_err(|e| HttpError::Url {
                url: name.to_owned(),
                expected: e.to_string(),
            })?;
        self.exchange(&mut conn.sender, request, name, read_body)
            .await
    }

    async fn connect(
        &self,
        url: &Url,
        source: Option<IpAddr>,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let addr = match url.socket_addr() {
            Some(a) => a,
            None if self.names => {
                return tokio::net::TcpStream::connect((url.host.as_str(), url.port)).await;
            }
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("expected an IP address as the host, got {:?}", url.host),
                ));
            }
        };
        let Some(src) = source else {
            return tokio::net::TcpStream::connect(addr).await;
        };
        let sock = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // An address not (yet) on the interface: let the kernel choose; the server says so if
        // its choice is not acceptable.
        if let Err(e) = sock.bind(SocketAddr::new(src, 0)) {
            tracing::debug!(%src, error = %e, "http: cannot send from this address");
        }
        sock.connect(addr).await
    }

    async fn exchange(
        &self,
        sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        request: http::Request<Full<Bytes>>,
        url: &str,
        read_body: bool,
    ) -> Result<Response, HttpError> {
        let http_err = |source| HttpError::Http {
            url: url.to_owned(),
            source,
        };
        let timeout = |step: &'static str, after: Duration| HttpError::Timeout {
            url: url.to_owned(),
            step,
            after,
        };
        async {
            let response = tokio::time::timeout(self.answer_timeout, async {
                // A kept connection is ready once the driver has seen the last answer end.
                sender.ready().await?;
                sender.send_request(request).await
            })
            .await
            .map_err(|_| timeout("answer", self.answer_timeout))?
            .map_err(http_err)?;
            let status = response.status();
            let headers = response.headers().clone();
            if !read_body {
                return Ok(Response {
                    status,
                    headers,
                    body: Bytes::new(),
                });
            }
            let too_large = || HttpError::TooLarge {
                url: url.to_owned(),
                limit: self.body_limit,
            };
            if response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n > self.body_limit as u64)
            {
                return Err(too_large());
            }
            let body = tokio::time::timeout(
                self.body_timeout,
                Limited::new(response.into_body(), self.body_limit).collect(),
            )
            .await
            .map_err(|_| timeout("body", self.body_timeout))?
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => http_err(*e),
                Err(_) => too_large(),
            })?;
            Ok(Response {
                status,
                headers,
                body: body.to_bytes(),
            })
        }
        .await
    }
}

/// An open HTTP/1.1 connection ([`HttpClient::open`]) that carries one request after
/// another while the server keeps it (keep-alive), so a caller that asks the same server
/// again and again (a member renewing its registration) pays the TCP and TLS handshakes
/// once rather than on every request. Closed when dropped.
#[derive(Debug)]
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// Drives the connection; aborted on drop.
    driver: tokio::task::JoinHandle<()>,
}

impl Connection {
    async fn handshake<IO>(io: IO, url: &str) -> Result<Self, HttpError>
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|source| HttpError::Http {
                url: url.to_owned(),
                source,
            })?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Connection { sender, driver })
    }

    /// Whether another request may go out on it: the server has not closed it (a request
    /// still waits until the connection is ready for it).
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A TLS client configuration that accepts any server certificate ([`Trust::Any`]): one
/// for the process, built on first use, as health checks open a connection every few
/// seconds per backend.
pub fn any_certificate() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::LazyLock<Arc<rustls::ClientConfig>> =
        std::sync::LazyLock::new(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            Arc::new(
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default TLS versions")
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                    .with_no_client_auth(),
            )
        });
    CONFIG.clone()
}

/// Accepts any server certificate (see [`Trust::Any`]), still checking signatures so the
/// handshake itself is sound.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_parts_and_refuse_what_is_not_a_url() {
        let u = Url::parse("http://169.254.169.254").unwrap();
        assert_eq!((u.https, u.port, u.path.as_str()), (false, 80, "/"));
        assert_eq!(u.host_header(), "169.254.169.254");
        let u = Url::parse("https://[fd00::5]:22623/config/master?x=1").unwrap();
        assert_eq!(u.socket_addr().unwrap().to_string(), "[fd00::5]:22623");
        assert_eq!(u.host_header(), "[fd00::5]:22623");
        assert_eq!(u.path, "/config/master?x=1");
        let u = Url::parse("http://[fe80::a9fe:a9fe%25lo]/openstack").unwrap();
        assert!(u.scope_id > 0, "zone resolved to lo's index");
        assert_eq!(u.host_header(), "[fe80::a9fe:a9fe]");
        assert!(Url::parse("https://example.com/x").unwrap().ip.is_none());
        for bad in [
            "ftp://10.0.0.1/",
            "http://",
            "http://[fd00::1/",
            "http://10.0.0.1:http/",
            "http://10.0.0.1%eth0/",
            "http://[fe80::1%no-such-interface-here]/",
            "http://a b/",
        ] {
            let e = Url::parse(bad).unwrap_err();
            assert!(matches!(e, HttpError::Url { .. }), "{bad}: {e}");
            assert!(e.to_string().starts_with(bad), "{e}");
            assert!(!e.is_transient());
        }
    }

    #[tokio::test]
    async fn names_are_refused_unless_allowed_and_https_needs_trust() {
        let e = HttpClient::new()
            .get("http://metadata.invalid/")
            .await
            .unwrap_err();
        assert!(
            matches!(e, HttpError::Connect { .. }) && e.to_string().contains("IP address"),
            "{e}"
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}/", listener.local_addr().unwrap());
        let e = HttpClient::new().get(&url).await.unwrap_err();
        assert!(matches!(e, HttpError::Trust { .. }), "{e}");
        assert!(!e.is_transient());
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused_for_good() {
        let url = format!(
            "http://{}/",
            keelson_testkit::http::endless_http_server().await
        );
        let e = HttpClient::new()
            .body_limit(1000)
            .get(&url)
            .await
            .unwrap_err();
        assert!(matches!(e, HttpError::TooLarge { limit: 1000, .. }), "{e}");
        assert!(!e.is_transient());
    }
}
