//! A Responses body's `tools` and `tool_choice` as the chat route's: each function tool a chat
//! declaration, its `parameters` as the client wrote them (key order kept: the model is shown
//! them as written, as on the chat route); a `namespace` tool's functions declared as
//! `NAMESPACE__NAME` (its description before theirs), their calls answered with `namespace`
//! and `name` apart; tools OpenAI runs on its own servers, and custom (freeform) tools, refused
//! by name. `strict` is honoured when true; left out it is off (OpenAI tries strict when the
//! schema allows it; k3 does not guess).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::fields::{bad, get, only, text_of};
use crate::error::{ApiError, short};

/// Tool types OpenAI runs on its own servers: nothing here runs them.
const HOSTED: [&str; 13] = [
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "mcp",
    "tool_search",
];

/// Between a namespace and its function's name in the name the model is shown.
pub const NAMESPACE_JOIN: &str = "__";

/// The declarations as the chat body's `tools`, and what they came from.
#[derive(Debug, Default)]
pub struct Declared {
    /// The chat `tools` array's JSON text.
    pub text: String,
    /// Where each declaration came from (`tools[2]`, `tools[3].tools[0]`).
    pub fields: Vec<String>,
    /// Declared names of namespaced functions to their namespace and name.
    pub namespaced: HashMap<String, (String, String)>,
}

/// A tool's fields with its `parameters` as written, and its nested tools' (a namespace's).
#[derive(Deserialize)]
struct Raw {
    parameters: Option<Box<RawValue>>,
    tools: Option<Vec<Box<RawValue>>>,
}

#[derive(Deserialize)]
struct RawTools {
    tools: Option<Vec<Box<RawValue>>>,
}

const FUNCTION: [&str; 5] = ["type", "name", "description", "parameters", "strict"];

/// `tools` as chat declarations (`None`: no tools), the tools echoed into `echo`.
pub fn declared(
    bytes: &[u8],
    o: &Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<Option<Declared>, ApiError> {
    let Some(list) = get(o, "tools") else {
        echo.insert("tools".into(), json!([]));
        return Ok(None);
    };
    let list = list.as_array().ok_or_else(|| bad("tools", "tools is a list of tools"))?;
    let raw: RawTools = serde_json::from_slice(bytes).map_err(|e| bad("tools", e.to_string()))?;
    let mut d = Declared::default();
    let mut out = Vec::new();
    for (i, (t, r)) in list.iter().zip(raw.tools.unwrap_or_default()).enumerate() {
        let at = format!("tools[{i}]");
        let t = t.as_object().ok_or_else(|| bad(&at, "a tool is an object"))?;
        let r: Raw = serde_json::from_str(r.get()).map_err(|e| bad(&at, e.to_string()))?;
        match kind(t, &at)? {
            "function" => {
                only(t, &FUNCTION, &at)?;
                out.push(function(t, r.parameters.as_deref(), &at, None)?);
                d.fields.push(at);
            }
            _ => {
                only(t, &["type", "name", "description", "tools"], &at)?;
                let ns = text_of(t, "name", &format!("{at}.name"))?.unwrap_or("");
                let inner = get(t, "tools").and_then(Value::as_array);
                let inner = inner.ok_or_else(|| bad(&format!("{at}.tools"), "a namespace has a list of tools"))?;
                for (j, (f, fr)) in inner.iter().zip(r.tools.unwrap_or_default()).enumerate() {
                    let at = format!("{at}.tools[{j}]");
                    let f = f.as_object().ok_or_else(|| bad(&at, "a tool is an object"))?;
                    if kind(f, &at)? != "function" {
                        return Err(bad(&format!("{at}.type"), "a namespace's tools here are functions"));
                    }
                    only(f, &FUNCTION, &at)?;
                    let fr: Raw = serde_json::from_str(fr.get()).map_err(|e| bad(&at, e.to_string()))?;
                    let name = text_of(f, "name", &format!("{at}.name"))?.unwrap_or("");
                    let joined = format!("{ns}{NAMESPACE_JOIN}{name}");
                    let about = text_of(t, "description", &format!("tools[{i}].description"))?;
                    out.push(function(f, fr.parameters.as_deref(), &at, Some((&joined, about)))?);
                    d.namespaced.insert(joined, (ns.to_string(), name.to_string()));
                    d.fields.push(at);
                }
            }
        }
    }
    echo.insert("tools".into(), Value::Array(list.clone()));
    d.text = format!("[{}]", out.join(","));
    Ok(Some(d))
}

/// A tool's type: `function` or `namespace`; anything else refused by name.
fn kind<'t>(t: &'t Map<String, Value>, at: &str) -> Result<&'t str, ApiError> {
    let kind = text_of(t, "type", &format!("{at}.type"))?.unwrap_or("");
    if HOSTED.contains(&kind) {
        return Err(bad(
            &format!("{at}.type"),
            format!("`{kind}` is a tool OpenAI runs on its servers; this server runs no tools: declare a function"),
        ));
    }
    if !matches!(kind, "function" | "namespace") {
        return Err(bad(
            &format!("{at}.type"),
            format!("`{kind}` tools are not supported (custom and freeform tools too): declare a `function`"),
        ));
    }
    Ok(kind)
}

/// One function's chat declaration; `namespaced`: the name it is declared as and its
/// namespace's description.
fn function(
    t: &Map<String, Value>,
    parameters: Option<&RawValue>,
    at: &str,
    namespaced: Option<(&str, Option<&str>)>,
) -> Result<String, ApiError> {
    let strict = match get(t, "strict") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad(&format!("{at}.strict"), format!("{} is not true or false", short(v)))),
    };
    let name = match namespaced {
        Some((joined, _)) => json!(joined),
        None => t.get("name").cloned().unwrap_or(json!("")),
    };
    let own = text_of(t, "description", &format!("{at}.description"))?;
    let description = match (namespaced.and_then(|(_, about)| about), own) {
        (Some(a), Some(d)) => Some(format!("{a}\n\n{d}")),
        (a, d) => a.or(d).map(str::to_string),
    };
    let mut f = format!("{{\"name\":{name}");
    if let Some(d) = description {
        f.push_str(&format!(",\"description\":{}", json!(d)));
    }
    if let Some(p) = parameters.filter(|p| p.get() != "null") {
        f.push_str(&format!(",\"parameters\":{}", p.get()));
    }
    f.push_str(&format!(",\"strict\":{strict}}}"));
    Ok(format!("{{\"type\":\"function\",\"function\":{f}}}"))
}

/// `tool_choice`: auto, none, required, or `{"type": "function", "name", "namespace"?}`.
pub fn choice(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(c) = get(o, "tool_choice") else {
        echo.insert("tool_choice".into(), json!("auto"));
        return Ok(());
    };
    let theirs = match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => c.clone(),
        Value::Object(m) if m.get("type").and_then(Value::as_str) == Some("function") => {
            only(m, &["type", "name", "namespace"], "tool_choice")?;
            let name =
                text_of(m, "name", "tool_choice.name")?.ok_or_else(|| bad("tool_choice.name", "name the function"))?;
            let name = match text_of(m, "namespace", "tool_choice.namespace")? {
                Some(ns) => format!("{ns}{NAMESPACE_JOIN}{name}"),
                None => name.to_string(),
            };
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(bad(
                "tool_choice",
                format!("{}: give auto, none, required or {{\"type\": \"function\", \"name\"}}", short(other)),
            ));
        }
    };
    chat.insert("tool_choice".into(), theirs);
    echo.insert("tool_choice".into(), c.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declare(text: &str) -> Result<Option<Declared>, ApiError> {
        let v: Value = serde_json::from_str(text).unwrap();
        declared(text.as_bytes(), v.as_object().unwrap(), &mut Map::new())
    }

    #[test]
    fn parameters_are_kept_as_written_and_strict_only_when_asked() {
        let d = declare(r#"{"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}]}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            d.text,
            r#"[{"type":"function","function":{"name":"f","parameters":{"type": "object", "properties": {"z": {}, "a": {}}},"strict":false}}]"#
        );
    }

    #[test]
    fn a_namespaces_functions_are_declared_under_its_name() {
        let d = declare(
            r#"{"tools": [{"type": "function", "name": "a", "strict": true},
            {"type": "namespace", "name": "crm", "description": "The CRM.", "tools": [
                {"type": "function", "name": "find", "description": "Finds.", "parameters": {"type": "object"}}]}]}"#,
        )
        .unwrap()
        .unwrap();
        let v: Value = serde_json::from_str(&d.text).unwrap();
        assert_eq!(
            v[1]["function"],
            json!({"name": "crm__find", "description": "The CRM.\n\nFinds.",
            "parameters": {"type": "object"}, "strict": false})
        );
        assert_eq!(v[0]["function"]["strict"], true);
        assert_eq!(d.fields, ["tools[0]", "tools[1].tools[0]"]);
        assert_eq!(d.namespaced["crm__find"], ("crm".to_string(), "find".to_string()));
    }

    #[test]
    fn tools_run_elsewhere_are_refused_by_name() {
        for (text, field) in [
            (r#"{"tools": [{"type": "web_search", "external_web_access": false}]}"#, "tools[0].type"),
            (r#"{"tools": [{"type": "custom", "name": "f"}]}"#, "tools[0].type"),
            (r#"{"tools": [{"type": "function", "name": "f", "defer_loading": true}]}"#, "tools[0].defer_loading"),
            (
                r#"{"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "custom", "name": "c"}]}]}"#,
                "tools[0].tools[0].type",
            ),
        ] {
            assert_eq!(declare(text).unwrap_err().param.as_deref(), Some(field), "{text}");
        }
    }
}
