//! Images through the OpenAI API on the tiny K3 with its vision tower
//! (`fixtures/golden/tiny-k3-vision`, whose rows and logits the engine's tests check against
//! SGLang and WARP): data URLs read, remote URLs refused, bad images a 400 naming the part, and
//! the prefix cache resuming through an image only when its bytes are the same.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine as _;
use common::{json_call, post, server};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use serde_json::{Value, json};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-k3-vision")
}

fn model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-vision");
        let _ = std::fs::remove_dir_all(&dir);
        convert(&ConvertOptions::new(golden(), dir.join("m")), &mut |_| {}).unwrap();
        dir.join("m")
    })
    .clone()
}

fn picture() -> Vec<u8> {
    std::fs::read(golden().join("golden/picture.png")).unwrap()
}

fn ask(url: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
        "max_tokens": 3, "temperature": 0,
    })
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[tokio::test]
async fn an_image_is_read_and_the_same_bytes_resume() {
    let router = server(ServerOptions::new(model())).await;
    let (status, first) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(&picture())))).await;
    assert_eq!(status, 200, "{first}");
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    // The text alone is far shorter: the image's 20 positions and its framing are in the prompt.
    let text_only = json!({"messages": [{"role": "user", "content": "What is in this picture?"}], "max_tokens": 1});
    let (_, t) = json_call(&router, post("/v1/chat/completions", &text_only)).await;
    assert!(prompt >= t["usage"]["prompt_tokens"].as_u64().unwrap() + 20 + 8, "{prompt}");
    let (_, again) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(&picture())))).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt));
    assert_eq!(again["choices"][0]["message"], first["choices"][0]["message"]);
    // One pixel differs: same size, same tokens, another image: nothing of it resumes.
    let mut pic = k3_vision::decode(&picture(), &Default::default()).unwrap();
    pic.rgb[0] ^= 0xff;
    let mut png = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_raw(pic.width, pic.height, pic.rgb)
        .unwrap()
        .write_to(&mut png, image::ImageFormat::Png)
        .unwrap();
    let png = png.into_inner();
    let (_, other) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(&png)))).await;
    assert_eq!(other["usage"]["prompt_tokens"].as_u64(), Some(prompt));
    assert_eq!(other["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));
}

#[tokio::test]
async fn bad_images_are_a_400_naming_the_part() {
    let router = server(ServerOptions::new(model())).await;
    let png = picture();
    let cases = [
        ("https://example.com/cat.png".to_string(), "never fetched"),
        ("file:///etc/passwd".to_string(), "never fetched"),
        (data_url(&png[..png.len() / 2]), "PNG"),
        ("data:text/plain;base64,aGk=".to_string(), "not an image"),
        ("data:image/png;base64,@@@".to_string(), "base64"),
        (data_url(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"), "GIF is not supported"),
    ];
    for (url, want) in cases {
        let (status, v) = json_call(&router, post("/v1/chat/completions", &ask(&url))).await;
        assert_eq!(status, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{url:.40}: {msg}");
        assert_eq!(v["error"]["param"], "messages[0].content[1].image_url.url");
    }
    let mut low = ask(&data_url(&png));
    low["messages"][0]["content"][1]["image_url"]["detail"] = json!("low");
    let (status, v) = json_call(&router, post("/v1/chat/completions", &low)).await;
    assert_eq!(
        (status.as_u16(), v["error"]["param"].as_str()),
        (400, Some("messages[0].content[1].image_url.detail")),
        "{v}"
    );
}

#[tokio::test]
async fn ollama_images_are_read_and_a_text_model_refuses_them() {
    let router = server(ServerOptions::new(model())).await;
    let (_, show) = json_call(&router, post("/api/show", &json!({"model": "m"}))).await;
    assert!(show["capabilities"].as_array().unwrap().contains(&json!("vision")), "{show}");
    let b64 = base64::engine::general_purpose::STANDARD.encode(picture());
    let body = json!({"model": "m", "stream": false, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "What is in this picture?", "images": [b64]}]});
    let (status, v) = json_call(&router, post("/api/chat", &body)).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["prompt_eval_count"].as_u64().unwrap() > 20 + 8, "{v}");
    let text =
        server(ServerOptions::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste"))).await;
    let mut body = body;
    body["model"] = json!("default");
    let (status, v) = json_call(&text, post("/api/chat", &body)).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("reads no images"), "{v}");
}
