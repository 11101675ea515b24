//! What the HTTP tests share: a server once it is ready, and requests through tower's `oneshot`.

#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use k3_server::{ServerOptions, app};
use serde_json::Value;
use tower::ServiceExt;

/// A server on its model, once it answers `/health` with 200.
pub async fn server(opts: ServerOptions) -> Router {
    let (router, _) = app(opts);
    for _ in 0..600 {
        let r = router.clone().oneshot(get("/health")).await.unwrap();
        if r.status() == StatusCode::OK {
            return router;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the server did not become ready");
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::post(uri).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap()
}

pub async fn call(router: &Router, req: Request<Body>) -> (StatusCode, String) {
    let r = router.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

pub async fn json_call(router: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (s, body) = call(router, req).await;
    (s, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// The `(event, data)` pairs of an SSE body with `event:` names (Anthropic's and the Responses
/// API's streams).
pub fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((std::mem::take(&mut name), serde_json::from_str(d).unwrap()));
        }
    }
    out
}

/// A chat completion that must succeed: its JSON.
pub async fn ask(router: &Router, body: &Value) -> Value {
    let (s, v) = json_call(router, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// A completion's `usage.prompt_tokens_details.cached_tokens`.
pub fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

/// A chat completion's message text.
pub fn content(v: &Value) -> &str {
    v["choices"][0]["message"]["content"].as_str().unwrap()
}
