//! Tool declarations and `tool_choice`, checked as OpenAI checks them: `tools` an array of
//! `{"type": "function", "function": {"name", "description"?, "parameters"?}}` with names of
//! letters, digits, `_` and `-` (at most 64) and `parameters` an object; `tool_choice` `auto`,
//! `none`, `required` or `{"type": "function", "function": {"name"}}` naming a declared
//! function. A named choice declares only that function to the model, so the call it is made to
//! make can only be that one. A function with `"strict": true` has its `parameters` compiled
//! (see `k3_text::json_schema`): its calls' arguments are constrained to them.

use std::sync::Arc;

use k3_text::chat_format::ToolChoice;
use k3_text::json_schema::{JsonSchema, SchemaLimits};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The declarations to show the model (as the client wrote them: key order kept) and the choice.
#[derive(Debug)]
pub struct Tools {
    pub declared: Option<String>,
    pub choice: ToolChoice,
    /// Strict functions: name, parameter schema, and where they are declared (`tools[i]`).
    pub strict: Vec<(String, Arc<JsonSchema>, usize)>,
}

/// The room a schema's answer has: the model's context and longest token (see [`SchemaLimits`]).
pub fn schema_limits(info: &crate::job::ModelInfo) -> SchemaLimits {
    SchemaLimits::new(info.context, info.max_token_bytes as u64)
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(param, message)
}

/// One declaration's function name and, when it is strict, its compiled parameters; the
/// declaration checked.
fn declared(i: usize, raw: &RawValue, limits: &SchemaLimits) -> Result<(String, Option<Arc<JsonSchema>>), ApiError> {
    let at = format!("tools[{i}]");
    let v: Value = serde_json::from_str(raw.get()).map_err(|e| bad(&at, e.to_string()))?;
    let Some(o) = v.as_object() else { return Err(bad(&at, "a tool is an object")) };
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(&format!("{at}.type"), "the only tool type is `function`"));
    }
    let Some(f) = o.get("function").and_then(Value::as_object) else {
        return Err(bad(&format!("{at}.function"), "a function tool needs a `function` object"));
    };
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        return Err(bad(
            &format!("{at}.function.name"),
            format!("`{name}`: a function name is 1 to 64 letters, digits, `_` or `-`"),
        ));
    }
    if let Some(p) = f.get("parameters").filter(|p| !p.is_object()) {
        return Err(bad(&format!("{at}.function.parameters"), format!("parameters is a JSON Schema object, not {p}")));
    }
    if let Some(d) = f.get("description").filter(|d| !d.is_string()) {
        return Err(bad(&format!("{at}.function.description"), format!("description is a string, not {d}")));
    }
    let strict = match f.get("strict") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => {
            let none = serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false});
            let schema = JsonSchema::compile(f.get("parameters").unwrap_or(&none), limits)
                .map_err(|e| bad(&format!("{at}.function.parameters"), e.to_string()))?;
            Some(Arc::new(schema))
        }
        Some(other) => {
            return Err(bad(&format!("{at}.function.strict"), format!("strict is true or false, not {other}")));
        }
    };
    Ok((name.to_string(), strict))
}

/// Checks `tools` and `tool_choice` together; strict functions' parameters are compiled for
/// answers within `limits`.
pub fn check(tools: Option<&RawValue>, tool_choice: Option<&Value>, limits: &SchemaLimits) -> Result<Tools, ApiError> {
    let list: Vec<Box<RawValue>> = match tools {
        None => Vec::new(),
        Some(raw) => serde_json::from_str(raw.get()).map_err(|_| bad("tools", "tools is an array of tool objects"))?,
    };
    let checked = list.iter().enumerate().map(|(i, t)| declared(i, t, limits)).collect::<Result<Vec<_>, _>>()?;
    let strict: Vec<(String, Arc<JsonSchema>, usize)> =
        checked.iter().enumerate().filter_map(|(i, (n, s))| s.clone().map(|s| (n.clone(), s, i))).collect();
    let names: Vec<String> = checked.into_iter().map(|(n, _)| n).collect();
    if let Some(dup) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)).map(|(_, n)| n) {
        return Err(bad("tools", format!("the function `{dup}` is declared twice")));
    }
    let declared = (!list.is_empty()).then(|| tools.map(|t| t.get().to_string())).flatten();
    let choice = match tool_choice {
        None => return Ok(Tools { declared, choice: ToolChoice::Auto, strict }),
        Some(Value::String(c)) => match c.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("`{other}`: tool_choice is auto, none, required or {{\"type\": \"function\", ...}}"),
                ));
            }
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name.filter(|_| o.get("type").and_then(Value::as_str) == Some("function")) else {
                return Err(bad(
                    "tool_choice",
                    "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            let Some(i) = names.iter().position(|n| n == name) else {
                return Err(bad("tool_choice", format!("`{name}` is not one of the declared tools")));
            };
            // Only the named function is shown: the call the model must make is to it.
            let strict = strict.into_iter().filter(|(n, _, _)| n == name).collect();
            return Ok(Tools { declared: Some(format!("[{}]", list[i].get())), choice: ToolChoice::Required, strict });
        }
        Some(_) => return Err(bad("tool_choice", "tool_choice is a string or an object")),
    };
    if choice == ToolChoice::Required && declared.is_none() {
        return Err(bad("tool_choice", "tool_choice `required` needs tools"));
    }
    Ok(Tools { declared, choice, strict })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tools: &str, choice: Option<Value>) -> Result<Tools, ApiError> {
        let raw: Box<RawValue> = serde_json::from_str(tools).unwrap();
        check(Some(&raw), choice.as_ref(), &SchemaLimits::new(4096, 16))
    }

    #[test]
    fn malformed_declarations_are_named() {
        let f = |name: &str| format!(r#"{{"type": "function", "function": {{"name": "{name}"}}}}"#);
        for (tools, param) in [
            (r#"{"a": 1}"#.to_string(), "tools"),
            ("[1]".to_string(), "tools[0]"),
            (r#"[{"type": "web", "function": {"name": "f"}}]"#.to_string(), "tools[0].type"),
            (r#"[{"type": "function"}]"#.to_string(), "tools[0].function"),
            (format!("[{}]", f("")), "tools[0].function.name"),
            (format!("[{}]", f("a b")), "tools[0].function.name"),
            (format!("[{}, {}]", f("ok"), f("x".repeat(65).as_str())), "tools[1].function.name"),
            (
                r#"[{"type": "function", "function": {"name": "f", "parameters": [1]}}]"#.to_string(),
                "tools[0].function.parameters",
            ),
            (format!("[{}, {}]", f("f"), f("f")), "tools"),
        ] {
            let e = run(&tools, None).expect_err(&tools);
            assert_eq!(e.param.as_deref(), Some(param), "{tools}: {e}");
        }
    }

    #[test]
    fn a_named_choice_must_be_declared_and_is_all_the_model_sees() {
        let tools = r#"[{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b", "description": "B"}}]"#;
        let named = |n: &str| Some(serde_json::json!({"type": "function", "function": {"name": n}}));
        let e = run(tools, named("c")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let t = run(tools, named("b")).unwrap();
        assert_eq!(t.choice, ToolChoice::Required);
        assert_eq!(
            t.declared.as_deref(),
            Some(r#"[{"type": "function", "function": {"name": "b", "description": "B"}}]"#)
        );
        assert!(
            check(None, Some(&Value::from("required")), &SchemaLimits::new(4096, 16)).is_err(),
            "required with no tools"
        );
        assert_eq!(run(tools, None).unwrap().declared.as_deref(), Some(tools), "kept as written");
    }
}
