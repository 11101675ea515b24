//! Anthropic's Messages body translated into the OpenAI chat body this server already checks, so
//! both APIs share one set of rules. Every field is honoured or refused by name; an error the
//! chat rules raise about an OpenAI field is renamed to the Anthropic field the client wrote
//! ([`Renames`]). The body is read as raw JSON (`RawValue`) so a tool's `input_schema` and a
//! call's `input` keep the client's key order: the model sees them as written, and a call sent
//! back renders as the model wrote it (the prefix cache resumes it).

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::blocks::{self, Out};
pub use super::fields::Renames;
use super::fields::{Obj, bad, boolean, join, known_keys, list, object, required_string, string, value, whole_number};
use crate::error::ApiError;

/// What `POST /v1/messages` takes (`seed` and `chat_template_kwargs` are k3's, as on
/// `/v1/chat/completions`).
const MESSAGES: [&str; 19] = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "context_management",
    "output_config",
    "cache_control",
    "speed",
    "chat_template_kwargs",
    "seed",
];

/// What `POST /v1/messages/count_tokens` takes: what shapes the prompt.
const COUNT: [&str; 10] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "context_management",
    "output_config",
    "cache_control",
    "chat_template_kwargs",
];

/// Which route a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Messages,
    CountTokens,
}

/// What `thinking` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// Absent or `adaptive`: the model's default (K3 thinks, as on `/v1/chat/completions`).
    Default,
    /// `{"type": "enabled", "budget_tokens": N}`: at most N tokens of thinking, within max_tokens.
    Budget(u64),
    /// `{"type": "disabled"}`.
    Off,
}

/// A translated request.
#[derive(Debug)]
pub struct Translated {
    /// The `/v1/chat/completions` body, as JSON text.
    pub body: String,
    pub thinking: Thinking,
    /// `thinking.display: "omitted"`: thinking blocks come back empty, with their signature.
    pub omit_thinking: bool,
    pub renames: Renames,
}

/// `tools` as OpenAI function tools, as JSON text (each `input_schema` as written).
fn tools(raw: &RawValue, renames: &mut Renames) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (i, t) in list(raw, "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        let t = object(t, &at)?;
        if let Some(kind) = string(&t, "type", &at)?.filter(|k| k != "custom") {
            return Err(bad(
                &join(&at, "type"),
                format!("`{kind}` is one of Anthropic's server tools, which k3 does not run: declare a custom tool"),
            ));
        }
        known_keys(&t, &["type", "name", "description", "input_schema", "cache_control"], &at)?;
        let name = t.get("name").ok_or_else(|| bad(&join(&at, "name"), "name is required"))?;
        let schema =
            t.get("input_schema").ok_or_else(|| bad(&join(&at, "input_schema"), "input_schema is required"))?;
        let description = t.get("description").map(|d| format!(", \"description\": {}", d.get())).unwrap_or_default();
        texts.push(format!(
            "{{\"type\": \"function\", \"function\": {{\"name\": {}{description}, \"parameters\": {}}}}}",
            name.get(),
            schema.get()
        ));
        for (openai, anthropic) in [("name", "name"), ("description", "description"), ("parameters", "input_schema")] {
            renames.add(format!("{at}.function.{openai}"), join(&at, anthropic));
        }
        renames.add(format!("{at}.function"), at.clone());
        renames.add(format!("{at}.type"), join(&at, "type"));
    }
    Ok(format!("[{}]", texts.join(", ")))
}

/// `tool_choice` as OpenAI's, and `parallel_tool_calls: false` when it disables parallel use.
fn tool_choice(raw: &RawValue, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let c = object(raw, "tool_choice")?;
    let kind = required_string(&c, "type", "tool_choice")?;
    let keys: &[&str] = match kind.as_str() {
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        "none" => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    known_keys(&c, keys, "tool_choice")?;
    let choice = match kind.as_str() {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => json!({"type": "function", "function": {"name": required_string(&c, "name", "tool_choice")?}}),
        other => return Err(bad("tool_choice.type", format!("`{other}`: auto, any, tool or none"))),
    };
    out.insert("tool_choice".into(), choice);
    if boolean(&c, "disable_parallel_tool_use", "tool_choice")? == Some(true) {
        out.insert("parallel_tool_calls".into(), json!(false));
    }
    Ok(())
}

/// `thinking`: enabled with a budget (below `max_tokens`), adaptive (the model decides: its
/// default), or disabled; and whether its `display` omits the thinking.
fn thinking(raw: &RawValue, max_tokens: Option<u64>, can_think: bool) -> Result<(Thinking, bool), ApiError> {
    let t = object(raw, "thinking")?;
    let kind = required_string(&t, "type", "thinking")?;
    known_keys(
        &t,
        if kind == "enabled" { &["type", "budget_tokens", "display"] } else { &["type", "display"] },
        "thinking",
    )?;
    let omit = match string(&t, "display", "thinking")?.as_deref() {
        None | Some("summarized") => false,
        Some("omitted") => true,
        Some(other) => return Err(bad("thinking.display", format!("`{other}`: summarized or omitted"))),
    };
    let asked = match kind.as_str() {
        "enabled" => {
            if !can_think {
                return Err(bad("thinking", "this model does not think (K3 does)"));
            }
            let budget = match t.get("budget_tokens").map(|b| value(b)) {
                Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => n.as_u64().unwrap_or(1),
                Some(other) => {
                    return Err(bad("thinking.budget_tokens", format!("{other} is not a whole number >= 1")));
                }
                None => return Err(bad("thinking.budget_tokens", "budget_tokens is required")),
            };
            if let Some(m) = max_tokens.filter(|&m| budget >= m) {
                return Err(bad(
                    "thinking.budget_tokens",
                    format!("budget_tokens ({budget}) must be less than max_tokens ({m})"),
                ));
            }
            Thinking::Budget(budget)
        }
        "adaptive" => Thinking::Default,
        "disabled" => Thinking::Off,
        other => return Err(bad("thinking.type", format!("`{other}`: enabled, adaptive or disabled"))),
    };
    Ok((asked, omit))
}

/// `output_config`: `effort` as K3's `reasoning_effort` (low, high, max: Anthropic's medium
/// rounds up to high, xhigh to max), `format` as a `json_schema` response format.
fn output_config(raw: &RawValue, out: &mut Map<String, Value>, renames: &mut Renames) -> Result<(), ApiError> {
    let at = "output_config";
    let c = object(raw, at)?;
    known_keys(&c, &["effort", "format"], at)?;
    if let Some(effort) = string(&c, "effort", at)? {
        let k3 = match effort.as_str() {
            "low" => "low",
            "medium" | "high" => "high",
            "xhigh" | "max" => "max",
            other => {
                return Err(bad("output_config.effort", format!("`{other}`: low, medium, high, xhigh or max")));
            }
        };
        out.insert("reasoning_effort".into(), json!(k3));
        renames.add("reasoning_effort", "output_config.effort");
    }
    if let Some(f) = c.get("format").filter(|f| !value(f).is_null()) {
        let fat = "output_config.format";
        let f = object(f, fat)?;
        known_keys(&f, &["type", "schema"], fat)?;
        if required_string(&f, "type", fat)? != "json_schema" {
            return Err(bad("output_config.format.type", "the format type is json_schema"));
        }
        let schema = f.get("schema").ok_or_else(|| bad("output_config.format.schema", "schema is required"))?;
        out.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": value(schema)}}),
        );
        renames.add("response_format.json_schema.schema", "output_config.format.schema");
        renames.add("response_format", "output_config.format");
    }
    Ok(())
}

/// Copies the sampling fields, checked for their JSON types.
fn sampling(body: &Obj, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    for key in ["temperature", "top_p"] {
        match body.get(key).map(|r| value(r)) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                out.insert(key.into(), v);
            }
            Some(other) => return Err(bad(key, format!("{other} is not a number"))),
        }
    }
    for key in ["top_k", "seed"] {
        if let Some(n) = whole_number(body, key)? {
            out.insert(key.into(), json!(n));
        }
    }
    if let Some(raw) = body.get("stop_sequences") {
        let stops: Vec<String> = serde_json::from_str(raw.get())
            .map_err(|_| bad("stop_sequences", "stop_sequences is a list of strings"))?;
        if !stops.is_empty() {
            out.insert("stop".into(), json!(stops));
        }
    }
    Ok(())
}

/// Fields that ask nothing k3 does not do: `metadata` (an object), `cache_control` (the prefix
/// cache is automatic), `speed` (`standard` only: there is no faster mode).
fn accepted(body: &Obj) -> Result<(), ApiError> {
    for key in ["metadata", "cache_control"] {
        if let Some(m) = body.get(key).filter(|m| !value(m).is_object() && !value(m).is_null()) {
            return Err(bad(key, format!("{} is not an object", m.get())));
        }
    }
    match string(body, "speed", "")?.as_deref() {
        None | Some("standard") => Ok(()),
        Some(other) => Err(bad("speed", format!("`{other}`: k3 has one speed, standard"))),
    }
}

/// `max_tokens`: required by `/v1/messages`; counting renders the prompt only, so one token of
/// room is all it asks of the context.
fn max_tokens(body: &Obj, route: Route, out: &mut Map<String, Value>) -> Result<Option<u64>, ApiError> {
    let max_tokens = whole_number(body, "max_tokens")?;
    let n = match (route, max_tokens) {
        (Route::Messages, None) => return Err(bad("max_tokens", "max_tokens is required")),
        (Route::Messages, Some(n)) => n,
        (Route::CountTokens, _) => 1,
    };
    out.insert("max_tokens".into(), json!(n));
    Ok(max_tokens)
}

/// Translates a body of `route`. `can_think`: the model writes a thinking section.
pub fn translate(raw: &str, route: Route, can_think: bool) -> Result<Translated, ApiError> {
    let body: Obj = serde_json::from_str(raw).map_err(|_| bad("body", "the request body is not a JSON object"))?;
    known_keys(&body, if route == Route::Messages { &MESSAGES } else { &COUNT }, "")?;
    let mut out = Map::new();
    let mut renames = Renames::default();
    for (openai, anthropic) in [("stop", "stop_sequences"), ("reasoning_effort", "thinking")] {
        renames.add(openai, anthropic);
    }
    if let Some(m) = string(&body, "model", "")? {
        out.insert("model".into(), json!(m));
    }
    let max_tokens = max_tokens(&body, route, &mut out)?;
    if let Some(s) = boolean(&body, "stream", "")? {
        out.insert("stream".into(), json!(s));
    }
    accepted(&body)?;
    sampling(&body, &mut out)?;
    if let Some(k) = body.get("chat_template_kwargs") {
        out.insert("chat_template_kwargs".into(), value(k));
    }
    if let Some(c) = body.get("output_config") {
        output_config(c, &mut out, &mut renames)?;
    }
    let (thinking, omit_thinking) = match body.get("thinking") {
        None => (Thinking::Default, false),
        Some(_) if body.contains_key("chat_template_kwargs") => {
            return Err(bad("chat_template_kwargs", "give thinking or chat_template_kwargs, not both"));
        }
        Some(t) => thinking(t, max_tokens, can_think)?,
    };
    if thinking == Thinking::Off {
        out.insert("reasoning_effort".into(), json!("none"));
    }
    if let Some(c) = body.get("tool_choice") {
        tool_choice(c, &mut out)?;
    }
    let mut msgs = Out::default();
    if let Some(s) = body.get("system") {
        blocks::system(blocks::content(Some(s), "system")?, "system", &mut msgs)?;
    }
    blocks::messages(body.get("messages").ok_or_else(|| bad("messages", "messages is required"))?, &mut msgs)?;
    if let Some(cm) = body.get("context_management") {
        blocks::context_management(cm, &mut msgs)?;
    }
    out.insert("messages".into(), json!(msgs.messages));
    renames.extend(msgs.renames);
    let mut text = Value::Object(out).to_string();
    if let Some(t) = body.get("tools") {
        // Spliced in as text: the declarations keep the client's key order.
        text.pop();
        text.push_str(&format!(", \"tools\": {}}}", tools(t, &mut renames)?));
    }
    Ok(Translated { body: text, thinking, omit_thinking, renames })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anthropic::blocks::TOOL_ERROR;

    /// `v` as the client writes it (a call's input with `z` before `a`, as no sorted map has it).
    fn run(v: Value) -> Result<(Value, Translated), ApiError> {
        let text = v.to_string().replace(r#"{"a":2,"z":1}"#, r#"{"z":1,"a":2}"#);
        let t = translate(&text, Route::Messages, true)?;
        Ok((serde_json::from_str(&t.body).unwrap(), t))
    }

    #[test]
    fn blocks_become_openai_messages_in_order() {
        let (v, t) = run(json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"z": 1, "a": 2}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"},
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": true,
                     "content": [{"type": "text", "text": "down"}]},
                    {"type": "text", "text": "And?"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}))
        .unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[0], json!({"role": "system", "content": [{"type": "text", "text": "S"}]}));
        assert_eq!(m[2]["reasoning_content"], "hm");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], r#"{"z":1,"a":2}"#, "input as written");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "t1", "name": "get_weather", "content": "18 C"}));
        assert_eq!(m[4]["content"][0]["text"], TOOL_ERROR);
        assert_eq!(m[5], json!({"role": "user", "content": [{"type": "text", "text": "And?"}]}));
        assert_eq!((v["tool_choice"].as_str(), v["parallel_tool_calls"].as_bool()), (Some("required"), Some(false)));
        assert_eq!(v["tools"][0]["function"]["parameters"], json!({"type": "object", "properties": {}}));
        let e = t.renames.rename(ApiError::bad("messages[4].content[1].text", "x"));
        assert_eq!(e.param.as_deref(), Some("messages[2].content[1].content[0].text"));
        let e = t.renames.rename(ApiError::bad("tools[0].function.parameters", "x"));
        assert_eq!(e.param.as_deref(), Some("tools[0].input_schema"));
    }

    /// What Claude Code sends beyond the basics: adaptive thinking, an effort, a thinking edit, a
    /// system message mid-conversation, cache_control at the top.
    #[test]
    fn claude_codes_fields_are_honoured() {
        let turn = |t: &str| {
            json!({"role": "assistant", "content": [{"type": "thinking", "thinking": t, "signature": "s"},
            {"type": "text", "text": "ok"}]})
        };
        let body = |keep: Value| {
            json!({"max_tokens": 9, "thinking": {"type": "adaptive"}, "cache_control": {"type": "ephemeral"},
            "output_config": {"effort": "medium", "format": {"type": "json_schema", "schema": {"type": "object"}}},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]},
            "messages": [{"role": "user", "content": "a"}, turn("one"), {"role": "system", "content": "mid"},
                {"role": "user", "content": "b"}, turn("two"), {"role": "user", "content": "c"}]})
        };
        let (v, t) = run(body(json!("all"))).unwrap();
        assert_eq!(t.thinking, Thinking::Default);
        assert_eq!(v["reasoning_effort"], "high", "medium rounds up to K3's high");
        assert_eq!(v["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m[2], json!({"role": "system", "content": "mid"}));
        assert_eq!(
            (m[1]["reasoning_content"].as_str(), m[4]["reasoning_content"].as_str()),
            (Some("one"), Some("two"))
        );
        let (v, _) = run(body(json!({"type": "thinking_turns", "value": 1}))).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!((m[1].get("reasoning_content"), m[4]["reasoning_content"].as_str()), (None, Some("two")));
        let mut other = body(json!("all"));
        other["context_management"]["edits"][0]["type"] = json!("clear_tool_uses_20250919");
        assert_eq!(run(other).unwrap_err().param.as_deref(), Some("context_management.edits[0].type"));
        let mut omitted = body(json!("all"));
        omitted["thinking"]["display"] = json!("omitted");
        assert!(run(omitted).unwrap().1.omit_thinking);
    }

    #[test]
    fn refusals_name_the_field_as_written() {
        let user = |content: Value| json!({"max_tokens": 5, "messages": [{"role": "user", "content": content}]});
        let img = |src: Value| user(json!([{"type": "text", "text": "x"}, {"type": "image", "source": src}]));
        for (body, field) in [
            (json!({"messages": []}), "max_tokens"),
            (json!({"max_tokens": 5, "messages": [], "service_tier": "auto"}), "service_tier"),
            (img(json!({"type": "url", "url": "http://x"})), "messages[0].content[1].source.type"),
            (
                img(json!({"type": "base64", "media_type": "image/bmp", "data": ""})),
                "messages[0].content[1].source.media_type",
            ),
            (user(json!([{"type": "document"}])), "messages[0].content[0].type"),
            (user(json!([{"type": "text", "text": "x", "extra": 1}])), "messages[0].content[0].extra"),
            (
                json!({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}),
                "tools[0].type",
            ),
            (
                json!({"max_tokens": 5, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 5}}),
                "thinking.budget_tokens",
            ),
            (json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": "pre"}]}), "messages[0]"),
            (json!({"max_tokens": 5, "messages": [], "speed": "fast"}), "speed"),
            (json!({"max_tokens": 5, "messages": [], "thinking": {"type": "between_tools"}}), "thinking.type"),
            (json!({"max_tokens": 5, "messages": [], "output_config": {"effort": "huge"}}), "output_config.effort"),
        ] {
            let e = run(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e}");
        }
        let e = translate(&json!({"messages": [], "max_tokens": 3}).to_string(), Route::CountTokens, true).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = translate(
            &json!({"messages": [], "max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 4}}).to_string(),
            Route::Messages,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking"));
    }
}
