//! The server's TLS settings from PEM files (rustls with the ring provider).

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The certificate PEM holds no usable `CERTIFICATE` block.
    #[error("{what}: expected PEM `CERTIFICATE` blocks: {detail}")]
    Certificate {
        /// The file or source name.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The key PEM holds no usable private key.
    #[error("{what}: expected a PEM private key (PKCS#8, PKCS#1 or SEC1): {detail}")]
    Key {
        /// The file or source name.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("TLS certificate/key: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A rustls server configuration for the certificate chain `cert_pem` (server
/// certificate first) and its key `key_pem`; `what` names them in errors.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    what: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate {
            what: what.to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificate {
            what: what.to_string(),
            detail: "none found".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key {
        what: what.to_string(),
        detail: e.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    // Ignition speaks HTTP/1.1 only; advertising it lets ALPN clients settle at once.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// [`tls_config`] from files.
pub fn tls_config_from_files(
    cert: &Path,
    key: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    tls_config(
        &read(cert)?,
        &read(key)?,
        &format!("{} / {}", cert.display(), key.display()),
    )
}
