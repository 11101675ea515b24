//! The chat page at `/`: one static file (no build step, no external fetches) that talks to
//! this server's `/v1/chat/completions`, streaming, with thinking shown apart, stop, new chat and
//! the API key kept in the browser's storage. Served without a key (it holds no data; every API
//! call it makes needs one when the server does), under a content security policy that lets it
//! reach nothing but this server.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("chat.html");

/// What the page may load and reach: its own inline script and style, and this origin.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

/// `GET /`.
pub async fn chat() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}
