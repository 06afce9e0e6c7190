//! Helpers the unit tests of several modules share.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A plain-HTTP server on loopback that answers any request with an endless chunked body
/// (the tests of every bounded reader point at it); returns its address.
pub async fn endless_http_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .await;
                let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, "x".repeat(1 << 16));
                while conn.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    addr
}
