//! The chat page at `/`: static files compiled in (no build step, no external fetches) that talk
//! to this server's `/v1/chat/completions`, streaming: markdown rendered into DOM nodes (never
//! parsed as HTML), conversations and settings kept in the browser's storage, images for a model
//! that reads them, a model picker when the server offers several, and the prompt's progress and the answer's speed. Served without a key (the
//! files hold no data; every API call the page makes needs one when the server does), under a
//! content security policy that lets it run only its own files and reach nothing but this server.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// What the page may load and reach: its own scripts and style from this origin (nothing
/// inline), images it was given as data URLs, and this origin's API. Trusted Types make every
/// HTML-parsing sink (innerHTML and the like) throw, so no string can become markup.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; \
                      require-trusted-types-for 'script'; trusted-types 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The page's files: path, content type, body. Served without a key, as the page itself is.
const FILES: [(&str, &str, &str); 8] = [
    ("/", HTML, include_str!("chat.html")),
    ("/chat.css", CSS, include_str!("chat.css")),
    // The renderer of model text.
    ("/markdown.js", JS, include_str!("markdown.js")),
    // Conversations and settings in the browser's storage.
    ("/store.js", JS, include_str!("store.js")),
    // The request and its SSE stream.
    ("/stream.js", JS, include_str!("stream.js")),
    // Conversations and answers on the page.
    ("/chat.js", JS, include_str!("chat.js")),
    // The model picker.
    ("/models.js", JS, include_str!("models.js")),
    // Settings, images and the composer.
    ("/inputs.js", JS, include_str!("inputs.js")),
];

/// Whether `path` is one of the page's files.
pub fn is_page(path: &str) -> bool {
    FILES.iter().any(|(p, _, _)| *p == path)
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The page's routes, for a one-model server's router and for the catalog's.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    FILES.iter().fold(Router::new(), |r, &(path, content_type, body)| {
        r.route(path, get(move || async move { file(content_type, body) }))
    })
}
