//! Extra routes the agent plugs into the Ignition server (e.g. unicast member
//! registration under `/keelson/`), so the server itself stays free of agent concerns.

use std::net::SocketAddr;

use bytes::Bytes;

/// A handler for requests under `/keelson/` on the Ignition server's ports.
pub trait ExtraRoutes: Send + Sync + 'static {
    /// Handles `method path` from `peer` with `body`; `None` when the path is not its
    /// (the server answers 404). The server has already checked the client is allowed.
    fn handle(
        &self,
        method: &http::Method,
        path: &str,
        peer: SocketAddr,
        body: Bytes,
    ) -> Option<(http::StatusCode, Bytes)>;

    /// [`ExtraRoutes::handle`] with the request's `headers`, answering with headers of its
    /// own besides [`ExtraRoutes::headers`] (what the server calls; by default
    /// [`ExtraRoutes::handle`], no headers of its own).
    fn handle_request(
        &self,
        method: &http::Method,
        path: &str,
        peer: SocketAddr,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Option<ExtraAnswer> {
        let _ = headers;
        self.handle(method, path, peer, body)
            .map(|(status, body)| ExtraAnswer {
                status,
                body,
                headers: Vec::new(),
            })
    }

    /// Headers added to every answer of [`ExtraRoutes::handle`] (default: none).
    fn headers(&self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        Vec::new()
    }
}

/// An answer of [`ExtraRoutes::handle_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraAnswer {
    /// Its status.
    pub status: http::StatusCode,
    /// Its body (JSON; none for `304 Not Modified`).
    pub body: Bytes,
    /// Headers of this answer alone.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}
