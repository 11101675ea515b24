//! A model's own Jinja chat template (K2, DeepSeek-V3: `tokenizer_config.json`'s `chat_template`),
//! rendered with minijinja configured as transformers' `apply_chat_template` configures jinja2:
//! `trim_blocks`, `lstrip_blocks`, loop controls, its `tojson` (Python's `json.dumps`: `", "` and
//! `": "`, key order kept, no ASCII escaping), `raise_exception`, Python's str/dict methods, and
//! lists in a `namespace` that `append` and `pop` (K2's templates queue tool-call ids that way).
//!
//! Content never passes through the tokenizer with the markup: every client string (message
//! text, reasoning, names, call arguments) enters the template as a placeholder; the rendering is
//! split at the placeholders, the template's own text tokenized with special tokens recognized,
//! each client string tokenized on its own as plain text.
//!
//! A template is code from the internet, so it runs within limits (see [`Limits`]): fuel (every
//! instruction costs one: a nested loop cannot hang a server worker), recursion depth (a macro
//! that calls itself cannot overflow the stack), the rendering's size (`'a' * 10**8` cannot
//! grow into gigabytes of tokens), and lists that cannot be made to hold themselves (printing a
//! cycle would recurse forever). Exceeding one is an error naming the limit.

use std::sync::{Arc, Mutex};

use minijinja::value::{Kwargs, Object, ObjectRepr, Value};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::json_style::{object_entries, python_json, sorted_json};
use crate::message::{ChatError, Message, PromptOptions, Role};
use crate::tokenizer::Tokenizer;

/// Brackets a placeholder's index: code points of a private-use plane no template or tokenizer
/// uses. A placeholder the template passed through `tojson` opens with `JSON_OPEN` instead and
/// stands for its string JSON-escaped.
const OPEN: char = '\u{F0000}';
const CLOSE: char = '\u{F0001}';
const JSON_OPEN: char = '\u{F0002}';

/// What one rendering may spend. The releases' templates use a small part of each: the probe
/// conversation of `super::check_template` takes under 1% of the fuel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Template instructions per rendering.
    pub fuel: u64,
    /// Nested calls (macros, includes, recursive loops).
    pub depth: usize,
    /// Bytes of rendered text (client strings stand in it as short placeholders).
    pub output: usize,
}

pub const LIMITS: Limits = Limits { fuel: 20_000_000, depth: 64, output: 16 << 20 };

/// A compiled chat template.
#[derive(Debug)]
pub struct Template {
    env: Environment<'static>,
    limits: Limits,
}

impl Template {
    pub fn with_limits(source: &str, limits: Limits) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.depth);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("namespace", namespace);
        check_namespaces(source)?;
        env.add_template_owned("chat", source.to_string()).map_err(|e| {
            ChatError::invalid("chat_template", format!("the model's chat template does not parse: {e}"))
        })?;
        Ok(Template { env, limits })
    }

    /// The conversation's token ids: `messages` and `o` as the template renders them, with the
    /// prompt for the assistant's turn when `generation_prompt`.
    pub fn render(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        o: &PromptOptions<'_>,
        generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        let mut strings = Strings::default();
        let msgs: Vec<Value> = messages.iter().map(|m| strings.message(m)).collect();
        let tools = match o.tools {
            Some(t) => {
                let v = json_value(t).ok_or_else(|| ChatError::invalid("tools", "not valid JSON"))?;
                check_declarations(tok, t)?;
                v
            }
            None => Value::from(()),
        };
        let ctx = minijinja::context! {
            messages => msgs,
            tools => tools,
            add_generation_prompt => generation_prompt,
            thinking => o.think,
        };
        let t = self.env.get_template("chat").map_err(|e| ChatError::invalid("chat_template", e.to_string()))?;
        let mut out = Bounded { text: Vec::new(), limit: self.limits.output };
        if let Err(e) = t.render_captured_to(ctx, &mut out) {
            let why = match e.kind() {
                ErrorKind::OutOfFuel => format!(
                    "the model's chat template ran more than {} instructions (a template that never ends?)",
                    self.limits.fuel
                ),
                _ if out.text.len() > self.limits.output => {
                    format!("the model's chat template wrote more than {} bytes", self.limits.output)
                }
                _ if e.to_string().contains("recursion") => {
                    format!("the model's chat template nests calls deeper than {}", self.limits.depth)
                }
                _ => format!("the model's chat template: {e}"),
            };
            return Err(ChatError::invalid("chat_template", why));
        }
        let text = String::from_utf8(out.text)
            .map_err(|_| ChatError::invalid("chat_template", "the model's chat template wrote invalid UTF-8"))?;
        Ok(strings.tokenize(tok, &text))
    }
}

/// Refuses a template that stores a namespace inside a namespace (`{% set ns.a = ns %}`, or
/// through a name bound to it): printing or serializing that cycle would recurse until the stack
/// overflows, and minijinja's namespaces cannot refuse the assignment at run time as
/// [`List`]s refuse theirs.
fn check_namespaces(source: &str) -> Result<(), ChatError> {
    let sets: Vec<(&str, &str)> = source
        .split("{%")
        .skip(1)
        .filter_map(|tag| tag.split("%}").next())
        .map(|tag| tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()))
        .filter_map(|tag| tag.strip_prefix("set "))
        .filter_map(|rest| rest.split_once('='))
        .map(|(lhs, rhs)| (lhs.trim(), rhs.trim()))
        .collect();
    let mut spaces: Vec<&str> = Vec::new();
    loop {
        let before = spaces.len();
        for (lhs, rhs) in &sets {
            let bound = rhs.starts_with("namespace(") || spaces.contains(rhs);
            if !lhs.contains('.') && bound && !spaces.contains(lhs) {
                spaces.push(lhs);
            }
        }
        if spaces.len() == before {
            break;
        }
    }
    for (lhs, rhs) in sets.iter().filter(|(lhs, _)| lhs.contains('.')) {
        if let Some(ns) = bare_names(rhs).find(|w| spaces.contains(w)) {
            return Err(ChatError::invalid(
                "chat_template",
                format!(
                    "the model's chat template stores the namespace `{ns}` inside one (`set {lhs} = ...`): a cycle"
                ),
            ));
        }
    }
    Ok(())
}

/// The names an expression uses as whole values (not `x.attr`, `x[i]` or `x(...)`), outside
/// string literals.
fn bare_names(expr: &str) -> impl Iterator<Item = &str> {
    let mut names = Vec::new();
    let (b, mut i, mut quote) = (expr.as_bytes(), 0, None);
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == b'"' || c == b'\'' => quote = Some(c),
            None if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let after = expr[i..].trim_start().bytes().next();
                let member = start > 0 && b[start - 1] == b'.';
                if !member && !matches!(after, Some(b'.' | b'[' | b'(')) {
                    names.push(&expr[start..i]);
                }
                continue;
            }
            None => {}
        }
        i += 1;
    }
    names.into_iter()
}

/// The rendering, refused past `limit` bytes.
struct Bounded {
    text: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.limit {
            // Marks the overflow for the caller's message.
            self.text.resize(self.limit + 1, 0);
            return Err(std::io::Error::other("the rendering is too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The client strings standing in the template as placeholders.
#[derive(Debug, Default)]
struct Strings(Vec<String>);

impl Strings {
    /// A placeholder for `s` (the empty string stands for itself: templates test for it).
    fn put(&mut self, s: &str) -> Value {
        if s.is_empty() {
            return Value::from("");
        }
        self.0.push(s.to_string());
        Value::from(format!("{OPEN}{}{CLOSE}", self.0.len() - 1))
    }

    fn message(&mut self, m: &Message) -> Value {
        let mut fields: Vec<(&str, Value)> =
            vec![("role", Value::from(m.role.name())), ("content", self.put(&m.content))];
        if let Some(n) = &m.name {
            fields.push(("name", self.put(n)));
        }
        if let Some(r) = &m.thinking {
            fields.push(("reasoning_content", self.put(r)));
        }
        if let Some(id) = &m.tool_call_id {
            fields.push(("tool_call_id", Value::from(id.as_str())));
        }
        if m.role == Role::Assistant && !m.tool_calls.is_empty() {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    let function =
                        Value::from_iter([("name", self.put(&c.name)), ("arguments", self.put(&c.arguments))]);
                    let mut call = vec![("type", Value::from("function")), ("function", function)];
                    if let Some(id) = &c.id {
                        call.push(("id", Value::from(id.as_str())));
                    }
                    Value::from_iter(call)
                })
                .collect();
            fields.push(("tool_calls", Value::from(calls)));
        }
        Value::from_iter(fields)
    }

    /// The rendering's token ids: the template's text with special tokens, each client string
    /// on its own as plain text.
    fn tokenize(&self, tok: &Tokenizer, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find([OPEN, JSON_OPEN]) {
            let json = rest[at..].starts_with(JSON_OPEN);
            let after = &rest[at + OPEN.len_utf8()..];
            let placeholder = after.find(CLOSE).and_then(|end| Some((after[..end].parse::<usize>().ok()?, end)));
            match placeholder.and_then(|(i, end)| Some((self.0.get(i)?, end))) {
                Some((s, end)) => {
                    ids.extend(tok.encode_with_specials(&rest[..at]));
                    if json {
                        let quoted = serde_json::to_string(s).expect("a string serializes");
                        ids.extend(tok.encode(&quoted[1..quoted.len() - 1]));
                    } else {
                        ids.extend(tok.encode(s));
                    }
                    rest = &after[end + CLOSE.len_utf8()..];
                }
                // Not one of ours (it cannot be: declarations carrying these are refused).
                None => {
                    ids.extend(tok.encode_with_specials(&rest[..at + OPEN.len_utf8()]));
                    rest = after;
                }
            }
        }
        ids.extend(tok.encode_with_specials(rest));
        ids
    }
}

/// Tool declarations are rendered as the template writes them (the template may sort or reshape
/// them), so they must not carry markup: a special token's text or a placeholder mark in them is
/// refused rather than let them forge a turn.
fn check_declarations(tok: &Tokenizer, tools: &str) -> Result<(), ChatError> {
    let text: String = serde_json::from_str::<serde_json::Value>(tools)
        .map(|v| v.to_string())
        .map_err(|e| ChatError::invalid("tools", format!("not valid JSON: {e}")))?;
    if text.contains([OPEN, CLOSE, JSON_OPEN]) {
        return Err(ChatError::invalid("tools", "the declarations contain private-use marks k3 reserves"));
    }
    match tok.special_names().find(|name| text.contains(*name)) {
        Some(name) => Err(ChatError::invalid("tools", format!("the declarations contain the special token `{name}`"))),
        None => Ok(()),
    }
}

/// JSON text as a template value, objects in their written key order.
fn json_value(text: &str) -> Option<Value> {
    if let Some(entries) = object_entries(text) {
        let fields: Option<Vec<(String, Value)>> =
            entries.into_iter().map(|(k, v)| Some((k, json_value(v.get())?))).collect();
        return Some(Value::from_iter(fields?));
    }
    if let Ok(items) = serde_json::from_str::<Vec<Box<serde_json::value::RawValue>>>(text) {
        return Some(Value::from(items.iter().map(|r| json_value(r.get())).collect::<Option<Vec<Value>>>()?));
    }
    Some(Value::from_serialize(serde_json::from_str::<serde_json::Value>(text).ok()?))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` (its keyword arguments accepted; `sort_keys` honoured).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("indent")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let bad = |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, e.to_string());
    let compact = serde_json::to_string(value).map_err(bad)?;
    let compact = if sort.unwrap_or(false) { sorted_json(&compact).map_err(bad)? } else { compact };
    // A placeholder inside a string now stands for its string JSON-escaped.
    let text = python_json(&compact).map_err(bad)?.replace(OPEN, &JSON_OPEN.to_string());
    Ok(Value::from_safe_string(text))
}

/// jinja2's `namespace`, with every list in it one that `append` and `pop` change in place.
fn namespace(defaults: Option<Value>) -> Result<Value, Error> {
    let Some(defaults) = defaults else { return minijinja::functions::namespace(None) };
    let fields: Vec<(Value, Value)> = defaults
        .try_iter()?
        .map(|k| {
            let v = defaults.get_item(&k)?;
            let v = match v.kind() {
                minijinja::value::ValueKind::Seq => Value::from_object(List(Mutex::new(v.try_iter()?.collect()))),
                _ => v,
            };
            Ok((k, v))
        })
        .collect::<Result<_, Error>>()?;
    minijinja::functions::namespace(Some(Value::from_iter(fields)))
}

/// Whether `v` is or holds `list` (looked for to a bounded depth: deeper is taken as yes).
fn reaches(v: &Value, list: &Arc<List>, depth: usize) -> bool {
    if depth > 64 {
        return true;
    }
    if let Some(l) = v.downcast_object_ref::<List>() {
        if std::ptr::eq(l, Arc::as_ptr(list)) {
            return true;
        }
        let items = l.0.lock().map(|i| i.clone()).unwrap_or_default();
        return items.iter().any(|x| reaches(x, list, depth + 1));
    }
    match v.kind() {
        minijinja::value::ValueKind::Seq | minijinja::value::ValueKind::Map => v
            .try_iter()
            .map(|it| {
                it.collect::<Vec<_>>().iter().any(|k| {
                    let item = if v.kind() == minijinja::value::ValueKind::Map {
                        v.get_item(k).unwrap_or_default()
                    } else {
                        k.clone()
                    };
                    reaches(&item, list, depth + 1)
                })
            })
            .unwrap_or(false),
        _ => false,
    }
}

/// A list that templates change in place.
#[derive(Debug)]
struct List(Mutex<Vec<Value>>);

impl Object for List {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.0.lock().expect("not poisoned");
        let i = key.as_i64()?;
        let i = if i < 0 { items.len() as i64 + i } else { i };
        items.get(usize::try_from(i).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(self.0.lock().expect("not poisoned").clone())
    }

    fn call_method(self: &Arc<Self>, _: &State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        let mut items = self.0.lock().expect("not poisoned");
        match (method, args) {
            ("append", [x]) => {
                // A list that held itself (or a list holding it) would print forever.
                if reaches(x, self, 0) {
                    return Err(Error::new(ErrorKind::InvalidOperation, "a list cannot be appended to itself"));
                }
                items.push(x.clone());
                Ok(Value::from(()))
            }
            ("pop", []) => items.pop().ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "pop from empty list")),
            ("pop", [i]) => {
                let i = i.as_i64().unwrap_or(-1);
                let i = if i < 0 { items.len() as i64 + i } else { i };
                match usize::try_from(i).ok().filter(|&i| i < items.len()) {
                    Some(i) => Ok(items.remove(i)),
                    None => Err(Error::new(ErrorKind::InvalidOperation, "pop index out of range")),
                }
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        }
    }
}
