//! Bytes through the proxy: bulk transfers intact both ways and TCP half-close in both
//! directions, with splice and with the buffered copy.

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};

use super::*;

// ---------------------------------------------------------------------------------------
// Data integrity

const BULK: u64 = 300 << 20;

/// A deterministic pseudo-random block; its odd length keeps chunks from lining up.
fn pattern(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity((1 << 20) + 8);
    while v.len() < (1 << 20) + 13 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate((1 << 20) + 13);
    v
}

/// Sends `total` bytes of the `seed` stream in uneven chunks, then shuts the write half.
async fn send_stream(mut w: impl AsyncWrite + Unpin, seed: u64, total: u64) -> [u8; 32] {
    let block = pattern(seed);
    let mut h = Sha256::new();
    let (mut sent, mut off, mut i) = (0u64, 0usize, 0usize);
    while sent < total {
        let want = (40_000 + (i * 7919) % 90_000).min((total - sent) as usize);
        let n = want.min(block.len() - off);
        let chunk = &block[off..off + n];
        w.write_all(chunk).await.expect("send");
        h.update(chunk);
        sent += n as u64;
        off = (off + n) % block.len();
        i += 1;
    }
    w.shutdown().await.expect("shutdown");
    h.finalize().into()
}

/// Reads to EOF: (byte count, sha256).
async fn recv_stream(mut r: impl AsyncRead + Unpin) -> (u64, [u8; 32]) {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).await.expect("receive");
        if n == 0 {
            return (total, h.finalize().into());
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
}

async fn bulk(splice: bool) {
    // The backend sends its own stream while it hashes the client's.
    let l = TcpListener::bind(lo0()).await.unwrap();
    let backend_addr = l.local_addr().unwrap();
    let backend = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (r, w) = s.into_split();
        let (got, sent) = tokio::join!(recv_stream(r), send_stream(w, 2, BULK));
        (got, sent)
    });
    let p = start(ProxyConfig { splice, ..config() }, &[backend_addr]);
    let c = TcpStream::connect(p.addr).await.unwrap();
    let (r, w) = c.into_split();
    let (client_got, client_sent) = tokio::join!(recv_stream(r), send_stream(w, 1, BULK));
    let (backend_got, backend_sent) = backend.await.unwrap();

    assert_eq!(
        backend_got.0, BULK,
        "bytes client -> backend (splice {splice})"
    );
    assert_eq!(
        backend_got.1, client_sent,
        "sha256 client -> backend (splice {splice})"
    );
    assert_eq!(
        client_got.0, BULK,
        "bytes backend -> client (splice {splice})"
    );
    assert_eq!(
        client_got.1, backend_sent,
        "sha256 backend -> client (splice {splice})"
    );
    assert_ne!(
        client_sent, backend_sent,
        "the two directions carry different bytes"
    );
    wait_until("connection closed", || p.proxy.active_connections() == 0).await;
    let s = p.snapshot(backend_addr);
    assert_eq!(
        (s.bytes_in, s.bytes_out, s.total, s.active),
        (BULK, BULK, 1, 0)
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_both_ways_is_intact_with_splice() {
    bulk(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_both_ways_is_intact_with_buffered_copy() {
    bulk(false).await;
}

// ---------------------------------------------------------------------------------------
// Half-close

/// 1 MiB and a bit: more than the first buffered read, so a spliced direction splices.
fn payload(tag: u8) -> Vec<u8> {
    let mut v = pattern(u64::from(tag));
    v.push(tag);
    v
}

async fn half_close(splice: bool) {
    // Client closes its write side first; the backend answers after seeing EOF.
    let l = TcpListener::bind(lo0()).await.unwrap();
    let a = l.local_addr().unwrap();
    let backend = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        s.write_all(&payload(1)).await.unwrap();
        s.shutdown().await.unwrap();
        got
    });
    let p = start(ProxyConfig { splice, ..config() }, &[a]);
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    c.write_all(&payload(2)).await.unwrap();
    c.shutdown().await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(SOON, c.read_to_end(&mut reply))
        .await
        .expect("reply arrives after the client's FIN")
        .unwrap();
    assert!(reply == payload(1), "reply after the FIN intact");
    assert!(backend.await.unwrap() == payload(2), "request intact");
    p.shutdown().await;

    // Backend closes its write side first; the client still sends afterwards.
    let l = TcpListener::bind(lo0()).await.unwrap();
    let a = l.local_addr().unwrap();
    let backend = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        s.write_all(&payload(3)).await.unwrap();
        s.shutdown().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        got
    });
    let p = start(ProxyConfig { splice, ..config() }, &[a]);
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    let mut banner = Vec::new();
    tokio::time::timeout(SOON, c.read_to_end(&mut banner))
        .await
        .expect("client sees the backend's FIN")
        .unwrap();
    assert!(banner == payload(3), "banner intact");
    c.write_all(&payload(4)).await.unwrap();
    c.shutdown().await.unwrap();
    let got = tokio::time::timeout(SOON, backend).await.unwrap().unwrap();
    assert!(got == payload(4), "data after the backend's FIN intact");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_both_directions_with_splice() {
    half_close(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_both_directions_with_buffered_copy() {
    half_close(false).await;
}
