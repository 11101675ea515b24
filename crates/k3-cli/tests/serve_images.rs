//! `serve --help` states the image budgets and their defaults (what a request may bring, what
//! may be decoded at once, how long a request waits for room), with the memory they stand for.

mod common;

use common::k3;

#[test]
fn serve_help_states_the_image_budgets() {
    let (ok, help, err) = k3(&["serve", "--help"]);
    assert!(ok, "{err}");
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for (flag, default) in
        [("--max-image-megapixels", "128"), ("--image-megapixels-in-flight", "256"), ("--image-wait", "10")]
    {
        let at = flat.find(&format!("{flag} <")).unwrap_or_else(|| panic!("{flag} is not in serve --help:\n{help}"));
        // The first default after the flag is its own.
        let said = flat[at..].find("[default: ").map(|d| &flat[at + d..]).unwrap_or_default();
        assert!(said.starts_with(&format!("[default: {default}]")), "{flag}: {}", &flat[at..]);
    }
    assert!(flat.contains("MB a megapixel") && flat.contains("503"), "{help}");
}
