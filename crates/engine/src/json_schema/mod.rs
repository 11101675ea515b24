//! A JSON schema compiled into what constrained generation checks the answer against
//! (`response_format: json_schema`): objects with their properties in any order, each once
//! (required ones always, optional ones may be left out, nothing else), dictionaries
//! (`additionalProperties` a schema), arrays with bounds, strings with length bounds, numbers,
//! integers, booleans, null, `enum`, `const`, `anyOf` (and a `type` list), `$ref` into `$defs` /
//! `definitions` (recursion allowed). Anything else that would constrain the answer is refused
//! by keyword and place, never ignored; annotations (`title`, `description`, `default`, ...)
//! are ignored. [`SchemaPrefix`] checks an answer as it is written.

mod matcher;

use std::collections::HashMap;

use serde_json::{Map, Value};

pub use matcher::SchemaPrefix;

/// Why a schema cannot be used: the keyword and where it is (a JSON pointer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct SchemaError {
    pub at: String,
    pub reason: String,
}

/// Properties of one object, and values of one `enum`, at most (each is a bit in a mask).
pub const MOST_ALTERNATIVES: usize = 64;

/// Keywords that describe and do not constrain.
const ANNOTATIONS: [&str; 12] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "discriminator",
    "strict",
];

/// Keywords this compiler honours.
const HONOURED: [&str; 17] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
];

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prop {
    /// The key as JSON text, quotes included.
    pub key: String,
    pub node: u32,
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// Not compiled yet (a `$ref` being compiled).
    Pending,
    AnyOf(Vec<u32>),
    /// These properties, in any order, each at most once; the required ones (bits of
    /// `required`) always.
    Object {
        props: Vec<Prop>,
        required: u64,
    },
    /// Any string keys, each value of `value`.
    Map(u32),
    Array {
        items: u32,
        min: u32,
        max: u32,
    },
    String {
        min: u32,
        max: u32,
    },
    Number {
        integer: bool,
    },
    /// Exactly one of these JSON texts (`enum`, `const`, `true`/`false`, `null`).
    Lits(Vec<String>),
}

/// A compiled schema: what an answer must be.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: u32,
}

impl JsonSchema {
    /// Compiles `schema`; the answer's top level must be an object (as OpenAI requires).
    pub fn compile(schema: &Value) -> Result<JsonSchema, SchemaError> {
        let mut c = Compiler { nodes: Vec::new(), defs: HashMap::new(), root: schema, any: None, refs: HashMap::new() };
        let root = c.add(Node::Pending);
        c.refs.insert("#".into(), root);
        let node = c.node(schema, "")?;
        c.nodes[root as usize] = c.nodes[node as usize].clone();
        let s = JsonSchema { nodes: c.nodes, root };
        if !s.object_at_top(root, 0) {
            return Err(SchemaError {
                at: "/".into(),
                reason: "the top level must be an object (type: object)".into(),
            });
        }
        Ok(s)
    }

    /// A checker of an answer in the making.
    pub fn prefix(self: &std::sync::Arc<Self>) -> SchemaPrefix {
        SchemaPrefix::new(self.clone())
    }

    fn object_at_top(&self, n: u32, depth: usize) -> bool {
        match &self.nodes[n as usize] {
            Node::Object { .. } | Node::Map(_) => true,
            Node::AnyOf(alts) if depth < 16 => alts.iter().all(|&a| self.object_at_top(a, depth + 1)),
            _ => false,
        }
    }
}

struct Compiler<'s> {
    nodes: Vec<Node>,
    /// `$defs` and `definitions` of the root, by their `$ref` text.
    defs: HashMap<String, &'s Value>,
    root: &'s Value,
    /// The node of "any JSON value", made once.
    any: Option<u32>,
    /// Nodes of `$ref` texts compiled or being compiled.
    refs: HashMap<String, u32>,
}

fn err(at: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError { at: if at.is_empty() { "/".into() } else { at.into() }, reason: reason.into() }
}

/// A count keyword (`minItems`, ...), if given.
fn count(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u32>, SchemaError> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| err(&format!("{at}/{key}"), format!("{v} is not a count"))),
    }
}

impl<'s> Compiler<'s> {
    fn add(&mut self, n: Node) -> u32 {
        self.nodes.push(n);
        (self.nodes.len() - 1) as u32
    }

    /// Any JSON value: null, booleans, numbers, strings, arrays and dictionaries of any values.
    fn any(&mut self) -> u32 {
        if let Some(a) = self.any {
            return a;
        }
        let any = self.add(Node::Pending);
        self.any = Some(any);
        let lits = self.add(Node::Lits(vec!["null".into(), "true".into(), "false".into()]));
        let num = self.add(Node::Number { integer: false });
        let s = self.add(Node::String { min: 0, max: u32::MAX });
        let arr = self.add(Node::Array { items: any, min: 0, max: u32::MAX });
        let map = self.add(Node::Map(any));
        self.nodes[any as usize] = Node::AnyOf(vec![lits, num, s, arr, map]);
        any
    }

    fn node(&mut self, v: &'s Value, at: &str) -> Result<u32, SchemaError> {
        let o = match v {
            Value::Bool(true) => return Ok(self.any()),
            Value::Bool(false) => return Err(err(at, "the schema `false` allows no value")),
            Value::Object(o) => o,
            other => return Err(err(at, format!("{other} is not a schema"))),
        };
        if let Some(k) = o.keys().find(|k| !ANNOTATIONS.contains(&k.as_str()) && !HONOURED.contains(&k.as_str())) {
            return Err(err(&format!("{at}/{k}"), format!("the keyword `{k}` is not supported")));
        }
        for defs in ["$defs", "definitions"] {
            if let Some(d) = o.get(defs) {
                let d = d.as_object().ok_or_else(|| err(&format!("{at}/{defs}"), "not an object"))?;
                for (name, schema) in d {
                    self.defs.insert(format!("#/{defs}/{name}"), schema);
                }
            }
        }
        if let Some(r) = o.get("$ref") {
            return self.reference(r, &format!("{at}/$ref"));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key) {
                return self.any_of(alts, &format!("{at}/{key}"));
            }
        }
        if let Some(all) = o.get("allOf") {
            // Pydantic's wrapper of a single `$ref`; an intersection of several is not supported.
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.node(one, &format!("{at}/allOf/0")),
                _ => Err(err(&format!("{at}/allOf"), "allOf with more than one schema is not supported")),
            };
        }
        if let Some(c) = o.get("const") {
            return Ok(self.add(Node::Lits(vec![c.to_string()])));
        }
        if let Some(e) = o.get("enum") {
            let values = e
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| err(&format!("{at}/enum"), "not a list of values"))?;
            if values.len() > MOST_ALTERNATIVES {
                return Err(err(
                    &format!("{at}/enum"),
                    format!("{} values; at most {MOST_ALTERNATIVES}", values.len()),
                ));
            }
            return Ok(self.add(Node::Lits(values.iter().map(Value::to_string).collect())));
        }
        match o.get("type") {
            None => Ok(self.any()),
            Some(Value::String(t)) => self.typed(t, o, at),
            Some(Value::Array(types)) => {
                let mut alts = Vec::new();
                for (i, t) in types.iter().enumerate() {
                    let t = t.as_str().ok_or_else(|| err(&format!("{at}/type/{i}"), "not a type name"))?;
                    alts.push(self.typed(t, o, at)?);
                }
                Ok(self.add(Node::AnyOf(alts)))
            }
            Some(other) => Err(err(&format!("{at}/type"), format!("{other} is not a type"))),
        }
    }

    fn reference(&mut self, r: &Value, at: &str) -> Result<u32, SchemaError> {
        let r = r.as_str().ok_or_else(|| err(at, "not a reference"))?;
        if let Some(&n) = self.refs.get(r) {
            return Ok(n);
        }
        let target = match self.defs.get(r) {
            Some(t) => *t,
            None => self.lookup(r).ok_or_else(|| err(at, format!("`{r}` names no schema in $defs or definitions")))?,
        };
        let n = self.add(Node::Pending);
        self.refs.insert(r.to_string(), n);
        let compiled = self.node(target, r.trim_start_matches('#'))?;
        self.nodes[n as usize] = self.nodes[compiled as usize].clone();
        Ok(n)
    }

    /// A local `#/$defs/Name` or `#/definitions/Name` of the root not yet seen.
    fn lookup(&self, r: &str) -> Option<&'s Value> {
        let path = r.strip_prefix("#/")?;
        let (section, name) = path.split_once('/')?;
        if !matches!(section, "$defs" | "definitions") {
            return None;
        }
        self.root.get(section)?.get(name)
    }

    fn any_of(&mut self, alts: &'s Value, at: &str) -> Result<u32, SchemaError> {
        let list = alts.as_array().filter(|a| !a.is_empty()).ok_or_else(|| err(at, "not a list of schemas"))?;
        let mut nodes = Vec::with_capacity(list.len());
        for (i, a) in list.iter().enumerate() {
            nodes.push(self.node(a, &format!("{at}/{i}"))?);
        }
        Ok(self.add(Node::AnyOf(nodes)))
    }

    fn typed(&mut self, t: &str, o: &'s Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        Ok(match t {
            "object" => return self.object(o, at),
            "array" => {
                let items = match o.get("items") {
                    None => self.any(),
                    Some(i) => self.node(i, &format!("{at}/items"))?,
                };
                let min = count(o, "minItems", at)?.unwrap_or(0);
                let max = count(o, "maxItems", at)?.unwrap_or(u32::MAX);
                if max < min {
                    return Err(err(&format!("{at}/maxItems"), format!("{max} is below minItems {min}")));
                }
                self.add(Node::Array { items, min, max })
            }
            "string" => {
                let min = count(o, "minLength", at)?.unwrap_or(0);
                let max = count(o, "maxLength", at)?.unwrap_or(u32::MAX);
                if max < min {
                    return Err(err(&format!("{at}/maxLength"), format!("{max} is below minLength {min}")));
                }
                self.add(Node::String { min, max })
            }
            "integer" => self.add(Node::Number { integer: true }),
            "number" => self.add(Node::Number { integer: false }),
            "boolean" => self.add(Node::Lits(vec!["true".into(), "false".into()])),
            "null" => self.add(Node::Lits(vec!["null".into()])),
            other => return Err(err(&format!("{at}/type"), format!("`{other}` is not a JSON type"))),
        })
    }

    fn object(&mut self, o: &'s Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let props = match o.get("properties") {
            None => EMPTY.get_or_init(Map::new),
            Some(p) => p.as_object().ok_or_else(|| err(&format!("{at}/properties"), "not an object"))?,
        };
        if props.len() > MOST_ALTERNATIVES {
            return Err(err(
                &format!("{at}/properties"),
                format!("{} properties; at most {MOST_ALTERNATIVES}", props.len()),
            ));
        }
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(r) => r
                .as_array()
                .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
                .ok_or_else(|| err(&format!("{at}/required"), "not a list of names"))?,
        };
        if let Some(missing) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(err(&format!("{at}/required"), format!("`{missing}` is not among the properties")));
        }
        let additional = o.get("additionalProperties");
        if props.is_empty() {
            // A dictionary: any keys (none with `additionalProperties: false`).
            return Ok(match additional {
                Some(Value::Bool(false)) => self.add(Node::Object { props: Vec::new(), required: 0 }),
                None | Some(Value::Bool(true)) => {
                    let any = self.any();
                    self.add(Node::Map(any))
                }
                Some(schema) => {
                    let value = self.node(schema, &format!("{at}/additionalProperties"))?;
                    self.add(Node::Map(value))
                }
            });
        }
        if additional.is_some_and(|a| !a.is_boolean()) {
            return Err(err(
                &format!("{at}/additionalProperties"),
                "a schema for further properties beside `properties` is not supported (give false)",
            ));
        }
        let mut list = Vec::with_capacity(props.len());
        for (name, schema) in props {
            let node = self.node(schema, &format!("{at}/properties/{name}"))?;
            list.push(Prop {
                key: Value::String(name.clone()).to_string(),
                node,
                required: required.contains(&name.as_str()),
            });
        }
        let required = list.iter().enumerate().filter(|(_, p)| p.required).fold(0u64, |m, (i, _)| m | 1 << i);
        Ok(self.add(Node::Object { props: list, required }))
    }
}
