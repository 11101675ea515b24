//! K3's calls: after the response, `<|open|>tools<|sep|>`, per call
//! `<|open|>call tool="NAME" index="I"<|sep|>` with `<|open|>argument key="K" type="T"<|sep|>VALUE
//! <|close|>argument<|sep|>` children (or one `json` child holding the whole object), closed by
//! `<|close|>call<|sep|>`, then `<|close|>tools<|sep|>`: the markup the chat format writes for
//! calls in the history.

use crate::message::{Piece, ToolCall};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the `tools` element.
    Outside,
    /// Inside `tools`, between calls.
    Tools,
    /// Inside a call, between its arguments.
    Call,
    /// Inside an `argument` (or `json`) element: its value's bytes.
    Value,
}

/// Reads K3's `tools` element.
#[derive(Debug, Clone)]
pub struct XtmlReader {
    open: u32,
    close: u32,
    sep: u32,
    state: State,
    /// After `<|open|>` / `<|close|>`: the tag's bytes so far and whether it opens.
    tag: Option<(Vec<u8>, bool)>,
    /// The open `tools` element as written, markers spelled out: shown if it never closes well.
    raw: Vec<u8>,
    /// The call being read: its tool and `"key":value` entries.
    name: String,
    entries: Vec<String>,
    /// The value being read: its key (`None` for a `json` element), type and bytes.
    key: Option<String>,
    kind: String,
    value: Vec<u8>,
    /// A `json` element's whole-object arguments.
    object: Option<String>,
}

impl XtmlReader {
    pub fn new(tok: &Tokenizer) -> Option<Self> {
        Some(XtmlReader {
            open: tok.special("<|open|>")?,
            close: tok.special("<|close|>")?,
            sep: tok.special("<|sep|>")?,
            state: State::Outside,
            tag: None,
            raw: Vec::new(),
            name: String::new(),
            entries: Vec::new(),
            key: None,
            kind: String::new(),
            value: Vec::new(),
            object: None,
        })
    }

    pub fn push(&mut self, id: u32, raw: &[u8], visible: &str) -> Vec<Piece> {
        if self.state != State::Outside {
            match id {
                i if i == self.open => self.raw.extend_from_slice(b"<|open|>"),
                i if i == self.close => self.raw.extend_from_slice(b"<|close|>"),
                i if i == self.sep => self.raw.extend_from_slice(b"<|sep|>"),
                _ => self.raw.extend_from_slice(raw),
            }
        }
        if id == self.open || id == self.close {
            if self.tag.is_some() {
                return self.bail();
            }
            self.tag = Some((Vec::new(), id == self.open));
            return Vec::new();
        }
        if id == self.sep {
            return match self.tag.take() {
                Some((tag, opening)) => self.element(&String::from_utf8_lossy(&tag), opening),
                None if self.state == State::Outside => Vec::new(),
                None => self.bail(),
            };
        }
        if let Some((tag, _)) = &mut self.tag {
            tag.extend_from_slice(raw);
            return Vec::new();
        }
        match self.state {
            State::Outside if visible.is_empty() => Vec::new(),
            State::Outside => vec![Piece::Text(visible.to_string())],
            State::Value => {
                self.value.extend_from_slice(raw);
                Vec::new()
            }
            // Between elements only whitespace belongs; another special token does not.
            _ if !raw.is_empty() && raw.iter().all(u8::is_ascii_whitespace) => Vec::new(),
            _ => self.bail(),
        }
    }

    /// A complete `<|open|>TAG ...<|sep|>` or `<|close|>TAG<|sep|>`.
    fn element(&mut self, tag: &str, opening: bool) -> Vec<Piece> {
        let Some((name, attrs)) = parse_tag(tag) else { return self.bail() };
        let attr = |k: &str| attrs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
        match (self.state, name, opening) {
            (State::Outside, "tools", true) => {
                self.state = State::Tools;
                self.raw = b"<|open|>tools<|sep|>".to_vec();
            }
            (State::Outside, ..) => {}
            (State::Tools, "call", true) => match attr("tool") {
                Some(tool) if !tool.is_empty() => {
                    self.state = State::Call;
                    self.name = tool;
                    self.entries.clear();
                    self.object = None;
                }
                _ => return self.bail(),
            },
            (State::Tools, "tools", false) => {
                self.state = State::Outside;
                self.raw.clear();
            }
            (State::Call, "argument", true) => match (attr("key"), attr("type")) {
                (Some(key), Some(kind)) => self.start_value(Some(key), kind),
                _ => return self.bail(),
            },
            (State::Call, "json", true) if self.entries.is_empty() && self.object.is_none() => {
                self.start_value(None, "object".into())
            }
            (State::Call, "call", false) => return self.end_call(),
            (State::Value, "argument", false) if self.key.is_some() => return self.end_value(),
            (State::Value, "json", false) if self.key.is_none() => return self.end_value(),
            _ => return self.bail(),
        }
        Vec::new()
    }

    fn start_value(&mut self, key: Option<String>, kind: String) {
        self.state = State::Value;
        self.key = key;
        self.kind = kind;
        self.value.clear();
    }

    /// A value ends: a string as it stands, anything else as the JSON of its declared type.
    fn end_value(&mut self) -> Vec<Piece> {
        let Ok(text) = std::str::from_utf8(&self.value) else { return self.bail() };
        let json = if self.kind == "string" {
            serde_json::to_string(text).expect("a string serializes")
        } else {
            match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) if type_name(&v) == self.kind => text.trim().to_string(),
                _ => return self.bail(),
            }
        };
        match self.key.take() {
            Some(key) => {
                self.entries.push(format!("{}:{json}", serde_json::to_string(&key).expect("a string serializes")))
            }
            None => self.object = Some(json),
        }
        self.state = State::Call;
        Vec::new()
    }

    fn end_call(&mut self) -> Vec<Piece> {
        let arguments = self.object.take().unwrap_or_else(|| format!("{{{}}}", self.entries.join(",")));
        self.state = State::Tools;
        // What was shown as a call is no longer owed as text.
        self.raw = b"<|open|>tools<|sep|>".to_vec();
        vec![Piece::Call(ToolCall { id: String::new(), name: std::mem::take(&mut self.name), arguments })]
    }

    /// The reply ended: an open `tools` element with no call in progress closes quietly; one
    /// cut inside a call comes out as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        match self.state {
            State::Outside => Vec::new(),
            State::Tools if self.tag.is_none() && self.raw == b"<|open|>tools<|sep|>" => {
                self.state = State::Outside;
                self.raw.clear();
                Vec::new()
            }
            _ => self.bail(),
        }
    }

    fn bail(&mut self) -> Vec<Piece> {
        self.state = State::Outside;
        self.tag = None;
        vec![Piece::Text(String::from_utf8_lossy(&std::mem::take(&mut self.raw)).into_owned())]
    }
}

/// JSON's name for a value's type, as the markup writes it.
fn type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// `NAME ATTR="VALUE" ...` into the name and attributes (values unescaped); `None` if malformed.
pub(crate) fn parse_tag(tag: &str) -> Option<(&str, Vec<(String, String)>)> {
    let (name, mut rest) = tag.split_once(' ').map_or((tag, ""), |(n, r)| (n, r));
    let mut attrs = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        attrs.push((key.to_string(), value.replace("&quot;", "\"").replace("&amp;", "&")));
        rest = after;
    }
    (!name.is_empty()).then_some((name, attrs))
}
