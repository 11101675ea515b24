//! The chat page's files: each is served without a key (when the server has one) with its
//! content type, `nosniff` and a policy that runs only this origin's scripts (none inline) under
//! Trusted Types; every file the page names is one of them; the API still needs the key; and
//! `/v1/models` says whether the model reads images.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use k3_server::ServerOptions;
use tower::ServiceExt;

mod common;
use common::{get, json_call, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

#[tokio::test]
async fn the_page_and_its_files_are_served_without_a_key_under_a_strict_policy() {
    let mut opts = ServerOptions::new(default_model());
    opts.boundary.api_keys = vec!["sesame".into()];
    let router = server(opts).await;
    let files = [
        ("/", "text/html; charset=utf-8"),
        ("/chat.css", "text/css; charset=utf-8"),
        ("/markdown.js", "text/javascript; charset=utf-8"),
        ("/store.js", "text/javascript; charset=utf-8"),
        ("/stream.js", "text/javascript; charset=utf-8"),
        ("/chat.js", "text/javascript; charset=utf-8"),
        ("/models.js", "text/javascript; charset=utf-8"),
        ("/inputs.js", "text/javascript; charset=utf-8"),
    ];
    let mut html = String::new();
    for (path, kind) in files {
        let r = router.clone().oneshot(get(path)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let h = r.headers();
        assert_eq!(h["content-type"], kind, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        let policy = h["content-security-policy"].to_str().unwrap();
        for part in
            ["default-src 'none'", "script-src 'self';", "connect-src 'self'", "require-trusted-types-for 'script'"]
        {
            assert!(policy.contains(part), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe"), "{path}: {policy}");
        let body = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        assert!(!body.is_empty());
        if path == "/" {
            html = body;
        }
    }
    // Every file the page loads is served (and nothing inline: no bare <script> or <style>).
    let named: Vec<&str> = html.split(['"', '\'']).filter(|s| s.starts_with('/') && s.contains('.')).collect();
    assert_eq!(named.len(), 7, "{named:?}");
    for n in named {
        assert!(files.iter().any(|(p, _)| *p == n), "{n} is not served");
    }
    assert!(!html.contains("<script>") && !html.contains("<style"), "inline script or style");
    // The API is not opened by the page's exemption.
    let r = router.clone().oneshot(get("/v1/models")).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let req = Request::get("/v1/models").header("authorization", "Bearer sesame").body(Body::empty()).unwrap();
    let (s, v) = json_call(&router, req).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["data"][0]["vision"], false, "{v}");
}
