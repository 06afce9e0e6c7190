//! One HTTP(S) GET for a health check, over hyper; HTTPS without certificate verification
//! (health endpoints use self-signed or cluster-CA certificates; the check is about the
//! local service answering, not about authenticating it).

use std::sync::Arc;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Errors of one GET.
#[derive(Debug, thiserror::Error)]
pub enum HttpCheckError {
    /// The URL is not `http(s)://IP[:port]/path`.
    #[error("url {0:?}: expected http(s)://<ip>[:port]/path")]
    Url(String),
    /// Connect, TLS or HTTP failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// HTTP failed.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// GETs `url` and returns the status code.
pub async fn get_status(url: &str) -> Result<u16, HttpCheckError> {
    let uri: http::Uri = url.parse().map_err(|_| HttpCheckError::Url(url.into()))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(HttpCheckError::Url(url.into())),
    };
    let host = uri.host().ok_or_else(|| HttpCheckError::Url(url.into()))?;
    let ip: std::net::IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| HttpCheckError::Url(url.into()))?;
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let tcp = tokio::net::TcpStream::connect((ip, port)).await?;
    let req = http::Request::get(path)
        .header(http::header::HOST, host)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|_| HttpCheckError::Url(url.into()))?;
    if tls {
        let connector = unverified_tls_connector();
        let name = ServerName::IpAddress(ip.into());
        let stream = connector.connect(name, tcp).await?;
        send(TokioIo::new(stream), req).await
    } else {
        send(TokioIo::new(tcp), req).await
    }
}

async fn send<IO>(io: IO, req: http::Request<Empty<bytes::Bytes>>) -> Result<u16, HttpCheckError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    let conn = tokio::spawn(conn);
    let resp = sender.send_request(req).await?;
    conn.abort();
    Ok(resp.status().as_u16())
}

/// A TLS client that accepts any server certificate, for health checks (haproxy's
/// `verify none`): they ask whether a local or cluster service answers, not who it is, and
/// the certificates are self-signed or from a CA the node may not hold.
pub fn unverified_tls_connector() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Accepts any server certificate (see [`unverified_tls_connector`]), still checking
/// signatures so the handshake itself is sound.
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
