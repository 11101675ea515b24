//! Ollama's request bodies translated into the OpenAI ones this server already checks, so both
//! APIs share one set of rules: every field honoured or refused by name, `options` included.
//! Resource hints Ollama's clients send (`num_thread`, `num_gpu`, `keep_alive`, ...) ask nothing
//! of the answer and are ignored; sampling options k3 does not have are refused unless they are
//! at their "off" value.

use serde_json::{Map, Value, json};

use crate::error::{ApiError, short};

/// `options` that map to an OpenAI field of the same name.
const SAME: [&str; 10] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
];

/// `options` about where and how the model runs, not what it answers.
const HINTS: [&str; 11] = [
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "low_vram",
    "numa",
    "f16_kv",
    "vocab_only",
];

/// Sampling `options` k3 does not have, with the value that turns each off.
const OFF: [(&str, f64); 4] = [("mirostat", 0.0), ("typical_p", 1.0), ("tfs_z", 1.0), ("penalize_newline", 0.0)];

/// An Ollama body's top-level fields: each known one's name.
fn check_fields(body: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match body.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            Err(ApiError::bad(k, format!("`{k}` is not a field this server takes (it takes {})", known.join(", "))))
        }
        None => Ok(()),
    }
}

/// A field's JSON type as Ollama's Go structs declare it. `null` is every field's zero value
/// (Go's `encoding/json` leaves the field unset), so it passes as each type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Text,
    Bool,
    List,
    Object,
    /// `keep_alive`: a duration string (`"5m"`) or a number of seconds.
    Duration,
    /// Checked where the field is read (`format`, `think`: more than one type).
    Any,
}

impl Type {
    fn fits(self, v: &Value) -> bool {
        match self {
            Type::Text => v.is_string(),
            Type::Bool => v.is_boolean(),
            Type::List => v.is_array(),
            Type::Object => v.is_object(),
            Type::Duration => v.is_string() || v.is_number(),
            Type::Any => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Type::Text => "a string",
            Type::Bool => "true or false",
            Type::List => "a list",
            Type::Object => "an object",
            Type::Duration => "a duration (\"5m\") or a number of seconds",
            Type::Any => "any value",
        }
    }
}

/// `/api/chat`'s fields and their types. `truncate` and `shift` (Ollama drops or shifts
/// earlier messages when the prompt does not fit, unless they are false) are taken either way:
/// k3 never drops a message, it answers a prompt that cannot fit with an error.
const CHAT: [(&str, Type); 10] = [
    ("model", Type::Text),
    ("messages", Type::List),
    ("tools", Type::List),
    ("format", Type::Any),
    ("options", Type::Object),
    ("stream", Type::Bool),
    ("keep_alive", Type::Duration),
    ("think", Type::Any),
    ("truncate", Type::Bool),
    ("shift", Type::Bool),
];

/// `/api/generate`'s fields and their types (`truncate` and `shift` as in [`CHAT`]).
const GENERATE: [(&str, Type); 13] = [
    ("model", Type::Text),
    ("prompt", Type::Text),
    ("system", Type::Text),
    ("raw", Type::Bool),
    ("stream", Type::Bool),
    ("format", Type::Any),
    ("options", Type::Object),
    ("keep_alive", Type::Duration),
    ("think", Type::Any),
    ("images", Type::List),
    ("suffix", Type::Text),
    ("truncate", Type::Bool),
    ("shift", Type::Bool),
];

/// A message's fields and their types.
const MESSAGE: [(&str, Type); 6] = [
    ("role", Type::Text),
    ("content", Type::Text),
    ("thinking", Type::Text),
    ("images", Type::List),
    ("tool_calls", Type::List),
    ("tool_name", Type::Text),
];

/// `/api/show`'s fields and their types (others are ignored, as Ollama ignores them).
const SHOW: [(&str, Type); 6] = [
    ("model", Type::Text),
    ("name", Type::Text),
    ("verbose", Type::Bool),
    ("system", Type::Text),
    ("template", Type::Text),
    ("options", Type::Object),
];

/// Each of `fields` present in `body` is of its type (Ollama answers 400 otherwise: a string
/// `"false"` is not `stream: false`); the error names the field (`prefix` before it).
fn check_types(body: &Map<String, Value>, fields: &[(&str, Type)], prefix: &str) -> Result<(), ApiError> {
    for (name, ty) in fields {
        match body.get(*name) {
            Some(v) if !v.is_null() && !ty.fits(v) => {
                let field = format!("{prefix}{name}");
                return Err(ApiError::bad(&field, format!("{} is not {}", short(v), ty.name())));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `POST /api/show`'s body: its fields' types.
pub fn show(body: &Value) -> Result<(), ApiError> {
    check_types(object(body)?, &SHOW, "")
}

/// The served model's names: its id, and the id with Ollama's `:latest` tag.
pub fn same_model(asked: &str, id: &str) -> bool {
    asked.is_empty() || asked == id || asked.strip_suffix(":latest") == Some(id)
}

/// `options` and the answer's other settings into `out` (an OpenAI request being built).
fn options(body: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    out.insert("stream".into(), json!(body.get("stream").and_then(Value::as_bool).unwrap_or(true)));
    if let Some(m) = body.get("model").and_then(Value::as_str) {
        out.insert("model".into(), json!(m.strip_suffix(":latest").unwrap_or(m)));
    }
    match body.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "strict": true, "schema": schema}}),
            );
        }
        Some(other) => return Err(ApiError::bad("format", format!("{other}: give \"json\" or a JSON schema"))),
    }
    match body.get("think") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            out.insert("reasoning_effort".into(), json!("none"));
        }
        Some(Value::String(e)) if matches!(e.as_str(), "low" | "high" | "max") => {
            out.insert("reasoning_effort".into(), json!(e));
        }
        Some(other) => {
            return Err(ApiError::bad("think", format!("{other}: give true, false, \"low\", \"high\" or \"max\"")));
        }
    }
    let Some(opts) = body.get("options").filter(|o| !o.is_null()) else { return Ok(()) };
    let opts = opts.as_object().ok_or_else(|| ApiError::bad("options", "options is not an object"))?;
    for (k, v) in opts {
        let field = format!("options.{k}");
        match k.as_str() {
            k if SAME.contains(&k) => {
                out.insert(k.into(), v.clone());
            }
            "num_predict" => match v.as_i64() {
                Some(-1 | -2) => {}
                Some(n) if n > 0 => {
                    out.insert("max_tokens".into(), json!(n));
                }
                _ => return Err(ApiError::bad(&field, format!("{v}: give a count of tokens, or -1 for no limit"))),
            },
            // Above the server's context it is clamped, as Ollama clamps it ([`num_ctx_over`]).
            "num_ctx" => match v.as_u64() {
                Some(n) if n > 0 => {}
                _ => return Err(ApiError::bad(&field, format!("{v}: give a context size in tokens"))),
            },
            k if HINTS.contains(&k) => {}
            k => match OFF.iter().find(|(name, _)| *name == k) {
                Some((_, off)) if v.as_f64() == Some(*off) || v.as_bool() == Some(false) => {}
                Some((_, off)) => {
                    return Err(ApiError::bad(&field, format!("{v}: k3 does not sample with {k} (only {off}, off)")));
                }
                None => return Err(ApiError::bad(&field, format!("`{k}` is not an option this server knows"))),
            },
        }
    }
    Ok(())
}

/// `options.num_ctx` when it asks for more than the server's `context`: the request runs in
/// that context instead (Ollama clamps to what the model has; the handler says so in the log
/// and the `x-k3-num-ctx` header).
pub fn num_ctx_over(body: &Value, context: u64) -> Option<u64> {
    body.get("options")?.get("num_ctx")?.as_u64().filter(|&n| n > context)
}

/// A `messages[i]` of Ollama's into OpenAI's shape (tool calls' arguments stay objects, which the
/// chat request keeps as written).
fn message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let field = format!("messages[{i}]");
    let m = m.as_object().ok_or_else(|| ApiError::bad(&field, "a message is an object"))?;
    check_fields(m, &MESSAGE.map(|(name, _)| name))
        .map_err(|e| ApiError::bad(&format!("{field}.{}", e.param.unwrap_or_default()), e.message))?;
    check_types(m, &MESSAGE, &format!("{field}."))?;
    let mut out = Map::new();
    out.insert("role".into(), m.get("role").cloned().unwrap_or(Value::Null));
    let content = m.get("content").cloned().unwrap_or(json!(""));
    out.insert("content".into(), with_images(m.get("images"), content, &format!("{field}.images"))?);
    if let Some(t) = m.get("thinking").filter(|t| !t.is_null()) {
        out.insert("reasoning_content".into(), t.clone());
    }
    if let Some(n) = m.get("tool_name").filter(|t| !t.is_null()) {
        out.insert("name".into(), n.clone());
    }
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| json!({"type": "function", "function": c.get("function").cloned().unwrap_or(Value::Null)}))
            .collect();
        out.insert("tool_calls".into(), json!(calls));
    }
    Ok(Value::Object(out))
}

fn object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object().ok_or_else(|| ApiError::bad("body", "the request body is not a JSON object"))
}

/// `POST /api/chat`'s body as a `/v1/chat/completions` body.
pub fn chat(body: &Value) -> Result<Value, ApiError> {
    let body = object(body)?;
    check_fields(body, &CHAT.map(|(name, _)| name))?;
    check_types(body, &CHAT, "")?;
    let mut out = Map::new();
    options(body, &mut out)?;
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("messages", "give messages: [{\"role\": \"user\", \"content\": \"...\"}]"))?;
    let messages = messages.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<_>, _>>()?;
    out.insert("messages".into(), json!(messages));
    if let Some(t) = body.get("tools").filter(|t| !t.is_null()) {
        out.insert("tools".into(), t.clone());
    }
    Ok(Value::Object(out))
}

/// What `POST /api/generate` asks for.
#[derive(Debug)]
pub enum Generate {
    /// No prompt: Ollama's way to load a model (answered at once).
    Load,
    /// A `/v1/chat/completions` body (the prompt as a user turn, `system` before it).
    Chat(Value),
    /// `raw`: a `/v1/completions` body (the prompt as it is).
    Raw(Value),
}

/// `POST /api/generate`'s body.
pub fn generate(body: &Value) -> Result<Generate, ApiError> {
    let body = object(body)?;
    check_fields(body, &GENERATE.map(|(name, _)| name))?;
    check_types(body, &GENERATE, "")?;
    if body.get("suffix").is_some_and(|s| !s.is_null() && s.as_str() != Some("")) {
        return Err(ApiError::bad("suffix", "fill-in-the-middle (suffix) is not supported"));
    }
    let prompt = match body.get("prompt") {
        None | Some(Value::Null) => return Ok(Generate::Load),
        Some(Value::String(p)) if p.is_empty() => return Ok(Generate::Load),
        Some(Value::String(p)) => p.clone(),
        Some(other) => return Err(ApiError::bad("prompt", format!("{other} is not text"))),
    };
    let mut out = Map::new();
    options(body, &mut out)?;
    let system = body.get("system").and_then(Value::as_str).filter(|s| !s.is_empty());
    if body.get("raw").and_then(Value::as_bool).unwrap_or(false) {
        if system.is_some() {
            return Err(ApiError::bad("system", "a raw prompt is sent as it is: put the system text in it"));
        }
        if body.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            return Err(ApiError::bad("images", "images go in a chat prompt: send them without raw"));
        }
        out.remove("reasoning_effort");
        out.insert("prompt".into(), json!(prompt));
        return Ok(Generate::Raw(Value::Object(out)));
    }
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": with_images(body.get("images"), json!(prompt), "images")?}));
    out.insert("messages".into(), json!(messages));
    Ok(Generate::Chat(Value::Object(out)))
}

/// Ollama's `images` (base64, no data URL) as OpenAI content parts before the text: `image_url`
/// parts the chat request reads like any other (a model without eyes refuses them there).
fn with_images(images: Option<&Value>, content: Value, field: &str) -> Result<Value, ApiError> {
    let images = match images {
        None | Some(Value::Null) => return Ok(content),
        Some(Value::Array(a)) if a.is_empty() => return Ok(content),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::bad(field, "images is a list of base64 strings")),
    };
    let mut parts = Vec::with_capacity(images.len() + 1);
    for (j, img) in images.iter().enumerate() {
        let b64 = img.as_str().ok_or_else(|| ApiError::bad(&format!("{field}[{j}]"), "an image is a base64 string"))?;
        parts.push(json!({"type": "image_url", "image_url": {"url": format!("data:image/*;base64,{b64}")}}));
    }
    match content {
        Value::String(t) if !t.is_empty() => parts.push(json!({"type": "text", "text": t})),
        Value::String(_) | Value::Null => {}
        other => return Err(ApiError::bad(field, format!("{other}: content is text"))),
    }
    Ok(json!(parts))
}

/// An error about an OpenAI field, renamed to the Ollama field the client sent.
pub fn renamed(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.as_deref() {
        let ollama = match p {
            "response_format" => "format".to_string(),
            "max_tokens" => "options.num_predict".to_string(),
            "reasoning_effort" => "think".to_string(),
            p if SAME.contains(&p) => format!("options.{p}"),
            p => p.to_string(),
        };
        e.param = Some(ollama);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_openai_fields_and_unknown_ones_are_refused() {
        let body = json!({"model": "default:latest", "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "num_predict": 5, "num_thread": 4, "mirostat": 0, "stop": ["x"]},
            "format": "json", "think": false});
        let v = chat(&body).unwrap();
        assert_eq!(v["model"], "default");
        assert_eq!((v["temperature"].as_f64(), v["max_tokens"].as_u64()), (Some(0.0), Some(5)));
        assert_eq!((v["stream"].as_bool(), v["reasoning_effort"].as_str()), (Some(true), Some("none")));
        assert_eq!(v["response_format"]["type"], "json_object");
        assert!(v.get("num_thread").is_none());
        let big = json!({"messages": [], "options": {"num_ctx": 100000}});
        assert!(chat(&big).is_ok(), "num_ctx above the context is clamped, not refused");
        assert_eq!((num_ctx_over(&big, 4096), num_ctx_over(&big, 200_000)), (Some(100_000), None));
        for (opts, field) in [
            (json!({"mirostat": 2}), "options.mirostat"),
            (json!({"num_ctx": 0}), "options.num_ctx"),
            (json!({"warp_speed": 9}), "options.warp_speed"),
            (json!({"num_predict": 0}), "options.num_predict"),
        ] {
            let body = json!({"messages": [], "options": opts});
            assert_eq!(chat(&body).unwrap_err().param.as_deref(), Some(field));
        }
        let body = json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]});
        let parts = &chat(&body).unwrap()["messages"][0]["content"];
        assert_eq!(parts[0]["image_url"]["url"], "data:image/*;base64,aGk=");
        assert_eq!(parts[1], json!({"type": "text", "text": "x"}));
        let body = json!({"messages": [{"role": "user", "content": "x", "images": [7]}]});
        assert_eq!(chat(&body).unwrap_err().param.as_deref(), Some("messages[0].images[0]"));
        assert_eq!(chat(&json!({"messages": [], "bogus": 1})).unwrap_err().param.as_deref(), Some("bogus"));
    }

    #[test]
    fn generate_is_a_user_turn_a_raw_prompt_or_a_load() {
        assert!(matches!(generate(&json!({"model": "m"})), Ok(Generate::Load)));
        let Ok(Generate::Chat(v)) = generate(&json!({"prompt": "p", "system": "s"})) else { panic!() };
        assert_eq!(v["messages"], json!([{"role": "system", "content": "s"}, {"role": "user", "content": "p"}]));
        let Ok(Generate::Raw(v)) = generate(&json!({"prompt": "p", "raw": true, "stream": false})) else { panic!() };
        assert_eq!((v["prompt"].as_str(), v["stream"].as_bool()), (Some("p"), Some(false)));
        let e = generate(&json!({"prompt": "p", "raw": true, "system": "s"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("system"));
    }
}
