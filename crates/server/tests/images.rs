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
    let mut png = Vec::new();
    image_png(&pic, &mut png);
    let (_, other) = json_call(&router, post("/v1/chat/completions", &ask(&data_url(&png)))).await;
    assert_eq!(other["usage"]["prompt_tokens"].as_u64(), Some(prompt));
    assert_eq!(other["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));
}

/// `pic` as a PNG, written by hand (stored deflate blocks), so the test needs no encoder.
fn image_png(pic: &k3_vision::Picture, out: &mut Vec<u8>) {
    let crc = |b: &[u8]| {
        let mut c = !0u32;
        for &x in b {
            c ^= u32::from(x);
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
        }
        !c
    };
    let chunk = |out: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
        out.extend((data.len() as u32).to_be_bytes());
        let body: Vec<u8> = kind.iter().chain(data).copied().collect();
        out.extend(&body);
        out.extend(crc(&body).to_be_bytes());
    };
    let raw: Vec<u8> = pic
        .rgb
        .chunks_exact(pic.width as usize * 3)
        .flat_map(|row| std::iter::once(0u8).chain(row.iter().copied()))
        .collect();
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        z.extend((b.len() as u16).to_le_bytes());
        z.extend((!(b.len() as u16)).to_le_bytes());
        z.extend(*b);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in &raw {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    z.extend(((b << 16) | a).to_be_bytes());
    out.extend(b"\x89PNG\r\n\x1a\n");
    let mut ihdr = pic.width.to_be_bytes().to_vec();
    ihdr.extend(pic.height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    chunk(out, b"IHDR", &ihdr);
    chunk(out, b"IDAT", &z);
    chunk(out, b"IEND", &[]);
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
