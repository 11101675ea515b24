//! Tool calls read out of a reply token by token (K2 / `im_` markup): calls whole at their end
//! marker, text around them streamed, malformed or cut-off markup shown as the text it was.

mod common;

use common::kimi_tokenizer as tokenizer;
use k3_engine::tokenizer::{KIMI_PATTERN, Tokenizer};
use k3_engine::toolcall::{Piece, ToolCall, ToolCallReader};

/// Feeds `reply` (markup as special tokens) token by token: the pieces, text runs merged.
fn read(tok: &Tokenizer, reply: &str) -> Vec<Piece> {
    let mut r = ToolCallReader::new(tok).unwrap();
    let mut out: Vec<Piece> = Vec::new();
    let ids = tok.encode_with_specials(reply);
    let pieces = ids.iter().flat_map(|&id| {
        let text = if tok.special_name(id).is_some() {
            String::new()
        } else {
            String::from_utf8(tok.decode_bytes(&[id]).unwrap()).unwrap()
        };
        r.push(id, &text)
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
    let mut r = ToolCallReader::new(&tok).unwrap();
    let mut shown = String::new();
    for id in tok.encode(reply) {
        for p in r.push(id, &String::from_utf8(tok.decode_bytes(&[id]).unwrap()).unwrap()) {
            let Piece::Text(t) = p else { panic!("a call from plain text: {p:?}") };
            shown.push_str(&t);
        }
    }
    assert_eq!(shown, reply);
    assert_eq!(
        ToolCallReader::new(&Tokenizer::from_tiktoken(b"IQ== 0\n", None, KIMI_PATTERN).unwrap()).map(|_| ()),
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
