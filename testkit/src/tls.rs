//! Throw-away certificates and TLS server configurations (ring, as the product uses).

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Arc<rustls::ServerConfig> {
    Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap(),
    )
}

/// A server configuration with a self-signed certificate for `localhost` (for clients that
/// do not verify, such as health checks).
pub fn self_signed() -> Arc<rustls::ServerConfig> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    server_config(vec![cert.cert.der().clone()], key)
}

/// [`self_signed`] as a tokio acceptor.
pub fn self_signed_acceptor() -> tokio_rustls::TlsAcceptor {
    tokio_rustls::TlsAcceptor::from(self_signed())
}

/// A CA and a server whose certificate it signed.
#[derive(Debug, Clone)]
pub struct CaSigned {
    /// The server's configuration (certificate for the names asked for).
    pub server: Arc<rustls::ServerConfig>,
    /// The CA certificate, PEM (what clients trust).
    pub ca_pem: String,
}

/// A fresh CA and a server certificate it signed for `names` (DNS names or IP addresses).
pub fn ca_signed(names: &[&str]) -> CaSigned {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    CaSigned {
        server: server_config(vec![CertificateDer::from(leaf.der().to_vec())], key),
        ca_pem: ca.pem(),
    }
}
