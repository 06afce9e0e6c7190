//! The HTTP metadata service (`http://169.254.169.254/openstack/latest/...`), with the
//! EC2-compatible tree (`/latest/meta-data/...`) as a fallback for clouds that only serve it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::net::http_client::{HttpClient, HttpError};

use super::{
    MAX_DOCUMENT_BYTES, MAX_USER_DATA_BYTES, MetaData, Metadata, MetadataError, NetworkData,
};

/// The metadata service's address.
pub const DEFAULT_URL: &str = "http://169.254.169.254";

/// The same service where a network has no IPv4: `fe80::a9fe:a9fe` on the NIC's link
/// (Nova's metadata over IPv6), e.g. `http://[fe80::a9fe:a9fe%eth0]`.
pub fn ipv6_url(interface: &str) -> String {
    format!("http://[fe80::a9fe:a9fe%{interface}]")
}

/// Why a GET gave nothing usable.
#[derive(Debug)]
enum GetError {
    /// Not reachable, timed out, 5xx...: worth another try.
    Unavailable(String),
    /// An answer the agent will not take (longer than its limit): retrying gives the same.
    Refused(String),
}

impl From<GetError> for MetadataError {
    fn from(e: GetError) -> Self {
        match e {
            GetError::Unavailable(m) => MetadataError::Unavailable(m),
            GetError::Refused(m) => MetadataError::Invalid {
                origin: "metadata service".into(),
                message: m,
            },
        }
    }
}

/// One GET of `path` under `base` (`http://` and an IP literal, with an optional IPv6 zone:
/// the agent is static and does no name lookups): `Ok(None)` on 404, an error on anything
/// else that is not 200 and on a body longer than `limit`.
async fn get(base: &str, path: &str, limit: usize) -> Result<Option<Vec<u8>>, GetError> {
    if !base.starts_with("http://") {
        return Err(GetError::Unavailable(format!(
            "{base}: expected an http:// URL"
        )));
    }
    let url = format!("{}/{}", base.trim_end_matches('/'), path);
    let client = HttpClient::new()
        .timeouts(
            Duration::from_secs(5),
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
        .body_limit(limit);
    match client.get(&url).await {
        Ok(r) if r.status == http::StatusCode::NOT_FOUND => Ok(None),
        Ok(r) if r.status.is_success() => Ok(Some(r.body.to_vec())),
        Ok(r) => Err(GetError::Unavailable(format!("{url}: HTTP {}", r.status))),
        Err(e @ HttpError::TooLarge { .. }) => Err(GetError::Refused(e.to_string())),
        Err(e) => Err(GetError::Unavailable(e.to_string())),
    }
}

/// Reads the metadata once from the service at `base`.
pub async fn read(base: &str) -> Result<Metadata, MetadataError> {
    let unavailable = MetadataError::from;
    let invalid = |m: String| MetadataError::Invalid {
        origin: base.to_owned(),
        message: m,
    };
    match get(base, "openstack/latest/meta_data.json", MAX_DOCUMENT_BYTES)
        .await
        .map_err(unavailable)?
    {
        Some(meta) => {
            let meta_data: MetaData = serde_json::from_slice(&meta)
                .map_err(|e| invalid(format!("openstack/latest/meta_data.json: {e}")))?;
            let network_data = match get(
                base,
                "openstack/latest/network_data.json",
                MAX_DOCUMENT_BYTES,
            )
            .await
            .map_err(unavailable)?
            {
                Some(b) => Some(
                    serde_json::from_slice::<NetworkData>(&b)
                        .map_err(|e| invalid(format!("openstack/latest/network_data.json: {e}")))?,
                ),
                None => None,
            };
            let user_data = get(base, "openstack/latest/user_data", MAX_USER_DATA_BYTES)
                .await
                .map_err(unavailable)?;
            Ok(Metadata {
                source: base.to_owned(),
                meta_data,
                network_data,
                user_data,
            })
        }
        None => read_ec2(base).await,
    }
}

/// The EC2-compatible tree: instance id, host name, keys and user data.
async fn read_ec2(base: &str) -> Result<Metadata, MetadataError> {
    let text = |b: Option<Vec<u8>>| b.map(|b| String::from_utf8_lossy(&b).trim().to_owned());
    let field = |p: &'static str| async move { get(base, p, MAX_DOCUMENT_BYTES).await.map(text) };
    let instance = field("latest/meta-data/instance-id")
        .await
        .map_err(MetadataError::from)?
        .ok_or_else(|| {
            MetadataError::Unavailable(format!(
                "{base}: neither openstack/latest/meta_data.json nor latest/meta-data/instance-id"
            ))
        })?;
    let hostname = field("latest/meta-data/hostname").await.ok().flatten();
    let mut public_keys = BTreeMap::new();
    if let Ok(Some(key)) = field("latest/meta-data/public-keys/0/openssh-key").await {
        public_keys.insert("0".to_owned(), key);
    }
    let user_data = match get(base, "latest/user-data", MAX_USER_DATA_BYTES).await {
        Ok(data) => data,
        Err(e @ GetError::Refused(_)) => return Err(e.into()),
        Err(GetError::Unavailable(_)) => None,
    };
    Ok(Metadata {
        source: format!("{base} (ec2)"),
        meta_data: MetaData {
            uuid: Some(instance),
            name: hostname
                .as_deref()
                .and_then(|h| h.split('.').next())
                .map(str::to_owned),
            hostname,
            public_keys,
            ..MetaData::default()
        },
        network_data: None,
        user_data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback HTTP server answering from `routes`; the first `fail_first` requests get 503.
    async fn serve(
        routes: Vec<(&'static str, &'static str)>,
        fail_first: usize,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let routes = routes.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let len = conn.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..len]).into_owned();
                    let path = req.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (status, body) = if n < fail_first {
                        ("503 Service Unavailable", "")
                    } else {
                        routes
                            .iter()
                            .find(|(p, _)| *p == path)
                            .map(|(_, b)| ("200 OK", *b))
                            .unwrap_or(("404 Not Found", ""))
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(resp.as_bytes()).await;
                });
            }
        });
        (base, count)
    }

    #[test]
    fn the_ipv6_url_names_the_link() {
        let u = crate::net::http_client::Url::parse(&ipv6_url("lo")).unwrap();
        assert_eq!(u.ip.unwrap().to_string(), "fe80::a9fe:a9fe");
        assert_eq!(u.scope_id, nix::net::if_::if_nametoindex("lo").unwrap());
        assert_eq!(u.host_header(), "[fe80::a9fe:a9fe]");
    }

    #[tokio::test]
    async fn only_plain_http_to_ip_literals() {
        for bad in ["https://169.254.169.254", "http://metadata.google.internal"] {
            let e = get(bad, "x", 10).await.unwrap_err();
            assert!(matches!(e, GetError::Unavailable(_)), "{bad}: {e:?}");
        }
    }

    #[tokio::test]
    async fn an_endless_body_is_refused_naming_the_limit() {
        let base = format!(
            "http://{}",
            keelson_testkit::http::endless_http_server().await
        );
        let err = read(&base).await.unwrap_err();
        assert!(
            matches!(err, MetadataError::Invalid { .. }),
            "not retried: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("meta_data.json") && text.contains(&MAX_DOCUMENT_BYTES.to_string()),
            "{text}"
        );
    }

    #[tokio::test]
    async fn openstack_tree() {
        let (base, _) = serve(
            vec![
                ("/openstack/latest/meta_data.json", r#"{"uuid":"u-1","name":"master-1","meta":{"keelson-role":"master"}}"#),
                ("/openstack/latest/network_data.json", r#"{"links":[],"networks":[],"services":[{"type":"dns","address":"10.0.0.1"}]}"#),
                ("/openstack/latest/user_data", "{}"),
            ],
            0,
        )
        .await;
        let md = read(&base).await.unwrap();
        assert_eq!(md.node_name().as_deref(), Some("master-1"));
        assert_eq!(md.meta_data.meta["keelson-role"], "master");
        assert_eq!(md.network_data.unwrap().services[0].address, "10.0.0.1");
        assert_eq!(md.user_data.as_deref(), Some(&b"{}"[..]));
    }

    #[tokio::test]
    async fn ec2_fallback() {
        let (base, _) = serve(
            vec![
                ("/latest/meta-data/instance-id", "i-0001"),
                ("/latest/meta-data/hostname", "worker-3.novalocal"),
                ("/latest/user-data", "ud"),
            ],
            0,
        )
        .await;
        let md = read(&base).await.unwrap();
        assert_eq!(md.meta_data.uuid.as_deref(), Some("i-0001"));
        assert_eq!(md.node_name().as_deref(), Some("worker-3"));
        assert!(md.source.ends_with("(ec2)"));
    }

    #[tokio::test]
    async fn discover_retries_until_the_service_answers() {
        let (base, count) = serve(
            vec![("/openstack/latest/meta_data.json", r#"{"name":"n"}"#)],
            2,
        )
        .await;
        let md = super::super::discover(&super::super::DiscoverOptions {
            source: super::super::SourceChoice::Http,
            url: Some(base),
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })
        .await
        .unwrap();
        assert_eq!(md.node_name().as_deref(), Some("n"));
        assert!(count.load(Ordering::SeqCst) >= 3, "two 503s then success");
    }

    #[tokio::test]
    async fn bad_json_names_the_file() {
        let (base, _) = serve(vec![("/openstack/latest/meta_data.json", "{not json")], 0).await;
        let err = read(&base).await.unwrap_err().to_string();
        assert!(err.contains("meta_data.json"), "{err}");
    }
}
