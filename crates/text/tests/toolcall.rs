//! Tool calls read out of a reply token by token (K2 / `im_` markup): calls whole at their end
//! marker, text around them streamed, malformed or cut-off markup shown as the text it was.

mod common;

use common::kimi_tokenizer as tokenizer;
use k3_text::Dialect;
use k3_text::tokenizer::{KIMI_PATTERN, Tokenizer};
use k3_text::toolcall::{Piece, ToolCall, ToolCallReader};

/// Feeds `reply` (markup as special tokens) token by token: the pieces, text runs merged.
fn read(tok: &Tokenizer, reply: &str) -> Vec<Piece> {
    read_as(tok, reply, Dialect::Im)
}

fn read_as(tok: &Tokenizer, reply: &str, dialect: Dialect) -> Vec<Piece> {
    let mut r = ToolCallReader::new(tok, dialect).unwrap();
    let mut out: Vec<Piece> = Vec::new();
    let ids = tok.encode_with_specials(reply);
    let pieces = ids.iter().flat_map(|&id| {
        let raw = if tok.special_name(id).is_some() { Vec::new() } else { tok.decode_bytes(&[id]).unwrap() };
        r.push(tok, id, &String::from_utf8(raw).unwrap())
    });
    let mut all: Vec<Piece> = pieces.collect();
    all.extend(r.finish());
    for p in all {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

fn call(id: &str, name: &str, arguments: &str) -> Piece {
    Piece::Call(ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() })
}

#[test]
fn calls_come_out_whole_and_text_streams_around_them() {
    let tok = tokenizer();
    let reply = "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(
        read(&tok, reply),
        vec![
            Piece::Text("Checking.".into()),
            call("functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"),
            call("functions.now:1", "now", "{}"),
        ]
    );
    // The same characters as ordinary tokens (a model spelling the markup out) are text.
    let mut r = ToolCallReader::new(&tok, Dialect::Im).unwrap();
    let mut shown = String::new();
    for id in tok.encode(reply) {
        let raw = tok.decode_bytes(&[id]).unwrap();
        for p in r.push(&tok, id, &String::from_utf8(raw).unwrap()) {
            let Piece::Text(t) = p else { panic!("a call from plain text: {p:?}") };
            shown.push_str(&t);
        }
    }
    assert_eq!(shown, reply);
    assert_eq!(
        ToolCallReader::new(&Tokenizer::from_tiktoken(b"IQ== 0\n", None, KIMI_PATTERN).unwrap(), Dialect::Im)
            .map(|_| ()),
        None
    );
}

#[test]
fn malformed_or_cut_off_markup_ends_as_text() {
    let tok = tokenizer();
    let cut = "Hi<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Pa";
    assert_eq!(
        read(&tok, cut),
        vec![Piece::Text(
            "Hi<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Pa".into()
        )]
    );
    let bad_id =
        "<|tool_calls_section_begin|><|tool_call_begin|>not a call id<|tool_call_argument_begin|>{}<|tool_call_end|>";
    assert_eq!(read(&tok, bad_id), vec![Piece::Text(bad_id.into())]);
    let out_of_place = "<|tool_calls_section_begin|><|tool_call_end|>after";
    assert_eq!(
        read(&tok, out_of_place),
        vec![Piece::Text("<|tool_calls_section_begin|><|tool_call_end|>after".into())]
    );
    // A complete call, then the section left open: the call stands, nothing is owed.
    let open = "<|tool_calls_section_begin|><|tool_call_begin|>now:3<|tool_call_argument_begin|>{}<|tool_call_end|>";
    assert_eq!(read(&tok, open), vec![call("now:3", "now", "{}")]);
}

/// K3's calls read back out of the `tools` element K3's own template writes
/// (fixtures/chat/k3-tools.json, case 1: jinja2's rendering of an assistant turn with two calls):
/// each call's name and its arguments as the JSON object the template was given.
#[test]
fn k3_calls_are_read_from_the_markup_k3s_template_writes() {
    let tok = tokenizer();
    let cases: Vec<serde_json::Value> = serde_json::from_slice(
        &std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat/k3-tools.json"))
            .unwrap(),
    )
    .unwrap();
    let rendered = cases[1]["rendered"].as_str().unwrap();
    let reply = &rendered[rendered.find("<|open|>response<|sep|>").unwrap() + "<|open|>response<|sep|>".len()..];
    let reply = &reply[..reply.find("<|end_of_msg|>").unwrap()];
    let pieces = read_as(&tok, reply, Dialect::Xtml);
    let want = cases[1]["messages"][1]["tool_calls"].as_array().unwrap();
    let calls: Vec<_> = pieces.iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }).collect();
    assert_eq!(calls.len(), want.len(), "{pieces:?}");
    for (got, want) in calls.iter().zip(want) {
        assert_eq!(got.name, want["function"]["name"].as_str().unwrap());
        let args: serde_json::Value = serde_json::from_str(&got.arguments).unwrap();
        assert_eq!(args, want["function"]["arguments"], "{}", got.arguments);
    }
    // The answer's text streams; the markup around it is not text.
    let text: String =
        pieces.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect();
    assert_eq!(text, "Checking.");
}

#[test]
fn k3_malformed_or_cut_off_calls_end_as_text() {
    let tok = tokenizer();
    let call = "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>";
    for bad in [
        // A value that is not of its declared type.
        format!(
            "{call}<|open|>argument key=\"n\" type=\"number\"<|sep|>many<|close|>argument<|sep|><|close|>call<|sep|>"
        ),
        // Cut off inside a call.
        format!("{call}<|open|>argument key=\"q\" type=\"string\"<|sep|>half"),
        // An element out of place.
        format!("{call}<|close|>tools<|sep|>"),
        // A call without a tool.
        "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|>".to_string(),
    ] {
        let pieces = read_as(&tok, &bad, Dialect::Xtml);
        assert!(
            matches!(pieces.as_slice(), [Piece::Text(t)] if bad.starts_with(t.as_str()) && t.len() > 20),
            "{bad}: {pieces:?}"
        );
    }
    // The markup's characters as ordinary tokens are text, never a call.
    let spelled = "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|close|>call<|sep|>";
    let mut r = ToolCallReader::new(&tok, Dialect::Xtml).unwrap();
    for id in tok.encode(spelled) {
        let raw = tok.decode_bytes(&[id]).unwrap();
        assert!(r.push(&tok, id, &String::from_utf8_lossy(&raw)).iter().all(|p| matches!(p, Piece::Text(_))));
    }
    // A whole call with a `json` child and typed values.
    let ok = format!(
        "{call}<|open|>argument key=\"a&quot;b\" type=\"array\"<|sep|>[1, \"x\"]<|close|>argument<|sep|><|open|>argument key=\"s\" type=\"string\"<|sep|>say \"hi\"<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{{\"k\": null}}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
    );
    let pieces = read_as(&tok, &ok, Dialect::Xtml);
    assert_eq!(
        pieces,
        vec![crate::call("", "f", r#"{"a\"b":[1, "x"],"s":"say \"hi\""}"#), crate::call("", "g", r#"{"k": null}"#)]
    );
}
