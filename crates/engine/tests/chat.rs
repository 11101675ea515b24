//! Chat prompts built exactly as models.md spells the formats.

mod common;

use std::path::Path;

use common::kimi_tokenizer as tokenizer;
use k3_engine::chat::{ChatFormat, Message, Role, python_json};
use k3_engine::config::Family;
use k3_engine::tokenizer::{KIMI_PATTERN, Tokenizer};

#[test]
fn k3_xtml_turns_and_generation_prompt() {
    let tok = tokenizer();
    let sp = |n: &str| tok.special(n).unwrap();
    let e = |s: &str| tok.encode(s);
    let f = ChatFormat::new(&tok, Family::KimiK3);
    let msgs = [Message::new(Role::System, "Be brief."), Message::new(Role::User, "Hi")];
    let got = f.prompt(&msgs, true).unwrap();
    let mut want = Vec::new();
    for (role, text) in [("system", "Be brief."), ("user", "Hi")] {
        want.push(sp("<|open|>"));
        for seg in ["message", " role", "=\"", role, "\""] {
            want.extend(e(seg));
        }
        want.push(sp("<|sep|>"));
        want.extend(e(text));
        want.push(sp("<|close|>"));
        want.extend(e("message"));
        want.push(sp("<|sep|>"));
        want.push(sp("<|end_of_msg|>"));
    }
    want.push(sp("<|open|>"));
    for seg in ["message", " role", "=\"", "assistant", "\""] {
        want.extend(e(seg));
    }
    want.push(sp("<|sep|>"));
    want.push(sp("<|open|>"));
    want.extend(e("think"));
    want.push(sp("<|sep|>"));
    assert_eq!(got, want);
    let no_think = f.prompt(&msgs, false).unwrap();
    assert_eq!(no_think[no_think.len() - 3..], [sp("<|open|>"), e("response")[0], sp("<|sep|>")]);
    assert_eq!(f.end_of_turn().unwrap(), sp("<|end_of_msg|>"));
}

#[test]
fn k3_prior_assistant_turns_wrap_think_and_response() {
    let tok = tokenizer();
    let f = ChatFormat::new(&tok, Family::KimiK3);
    let mut a = Message::new(Role::Assistant, "Hello!");
    a.thinking = Some("greet".into());
    let ids = f.prompt(&[Message::new(Role::User, "Hi"), a], false).unwrap();
    let text = String::from_utf8_lossy(&tok.decode_bytes(&ids).unwrap()).into_owned();
    assert!(
        text.contains("<|open|>think<|sep|>greet<|close|>think<|sep|><|open|>response<|sep|>Hello!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"),
        "{text}"
    );
}

#[test]
fn kimi_linear_im_format() {
    let tok = tokenizer();
    let f = ChatFormat::new(&tok, Family::KimiLinear);
    let ids = f.prompt(&[Message::new(Role::User, "Hi")], false).unwrap();
    let text = String::from_utf8_lossy(&tok.decode_bytes(&ids).unwrap()).into_owned();
    assert_eq!(text, "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
    assert_eq!(f.end_of_turn().unwrap(), tok.special("<|im_end|>").unwrap());
}

#[test]
fn a_tokenizer_without_the_markers_is_a_clear_error() {
    let ranks =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer/o200k_base.tiktoken"))
            .unwrap();
    let tok = Tokenizer::from_tiktoken(&ranks, None, KIMI_PATTERN).unwrap();
    let e = ChatFormat::new(&tok, Family::KimiK3).prompt(&[], true).unwrap_err().to_string();
    assert!(e.contains("<|open|>"), "{e}");
}

/// Tool declarations, assistant tool calls and tool results as Kimi K2's own chat template renders
/// them (fixtures/chat/k2-tools.json: Python jinja2 with transformers' `tojson`, made by
/// tools/golden/k2_tool_renderings.py), compared as text: the declarations come in as a client
/// sends them (compact, ASCII-escaped) and are written as the template writes them.
#[test]
fn tool_turns_render_as_kimis_template_renders_them() {
    let tok = tokenizer();
    let f = ChatFormat::new(&tok, Family::KimiLinear);
    let cases: Vec<serde_json::Value> = serde_json::from_slice(
        &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat/k2-tools.json")).unwrap(),
    )
    .unwrap();
    for (i, c) in cases.iter().enumerate() {
        let messages: Vec<Message> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let role = match m["role"].as_str().unwrap() {
                    "system" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    _ => Role::Tool,
                };
                let mut msg = Message::new(role, m["content"].as_str().unwrap_or(""));
                msg.name = m["name"].as_str().map(str::to_string);
                msg.tool_calls = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        let func = &t["function"];
                        (func["name"].as_str().unwrap().to_string(), func["arguments"].as_str().unwrap().to_string())
                    })
                    .collect();
                msg
            })
            .collect();
        let tools = python_json(c["tools_text"].as_str().unwrap()).unwrap();
        let ids = f.prompt_with_tools(&messages, Some(&tools), false).unwrap();
        let text = String::from_utf8(tok.decode_bytes(&ids).unwrap()).unwrap();
        assert_eq!(text, c["rendered"].as_str().unwrap(), "case {i}");
    }
    assert!(python_json("{\"a\": [1, 2,").is_err(), "invalid JSON is refused");
}
