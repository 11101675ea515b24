//! A `POST /v1/responses` body translated once into the `/v1/chat/completions` body it stands
//! for, which the chat route's own rules then check and render: `input` items into `messages`
//! (earlier items of a stored conversation first), `instructions` a system message before them,
//! function tools into chat tools (written as the client wrote their parameters), `text.format`
//! into `response_format`, `reasoning.effort` into `reasoning_effort`. Every field is honoured,
//! accepted for a stated reason, or refused with a 400 naming it as the client wrote it.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::fields::{bad, bool_of, get, text_of};
use super::items::{Conversation, Source, conversation};
use super::tools::{choice, declared};
use crate::error::{ApiError, short};

/// What a Responses body asks, translated.
#[derive(Debug)]
pub struct Translated {
    /// The chat body's JSON text.
    pub chat: String,
    /// This request's input as Responses items (a string input is one user message).
    pub input: Vec<Value>,
    /// Where the chat body's messages and tools came from, as the client wrote them.
    pub origins: Origins,
    /// Declared names of namespaced functions to their namespace and name.
    pub namespaced: HashMap<String, (String, String)>,
    /// The request's settings as a response echoes them.
    pub echo: Map<String, Value>,
    pub stream: bool,
    pub store: bool,
}

/// Where each of the chat body's messages and tool declarations came from.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    pub messages: Vec<Source>,
    pub tools: Vec<String>,
}

/// The fields a Responses body may have; any other is refused by name.
const FIELDS: [&str; 31] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "reasoning",
    "text",
    "parallel_tool_calls",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "include",
    "truncation",
    "service_tier",
    "background",
    "conversation",
    "prompt",
    "max_tool_calls",
    "top_logprobs",
    "stream_options",
    "prompt_cache_retention",
    // k3's own, as on /v1/chat/completions: the sampling seed.
    "seed",
    // Codex's description of itself (its session and turn): asks nothing of the answer.
    "client_metadata",
    "context_management",
];

/// `bytes` (a JSON object, already parsed into `body`) as a chat body; `earlier`: the stored
/// conversation `previous_response_id` names, as Responses items.
pub fn translate(bytes: &[u8], body: &Value, earlier: &[Value]) -> Result<Translated, ApiError> {
    let o = body.as_object().ok_or_else(|| bad("body", "the request body is not a JSON object"))?;
    if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, format!("`{k}` is not a field of a Responses request this server knows")));
    }
    refused(o)?;
    let mut chat = Map::new();
    let mut echo = Map::new();
    if let Some(m) = text_of(o, "model", "model")? {
        chat.insert("model".into(), json!(m));
    }
    let stream = bool_of(o, "stream")?.unwrap_or(false);
    chat.insert("stream".into(), json!(stream));
    sampling(o, &mut chat, &mut echo)?;
    reasoning(o, &mut chat, &mut echo)?;
    text_format(o, &mut chat, &mut echo)?;
    let tools = declared(bytes, o, &mut echo)?.unwrap_or_default();
    choice(o, &mut chat, &mut echo)?;
    let Conversation { messages, sources, input } = conversation(o, earlier, &mut echo)?;
    chat.insert("messages".into(), json!(messages));
    let store = bool_of(o, "store")?.unwrap_or(true);
    echo.insert("store".into(), json!(store));
    for k in ["metadata", "user", "prompt_cache_key", "safety_identifier", "previous_response_id"] {
        echo.insert(k.into(), o.get(k).cloned().unwrap_or(Value::Null));
    }
    for k in ["user", "prompt_cache_key", "safety_identifier"] {
        text_of(o, k, k)?;
    }
    match get(o, "metadata") {
        None => {}
        Some(Value::Object(m)) => {
            if let Some((k, v)) = m.iter().find(|(_, v)| !v.is_string()) {
                return Err(bad(&format!("metadata.{k}"), format!("{} is not a string", short(v))));
            }
        }
        Some(m) => return Err(bad("metadata", format!("{} is not an object of strings", short(m)))),
    }
    let mut text = Value::Object(chat).to_string();
    if !tools.text.is_empty() {
        // The declarations go in as written: `{...}` becomes `{...,"tools":[...]}`.
        text.pop();
        text.push_str(",\"tools\":");
        text.push_str(&tools.text);
        text.push('}');
    }
    let origins = Origins { messages: sources, tools: tools.fields };
    Ok(Translated { chat: text, input, origins, namespaced: tools.namespaced, echo, stream, store })
}

/// Fields asking for what this server does not do: refused by name unless they ask nothing.
fn refused(o: &Map<String, Value>) -> Result<(), ApiError> {
    if bool_of(o, "background")? == Some(true) {
        return Err(bad("background", "background responses are not supported: send the request and wait"));
    }
    echo_only(o, "conversation", "conversations are not kept here: send previous_response_id or the history")?;
    echo_only(o, "prompt", "stored prompt templates are OpenAI's: send the instructions and input")?;
    echo_only(o, "max_tool_calls", "not supported: parallel_tool_calls false limits a turn to one call")?;
    echo_only(o, "context_management", "not supported: the server compacts nothing; send a shorter history")?;
    echo_only(o, "stream_options", "not supported (no obfuscation is added to streamed events)")?;
    match get(o, "top_logprobs") {
        None => {}
        Some(v) if v.as_u64() == Some(0) => {}
        Some(v) => return Err(bad("top_logprobs", format!("{}: log-probabilities are on /v1/chat/completions", v))),
    }
    match text_of(o, "truncation", "truncation")? {
        None | Some("disabled") => {}
        Some("auto") => {
            return Err(bad(
                "truncation",
                "`auto` is not supported: k3 drops no turns; a conversation that does not fit is refused \
                 (context_length_exceeded): send a shorter one",
            ));
        }
        Some(t) => return Err(bad("truncation", format!("`{t}`: give `disabled` (or leave it out)"))),
    }
    match text_of(o, "service_tier", "service_tier")? {
        None | Some("auto" | "default") => {}
        Some(t) => return Err(bad("service_tier", format!("`{t}`: this server has one tier (auto or default)"))),
    }
    match text_of(o, "prompt_cache_retention", "prompt_cache_retention")? {
        None | Some("in_memory") => {}
        Some(t) => {
            return Err(bad("prompt_cache_retention", format!("`{t}`: the prompt cache keeps states in memory")));
        }
    }
    if let Some(v) = get(o, "include") {
        let list = v.as_array().ok_or_else(|| bad("include", "include is a list of strings"))?;
        for (i, x) in list.iter().enumerate() {
            if x.as_str() != Some("reasoning.encrypted_content") {
                return Err(bad(
                    &format!("include[{i}]"),
                    format!(
                        "{}: not supported (reasoning.encrypted_content is: k3 returns the reasoning as text)",
                        short(x)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A field refused unless absent or null.
fn echo_only(o: &Map<String, Value>, key: &str, why: &str) -> Result<(), ApiError> {
    match get(o, key) {
        None => Ok(()),
        Some(_) => Err(bad(key, why)),
    }
}

/// `max_output_tokens`, `temperature`, `top_p`, `seed`, `parallel_tool_calls`.
fn sampling(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    for (ours, theirs) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("seed", "seed"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(v) = get(o, ours) {
            let (fits, want) = match ours {
                "max_output_tokens" | "seed" => (v.is_u64(), "a whole number"),
                "parallel_tool_calls" => (v.is_boolean(), "true or false"),
                _ => (v.is_number(), "a number"),
            };
            if !fits {
                return Err(bad(ours, format!("{} is not {want}", short(v))));
            }
            chat.insert(theirs.into(), v.clone());
        }
        if ours != "seed" {
            echo.insert(ours.into(), o.get(ours).cloned().unwrap_or(Value::Null));
        }
    }
    if echo["parallel_tool_calls"].is_null() {
        echo.insert("parallel_tool_calls".into(), json!(true));
    }
    Ok(())
}

/// `reasoning`: `effort` onto K3's efforts (none, low, high, max); `summary` accepted (k3
/// returns the reasoning itself, not a summary).
fn reasoning(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(r) = get(o, "reasoning") else {
        echo.insert("reasoning".into(), json!({"effort": null, "summary": null}));
        return Ok(());
    };
    let r = r.as_object().ok_or_else(|| bad("reasoning", "reasoning is an object {\"effort\", \"summary\"}"))?;
    if let Some(k) = r.keys().find(|k| !matches!(k.as_str(), "effort" | "summary" | "generate_summary")) {
        return Err(bad(&format!("reasoning.{k}"), "not a field of reasoning (effort, summary)"));
    }
    let effort = text_of(r, "effort", "reasoning.effort")?;
    let k3 = match effort {
        None => None,
        Some(e) => Some(crate::api::k3_effort(e).ok_or_else(|| {
            bad("reasoning.effort", format!("`{e}`: give none, minimal, low, medium, high, xhigh (or K3's max)"))
        })?),
    };
    if let Some(e) = k3 {
        chat.insert("reasoning_effort".into(), json!(e));
    }
    for key in ["summary", "generate_summary"] {
        match text_of(r, key, &format!("reasoning.{key}"))? {
            None | Some("auto" | "concise" | "detailed") => {}
            Some(s) => return Err(bad(&format!("reasoning.{key}"), format!("`{s}`: give auto, concise or detailed"))),
        }
    }
    echo.insert("reasoning".into(), json!({"effort": effort, "summary": r.get("summary").cloned()}));
    Ok(())
}

/// `text`: `format` into `response_format`; `verbosity` only at its default (`medium`).
fn text_format(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let default = json!({"format": {"type": "text"}, "verbosity": "medium"});
    let Some(t) = get(o, "text") else {
        echo.insert("text".into(), default);
        return Ok(());
    };
    let t = t.as_object().ok_or_else(|| bad("text", "text is an object {\"format\", \"verbosity\"}"))?;
    if let Some(k) = t.keys().find(|k| !matches!(k.as_str(), "format" | "verbosity")) {
        return Err(bad(&format!("text.{k}"), "not a field of text (format, verbosity)"));
    }
    match text_of(t, "verbosity", "text.verbosity")? {
        None | Some("medium") => {}
        Some(v) => return Err(bad("text.verbosity", format!("`{v}`: k3 does not steer verbosity (only medium)"))),
    }
    let format = match get(t, "format") {
        None => json!({"type": "text"}),
        Some(f) => f.clone(),
    };
    let f = format.as_object().ok_or_else(|| bad("text.format", "format is an object {\"type\", ...}"))?;
    let kind = text_of(f, "type", "text.format.type")?.unwrap_or("");
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "name", "schema", "strict", "description"],
        other => return Err(bad("text.format.type", format!("`{other}`: give text, json_object or json_schema"))),
    };
    if let Some(k) = f.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(&format!("text.format.{k}"), format!("not a field of a `{kind}` format")));
    }
    let response_format = if kind == "json_schema" {
        let mut spec = f.clone();
        spec.remove("type");
        json!({"type": "json_schema", "json_schema": spec})
    } else {
        json!({"type": kind})
    };
    chat.insert("response_format".into(), response_format);
    echo.insert("text".into(), json!({"format": format, "verbosity": "medium"}));
    Ok(())
}

/// An error about the chat body, renamed to the field the client wrote.
pub fn renamed(mut e: ApiError, origins: &Origins) -> ApiError {
    let Some(p) = e.param.clone() else { return e };
    e.param = Some(rename(&p, origins));
    e
}

fn rename(p: &str, origins: &Origins) -> String {
    if let Some(rest) = p.strip_prefix("messages[") {
        let (i, tail) = rest.split_once(']').unwrap_or((rest, ""));
        let Some(src) = i.parse::<usize>().ok().and_then(|i| origins.messages.get(i)) else { return "input".into() };
        if let Some(call) = tail.strip_prefix(".tool_calls[") {
            let (k, tail) = call.split_once(']').unwrap_or((call, ""));
            if let Some(f) = k.parse::<usize>().ok().and_then(|k| src.calls.get(k)) {
                return format!("{f}{}", tail.replace(".function.", "."));
            }
        }
        return format!("{}{tail}", src.field);
    }
    if let Some(rest) = p.strip_prefix("tools[") {
        let (k, tail) = rest.split_once(']').unwrap_or((rest, ""));
        let tail = tail.strip_prefix(".function").unwrap_or(tail);
        if let Some(f) = k.parse::<usize>().ok().and_then(|k| origins.tools.get(k)) {
            return format!("{f}{tail}");
        }
    }
    if let Some(rest) = p.strip_prefix("response_format") {
        return format!("text.format{}", rest.strip_prefix(".json_schema").unwrap_or(rest));
    }
    match p {
        "messages" => "input".into(),
        "max_tokens" | "max_completion_tokens" => "max_output_tokens".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        p => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(body: Value) -> Result<Translated, ApiError> {
        translate(body.to_string().as_bytes(), &body, &[])
    }

    fn chat(body: Value) -> Value {
        serde_json::from_str(&tr(body).unwrap().chat).unwrap()
    }

    #[test]
    fn items_become_the_chat_turns_they_stand_for() {
        let v = chat(json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]}));
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 4, "{v}");
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["reasoning_content"], "Look it up.");
        assert_eq!(m[2]["content"], json!([{"type": "text", "text": "Checking."}]));
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2, "consecutive calls are one turn");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C"}));
        // A turn cut while thinking is an assistant turn of reasoning alone.
        let v = chat(json!({"input": [{"role": "user", "content": "a"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Hm."}]}, {"role": "user", "content": "b"}]}));
        assert_eq!(v["messages"][1], json!({"role": "assistant", "content": "", "reasoning_content": "Hm."}));
    }

    #[test]
    fn what_cannot_be_done_is_refused_by_name() {
        for (body, field) in [
            (json!({"input": "x", "bogus": 1}), "bogus"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "conversation": "c"}), "conversation"),
            (json!({"input": "x", "temperature": "hot"}), "temperature"),
            (json!({"input": "x", "max_output_tokens": -3}), "max_output_tokens"),
            (json!({"input": "x", "metadata": {"a": 1}}), "metadata.a"),
            (json!({"input": "x", "user": 7}), "user"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content", "file_search_call.results"]}),
                "include[1]",
            ),
            (json!({"input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"input": "x", "tools": [{"type": "custom", "name": "f"}]}), "tools[0].type"),
            (json!({"input": "x", "text": {"verbosity": "low"}}), "text.verbosity"),
            (json!({"input": "x", "reasoning": {"effort": "huge"}}), "reasoning.effort"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                {"type": "input_image", "image_url": "https://x/y.png"}]}]}),
                "input[0].content[1].image_url",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input[0].content[0].type",
            ),
            (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
        ] {
            assert_eq!(tr(body.clone()).unwrap_err().param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn chat_errors_name_the_field_the_client_wrote() {
        let sources = Origins {
            messages: vec![
                Source { field: "instructions".into(), calls: vec![] },
                Source { field: "input[2]".into(), calls: vec!["input[3]".into()] },
            ],
            tools: vec!["tools[0]".into(), "tools[1].tools[0]".into(), "tools[2]".into()],
        };
        assert_eq!(rename("messages[1].content[0].image_url.url", &sources), "input[2].content[0].image_url.url");
        assert_eq!(rename("messages[1].tool_calls[0].function.arguments", &sources), "input[3].arguments");
        assert_eq!(rename("tools[2].function.name", &sources), "tools[2].name");
        assert_eq!(rename("tools[1].function.parameters", &sources), "tools[1].tools[0].parameters");
        assert_eq!(rename("response_format.json_schema.schema", &sources), "text.format.schema");
        assert_eq!(rename("max_tokens", &sources), "max_output_tokens");
        assert_eq!(rename("reasoning_effort", &sources), "reasoning.effort");
    }
}
