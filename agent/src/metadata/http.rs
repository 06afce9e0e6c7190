//! The HTTP metadata service (`http://169.254.169.254/openstack/latest/...`), with the
//! EC2-compatible tree (`/latest/meta-data/...`) as a fallback for clouds that only serve it.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

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

/// Where the service is: an IP literal with an optional IPv6 zone. The agent is static and
/// does no name lookups, so `http://host:port` with a name is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    addr: SocketAddr,
    /// The Host header (`169.254.169.254`, `[fe80::a9fe:a9fe]`).
    host: String,
}

fn endpoint(base: &str) -> Result<Endpoint, String> {
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("{base}: expected an http:// URL"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{base}: unclosed [ in the host"))?;
        let port = after.strip_prefix(':');
        (inside, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port: u16 = match port {
        Some(p) => p
            .parse()
            .map_err(|_| format!("{base}: expected a port number, got {p:?}"))?,
        None => 80,
    };
    let (literal, zone) = match host.split_once('%') {
        Some((ip, zone)) => (ip, Some(zone.strip_prefix("25").unwrap_or(zone))),
        None => (host, None),
    };
    let ip: IpAddr = literal
        .parse()
        .map_err(|_| format!("{base}: expected an IP address as the host, got {literal:?}"))?;
    let addr = match (ip, zone) {
        (IpAddr::V6(v6), Some(zone)) => {
            let index = nix::net::if_::if_nametoindex(zone)
                .map_err(|e| format!("{base}: interface {zone:?}: {e}"))?;
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, index))
        }
        (_, Some(zone)) => return Err(format!("{base}: a zone ({zone}) needs an IPv6 address")),
        (ip, None) => SocketAddr::new(ip, port),
    };
    let host = match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    };
    Ok(Endpoint { addr, host })
}

/// Why a GET gave nothing usable.
#[derive(Debug)]
enum GetError {
    /// Not reachable, timed out, 5xx...: worth another try.
    Unavailable(String),
    /// An answer the agent will not take (longer than its limit): retrying gives the same.
    Refused(String),
}

impl From<String> for GetError {
    fn from(message: String) -> Self {
        GetError::Unavailable(message)
    }
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

/// One GET: `Ok(None)` on 404, an error on anything else that is not 200 and on a body
/// longer than `limit`.
async fn get(base: &str, path: &str, limit: usize) -> Result<Option<Vec<u8>>, GetError> {
    let url = format!("{}/{}", base.trim_end_matches('/'), path);
    let endpoint = endpoint(base)?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(endpoint.addr),
    )
    .await
    .map_err(|_| format!("{url}: connect timed out"))?
    .map_err(|e| format!("{url}: connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let conn = tokio::spawn(conn);
    let request = hyper::Request::get(format!("/{path}"))
        .header(hyper::header::HOST, &endpoint.host)
        .header(
            hyper::header::USER_AGENT,
            concat!("keelson-agent/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("{url}: {e}"))?;
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .map_err(|_| format!("{url}: no answer within 5 s"))?
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    if status == hyper::StatusCode::NOT_FOUND {
        conn.abort();
        return Ok(None);
    }
    if !status.is_success() {
        conn.abort();
        return Err(format!("{url}: HTTP {status}").into());
    }
    let body = tokio::time::timeout(
        Duration::from_secs(10),
        Limited::new(response.into_body(), limit).collect(),
    )
    .await
    .map_err(|_| format!("{url}: body not complete within 10 s"))?
    .map_err(|e| {
        if e.is::<http_body_util::LengthLimitError>() {
            GetError::Refused(format!("{url}: longer than the limit of {limit} bytes"))
        } else {
            GetError::Unavailable(format!("{url}: {e}"))
        }
    })?;
    conn.abort();
    Ok(Some(body.to_bytes().to_vec()))
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
    fn endpoints_are_ip_literals_with_an_optional_zone() {
        let e = endpoint("http://169.254.169.254").unwrap();
        assert_eq!(e.addr, "169.254.169.254:80".parse().unwrap());
        assert_eq!(e.host, "169.254.169.254");
        let e = endpoint("http://127.0.0.1:8775/").unwrap();
        assert_eq!(e.addr.port(), 8775);
        let e = endpoint(&ipv6_url("lo")).unwrap();
        match e.addr {
            SocketAddr::V6(v6) => {
                assert_eq!(v6.ip().to_string(), "fe80::a9fe:a9fe");
                assert_eq!(v6.scope_id(), nix::net::if_::if_nametoindex("lo").unwrap());
            }
            other => panic!("{other}"),
        }
        assert_eq!(e.host, "[fe80::a9fe:a9fe]");
        for bad in [
            "https://169.254.169.254",
            "http://metadata.google.internal",
            "http://[fe80::1",
            "http://10.0.0.1:http",
            "http://10.0.0.1%eth0",
            "http://[fe80::1%nosuchinterface0]",
        ] {
            assert!(endpoint(bad).is_err(), "{bad}");
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
