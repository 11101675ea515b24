//! What a request must show before any handler sees it. A local server is reachable from every
//! page the user's browser opens, so three checks stand between a web page and the model:
//!
//! - `Host` must name this server (a loopback name for a loopback bind, an address literal for
//!   an address bind, or a name given with `--allowed-host`): a DNS-rebinding page, whose own
//!   name now resolves to 127.0.0.1, sends its own name and is refused (403).
//! - An `Origin` naming another site is refused unless `--cors` allows it; allowed origins get
//!   CORS headers and answered preflights. Same-origin and non-browser clients (no `Origin`)
//!   pass.
//! - POST bodies must be `application/json` (415): a browser sends `text/plain` or form bodies
//!   cross-site without a preflight, `application/json` only after one, which fails here
//!   unless `--cors` allows the page. Ollama's routes take any body from a client that is no
//!   browser (no `Origin`), as Ollama does: its own examples post with `curl -d`, which says
//!   `application/x-www-form-urlencoded`; a browser always sends `Origin` with a POST.
//!
//! Then the API key, when the server has any: `Authorization: Bearer KEY` (scheme in any case)
//! or Anthropic's `x-api-key: KEY`, 401 with `WWW-Authenticate` otherwise. Which key matched is the request's [`Scope`]: the prefix
//! cache keeps each key's states apart.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Shape};
use k3_generate::cache::Scope;

/// Who may reach the server, and from where.
#[derive(Debug, Clone, Default)]
pub struct Boundary {
    /// The address the server listens on (`None`: not known, as in tests through `oneshot`,
    /// where only loopback names and `allowed_hosts` pass).
    pub bind: Option<IpAddr>,
    /// Further names `Host` may carry (lowercase, no port).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed cross-site (`*`: any).
    pub cors: Vec<String>,
    /// API keys; empty: none needed.
    pub api_keys: Vec<String>,
    /// Every key's requests share one prompt cache (otherwise each key has its own).
    pub shared_cache: bool,
}

/// The host part of a `Host` header or an origin's authority: lowercase, without port or
/// brackets.
fn host_name(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        a.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())).map_or(a, |(h, _)| h)
    };
    host.to_ascii_lowercase()
}

fn is_loopback_name(h: &str) -> bool {
    h == "localhost" || h.ends_with(".localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Boundary {
    /// Whether `Host: host` names this server.
    pub fn host_allowed(&self, host: &str) -> bool {
        let h = host_name(host);
        if self.allowed_hosts.iter().any(|a| a == "*" || *a == h) {
            return true;
        }
        match (self.bind, h.parse::<IpAddr>()) {
            // A literal address cannot be rebound by DNS: any is fine on a wildcard bind.
            (Some(b), Ok(_)) if b.is_unspecified() => true,
            (Some(b), Ok(ip)) if ip == b => true,
            (Some(b), _) if !b.is_loopback() && !b.is_unspecified() => false,
            _ => is_loopback_name(&h),
        }
    }

    /// Whether a page at `origin` may make requests here cross-site.
    fn cors_allows(&self, origin: &str) -> bool {
        self.cors.iter().any(|c| c == "*" || c.eq_ignore_ascii_case(origin))
    }

    /// Which key `authorization` carries (`Ok(None)`: the server has no keys).
    fn key_of(&self, headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
        if self.api_keys.is_empty() {
            return Ok(None);
        }
        // Anthropic's clients send the key as `x-api-key` (Claude Code with ANTHROPIC_API_KEY).
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
            .unwrap_or("");
        // Every key is compared, so the time taken says nothing of which one came close.
        let mut found = None;
        for (i, k) in self.api_keys.iter().enumerate() {
            if same(given.as_bytes(), k.as_bytes()) && found.is_none() {
                found = Some(i);
            }
        }
        found.map(Some).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
            )
        })
    }

    fn scope(&self, key: Option<usize>) -> Scope {
        match key {
            Some(i) if !self.shared_cache => Scope::of_key(&self.api_keys[i]),
            _ => Scope(0),
        }
    }
}

/// Which of the server's API keys a request showed (`None`: the server has none): what owns
/// the responses `/v1/responses` stores, whether or not the keys share the prompt cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller(pub Option<usize>);

/// The token of `Bearer TOKEN`, the scheme in any case (RFC 7235).
fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Byte-string equality in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether a `Content-Type` is JSON (`application/json`, any parameters, any case).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    ct.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The CORS headers for an allowed origin.
fn cors_headers(headers: &mut HeaderMap, origin: &HeaderValue) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// The checks above, in order; `/health` needs no key (monitors probe it), but passes the rest.
pub async fn check(State(b): State<std::sync::Arc<Boundary>>, mut req: Request, next: Next) -> Response {
    // Ollama's and Anthropic's routes answer errors in the shape their clients read.
    let shape = Shape::of_path(req.uri().path());
    let ollama = shape == Shape::Ollama;
    let headers = req.headers();
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().unwrap_or("");
        if !b.host_allowed(host) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "`Host: {host}` does not name this server; start it with --allowed-host {} to serve that name",
                    host_name(host)
                ),
            )
            .shaped(shape);
        }
    }
    let origin = headers.get(header::ORIGIN).cloned();
    let cross = origin.as_ref().filter(|o| !same_origin(o, headers));
    if let Some(o) = cross {
        let text = o.to_str().unwrap_or("");
        if !b.cors_allows(text) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!("requests from the page `{text}` are not allowed; start the server with --cors {text}"),
            )
            .shaped(shape);
        }
        if req.method() == Method::OPTIONS {
            return preflight(o);
        }
    }
    let browser = origin.is_some();
    if req.method() == Method::POST && !is_json(headers) && (browser || !ollama) {
        let given = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("none");
        return ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("the body must be sent as `Content-Type: application/json` (it was {given})"),
        )
        .shaped(shape);
    }
    let key = match b.key_of(headers) {
        Ok(k) => k,
        // The health check, and the chat page and its files (static; its API calls carry the key).
        Err(_) if req.uri().path() == "/health" || crate::page::is_page(req.uri().path()) => None,
        Err(e) => {
            let mut r = e.shaped(shape);
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"k3\""));
            return r;
        }
    };
    req.extensions_mut().insert(b.scope(key));
    req.extensions_mut().insert(Caller(key));
    let mut r = next.run(req).await;
    if let Some(o) = cross {
        cors_headers(r.headers_mut(), o);
    }
    r
}

/// Whether `Origin` names the server itself (its scheme and authority are the `Host`).
fn same_origin(origin: &HeaderValue, headers: &HeaderMap) -> bool {
    let (Ok(o), Some(Ok(host))) = (origin.to_str(), headers.get(header::HOST).map(|h| h.to_str())) else {
        return false;
    };
    o.strip_prefix("http://").is_some_and(|a| a.eq_ignore_ascii_case(host))
}

/// An answered CORS preflight for an allowed origin.
fn preflight(origin: &HeaderValue) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    cors_headers(h, origin);
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version, anthropic-beta"),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(ip: &str) -> Boundary {
        Boundary { bind: Some(ip.parse().unwrap()), ..Boundary::default() }
    }

    #[test]
    fn host_names_what_is_served() {
        let lo = bound("127.0.0.1");
        for ok in ["localhost:8000", "127.0.0.1:8000", "LOCALHOST", "[::1]:8000", "127.0.0.2", "app.localhost"] {
            assert!(lo.host_allowed(ok), "{ok}");
        }
        for bad in ["attacker.example:8000", "192.168.1.5:8000", "localhost.attacker.example", ""] {
            assert!(!lo.host_allowed(bad), "{bad}");
        }
        let any = bound("0.0.0.0");
        assert!(any.host_allowed("192.168.1.5:8000") && any.host_allowed("localhost"));
        assert!(!any.host_allowed("box.lan:8000"));
        let named = Boundary { allowed_hosts: vec!["box.lan".into()], ..bound("0.0.0.0") };
        assert!(named.host_allowed("box.lan:8000") && named.host_allowed("BOX.LAN"));
        let one = bound("192.168.1.5");
        assert!(
            one.host_allowed("192.168.1.5:8000") && !one.host_allowed("10.0.0.1") && !one.host_allowed("localhost")
        );
    }

    #[test]
    fn bearer_scheme_in_any_case() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("abc"), None);
    }
}
