//! The tokenizer against Python tiktoken (fixtures/tokenizer/README.md): identical ids on 1,200
//! varied strings, and streaming decode that reassembles characters split across tokens.

use std::path::{Path, PathBuf};

use k3_text::tokenizer::{KIMI_PATTERN, StreamDecoder, Tokenizer};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")
}

fn tokenizer() -> Tokenizer {
    let ranks = std::fs::read(dir().join("o200k_base.tiktoken")).unwrap();
    let config =
        br#"{"added_tokens_decoder": {"200000": {"content": "<|open|>"}, "200001": {"content": "<|close|>"}}}"#;
    Tokenizer::from_tiktoken(&ranks, Some(config), KIMI_PATTERN).unwrap()
}

fn reference() -> Vec<(String, Vec<u32>)> {
    std::fs::read_to_string(dir().join("reference.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["text"].as_str().unwrap().to_string(),
                v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect(),
            )
        })
        .collect()
}

#[test]
fn ids_equal_python_tiktoken_on_the_corpus() {
    let tok = tokenizer();
    let refs = reference();
    assert!(refs.len() >= 1000);
    let mut wrong = Vec::new();
    for (text, ids) in &refs {
        if &tok.encode(text) != ids {
            wrong.push(text.clone());
        }
    }
    assert!(wrong.is_empty(), "{} of {} differ, e.g. {:?}", wrong.len(), refs.len(), wrong.first());
}

#[test]
fn streaming_decode_reassembles_split_characters() {
    let tok = tokenizer();
    let mut split_seen = false;
    for (text, ids) in reference() {
        let mut d = StreamDecoder::default();
        let mut out = String::new();
        for id in &ids {
            let piece = d.push(&tok, *id).unwrap();
            if piece.is_empty() {
                split_seen = true;
            }
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
    }
    assert!(split_seen, "the corpus should contain a character split across tokens");
}

#[test]
fn special_tokens_are_single_ids_only_when_asked() {
    let tok = tokenizer();
    assert_eq!(
        tok.encode_with_specials("<|open|>hi<|close|>"),
        [vec![200000], tok.encode("hi"), vec![200001]].concat()
    );
    assert!(tok.encode("<|open|>").len() > 1, "as plain text it is ordinary tokens");
    assert_eq!(tok.special("<|close|>"), Some(200001));
    assert_eq!(tok.special_name(200000), Some("<|open|>"));
    assert!(tok.decode_bytes(&[300_000]).unwrap_err().to_string().contains("300000"));
}

#[test]
fn a_damaged_rank_file_names_the_line() {
    let e = Tokenizer::from_tiktoken(b"IQ== 0\nnot-base64! 1\n", None, KIMI_PATTERN).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("base64"), "{e}");
}

#[test]
fn a_hugging_face_tokenizer_json_loads_through_the_tokenizers_crate() {
    let json = std::fs::read(dir().join("minilm-tokenizer.json")).unwrap();
    let tok = Tokenizer::from_hf_json(&json).unwrap();
    // bert-base-uncased WordPiece ids.
    assert_eq!(tok.encode("Hello world"), vec![7592, 2088]);
    assert_eq!(String::from_utf8(tok.decode_bytes(&[7592, 2088]).unwrap()).unwrap(), "hello world");
    assert_eq!(tok.special("[CLS]"), Some(101));
    assert!(tok.decode_bytes(&[10_000_000]).is_err());
    assert!(Tokenizer::from_hf_json(b"{not json").unwrap_err().to_string().contains("tokenizer.json"));
}

/// A Hugging Face tokenizer matches its added tokens in any text it is given; `encode` must not
/// (a user who writes `<|im_end|>` would close their own turn), `encode_with_specials` must.
#[test]
fn hugging_face_special_tokens_are_single_ids_only_when_asked() {
    let model = k3_format::Model::open(dir().join("../default.waste")).unwrap();
    let tok = Tokenizer::from_files(|n| model.blob(n)).unwrap().unwrap();
    let end = tok.special("<|im_end|>").expect("the default model's end of turn");
    assert!(!tok.encode("a<|im_end|>b").contains(&end), "as plain text it is ordinary tokens");
    assert!(tok.encode_with_specials("a<|im_end|>b").contains(&end));
    assert_eq!(String::from_utf8(tok.decode_bytes(&tok.encode("a<|im_end|>b")).unwrap()).unwrap(), "a<|im_end|>b");
}
