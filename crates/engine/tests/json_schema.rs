//! Constrained JSON against references this project did not write: schemas made by pydantic (and
//! the `openai` client's strict form of them, what its `parse` sends), documents labelled valid
//! or not by the `jsonschema` package (fixtures/json-schema/cases.json, made by
//! tools/golden/json_schema_cases.py). A document is accepted whole and complete exactly when it
//! is valid; every prefix of a valid one is accepted (generation never paints itself into a
//! corner); a schema the compiler cannot honour is refused naming the keyword and its place.

use std::sync::Arc;

use k3_engine::json_schema::JsonSchema;
use serde_json::{Value, json};

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/json-schema/cases.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn documents_are_accepted_exactly_when_jsonschema_says_they_are_valid() {
    let mut checked = (0, 0);
    for case in cases() {
        let schema = Arc::new(JsonSchema::compile(&case["schema"]).unwrap_or_else(|e| panic!("{}: {e}", case["name"])));
        for doc in case["docs"].as_array().unwrap() {
            let text = doc["text"].as_str().unwrap();
            let valid = doc["valid"].as_bool().unwrap();
            let mut p = schema.prefix();
            let ours = p.push_str(text) && p.complete();
            assert_eq!(ours, valid, "{}: {text}", case["name"]);
            if valid {
                // Every prefix goes on, and only the whole is complete; nothing goes after it.
                let mut q = schema.prefix();
                for (i, c) in text.char_indices() {
                    assert!(!q.complete(), "{}: complete after {:?}", case["name"], &text[..i]);
                    assert!(q.push_str(&c.to_string()), "{}: refused at {i} of {text}", case["name"]);
                }
                assert!(q.complete() && !q.accepts(" ") && !q.accepts("{"), "{text}");
                checked.0 += 1;
            } else {
                checked.1 += 1;
            }
        }
    }
    assert!(checked.0 >= 50 && checked.1 >= 300, "{checked:?}");
}

#[test]
fn whitespace_comes_between_tokens_one_character_at_a_time() {
    let schema = Arc::new(
        JsonSchema::compile(&json!({"type": "object", "properties": {"a": {"type": "array",
        "items": {"type": "integer"}}}, "required": ["a"], "additionalProperties": false}))
        .unwrap(),
    );
    let mut p = schema.prefix();
    assert!(!p.accepts(" "), "the answer starts at once");
    assert!(p.push_str("{ \"a\" :\n[ 1 , 2 ]\n}") && p.complete());
    let mut p = schema.prefix();
    assert!(p.push_str("{") && p.push_str(" ") && !p.accepts(" ") && !p.accepts("\n"), "one in a row at most");
    let p = schema.prefix();
    assert!(!p.accepts("{\"a\":[1 2]}") && !p.accepts("{\"a\":[1,]}") && !p.accepts("{\"a\":[01]}"));
}

#[test]
fn unsupported_keywords_are_refused_naming_them_and_where() {
    for (schema, at, says) in [
        (
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}),
            "/properties/n/minimum",
            "minimum",
        ),
        (
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}),
            "/properties/s/pattern",
            "pattern",
        ),
        (
            json!({"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}}}),
            "/properties/d/format",
            "format",
        ),
        (json!({"type": "array", "items": {"type": "string"}}), "/", "top level"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}), "/properties/a/$ref", "Missing"),
        (
            json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 3}]}}}),
            "/properties/a/allOf",
            "allOf",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}),
            "/additionalProperties",
            "beside",
        ),
        (json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}), "/required", "`b`"),
        (json!({"type": "object", "properties": {"a": {"type": "strin"}}}), "/properties/a/type", "strin"),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err();
        assert_eq!(e.at, at, "{schema}: {e}");
        assert!(e.to_string().contains(says), "{schema}: {e}");
    }
}

/// A schema whose `anyOf` refers back to itself with nothing in between (`L = L | null`) comes
/// from a request: it must neither recurse without end nor refuse what it allows.
#[test]
fn an_anyof_that_refers_to_itself_ends() {
    let schema = Arc::new(
        JsonSchema::compile(&json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/L"}}, "required": ["a"],
            "$defs": {"L": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}}}))
        .unwrap(),
    );
    let mut p = schema.prefix();
    assert!(p.push_str(r#"{"a":null}"#) && p.complete());
    assert!(!schema.prefix().accepts(r#"{"a":1"#));
}

#[test]
fn recursion_enums_consts_and_dictionaries() {
    let schema = Arc::new(
        JsonSchema::compile(&json!({
            "$defs": {"T": {"type": "object", "properties": {"v": {"enum": [1, 12, "x", null]},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/T"}, "maxItems": 2}},
                "required": ["v"], "additionalProperties": false}},
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/T"}, "k": {"const": "fixed"},
                           "d": {"type": "object", "additionalProperties": {"type": "boolean"}}},
            "required": ["root", "k", "d"], "additionalProperties": false,
        }))
        .unwrap(),
    );
    let ok = r#"{"k":"fixed","root":{"v":12,"kids":[{"v":1},{"v":null,"kids":[]}]},"d":{"a":true,"b":false}}"#;
    let mut p = schema.prefix();
    assert!(p.push_str(ok) && p.complete(), "{ok}");
    for bad in [
        r#"{"k":"fixed!"#,
        r#"{"k":"fixed","k""#,
        r#"{"root":{"v":13"#,
        r#"{"root":{"v":1,"kids":[{"v":1},{"v":1},"#,
        r#"{"d":{"a":1"#,
        r#"{"root":{"v":"y""#,
    ] {
        assert!(!schema.prefix().accepts(bad), "{bad} was accepted");
    }
    // A required key left out: the object cannot close.
    let mut p = schema.prefix();
    assert!(p.push_str(r#"{"k":"fixed","d":{}"#) && !p.accepts("}") && p.accepts(","));
}
