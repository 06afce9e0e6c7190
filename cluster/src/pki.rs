//! The cluster's TLS: a root CA and the Ignition server certificate (SANs: the API VIPs,
//! `api-int.<zone>` and `api.<zone>`), made with rcgen and kept in `DIR/tls/`.
//!
//! Reused when present, so rebuilding into the same directory gives the same bytes; validity
//! starts at `SOURCE_DATE_EPOCH` when set. The CA key never leaves `tls/`: nodes get the CA
//! certificate and the server pair only. Beside them, the membership key(s)
//! ([`crate::membership`]), which every node gets.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::cluster::ClusterConfig;

/// File names inside `tls/`.
pub use crate::tls_files as files;

/// The PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// CA certificate.
    pub ca_cert_pem: String,
    /// CA key.
    pub ca_key_pem: String,
    /// Server certificate.
    pub server_cert_pem: String,
    /// Server key.
    pub server_key_pem: String,
    /// Membership key files by name: `membership.key` always, and the rotation files when
    /// the operator put them there.
    pub membership_keys: std::collections::BTreeMap<String, String>,
}

impl Pki {
    /// The ID of the signing membership key (`members.keyId` in `cluster.json`).
    pub fn membership_key_id(&self) -> Option<String> {
        let text = self.membership_keys.get(files::MEMBERSHIP_KEY)?;
        crate::membership::parse_key(text)
            .ok()
            .map(|k| crate::membership::key_id(&k))
    }
}

/// Errors making or loading the PKI.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// rcgen failed.
    #[error("{what}: {source}")]
    Rcgen {
        /// What was being done.
        what: String,
        /// The error.
        source: rcgen::Error,
    },
    /// A membership key file is not one.
    #[error("{path}: {source}")]
    MembershipKey {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: crate::membership::KeyError,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn rc(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError::Rcgen {
        what: what.into(),
        source,
    }
}

fn validity(params: &mut CertificateParams, source_date_epoch: Option<u64>, years: i64) {
    let start = source_date_epoch
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s as i64).ok())
        .unwrap_or_else(time::OffsetDateTime::now_utc);
    params.not_before = start;
    params.not_after = start + time::Duration::days(365 * years);
}

/// The server certificate's names: API VIPs and the API names.
pub fn server_names(cluster: &ClusterConfig) -> Vec<String> {
    let mut names: Vec<String> = cluster.api_vips.iter().map(|v| v.to_string()).collect();
    names.push(format!("api-int.{}", cluster.zone()));
    names.push(format!("api.{}", cluster.zone()));
    names
}

fn server_cert(
    cluster: &ClusterConfig,
    issuer: &Issuer<'_, KeyPair>,
    source_date_epoch: Option<u64>,
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(rc("generating the server key"))?;
    let mut params =
        CertificateParams::new(server_names(cluster)).map_err(rc("server certificate names"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("api-int.{}", cluster.zone()));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    validity(&mut params, source_date_epoch, 10);
    let cert = params
        .signed_by(&key, issuer)
        .map_err(rc("signing the server certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Loads `dir` (reusing whatever is there) or creates what is missing.
pub fn load_or_create(
    dir: &Path,
    cluster: &ClusterConfig,
    source_date_epoch: Option<u64>,
) -> Result<Pki, PkiError> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (ca_cert_pem, ca_key_pem) = match (read(files::CA_CERT), read(files::CA_KEY)) {
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            let key = KeyPair::generate().map_err(rc("generating the CA key"))?;
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc("CA"))?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(
                DnType::CommonName,
                format!("keelson root CA {}", cluster.zone()),
            );
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            validity(&mut params, source_date_epoch, 10);
            let ca =
                CertifiedIssuer::self_signed(params, key).map_err(rc("self-signing the CA"))?;
            (ca.pem(), ca.key().serialize_pem())
        }
    };
    let (server_cert_pem, server_key_pem) =
        match (read(files::SERVER_CERT), read(files::SERVER_KEY)) {
            (Some(cert), Some(key)) => (cert, key),
            _ => {
                let key = KeyPair::from_pem(&ca_key_pem).map_err(rc("tls/ca.key"))?;
                let issuer =
                    Issuer::from_ca_cert_pem(&ca_cert_pem, key).map_err(rc("tls/ca.crt"))?;
                server_cert(cluster, &issuer, source_date_epoch)?
            }
        };
    let mut membership_keys = std::collections::BTreeMap::new();
    for name in files::MEMBERSHIP_KEYS {
        if let Some(text) = read(name) {
            crate::membership::parse_key(&text).map_err(|source| PkiError::MembershipKey {
                path: dir.join(name).display().to_string(),
                source,
            })?;
            membership_keys.insert(name.to_string(), text);
        }
    }
    if !membership_keys.contains_key(files::MEMBERSHIP_KEY) {
        let text = crate::membership::generate().map_err(|source| PkiError::MembershipKey {
            path: dir.join(files::MEMBERSHIP_KEY).display().to_string(),
            source,
        })?;
        membership_keys.insert(files::MEMBERSHIP_KEY.to_string(), text);
    }
    Ok(Pki {
        ca_cert_pem,
        ca_key_pem,
        server_cert_pem,
        server_key_pem,
        membership_keys,
    })
}

impl Pki {
    /// Writes the four files into `dir` (the keys 0600).
    pub fn write(&self, dir: &Path) -> Result<(), PkiError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(|source| PkiError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut all = vec![
            (files::CA_CERT, &self.ca_cert_pem, 0o644),
            (files::CA_KEY, &self.ca_key_pem, 0o600),
            (files::SERVER_CERT, &self.server_cert_pem, 0o644),
            (files::SERVER_KEY, &self.server_key_pem, 0o600),
        ];
        for (name, text) in &self.membership_keys {
            all.push((name.as_str(), text, 0o600));
        }
        for (name, text, mode) in all {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .and_then(|_| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                })
                .map_err(|source| PkiError::Io {
                    path: path.display().to_string(),
                    source,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterConfig {
        crate::install_config::InstallConfig::parse(include_str!(
            "../../examples/install-config.yaml"
        ))
        .unwrap()
        .cluster_config()
    }

    #[test]
    fn created_reused_and_trusted_by_rustls() {
        let dir = tempfile::tempdir().unwrap();
        let c = cluster();
        let pki = load_or_create(dir.path(), &c, Some(1_700_000_000)).unwrap();
        pki.write(dir.path()).unwrap();
        assert_eq!(
            load_or_create(dir.path(), &c, None).unwrap(),
            pki,
            "reused as is"
        );

        // A lost server pair is re-issued by the same CA.
        std::fs::remove_file(dir.path().join(files::SERVER_CERT)).unwrap();
        let again = load_or_create(dir.path(), &c, Some(1_700_000_000)).unwrap();
        assert_eq!(again.ca_cert_pem, pki.ca_cert_pem);
        assert_ne!(again.server_cert_pem, pki.server_cert_pem);

        // rustls accepts the server certificate for the VIP and api-int under the CA.
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(
                rustls::pki_types::CertificateDer::from_pem_slice(again.ca_cert_pem.as_bytes())
                    .unwrap(),
            )
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let cert =
            rustls::pki_types::CertificateDer::from_pem_slice(again.server_cert_pem.as_bytes())
                .unwrap();
        let now = rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
            1_700_000_100,
        ));
        for name in ["10.0.0.5", "api-int.ocp4.osd2019.local"] {
            let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&cert, &[], &server_name, &[], now)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(files::CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
