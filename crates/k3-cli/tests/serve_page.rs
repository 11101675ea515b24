//! The chat page at `/` as raw HTTP: served without a key (it is static; its API calls need one),
//! as HTML under a policy that lets it reach nothing but this server, and referring to nothing
//! outside it. (Chromium drives it in `tools/server/chat_page_test.py`, run by CI.)

mod common;

use common::server::Server;

#[test]
fn the_page_is_served_static_and_self_contained() {
    let s = Server::start(&["--api-key", "k"]);
    let r = s.request("GET", "/", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    // Everything it loads is a file of this server (a local path), served without the key too.
    let mut all = r.body.clone();
    for part in r.body.split(['"', '\'']).filter(|p| p.starts_with('/')) {
        assert!(!part.starts_with("//"), "the page refers to {part}");
        let f = s.request("GET", part, &[], "");
        assert_eq!(f.status, 200, "{part}");
        assert_eq!(f.header("x-content-type-options"), Some("nosniff"), "{part}");
        all.push_str(&f.body);
    }
    assert!(all.contains("/v1/chat/completions") && all.contains("Authorization"));
    for outside in ["http://", "https://", "//cdn", "fetch(\"http", "import("] {
        assert!(!all.contains(outside), "the page refers to {outside}");
    }
    // The API behind it still wants the key.
    assert_eq!(s.request("GET", "/v1/models", &[], "").status, 401);
    // Another site's page cannot frame or read it: a foreign Origin is refused.
    let r = s.request("GET", "/", &["Origin: http://evil.example"], "");
    assert_eq!(r.status, 403);
}
