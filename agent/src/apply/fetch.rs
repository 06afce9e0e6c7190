//! HTTPS (and plain HTTP) GET for pointer configs and remote file sources, trusting only the
//! CAs the Ignition config names (the cluster root CA), as Ignition itself does.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// The Accept header Ignition 3.x sends, so the server negotiates the spec version.
pub const ACCEPT: &str = "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1";

/// A failed fetch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Worth retrying: connection refused, timeouts, 5xx (workers get 500 until a master
    /// serves them).
    #[error("{url}: {message} (will retry)")]
    Transient {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
    },
    /// The answer is longer than the caller's limit (never retried).
    #[error("{url}: longer than the limit of {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// Not worth retrying: bad URL, 4xx, TLS trust failure, no CA for HTTPS.
    #[error("{url}: {message}")]
    Permanent {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
    },
}

/// GETs `url` once. `cas` are PEM certificates trusted for HTTPS; a body longer than `limit`
/// bytes is refused (for good: a longer answer will not get shorter).
pub async fn get(url: &str, cas: &[Vec<u8>], limit: usize) -> Result<Vec<u8>, FetchError> {
    let permanent = |m: String| FetchError::Permanent {
        url: url.to_owned(),
        message: m,
    };
    let transient = |m: String| FetchError::Transient {
        url: url.to_owned(),
        message: m,
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| permanent(format!("bad URL: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(permanent("expected an http:// or https:// URL".into())),
    };
    let host = uri
        .host()
        .ok_or_else(|| permanent("no host".into()))?
        .to_owned();
    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_owned();
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect((bare_host.as_str(), port)),
    )
    .await
    .map_err(|_| transient("connect timed out".into()))?
    .map_err(|e| transient(format!("connect: {e}")))?;

    let request = hyper::Request::get(&path)
        .header(hyper::header::HOST, host.as_str())
        .header(hyper::header::ACCEPT, ACCEPT)
        .header(
            hyper::header::USER_AGENT,
            concat!("keelson-agent/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| permanent(e.to_string()))?;

    let response = if https {
        if cas.is_empty() {
            return Err(permanent(
                "https source but the config names no certificate authority \
                 (ignition.security.tls.certificateAuthorities)"
                    .into(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for pem in cas {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| permanent(format!("CA certificate: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| permanent(format!("CA certificate: {e}")))?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| permanent(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = ServerName::try_from(bare_host.clone())
            .map_err(|e| permanent(format!("server name: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| {
                // An untrusted certificate will not become trusted by retrying; a reset might.
                if e.kind() == std::io::ErrorKind::InvalidData {
                    permanent(format!("TLS: {e}"))
                } else {
                    transient(format!("TLS: {e}"))
                }
            })?;
        send(hyper_util::rt::TokioIo::new(tls), request).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), request).await
    }
    .map_err(transient)?;

    let status = response.status();
    if status.is_server_error() {
        return Err(transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(permanent(format!("HTTP {status}")));
    }
    if response
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64)
    {
        return Err(FetchError::TooLarge {
            url: url.to_owned(),
            limit,
        });
    }
    let body = tokio::time::timeout(
        Duration::from_secs(60),
        http_body_util::Limited::new(response.into_body(), limit).collect(),
    )
    .await
    .map_err(|_| transient("body timed out".into()))?
    .map_err(|e| {
        if e.is::<http_body_util::LengthLimitError>() {
            FetchError::TooLarge {
                url: url.to_owned(),
                limit,
            }
        } else {
            transient(e.to_string())
        }
    })?;
    Ok(body.to_bytes().to_vec())
}

async fn send<T>(
    io: T,
    request: hyper::Request<Empty<bytes::Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .map_err(|_| "no response within 30 s".to_owned())?
        .map_err(|e| format!("request: {e}"))
}

impl crate::retry::Transient for FetchError {
    fn is_transient(&self) -> bool {
        matches!(self, FetchError::Transient { .. })
    }
}

/// GETs with retries (the agent's retry policy: 0.5 s doubling to 10 s, with jitter) while
/// the failure is transient, until `timeout` (None: forever, as a booting node does). Each
/// retry says on the console what failed and when the next try is.
pub async fn get_with_retry(
    url: &str,
    cas: &[Vec<u8>],
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, FetchError> {
    let backoff = crate::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    crate::retry::retry("fetch", backoff, timeout, || get(url, cas, limit)).await
}
