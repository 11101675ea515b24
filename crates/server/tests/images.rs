//! Images through the OpenAI API on the tiny K3 with its vision tower
//! (`fixtures/golden/tiny-k3-vision`, whose rows and logits the engine's tests check against
//! SGLang and WARP): data URLs read, remote URLs refused, bad images a 400 naming the part, and
//! the prompt cache resuming through an image only when its bytes are the same; images bounded
//! per request (by their headers, before any is decoded) and in flight across the server;
//! truncated files refused with the reason.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine as _;
use common::{call, json_call, post, server};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use k3_server::image_budget::ImageLimits;
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

/// A PNG whose header claims `w x h` and whose structure is whole (IHDR, a tiny IDAT, IEND),
/// though its data holds a single row: decoding it fails, reading its header does not.
fn claimed_png(w: u32, h: u32) -> Vec<u8> {
    let mut png = std::io::Cursor::new(Vec::new());
    image::RgbImage::new(1, 1).write_to(&mut png, image::ImageFormat::Png).unwrap();
    let mut png = png.into_inner();
    // IHDR's width and height (bytes 16..24), then its CRC (bytes 29..33) over type and data.
    png[16..20].copy_from_slice(&w.to_be_bytes());
    png[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    png
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn ask_many(urls: &[String]) -> Value {
    let mut content = vec![json!({"type": "text", "text": "What is in these pictures?"})];
    content.extend(urls.iter().map(|u| json!({"type": "image_url", "image_url": {"url": u}})));
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0})
}

#[tokio::test]
async fn images_over_the_request_budget_are_refused_by_their_headers() {
    let router = server(ServerOptions::new(model())).await;
    // Eight images claiming 64 megapixels each (~190 MB of decoding apiece). Their data would
    // not decode: the refusal names the budget from the headers, so none was decoded.
    let bomb = data_url(&claimed_png(8000, 8000));
    let (status, v) = json_call(&router, post("/v1/chat/completions", &ask_many(&vec![bomb; 8]))).await;
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("image 3 of 8") && msg.contains("192000000 pixels"), "{msg}");
    assert!(msg.contains("per-request budget of 128000000 pixels") && msg.contains("--max-image-megapixels"), "{msg}");
    assert_eq!(v["error"]["param"], "messages[0].content[3].image_url.url");
    // A smaller budget counts real pictures the same way.
    let pic = k3_vision::probe(&picture(), &Default::default()).unwrap();
    let mut opts = ServerOptions::new(model());
    opts.images = ImageLimits { per_request: pic.pixels() * 2, ..ImageLimits::default() };
    let small = server(opts).await;
    let url = data_url(&picture());
    let (status, v) = json_call(&small, post("/v1/chat/completions", &ask_many(&vec![url.clone(); 2]))).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = json_call(&small, post("/v1/chat/completions", &ask_many(&vec![url; 3]))).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("image 3 of 3"), "{v}");
}

/// `picture` re-encoded as `format` by the `image` crate.
fn encoded(format: image::ImageFormat) -> Vec<u8> {
    let pic = k3_vision::decode(&picture(), &Default::default()).unwrap();
    let mut out = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_raw(pic.width, pic.height, pic.rgb).unwrap().write_to(&mut out, format).unwrap();
    out.into_inner()
}

#[tokio::test]
async fn truncated_jpeg_and_png_are_refused_with_the_reason() {
    let router = server(ServerOptions::new(model())).await;
    let jpeg = encoded(image::ImageFormat::Jpeg);
    let (status, v) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(&jpeg)))).await;
    assert_eq!(status, 200, "the whole JPEG is read: {v}");
    let png = encoded(image::ImageFormat::Png);
    for (cut, want) in [
        (&jpeg[..jpeg.len() * 2 / 3], "JPEG truncated"),
        (&jpeg[..jpeg.len() - 2], "JPEG truncated"),
        (&png[..png.len() * 2 / 3], "PNG truncated"),
        (&png[..png.len() - 6], "PNG truncated"),
    ] {
        let (status, v) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(cut)))).await;
        assert_eq!(status, 400, "{want} at {}: {v}", cut.len());
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want) && msg.contains(&format!("ends at byte {}", cut.len())), "{msg}");
        assert_eq!(v["error"]["param"], "messages[0].content[1].image_url.url");
    }
}

#[tokio::test]
async fn images_beyond_the_in_flight_budget_are_a_503_not_more_memory() {
    // Room in flight for one picture, no waiting, and a batch of one kept busy by a stream:
    // an image request admitted holds its pixels while it waits for the batch.
    let pic = k3_vision::probe(&picture(), &Default::default()).unwrap();
    let mut opts = ServerOptions::new(model());
    opts.max_batch = 1;
    opts.images = ImageLimits { per_request: pic.pixels(), in_flight: pic.pixels(), wait: std::time::Duration::ZERO };
    let router = server(opts).await;
    // Token 65 forced at every step: the stream runs until it is dropped.
    let busy = json!({"messages": [{"role": "user", "content": "Count."}], "max_tokens": 3000, "stream": true,
        "temperature": 0, "logit_bias": {"65": 100}});
    let stream = tower::ServiceExt::oneshot(router.clone(), post("/v1/chat/completions", &busy)).await.unwrap();
    assert_eq!(stream.status(), 200);
    let body = ask(&data_url(&picture()));
    let (a, b) = (
        tokio::spawn(call_owned(router.clone(), body.clone())),
        tokio::spawn(call_owned(router.clone(), body.clone())),
    );
    // One of them holds the budget (queued behind the stream), the other is refused at once;
    // without a budget neither ends while the stream runs (a minute at most, then it goes).
    for _ in 0..6000 {
        if a.is_finished() || b.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(stream);
    let mut answers = [a.await.unwrap(), b.await.unwrap()];
    answers.sort_by_key(|(s, _)| *s);
    let [(ok, _), (busy_status, refused)] = &answers;
    assert_eq!((*ok, *busy_status), (200, 503), "{answers:?}");
    assert!(refused.contains("in-flight budget") && refused.contains("--image-megapixels-in-flight"), "{refused}");
    // Once it is through, the pixels are back: the next request gets them.
    let (status, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, 200, "{v}");
    // An image whose data fails to decode gives its pixels back too (twice: none leaked).
    let side = (pic.pixels() as f64).sqrt() as u32;
    for _ in 0..2 {
        let (status, v) =
            json_call(&router, post("/v1/chat/completions", &ask(&data_url(&claimed_png(side, side))))).await;
        assert_eq!(status, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("PNG data"), "{v}");
    }
    let (status, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, 200, "{v}");
}

async fn call_owned(router: axum::Router, body: Value) -> (u16, String) {
    let (s, b) = call(&router, post("/v1/chat/completions", &body)).await;
    (s.as_u16(), b)
}
