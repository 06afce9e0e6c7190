//! Forwarding to the upstream resolvers, in order, with a small TTL-respecting cache.
//!
//! Each upstream gets [`UPSTREAM_TIMEOUT`]; one that times out, answers garbage (undecodable,
//! wrong id or question) or answers SERVFAIL/REFUSED is skipped for the next. When none
//! gives a usable answer the client gets SERVFAIL. A truncated UDP answer is retried over
//! TCP with the same upstream.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// How long one upstream gets to answer.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(1500);
/// Cache entries kept at most.
const CACHE_CAPACITY: usize = 4096;
/// Longest time an answer is cached, whatever its TTL.
const MAX_CACHE_TTL: u32 = 3600;
/// Negative answers without a SOA are cached this long.
const DEFAULT_NEGATIVE_TTL: u32 = 30;

/// The records of an upstream answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// Response code (NOERROR or NXDOMAIN when cached).
    pub rcode: ResponseCode,
    /// Answer section.
    pub answers: Vec<Record>,
    /// Authority section.
    pub authorities: Vec<Record>,
    /// Additional section (without OPT).
    pub additionals: Vec<Record>,
}

/// Why forwarding failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// No upstream is configured or learned.
    #[error("no upstream resolver configured")]
    NoUpstream,
    /// Too many queries are being forwarded already.
    #[error("too many queries in flight")]
    Busy,
    /// Every upstream timed out, failed, or answered garbage (the last reason).
    #[error("every upstream failed; last: {0}")]
    AllFailed(String),
}

type Key = (Name, RecordType, DNSClass);

struct Entry {
    stored: Instant,
    ttl: u32,
    data: Upstream,
}

/// The forwarder: upstream list plus cache; shared by the UDP and TCP loops.
pub struct Forwarder {
    upstreams: RwLock<Vec<SocketAddr>>,
    cache: Mutex<HashMap<Key, Entry>>,
    timeout: Duration,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("upstreams", &self.upstreams())
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder to `upstreams` (tried in order).
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration) -> Self {
        Self {
            upstreams: RwLock::new(upstreams),
            cache: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// Replaces the upstream list.
    pub fn set_upstreams(&self, upstreams: Vec<SocketAddr>) {
        *self.upstreams.write().unwrap_or_else(|e| e.into_inner()) = upstreams;
    }

    /// The current upstream list.
    pub fn upstreams(&self) -> Vec<SocketAddr> {
        self.upstreams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn key(q: &Query) -> Key {
        (q.name().to_lowercase(), q.query_type(), q.query_class())
    }

    /// A cached answer for `q`, with TTLs lowered by the time spent in the cache.
    pub fn cached(&self, q: &Query) -> Option<Upstream> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let key = Self::key(q);
        let entry = cache.get(&key)?;
        let age = entry.stored.elapsed().as_secs().min(u64::from(u32::MAX)) as u32;
        if age >= entry.ttl {
            cache.remove(&key);
            return None;
        }
        let mut data = entry.data.clone();
        for r in data
            .answers
            .iter_mut()
            .chain(data.authorities.iter_mut())
            .chain(data.additionals.iter_mut())
        {
            r.ttl = r.ttl.saturating_sub(age);
        }
        Some(data)
    }

    fn store(&self, q: &Query, data: &Upstream) {
        let ttl = cache_ttl(data);
        if ttl == 0 {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_CAPACITY {
            let now = Instant::now();
            cache.retain(|_, e| now.duration_since(e.stored).as_secs() < u64::from(e.ttl));
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(
            Self::key(q),
            Entry {
                stored: Instant::now(),
                ttl,
                data: data.clone(),
            },
        );
    }

    /// Resolves `q` from the cache or the upstreams.
    pub async fn resolve(&self, q: &Query) -> Result<Upstream, ForwardError> {
        if let Some(hit) = self.cached(q) {
            return Ok(hit);
        }
        let upstreams = self.upstreams();
        if upstreams.is_empty() {
            return Err(ForwardError::NoUpstream);
        }
        let mut last = String::new();
        let mut fallback = None;
        for up in upstreams {
            match ask(up, q, self.timeout).await {
                Ok(answer)
                    if matches!(answer.rcode, ResponseCode::NoError | ResponseCode::NXDomain) =>
                {
                    self.store(q, &answer);
                    return Ok(answer);
                }
                Ok(answer) => {
                    last = format!("{up}: {}", answer.rcode);
                    fallback = Some(answer);
                }
                Err(e) => {
                    tracing::debug!(upstream = %up, error = %e, "upstream failed");
                    last = format!("{up}: {e}");
                }
            }
        }
        // Every upstream refused or failed: relay the last real answer if there was one.
        fallback.ok_or(ForwardError::AllFailed(last))
    }
}

/// How long `data` may be cached: the smallest TTL of its records (RFC 2181 §5.2), or for
/// a negative answer the SOA's minimum (RFC 2308 §5).
pub fn cache_ttl(data: &Upstream) -> u32 {
    let ttl = if data.answers.is_empty() {
        data.authorities
            .iter()
            .find_map(|r| match &r.data {
                hickory_proto::rr::RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
            .unwrap_or(DEFAULT_NEGATIVE_TTL)
    } else {
        data.answers.iter().map(|r| r.ttl).min().unwrap_or(0)
    };
    ttl.min(MAX_CACHE_TTL)
}

/// Errors from one upstream.
#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("garbage answer: {0}")]
    Garbage(String),
}

fn build_query(q: &Query) -> (u16, Vec<u8>) {
    let id: u16 = rand::random();
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(q.clone());
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    m.set_edns(edns);
    (id, m.to_vec().unwrap_or_default())
}

fn check(id: u16, q: &Query, bytes: &[u8]) -> Result<Message, AskError> {
    let m = Message::from_vec(bytes).map_err(|e| AskError::Garbage(e.to_string()))?;
    if m.metadata.id != id || m.metadata.message_type != MessageType::Response {
        return Err(AskError::Garbage("id or QR bit does not match".into()));
    }
    match m.queries.as_slice() {
        [aq] if aq.name() == q.name() && aq.query_type() == q.query_type() => Ok(m),
        _ => Err(AskError::Garbage("question does not match".into())),
    }
}

async fn ask(up: SocketAddr, q: &Query, timeout: Duration) -> Result<Upstream, AskError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let (id, packet) = build_query(q);
    let bind: SocketAddr = if up.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(bind).await?;
    sock.connect(up).await?;
    sock.send(&packet).await?;
    let mut buf = vec![0u8; 4096];
    let m = loop {
        let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
            .await
            .map_err(|_| AskError::Timeout)??;
        match check(id, q, &buf[..n]) {
            Ok(m) => break m,
            // A stray datagram with the wrong id: keep waiting for ours, up to the deadline.
            Err(AskError::Garbage(e)) if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) != id => {
                tracing::debug!(upstream = %up, error = %e, "ignored stray datagram");
            }
            Err(e) => return Err(e),
        }
    };
    let m = if m.metadata.truncation {
        tokio::time::timeout_at(deadline, ask_tcp(up, q))
            .await
            .map_err(|_| AskError::Timeout)??
    } else {
        m
    };
    Ok(Upstream {
        rcode: m.metadata.response_code,
        answers: m.answers,
        authorities: m.authorities,
        additionals: m.additionals,
    })
}

async fn ask_tcp(up: SocketAddr, q: &Query) -> Result<Message, AskError> {
    let (id, packet) = build_query(q);
    let mut s = TcpStream::connect(up).await?;
    let mut framed = (packet.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&packet);
    s.write_all(&framed).await?;
    let len = s.read_u16().await? as usize;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    check(id, q, &buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::RData;
    use hickory_proto::rr::rdata::{A, SOA};

    fn q(name: &str) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), RecordType::A)
    }

    fn a(name: &str, ttl: u32) -> Record {
        Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            ttl,
            RData::A(A::new(192, 0, 2, 1)),
        )
    }

    #[test]
    fn ttl_rules() {
        let pos = Upstream {
            rcode: ResponseCode::NoError,
            answers: vec![a("x.", 300), a("x.", 20)],
            authorities: vec![],
            additionals: vec![],
        };
        assert_eq!(cache_ttl(&pos), 20);
        let soa = Record::from_rdata(
            Name::from_ascii("x.").unwrap(),
            900,
            RData::SOA(SOA::new(Name::root(), Name::root(), 1, 1, 1, 1, 45)),
        );
        let neg = Upstream {
            rcode: ResponseCode::NXDomain,
            answers: vec![],
            authorities: vec![soa],
            additionals: vec![],
        };
        assert_eq!(cache_ttl(&neg), 45);
    }

    #[test]
    fn cache_is_case_insensitive_and_zero_ttl_not_cached() {
        let f = Forwarder::new(vec![], UPSTREAM_TIMEOUT);
        let data = Upstream {
            rcode: ResponseCode::NoError,
            answers: vec![a("x.example.", 100)],
            authorities: vec![],
            additionals: vec![],
        };
        f.store(&q("X.Example."), &data);
        assert_eq!(f.cached(&q("x.example.")).unwrap().answers[0].ttl, 100);
        let zero = Upstream {
            answers: vec![a("y.example.", 0)],
            ..data
        };
        f.store(&q("y.example."), &zero);
        assert!(f.cached(&q("y.example.")).is_none());
    }

    #[test]
    fn garbage_is_rejected() {
        let query = q("x.example.");
        assert!(check(1, &query, b"\x00\x01garbage").is_err());
        let mut m = Message::new(2, MessageType::Response, OpCode::Query);
        m.add_query(query.clone());
        assert!(check(1, &query, &m.to_vec().unwrap()).is_err());
        m.metadata.id = 1;
        assert!(check(1, &query, &m.to_vec().unwrap()).is_ok());
        assert!(check(1, &q("other.example."), &m.to_vec().unwrap()).is_err());
    }
}
