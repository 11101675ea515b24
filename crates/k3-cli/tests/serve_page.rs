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
    assert!(r.body.contains("/v1/chat/completions") && r.body.contains("Authorization"));
    for outside in ["http://", "https://", "//cdn", "src=\""] {
        assert!(!r.body.contains(outside), "the page refers to {outside}");
    }
    // The API behind it still wants the key.
    assert_eq!(s.request("GET", "/v1/models", &[], "").status, 401);
    // Another site's page cannot frame or read it: a foreign Origin is refused.
    let r = s.request("GET", "/", &["Origin: http://evil.example"], "");
    assert_eq!(r.status, 403);
}
