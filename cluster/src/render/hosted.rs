//! The pointer config for a config hosted elsewhere (docs/openstack.md, "A bootstrap config
//! over the user_data limit"): Nova takes at most 65,535 bytes of base64 as user_data, and a
//! bootstrap config carrying a distribution's own configuration (OpenShift's is hundreds of
//! KiB) does not fit. As OpenShift's installer does for its own bootstrap, the full config is
//! put where the node can fetch it (Glance, an object store, any HTTP server) and the node
//! boots from a small config that merges it: the URL, the full config's sha512 (so the copy
//! fetched is the one written), the HTTP headers the host wants (Glance: `X-Auth-Token`) and
//! the CAs to trust for it.
//!
//! The pointer is written in the hosted config's own spec, as Ignition merges configs of one
//! major version. Headers are `httpHeaders`, which Ignition has from spec 3.1.0 on: a 2.2 or
//! 3.0 config with headers is refused, not written without them.

use sha2::{Digest, Sha512};

use super::{RenderError, V3Config, in_spec, plain_data_url, to_bytes, v22};
use crate::version::SpecVersion;

/// Where the full config is hosted and how to fetch it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostedSource {
    /// The URL (`http://` or `https://`).
    pub url: String,
    /// Headers to send with the request, as (name, value).
    pub headers: Vec<(String, String)>,
    /// CAs (PEM) to trust for an `https://` URL; the appliance trusts no others.
    pub cas: Vec<String>,
}

/// Why no pointer could be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostedError {
    /// The hosted config is not an Ignition config keelson can point at.
    #[error("the hosted config: {0}")]
    Config(String),
    /// The URL is not one Ignition fetches with headers and a CA.
    #[error("--source {0:?}: expected an http:// or https:// URL")]
    Url(String),
    /// A header name is not an HTTP token.
    #[error("--header {0:?}: expected NAME=VALUE with NAME an HTTP header name")]
    Header(String),
    /// The spec has no `httpHeaders`.
    #[error(
        "the hosted config is spec {0}, which has no httpHeaders (Ignition reads them from spec 3.1.0 on): \
         host it where the URL alone reaches it (no --header), or build it with --spec 3.1.0 or newer"
    )]
    NoHeaders(SpecVersion),
    /// An HTTPS URL and no CA to check it with.
    #[error("--source {0}: an https:// URL needs the CA that signed its certificate (--ca FILE)")]
    NoCa(String),
    /// Writing the typed config failed.
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// Whether `name` is an HTTP header name (RFC 9110's token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses `NAME=VALUE` (the command line's form of a header).
pub fn parse_header(text: &str) -> Result<(String, String), HostedError> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| HostedError::Header(text.to_owned()))?;
    if !is_header_name(name) || value.bytes().any(|b| b == b'\r' || b == b'\n') {
        return Err(HostedError::Header(text.to_owned()));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// The spec of `config` (its `ignition.version`), when keelson writes that spec.
pub fn spec_of(config: &[u8]) -> Result<SpecVersion, HostedError> {
    let doc: serde_json::Value = serde_json::from_slice(config)
        .map_err(|e| HostedError::Config(format!("expected Ignition JSON: {e}")))?;
    let version = doc["ignition"]["version"]
        .as_str()
        .ok_or_else(|| HostedError::Config("expected ignition.version".into()))?;
    version
        .parse()
        .map_err(|e: crate::version::UnsupportedVersion| HostedError::Config(e.to_string()))
}

/// The pointer config that merges `hosted` (the full config's bytes) from `source`.
pub fn pointer_to(hosted: &[u8], source: &HostedSource) -> Result<Vec<u8>, HostedError> {
    use ignition_config::v3_5::{
        HttpHeadersItem, IgnitionConfig, Resource, Security, SecurityTls, Verification,
    };
    let spec = spec_of(hosted)?;
    super::read(hosted).map_err(|e| HostedError::Config(e.to_string()))?;
    let https = source.url.starts_with("https://");
    if !https && !source.url.starts_with("http://") || source.url.contains(char::is_whitespace) {
        return Err(HostedError::Url(source.url.clone()));
    }
    if https && source.cas.is_empty() {
        return Err(HostedError::NoCa(source.url.clone()));
    }
    for (name, value) in &source.headers {
        parse_header(&format!("{name}={value}"))?;
    }
    if !source.headers.is_empty() && matches!(spec, SpecVersion::V2_2 | SpecVersion::V3_0) {
        return Err(HostedError::NoHeaders(spec));
    }
    let mut config = V3Config::default();
    config.ignition.version = spec.as_str().to_owned();
    config.ignition.config = Some(IgnitionConfig {
        merge: Some(vec![Resource {
            source: Some(source.url.clone()),
            verification: Some(Verification {
                hash: Some(format!("sha512-{}", hex::encode(Sha512::digest(hosted)))),
            }),
            http_headers: (!source.headers.is_empty()).then(|| {
                source
                    .headers
                    .iter()
                    .map(|(name, value)| HttpHeadersItem {
                        name: name.clone(),
                        value: Some(value.clone()),
                    })
                    .collect()
            }),
            ..Resource::default()
        }]),
        ..IgnitionConfig::default()
    });
    if !source.cas.is_empty() {
        config.ignition.security = Some(Security {
            tls: Some(SecurityTls {
                certificate_authorities: Some(
                    source
                        .cas
                        .iter()
                        .map(|pem| Resource {
                            source: Some(plain_data_url(pem.as_bytes())),
                            ..Resource::default()
                        })
                        .collect(),
                ),
            }),
        });
    }
    use ignition_config::{v3_1, v3_2, v3_3, v3_4};
    Ok(match spec {
        SpecVersion::V2_2 => to_bytes(&v22::from_v3(&config), spec)?,
        SpecVersion::V3_0 => in_spec::<ignition_config::v3_0::Config>(&config, spec)?,
        SpecVersion::V3_1 => in_spec::<v3_1::Config>(&config, spec)?,
        SpecVersion::V3_2 => in_spec::<v3_2::Config>(&config, spec)?,
        SpecVersion::V3_3 => in_spec::<v3_3::Config>(&config, spec)?,
        SpecVersion::V3_4 => in_spec::<v3_4::Config>(&config, spec)?,
        SpecVersion::V3_5 => to_bytes(&config, spec)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{check_user_data, read};

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    /// A full config of `spec` of about `size` bytes (one big inline file).
    fn full(spec: SpecVersion, size: usize) -> Vec<u8> {
        let model = crate::render::Model {
            files: vec![crate::render::FileSpec {
                path: "/etc/big".into(),
                mode: 0o644,
                // Incompressible, so the data URL stays as large as asked.
                contents: crate::render::Contents::Inline(
                    (0..size.div_ceil(64) as u64)
                        .flat_map(|i| Sha512::digest(i.to_le_bytes()).to_vec())
                        .take(size)
                        .collect(),
                ),
            }],
            ..Default::default()
        };
        crate::render::write(&model, spec).unwrap()
    }

    fn source(headers: &[(&str, &str)]) -> HostedSource {
        HostedSource {
            url: "http://172.24.4.2:9292/v2/images/0c6f/file".into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            cas: vec![CA.into()],
        }
    }

    #[test]
    fn a_large_config_boots_from_a_small_pointer() {
        let big = full(SpecVersion::V3_2, 200_000);
        assert!(check_user_data("bootstrap.ign", &big).is_err());
        let pointer = pointer_to(&big, &source(&[("X-Auth-Token", "gAAAA-token")])).unwrap();
        check_user_data("bootstrap pointer", &pointer).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&pointer).unwrap();
        assert_eq!(doc["ignition"]["version"], "3.2.0");
        let merge = &doc["ignition"]["config"]["merge"][0];
        assert_eq!(
            merge["source"],
            "http://172.24.4.2:9292/v2/images/0c6f/file"
        );
        assert_eq!(
            merge["verification"]["hash"],
            format!("sha512-{}", hex::encode(Sha512::digest(&big)))
        );
        assert_eq!(
            merge["httpHeaders"],
            serde_json::json!([{"name": "X-Auth-Token", "value": "gAAAA-token"}])
        );
        assert!(
            doc["ignition"]["security"]["tls"]["certificateAuthorities"][0]["source"]
                .as_str()
                .unwrap()
                .starts_with("data:")
        );
        // What the agent and Ignition read back.
        let back = read(&pointer).unwrap();
        let reference = &back.config.ignition.config.unwrap().merge.unwrap()[0];
        assert_eq!(
            reference.http_headers.as_ref().unwrap()[0].name,
            "X-Auth-Token"
        );
    }

    #[test]
    fn the_pointer_has_the_hosted_configs_spec() {
        for spec in SpecVersion::ALL {
            let hosted = full(spec, 100);
            let headers: &[(&str, &str)] = if spec.major_minor() >= (3, 1) {
                &[("X-Auth-Token", "t")]
            } else {
                &[]
            };
            let pointer = pointer_to(&hosted, &source(headers)).unwrap();
            assert_eq!(spec_of(&pointer).unwrap(), spec, "{spec}");
            let back = read(&pointer).unwrap();
            assert_eq!(back.v2, spec.is_v2());
            let merged = back.config.ignition.config.unwrap().merge.unwrap();
            assert!(
                merged[0]
                    .verification
                    .as_ref()
                    .unwrap()
                    .hash
                    .as_ref()
                    .unwrap()
                    .starts_with("sha512-"),
                "{spec}"
            );
        }
    }

    #[test]
    fn headers_where_the_spec_has_none_are_refused() {
        for spec in [SpecVersion::V2_2, SpecVersion::V3_0] {
            let err = pointer_to(&full(spec, 100), &source(&[("X-Auth-Token", "t")]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!(
                    "the hosted config is spec {spec}, which has no httpHeaders"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_input_is_named() {
        let hosted = full(SpecVersion::V3_2, 100);
        let mut s = source(&[]);
        s.url = "ftp://host/x".into();
        assert!(
            pointer_to(&hosted, &s)
                .unwrap_err()
                .to_string()
                .starts_with("--source \"ftp://host/x\"")
        );
        let mut s = source(&[]);
        s.url = "https://images.example/x".into();
        s.cas.clear();
        assert!(
            pointer_to(&hosted, &s)
                .unwrap_err()
                .to_string()
                .contains("--ca FILE")
        );
        assert!(matches!(
            parse_header("X-Auth-Token"),
            Err(HostedError::Header(_))
        ));
        assert!(matches!(
            parse_header("Bad Name=v"),
            Err(HostedError::Header(_))
        ));
        assert!(matches!(
            parse_header("X=a\r\nInjected: 1"),
            Err(HostedError::Header(_))
        ));
        assert_eq!(
            parse_header("X-Auth-Token=a=b").unwrap(),
            ("X-Auth-Token".to_owned(), "a=b".to_owned())
        );
        assert!(
            pointer_to(b"{}", &source(&[]))
                .unwrap_err()
                .to_string()
                .contains("ignition.version")
        );
        assert!(pointer_to(b"not json", &source(&[])).is_err());
    }
}
