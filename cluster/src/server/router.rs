//! Request routing and the status-code rules of docs/ignition-server.md, without sockets: a request
//! line, the `Accept` header and the peer address in, a response out.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::Full;

use super::access::AccessList;
use super::assets::{Assets, valid_asset_name};
use super::source::Cache;
use crate::cluster::Role;
use crate::negotiate::negotiate;
use crate::routes::ExtraRoutes;

/// The route a request path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route<'a> {
    /// `/healthz`.
    Healthz,
    /// `/config/<pool>` (the pool may be unknown).
    Config(&'a str),
    /// `/assets/<name>` (the name may be unknown).
    Asset(&'a str),
    /// `/keelson/...`: the whole path, for [`ExtraRoutes`].
    Keelson(&'a str),
    /// Anything else, including every path with a trick in it.
    NotFound,
}

/// Maps a request path (without query) to a route. Paths with dot segments, empty
/// segments (`//`), percent-encoding (`%2F`) or backslashes are never routed anywhere:
/// clients of this server (Ignition, the agent) never send them, so they can only be
/// probes.
pub(crate) fn parse_route(path: &str) -> Route<'_> {
    let Some(rest) = path.strip_prefix('/') else {
        return Route::NotFound;
    };
    if rest.contains(['%', '\\'])
        || rest
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Route::NotFound;
    }
    if rest == "healthz" {
        return Route::Healthz;
    }
    let single = |prefix: &str| rest.strip_prefix(prefix).filter(|name| !name.contains('/'));
    if let Some(pool) = single("config/") {
        return Route::Config(pool);
    }
    if let Some(name) = single("assets/") {
        return if valid_asset_name(name) {
            Route::Asset(name)
        } else {
            Route::NotFound
        };
    }
    if rest.starts_with("keelson/") {
        return Route::Keelson(path);
    }
    Route::NotFound
}

impl Route<'_> {
    /// The route's kind and, for configs, the pool, as bounded labels for counters.
    pub(crate) fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Route::Healthz => ("healthz", ""),
            Route::Config("master") => ("config", "master"),
            Route::Config("worker") => ("config", "worker"),
            Route::Config(_) => ("config", "other"),
            Route::Asset(_) => ("asset", ""),
            Route::Keelson(_) => ("keelson", ""),
            Route::NotFound => ("other", ""),
        }
    }
}

/// The spec version a config response carries (a response extension, for counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServedSpec(pub(crate) crate::version::SpecVersion);

/// The response body type.
pub(crate) type Body = Full<Bytes>;

/// A response with `Content-Type` and `Content-Length` set, as machine-config-server
/// sends them (hyper omits the body of a HEAD response and keeps the length).
pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
) -> Response<Body> {
    let mut r = Response::new(Full::new(body.clone()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    r
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut msg = msg.into();
    msg.push('\n');
    respond(status, "text/plain; charset=utf-8", Bytes::from(msg))
}

fn method_not_allowed() -> Response<Body> {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: use GET or HEAD",
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    r
}

/// Everything a request needs, shared by all connections.
pub(crate) struct Router {
    pub(crate) configs: Cache,
    pub(crate) assets: Assets,
    pub(crate) bootstrap: bool,
    pub(crate) access: AccessList,
    pub(crate) extra: Option<Arc<dyn ExtraRoutes>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("bootstrap", &self.bootstrap)
            .field("access", &self.access)
            .field("extra", &self.extra.is_some())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// Whether `path` goes to [`ExtraRoutes`] (the only route with a request body).
    pub(crate) fn wants_body(&self, path: &str) -> bool {
        matches!(parse_route(path), Route::Keelson(_))
    }

    /// Answers one request. `accept` is the `Accept` header (several header lines joined
    /// with `, `); `body` is empty except for `/keelson/` routes.
    pub(crate) fn handle(
        &self,
        method: &Method,
        path: &str,
        accept: Option<&[u8]>,
        peer: SocketAddr,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let route = parse_route(path);
        // /healthz is open to everyone (load balancers probe it); it tells nothing secret.
        if route != Route::Healthz && !self.access.allows(peer.ip()) {
            return text(
                StatusCode::FORBIDDEN,
                format!("client {} is outside the allowed networks", peer.ip()),
            );
        }
        if let Route::Keelson(path) = route {
            let Some(extra) = self.extra.as_ref() else {
                return text(StatusCode::NOT_FOUND, "not found");
            };
            return match extra.handle_request(method, path, peer, headers, body) {
                Some(answer) => {
                    let mut r = respond(answer.status, "application/json", answer.body);
                    for (name, value) in answer.headers.into_iter().chain(extra.headers()) {
                        r.headers_mut().insert(name, value);
                    }
                    r
                }
                None => text(StatusCode::NOT_FOUND, "not found"),
            };
        }
        if method != Method::GET && method != Method::HEAD {
            return method_not_allowed();
        }
        match route {
            Route::Healthz => respond(StatusCode::OK, "text/plain; charset=utf-8", Bytes::new()),
            Route::Config(pool) => self.config(pool, accept),
            Route::Asset(name) => match self.assets.get(name) {
                Some(b) => respond(StatusCode::OK, "application/octet-stream", b.clone()),
                None => text(StatusCode::NOT_FOUND, format!("no asset {name:?}")),
            },
            Route::Keelson(_) | Route::NotFound => text(StatusCode::NOT_FOUND, "not found"),
        }
    }

    fn config(&self, pool: &str, accept: Option<&[u8]>) -> Response<Body> {
        let pool = match pool {
            "master" => Role::Master,
            "worker" => Role::Worker,
            other => {
                return text(
                    StatusCode::NOT_FOUND,
                    format!("unknown pool {other:?}: expected master or worker"),
                );
            }
        };
        let spec = match negotiate(accept) {
            Ok(s) => s,
            Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
        };
        if self.bootstrap && pool == Role::Worker {
            // Ignition retries 5xx: the worker keeps asking until the API VIP has moved to
            // a master, which serves it. A 404 would fail the worker's first boot.
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the bootstrap node serves only the master pool; retry until a master answers",
            );
        }
        match self.configs.get(pool, spec) {
            Ok(bytes) => {
                let mut r = respond(StatusCode::OK, "application/json", bytes);
                r.extensions_mut().insert(ServedSpec(spec));
                r
            }
            Err(e) => {
                tracing::error!(%pool, %spec, error = %e, "rendering the config failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("could not render the {pool} config for spec {spec}"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::source::ConfigSource;
    use crate::version::SpecVersion;
    use proptest::prelude::*;

    #[test]
    fn routes() {
        assert_eq!(parse_route("/healthz"), Route::Healthz);
        assert_eq!(parse_route("/config/master"), Route::Config("master"));
        assert_eq!(parse_route("/config/nope"), Route::Config("nope"));
        assert_eq!(
            parse_route("/assets/keelson-agent"),
            Route::Asset("keelson-agent")
        );
        assert_eq!(
            parse_route("/keelson/members"),
            Route::Keelson("/keelson/members")
        );
        for bad in [
            "",
            "healthz",
            "/",
            "/healthz/",
            "/config/",
            "/config/master/",
            "/config/../x",
            "/config/./master",
            "/config/..",
            "//config/master",
            "/config//master",
            "/config%2Fmaster",
            "/config/master%2F..%2Fx",
            "/assets/..%2Fetc%2Fpasswd",
            "/assets/.hidden",
            "/assets/a\\b",
            "/assets/../tls/server.key",
            "/keelson/../config/master",
            "/keelson/",
            "/other",
        ] {
            assert_eq!(parse_route(bad), Route::NotFound, "{bad:?}");
        }
    }

    struct Fake;
    impl ConfigSource for Fake {
        fn config(
            &self,
            pool: Role,
            spec: SpecVersion,
        ) -> Result<Bytes, crate::server::SourceError> {
            Ok(Bytes::from(format!(
                "{{\"pool\":\"{pool}\",\"spec\":\"{spec}\"}}"
            )))
        }
    }

    fn router(bootstrap: bool) -> Router {
        Router {
            configs: Cache::new(Arc::new(Fake)),
            assets: Assets::new(),
            bootstrap,
            access: AccessList::new(vec!["10.0.0.0/16".parse().unwrap()], true),
            extra: None,
        }
    }

    fn status(r: &Router, m: Method, path: &str, peer: &str) -> StatusCode {
        r.handle(
            &m,
            path,
            None,
            peer.parse().unwrap(),
            &http::HeaderMap::new(),
            Bytes::new(),
        )
        .status()
    }

    #[test]
    fn status_rules() {
        let r = router(false);
        assert_eq!(
            status(&r, Method::GET, "/config/master", "10.0.0.9:1"),
            StatusCode::OK
        );
        assert_eq!(
            status(&r, Method::HEAD, "/config/worker", "127.0.0.1:1"),
            StatusCode::OK
        );
        assert_eq!(
            status(&r, Method::GET, "/config/infra", "10.0.0.9:1"),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&r, Method::GET, "/config/bootstrap", "10.0.0.9:1"),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&r, Method::POST, "/config/master", "10.0.0.9:1"),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(&r, Method::GET, "/config/master", "10.1.0.9:1"),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(&r, Method::GET, "/healthz", "192.0.2.1:1"),
            StatusCode::OK
        );
        assert_eq!(
            status(&r, Method::GET, "/keelson/x", "10.0.0.9:1"),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&r, Method::GET, "/assets/x", "10.0.0.9:1"),
            StatusCode::NOT_FOUND
        );
        let b = router(true);
        assert_eq!(
            status(&b, Method::GET, "/config/worker", "10.0.0.9:1"),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status(&b, Method::GET, "/config/master", "10.0.0.9:1"),
            StatusCode::OK
        );
    }

    #[test]
    fn bad_accept_is_400() {
        let r = router(false);
        let h: &[u8] = b"application/vnd.coreos.ignition+json;version=4.0.0";
        let resp = r.handle(
            &Method::GET,
            "/config/master",
            Some(h),
            "10.0.0.9:1".parse().unwrap(),
            &http::HeaderMap::new(),
            Bytes::new(),
        );
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn routing_never_panics_and_only_clean_paths_route(p in "[/a-z.%2F\\\\-]{0,40}") {
            let route = parse_route(&p);
            if route != Route::NotFound {
                prop_assert!(!p.contains("..") || p.split('/').all(|s| s != ".."));
                prop_assert!(!p.contains("//") && !p.contains('%'));
            }
        }
    }
}
