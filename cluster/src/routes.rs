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

    /// Headers added to every answer of [`ExtraRoutes::handle`] (default: none).
    fn headers(&self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        Vec::new()
    }
}
