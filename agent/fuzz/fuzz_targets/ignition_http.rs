//! Raw HTTP/1.1 bytes into the Ignition server as the agent runs it (plain port): hyper's
//! request parsing, the router (paths, access list, `Accept` negotiation) and the unicast
//! member registry on `/keelson/v1/members`, through `BoundServer::serve_stream` over an
//! in-memory pipe. The first input byte picks the client address (inside the allowed
//! machine network or outside it); the rest is what the client sends before closing.
//!
//! Checks: the connection always ends; whatever the server writes is HTTP/1.x responses,
//! none of them a 5xx (configs always render here, and the node is not the bootstrap).
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keelson_agent::members::unicast::Registry;
use keelson_cluster::server::{Assets, ConfigSource, IgnitionServer, ServerOptions, SourceError};
use keelson_cluster::{Role, SpecVersion};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Configs are not what is fuzzed here: a fixed document per pool and spec.
struct FixedConfigs;

impl ConfigSource for FixedConfigs {
    fn config(&self, pool: Role, spec: SpecVersion) -> Result<Bytes, SourceError> {
        Ok(Bytes::from(format!(
            "{{\"ignition\":{{\"version\":\"{}\"}},\"pool\":\"{}\"}}",
            spec.as_str(),
            pool.as_str()
        )))
    }
}

async fn exchange(peer: SocketAddr, request: &[u8]) -> Vec<u8> {
    let cluster = keelson_agent_fuzz::cluster();
    let mut assets = Assets::new();
    assets
        .insert("keelson-agent", Bytes::from_static(b"\x7fELF"))
        .unwrap();
    let opts = ServerOptions {
        tls_listen: None,
        plain_listen: None,
        allowed_networks: keelson_cluster::server::default_allowed_networks(cluster),
        allow_loopback: false,
        ..ServerOptions::default()
    };
    let registry = Arc::new(Registry::new(&cluster.zone(), Duration::from_secs(35)));
    let server = IgnitionServer::new(FixedConfigs, assets, opts)
        .with_extra_routes(registry)
        .bind()
        .await
        .expect("no listeners to bind");
    let (mut client, server_side) = tokio::io::duplex(1 << 16);
    let serve = server.serve_stream(server_side, peer);
    let talk = async {
        client.write_all(request).await.ok();
        client.shutdown().await.ok();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.ok();
        out
    };
    let ((), out) = tokio::join!(serve, talk);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&who, request)) = data.split_first() else {
        return;
    };
    let peer: SocketAddr = if who & 1 == 0 {
        "10.0.0.11:40000".parse().unwrap()
    } else {
        "192.0.2.1:40000".parse().unwrap()
    };
    let rt = keelson_agent_fuzz::runtime();
    let out = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), exchange(peer, request)).await
        })
        .expect("the server ends the connection once the client has closed its side");
    let text = String::from_utf8_lossy(&out);
    // HTTP/1.0 requests get HTTP/1.0 responses.
    let status_line = |l: &str| l.starts_with("HTTP/1.1 ") || l.starts_with("HTTP/1.0 ");
    if !out.is_empty() {
        assert!(status_line(&text), "not an HTTP response: {text:?}");
    }
    for line in text.split("\r\n").filter(|l| status_line(l)) {
        let code: u16 = line
            .get(9..12)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("status line {line:?}"));
        assert!(code < 500, "server error: {line}");
    }
});
