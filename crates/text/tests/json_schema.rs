//! Constrained JSON against references this project did not write: schemas made by pydantic (and
//! the `openai` client's strict form of them, what its `parse` sends), documents labelled valid
//! or not by the `jsonschema` package (fixtures/json-schema/cases.json, made by
//! tools/golden/json_schema_cases.py). A document is accepted whole and complete exactly when it
//! is valid; every prefix of a valid one is accepted (generation never paints itself into a
//! corner); a schema the compiler cannot honour is refused naming the keyword and its place.

use std::sync::Arc;

use k3_text::json_schema::{JsonSchema, SchemaError, SchemaLimits};
use serde_json::{Map, Value, json};

/// A 128K context of tokens of at most 16 bytes: room for any reasonable answer.
const ROOMY: SchemaLimits = SchemaLimits { context_tokens: 128 << 10, max_token_bytes: 16 };

fn compile(schema: &Value) -> Result<JsonSchema, SchemaError> {
    JsonSchema::compile(schema, &ROOMY)
}

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/json-schema/cases.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn documents_are_accepted_exactly_when_jsonschema_says_they_are_valid() {
    let mut checked = (0, 0);
    for case in cases() {
        let schema = Arc::new(compile(&case["schema"]).unwrap_or_else(|e| panic!("{}: {e}", case["name"])));
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
        compile(&json!({"type": "object", "properties": {"a": {"type": "array",
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
        let e = compile(&schema).unwrap_err();
        assert_eq!(e.at, at, "{schema}: {e}");
        assert!(e.to_string().contains(says), "{schema}: {e}");
    }
}

/// A schema whose `anyOf` refers back to itself with nothing in between (`L = L | null`) comes
/// from a request: it must neither recurse without end nor refuse what it allows.
#[test]
fn an_anyof_that_refers_to_itself_ends() {
    let schema = Arc::new(
        compile(&json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/L"}}, "required": ["a"],
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
        compile(&json!({
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

/// `{"type": "object", "properties": {"x": ...}, "required": ["x"]}` around `x`.
fn with_x(x: Value) -> Value {
    json!({"type": "object", "properties": {"x": x}, "required": ["x"]})
}

/// `$defs` `D0` .. `D{n-1}` reached from the root's `x`, each `link(next)` of the following one,
/// the last a string.
fn chain(n: usize, link: impl Fn(Value) -> Value) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let def =
            if i + 1 < n { link(json!({"$ref": format!("#/$defs/D{}", i + 1)})) } else { json!({"type": "string"}) };
        defs.insert(format!("D{i}"), def);
    }
    let mut root = with_x(json!({"$ref": "#/$defs/D0"}));
    root["$defs"] = Value::Object(defs);
    root
}

/// Runs `f` on a thread with a stack of `kib` KiB: a recursion that outgrows it aborts the test.
fn on_stack<T: Send + 'static>(kib: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new().stack_size(kib << 10).spawn(f).unwrap().join().unwrap()
}

/// The audit's body that overflowed a server worker's stack: `$ref`s chained through 1,500
/// definitions (and 100,000), bare or each inside an object, refused at the depth limit on a
/// stack an eighth of a tokio worker's, never by overflowing it.
#[test]
fn a_long_chain_of_refs_is_refused_at_the_depth_limit_without_overflowing() {
    for n in [1_500, 100_000] {
        let bare = chain(n, |next| next);
        let nested = chain(n, |next| json!({"type": "object", "properties": {"next": next}, "required": ["next"]}));
        for schema in [bare, nested] {
            let e = on_stack(256, move || compile(&schema).unwrap_err());
            assert!(e.at.starts_with("/$defs/D"), "{e}");
            assert!(e.reason.contains("more than 64 levels"), "{e}");
        }
    }
}

/// The depth limit is where it says: 64 schemas nested in one another compile, on a stack an
/// eighth of a tokio worker's; 65 are refused at the innermost.
#[test]
fn sixty_four_levels_compile_on_a_small_stack_and_sixty_five_do_not() {
    let nested = |levels: usize| {
        (1..levels).fold(json!({"type": "string"}), |inner, _| json!({"type": "object", "properties": {"a": inner}}))
    };
    let deepest = nested(64);
    let schema = on_stack(256, move || compile(&deepest).map(Arc::new).unwrap());
    let text = format!("{}\"s\"{}", r#"{"a":"#.repeat(63), "}".repeat(62));
    let mut p = schema.prefix();
    assert!(p.push_str(&text) && !p.complete() && p.push_str("}") && p.complete(), "{text}");
    let e = compile(&nested(65)).unwrap_err();
    assert_eq!(e.at, "/properties/a".repeat(64), "{e}");
}

/// `anyOf`s too wide to try on every character: one list of 10^4 or 10^5 alternatives, a `type`
/// list, and alternatives that are few in each list but many once nested `anyOf`s (directly or
/// through `$ref`) are flattened.
#[test]
fn too_many_alternatives_are_refused_naming_the_anyof() {
    let consts = |from: usize, n: usize| (from..from + n).map(|i| json!({"const": i})).collect::<Vec<_>>();
    for n in [10_000, 100_000] {
        let e = compile(&with_x(json!({"anyOf": consts(0, n)}))).unwrap_err();
        assert_eq!(e.at, "/properties/x/anyOf", "{e}");
        assert!(e.reason.contains(&format!("{n} alternatives; at most 256")), "{e}");
    }
    let e = compile(&with_x(json!({"type": vec!["string"; 300]}))).unwrap_err();
    assert_eq!((e.at.as_str(), e.reason.contains("at most 256")), ("/properties/x/type", true), "{e}");
    // 40 levels of anyOf in anyOf, 10 alternatives each: 370 once flattened.
    let deep = (0..40).fold(json!({"const": -1}), |inner, level| {
        let mut alts = consts(level * 10, 9);
        alts.insert(0, inner);
        json!({"anyOf": alts})
    });
    let e = compile(&with_x(deep)).unwrap_err();
    assert!(e.at.starts_with("/properties/x/anyOf/0/anyOf") && e.at.ends_with("/anyOf"), "{e}");
    assert!(e.reason.contains("flattened; at most 256"), "{e}");
    let mut through_refs = with_x(json!({"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}));
    through_refs["$defs"] = json!({"A": {"anyOf": consts(0, 200)}, "B": {"anyOf": consts(200, 200)}});
    let e = compile(&through_refs).unwrap_err();
    assert_eq!(e.at, "/properties/x/anyOf", "{e}");
    // 40 levels of two alternatives are 40 once flattened: taken, and matched.
    let narrow = (0..40).fold(json!({"const": -1}), |inner, level| json!({"anyOf": [inner, {"const": level}]}));
    let schema = Arc::new(compile(&with_x(narrow)).unwrap());
    for ok in [r#"{"x":-1}"#, r#"{"x":39}"#, r#"{"x":0}"#] {
        let mut p = schema.prefix();
        assert!(p.push_str(ok) && p.complete(), "{ok}");
    }
    assert!(!schema.prefix().accepts(r#"{"x":40}"#));
}

/// More compiled nodes than the bound: 64 properties of 64 properties of a 3-type list.
#[test]
fn too_many_nodes_are_refused() {
    let leaf = json!({"type": ["string", "integer", "null"]});
    let props = |v: Value| Value::Object((0..64).map(|i| (format!("p{i}"), v.clone())).collect());
    let schema = json!({"type": "object", "properties": props(json!({"type": "object", "properties": props(leaf)}))});
    let e = compile(&schema).unwrap_err();
    assert!(e.at.starts_with("/properties/p") && e.reason.contains("at most 8192"), "{e}");
}

/// Counts whose shortest answer no context can hold: `minItems` 4e9, `minLength` 4e9, and
/// counts fine alone whose product is not; the rule (bytes ≤ context × longest token) exact.
#[test]
fn counts_beyond_the_context_are_refused_naming_the_count() {
    let small = SchemaLimits::new(4096, 16);
    let refused = |schema: Value| JsonSchema::compile(&schema, &small).unwrap_err();
    let e = refused(with_x(json!({"type": "array", "minItems": 4_000_000_000u64})));
    assert_eq!(e.at, "/properties/x/minItems", "{e}");
    assert!(
        e.reason.contains("4000000000 items") && e.reason.contains("4096 tokens") && e.reason.contains("65536"),
        "{e}"
    );
    let e = refused(with_x(json!({"type": "string", "minLength": 4_000_000_000u64})));
    assert_eq!(e.at, "/properties/x/minLength", "{e}");
    // An optional property that could never end within the context is refused too.
    let e = refused(json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 70_000}}}));
    assert_eq!(e.at, "/properties/s/minLength", "{e}");
    // Each array fits (2,001 bytes); 1,000 of them do not (2,002,001 bytes): the outer is named.
    let grid = json!({"type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 1000, "items": {"type": "integer"}}});
    let e = refused(with_x(grid.clone()));
    assert_eq!(e.at, "/properties/x/minItems", "{e}");
    assert!(e.reason.contains("2001 bytes each") && e.reason.contains("2002001 bytes"), "{e}");
    assert!(JsonSchema::compile(&with_x(grid), &SchemaLimits::new(128 << 10, 16)).is_ok());
    // Through a `$ref`, objects of objects.
    let mut objects = with_x(json!({"type": "array", "minItems": 5000, "items": {"$ref": "#/$defs/P"}}));
    objects["$defs"] = json!({"P": {"type": "object", "properties": {"name": {"type": "string", "minLength": 10}},
        "required": ["name"]}});
    let e = refused(objects);
    assert_eq!(e.at, "/properties/x/minItems", "{e}");
    // `{"s":"0123456789"}` is 18 bytes: room for 18 takes it, room for 17 does not.
    let ten = json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 10}}, "required": ["s"]});
    assert!(JsonSchema::compile(&ten, &SchemaLimits::new(18, 1)).is_ok());
    assert!(JsonSchema::compile(&ten, &SchemaLimits::new(9, 2)).is_ok());
    let e = JsonSchema::compile(&ten, &SchemaLimits::new(17, 1)).unwrap_err();
    assert_eq!((e.at.as_str(), e.reason.contains("at least 18 bytes")), ("/", true), "{e}");
}

/// Schemas nothing can satisfy, refused naming where: a `$ref` to itself (bare, through `anyOf`,
/// the root's own `#`), a mutual cycle, a required property that requires its own kind, `type: []`,
/// an empty `anyOf`; and an optional property that could be begun but never finished.
#[test]
fn schemas_nothing_satisfies_are_refused_naming_the_cause() {
    let defs = |x: Value, defs: Value| {
        let mut s = with_x(x);
        s["$defs"] = defs;
        s
    };
    let a = json!({"$ref": "#/$defs/A"});
    for (schema, at, says) in [
        (defs(a.clone(), json!({"A": {"$ref": "#/$defs/A"}})), "/$defs/A/$ref", "`#/$defs/A` refers to itself"),
        (
            defs(a.clone(), json!({"A": {"anyOf": [{"$ref": "#/$defs/A"}]}})),
            "/$defs/A/anyOf/0/$ref",
            "refers to itself",
        ),
        (
            defs(a.clone(), json!({"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}})),
            "/$defs/B/$ref",
            "(`#/$defs/A` → `#/$defs/B` → `#/$defs/A`) with nothing that can end it",
        ),
        (
            defs(
                a.clone(),
                json!({
                "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                "B": {"type": "array", "minItems": 1, "items": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}]}}}),
            ),
            "/$defs/B/items/anyOf/0/$ref",
            "refers back to itself",
        ),
        (
            defs(
                json!({"$ref": "#/$defs/T"}),
                json!({"T": {"type": "object", "properties": {
                "v": {"type": "integer"}, "kid": {"$ref": "#/$defs/T"}}, "required": ["v", "kid"]}}),
            ),
            "/$defs/T/properties/kid/$ref",
            "`#/$defs/T` refers to itself",
        ),
        (
            json!({"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}),
            "/properties/me/$ref",
            "`#` refers to itself",
        ),
        (with_x(json!({"type": []})), "/properties/x/type", "an empty list of types allows no value"),
        (with_x(json!({"anyOf": []})), "/properties/x/anyOf", "an empty list of schemas allows no value"),
        (
            defs(json!({"type": "string"}), json!({"A": {"$ref": "#/$defs/A"}}))
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o["properties"]["y"] = json!({"$ref": "#/$defs/A"});
                    Value::Object(o)
                })
                .unwrap(),
            "/$defs/A/$ref",
            "refers to itself",
        ),
    ] {
        let e = compile(&schema).unwrap_err();
        assert_eq!(e.at, at, "{schema}: {e}");
        assert!(e.reason.contains(says), "{schema}: {e}");
    }
}

/// Recursion with a way out still compiles and matches: a list whose `next` may be null, a tree
/// whose required children are an array that may be empty.
#[test]
fn recursion_with_a_way_out_compiles() {
    let mut list = with_x(json!({"$ref": "#/$defs/N"}));
    list["$defs"] = json!({"N": {"type": "object", "required": ["next"],
        "properties": {"next": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}}}});
    let list = Arc::new(compile(&list).unwrap());
    let mut p = list.prefix();
    assert!(p.push_str(r#"{"x":{"next":{"next":null}}}"#) && p.complete());
    let mut tree = with_x(json!({"$ref": "#/$defs/T"}));
    tree["$defs"] = json!({"T": {"type": "object", "required": ["kids"],
        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/T"}}}}});
    let tree = Arc::new(compile(&tree).unwrap());
    let mut p = tree.prefix();
    assert!(p.push_str(r#"{"x":{"kids":[{"kids":[]},{"kids":[{"kids":[]}]}]}}"#) && p.complete());
}

/// Names with `/` or `~` are escaped in the pointers errors give (RFC 6901), and a `$ref` escaped
/// so finds its definition.
#[test]
fn pointers_escape_names() {
    let e =
        compile(&json!({"type": "object", "properties": {"a/b~c": {"type": "integer", "minimum": 0}}})).unwrap_err();
    assert_eq!(e.at, "/properties/a~1b~0c/minimum", "{e}");
    let schema = json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/x~1y"}}, "required": ["p"],
        "$defs": {"x/y": {"type": "integer"}}});
    let schema = Arc::new(compile(&schema).unwrap());
    let mut p = schema.prefix();
    assert!(p.push_str(r#"{"p":12}"#) && p.complete());
}
