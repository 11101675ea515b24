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

/// The page's paths: served without a key, as the page itself is.
const PATHS: [&str; 8] =
    ["/", "/chat.css", "/markdown.js", "/store.js", "/stream.js", "/chat.js", "/models.js", "/inputs.js"];

/// Whether `path` is one of the page's files.
pub fn is_page(path: &str) -> bool {
    PATHS.contains(&path)
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

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

/// `GET /`.
pub async fn chat() -> Response {
    file(HTML, include_str!("chat.html"))
}

/// `GET /chat.css`.
pub async fn style() -> Response {
    file(CSS, include_str!("chat.css"))
}

/// `GET /markdown.js`: the renderer of model text.
pub async fn markdown() -> Response {
    file(JS, include_str!("markdown.js"))
}

/// `GET /store.js`: conversations and settings in the browser's storage.
pub async fn store() -> Response {
    file(JS, include_str!("store.js"))
}

/// `GET /stream.js`: the request and its SSE stream.
pub async fn stream() -> Response {
    file(JS, include_str!("stream.js"))
}

/// `GET /chat.js`: conversations and answers on the page.
pub async fn script() -> Response {
    file(JS, include_str!("chat.js"))
}

/// `GET /models.js`: the models offered and the one chosen.
pub async fn models() -> Response {
    file(JS, include_str!("models.js"))
}

/// `GET /inputs.js`: settings, images and the composer.
pub async fn inputs() -> Response {
    file(JS, include_str!("inputs.js"))
}

/// The page's routes, for a one-model server's router and for the catalog's.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(chat))
        .route("/chat.css", get(style))
        .route("/markdown.js", get(markdown))
        .route("/store.js", get(store))
        .route("/stream.js", get(stream))
        .route("/chat.js", get(script))
        .route("/models.js", get(models))
        .route("/inputs.js", get(inputs))
}
