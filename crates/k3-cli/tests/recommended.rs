//! A release's recommended sampling (`generation_config.json`): embedded by `convert`, shown by
//! `inspect`, and the default of `generate` and `serve` where no switch or field says otherwise;
//! an unusable file is refused at conversion, naming the field.

mod common;

use common::server::Server;
use common::{fixture, k3};
use serde_json::json;

/// The golden tiny K3 checkpoint with `generation` as its generation_config.json, converted.
fn converted(generation: &str) -> (tempfile::TempDir, bool, String) {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(fixture("golden/tiny-k3")).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
        }
    }
    std::fs::write(src.join("generation_config.json"), generation).unwrap();
    let out = d.path().join("out");
    let (ok, _, err) = k3(&["convert", "--from", src.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    (d, ok, err)
}

#[test]
fn the_release_settings_are_the_defaults_and_a_switch_overrides_them() {
    let (d, ok, err) = converted(r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "eos_token_id": 1}"#);
    assert!(ok, "{err}");
    let m = d.path().join("out");
    let m = m.to_str().unwrap();
    let (ok, out, err) = k3(&["inspect", m, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sampling"]["from"], "the model's generation_config.json", "{}", v["sampling"]);
    assert_eq!(v["sampling"]["generate"]["text"], "temperature 0.6, top-p 0.95");
    let (_, table, _) = k3(&["inspect", m]);
    assert!(table.contains("generate: temperature 0.6, top-p 0.95"), "{table}");
    let run = ["generate", "-m", m, "--ids", "37 246 205", "-n", "2", "--stats"];
    let (ok, _, err) = k3(&run);
    assert!(ok && err.contains("sampling: temperature 0.6, top-p 0.95"), "{err}");
    let (ok, _, err) = k3(&[&run[..], &["--temp", "0"]].concat());
    assert!(ok && err.contains("sampling: greedy"), "{err}");
    // Without the file, generate is greedy.
    let (_, _, err) =
        k3(&["generate", "-m", fixture("tiny-k3.waste").to_str().unwrap(), "--ids", "1", "-n", "1", "--stats"]);
    assert!(err.contains("sampling: greedy"), "{err}");
}

#[test]
fn serve_takes_the_release_settings_for_fields_a_request_leaves_out() {
    // A release that asks for greedy decoding: requests without `temperature` agree whatever their
    // seeds; one that asks for temperature 2 gets sampled text.
    let (d, ok, err) = converted(r#"{"do_sample": false}"#);
    assert!(ok, "{err}");
    let m = d.path().join("out");
    let s = Server::start(&["--model", m.to_str().unwrap()]);
    let answer = |extra: serde_json::Value| {
        let mut body = json!({"prompt": [37, 246, 205], "max_tokens": 12});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = s.post("/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let greedy: Vec<String> = (1..=4).map(|seed| answer(json!({"seed": seed}))).collect();
    assert!(greedy.iter().all(|t| *t == greedy[0]), "{greedy:?}");
    let hot: Vec<String> = (1..=4).map(|seed| answer(json!({"seed": seed, "temperature": 2.0}))).collect();
    assert!(hot.iter().any(|t| *t != greedy[0]), "temperature 2 sampled nothing else: {hot:?}");
}

#[test]
fn an_unusable_file_is_refused_at_conversion_naming_the_field() {
    let (_d, ok, err) = converted(r#"{"temperature": -0.5}"#);
    assert!(!ok && err.contains("generation_config.json") && err.contains("temperature"), "{err}");
}
