//! A schema's JSON into nodes: each keyword checked, refused by name and place when it cannot be
//! honoured, the recursion bounded by [`MOST_DEPTH`] and the nodes by [`MOST_NODES`]. A `$ref` is a
//! one-alternative `anyOf` of its definition (an alias the matcher flattens away), so recursion
//! needs no placeholder copied before it is filled.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::limits::{MOST_ANY_OF, MOST_DEPTH, MOST_NODES};
use super::{ANNOTATIONS, HONOURED, MOST_ALTERNATIVES, Node, Prop, SchemaError};

/// Where a node comes from, for errors; pointers as `at` is written (`""` is the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origin {
    /// The schema at this JSON pointer.
    Schema(String),
    /// The definition a `$ref` text (`name`) names, at its pointer.
    Def { at: String, name: String },
    /// A `$ref` at this pointer, to the definition `name`.
    Ref { at: String, name: String },
}

impl Origin {
    pub(super) fn at(&self) -> &str {
        match self {
            Origin::Schema(at) | Origin::Def { at, .. } | Origin::Ref { at, .. } => at,
        }
    }
}

/// A schema's nodes, where each comes from, and the root (an alias of the top schema).
pub(super) struct Compiled {
    pub nodes: Vec<Node>,
    pub origins: Vec<Origin>,
    pub root: u32,
}

pub(super) fn err(at: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError { at: if at.is_empty() { "/".into() } else { at.into() }, reason: reason.into() }
}

/// Compiles `schema` into nodes, without yet asking whether anything satisfies them.
pub(super) fn compile(schema: &Value) -> Result<Compiled, SchemaError> {
    let mut c = Compiler {
        nodes: Vec::new(),
        origins: Vec::new(),
        defs: HashMap::new(),
        root: schema,
        any: None,
        refs: HashMap::new(),
        depth: 0,
    };
    let root = c.add(Node::Pending, Origin::Def { at: String::new(), name: "#".into() })?;
    c.refs.insert("#".into(), root);
    let body = c.node(schema, "")?;
    c.nodes[root as usize] = Node::AnyOf(vec![body]);
    Ok(Compiled { nodes: c.nodes, origins: c.origins, root })
}

struct Compiler<'s> {
    nodes: Vec<Node>,
    origins: Vec<Origin>,
    /// `$defs` and `definitions` of the root, by their `$ref` text.
    defs: HashMap<String, &'s Value>,
    root: &'s Value,
    /// The node of "any JSON value", made once.
    any: Option<u32>,
    /// The definition node of each `$ref` text compiled or being compiled.
    refs: HashMap<String, u32>,
    /// Schemas being compiled, one in another (the recursion's depth).
    depth: usize,
}

/// A name as one token of a JSON pointer (RFC 6901: `~` is `~0`, `/` is `~1`).
fn token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
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

/// A list of alternatives (`anyOf`, `oneOf`, a `type` list): not empty, not too long.
fn alternatives<'v>(v: &'v Value, at: &str, what: &str) -> Result<&'v [Value], SchemaError> {
    let list = v.as_array().ok_or_else(|| err(at, format!("not a list of {what}")))?;
    if list.is_empty() {
        return Err(err(at, format!("an empty list of {what} allows no value")));
    }
    if list.len() > MOST_ANY_OF {
        return Err(err(at, format!("{} alternatives; at most {MOST_ANY_OF}", list.len())));
    }
    Ok(list)
}

impl<'s> Compiler<'s> {
    fn add(&mut self, n: Node, origin: Origin) -> Result<u32, SchemaError> {
        if self.nodes.len() == MOST_NODES {
            return Err(err(
                origin.at(),
                format!(
                    "more than {MOST_NODES} compiled schemas (each schema, type and $ref counts); at most {MOST_NODES}"
                ),
            ));
        }
        self.nodes.push(n);
        self.origins.push(origin);
        Ok((self.nodes.len() - 1) as u32)
    }

    fn here(&mut self, n: Node, at: &str) -> Result<u32, SchemaError> {
        self.add(n, Origin::Schema(at.into()))
    }

    /// Any JSON value: null, booleans, numbers, strings, arrays and dictionaries of any values.
    fn any(&mut self, at: &str) -> Result<u32, SchemaError> {
        if let Some(a) = self.any {
            return Ok(a);
        }
        let any = self.here(Node::Pending, at)?;
        self.any = Some(any);
        let lits = self.here(Node::Lits(vec!["null".into(), "true".into(), "false".into()]), at)?;
        let num = self.here(Node::Number { integer: false }, at)?;
        let s = self.here(Node::String { min: 0, max: u32::MAX }, at)?;
        let arr = self.here(Node::Array { items: any, min: 0, max: u32::MAX }, at)?;
        let map = self.here(Node::Map(any), at)?;
        self.nodes[any as usize] = Node::AnyOf(vec![lits, num, s, arr, map]);
        Ok(any)
    }

    /// The schema `v` at `at`, one level deeper than its parent: refused past [`MOST_DEPTH`], so
    /// the recursion (nesting and `$ref` hops) stays far inside any thread's stack.
    fn node(&mut self, v: &'s Value, at: &str) -> Result<u32, SchemaError> {
        if self.depth == MOST_DEPTH {
            return Err(err(
                at,
                format!(
                    "schemas nested more than {MOST_DEPTH} levels deep ($ref hops count); at most {MOST_DEPTH} levels"
                ),
            ));
        }
        self.depth += 1;
        let n = self.schema(v, at);
        self.depth -= 1;
        n
    }

    fn schema(&mut self, v: &'s Value, at: &str) -> Result<u32, SchemaError> {
        let o = match v {
            Value::Bool(true) => return self.any(at),
            Value::Bool(false) => return Err(err(at, "the schema `false` allows no value")),
            Value::Object(o) => o,
            other => return Err(err(at, format!("{other} is not a schema"))),
        };
        if let Some(k) = o.keys().find(|k| !ANNOTATIONS.contains(&k.as_str()) && !HONOURED.contains(&k.as_str())) {
            return Err(err(&format!("{at}/{}", token(k)), format!("the keyword `{k}` is not supported")));
        }
        for defs in ["$defs", "definitions"] {
            if let Some(d) = o.get(defs) {
                let d = d.as_object().ok_or_else(|| err(&format!("{at}/{defs}"), "not an object"))?;
                for (name, schema) in d {
                    self.defs.insert(format!("#/{defs}/{}", token(name)), schema);
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
            return self.here(Node::Lits(vec![c.to_string()]), at);
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
            return self.here(Node::Lits(values.iter().map(Value::to_string).collect()), at);
        }
        match o.get("type") {
            None => self.any(at),
            Some(Value::String(t)) => self.typed(t, o, at),
            Some(types @ Value::Array(_)) => {
                let types = alternatives(types, &format!("{at}/type"), "types")?;
                let mut alts = Vec::with_capacity(types.len());
                for (i, t) in types.iter().enumerate() {
                    let t = t.as_str().ok_or_else(|| err(&format!("{at}/type/{i}"), "not a type name"))?;
                    alts.push(self.typed(t, o, at)?);
                }
                self.here(Node::AnyOf(alts), &format!("{at}/type"))
            }
            Some(other) => Err(err(&format!("{at}/type"), format!("{other} is not a type"))),
        }
    }

    /// A `$ref` at `at`: an alias of its definition, which is compiled the first time it is named
    /// (a definition naming itself, directly or not, refers to the node being compiled).
    fn reference(&mut self, r: &Value, at: &str) -> Result<u32, SchemaError> {
        let r = r.as_str().ok_or_else(|| err(at, "not a reference"))?;
        let def = match self.refs.get(r) {
            Some(&d) => d,
            None => {
                let target = match self.defs.get(r) {
                    Some(t) => *t,
                    None => self
                        .lookup(r)
                        .ok_or_else(|| err(at, format!("`{r}` names no schema in $defs or definitions")))?,
                };
                let def_at = r.trim_start_matches('#');
                let d = self.add(Node::Pending, Origin::Def { at: def_at.into(), name: r.into() })?;
                self.refs.insert(r.to_string(), d);
                let body = self.node(target, def_at)?;
                self.nodes[d as usize] = Node::AnyOf(vec![body]);
                d
            }
        };
        self.add(Node::AnyOf(vec![def]), Origin::Ref { at: at.into(), name: r.into() })
    }

    /// A local `#/$defs/Name` or `#/definitions/Name` of the root not yet seen.
    fn lookup(&self, r: &str) -> Option<&'s Value> {
        let path = r.strip_prefix("#/")?;
        let (section, name) = path.split_once('/')?;
        if !matches!(section, "$defs" | "definitions") {
            return None;
        }
        self.root.get(section)?.get(name.replace("~1", "/").replace("~0", "~"))
    }

    fn any_of(&mut self, alts: &'s Value, at: &str) -> Result<u32, SchemaError> {
        let list = alternatives(alts, at, "schemas")?;
        let mut nodes = Vec::with_capacity(list.len());
        for (i, a) in list.iter().enumerate() {
            nodes.push(self.node(a, &format!("{at}/{i}"))?);
        }
        self.here(Node::AnyOf(nodes), at)
    }

    fn typed(&mut self, t: &str, o: &'s Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        let node = match t {
            "object" => return self.object(o, at),
            "array" => {
                let items = match o.get("items") {
                    None => self.any(at)?,
                    Some(i) => self.node(i, &format!("{at}/items"))?,
                };
                let min = count(o, "minItems", at)?.unwrap_or(0);
                let max = count(o, "maxItems", at)?.unwrap_or(u32::MAX);
                if max < min {
                    return Err(err(&format!("{at}/maxItems"), format!("{max} is below minItems {min}")));
                }
                Node::Array { items, min, max }
            }
            "string" => {
                let min = count(o, "minLength", at)?.unwrap_or(0);
                let max = count(o, "maxLength", at)?.unwrap_or(u32::MAX);
                if max < min {
                    return Err(err(&format!("{at}/maxLength"), format!("{max} is below minLength {min}")));
                }
                Node::String { min, max }
            }
            "integer" => Node::Number { integer: true },
            "number" => Node::Number { integer: false },
            "boolean" => Node::Lits(vec!["true".into(), "false".into()]),
            "null" => Node::Lits(vec!["null".into()]),
            other => return Err(err(&format!("{at}/type"), format!("`{other}` is not a JSON type"))),
        };
        self.here(node, at)
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
            let node = match additional {
                Some(Value::Bool(false)) => Node::Object { props: Vec::new(), required: 0 },
                None | Some(Value::Bool(true)) => Node::Map(self.any(at)?),
                Some(schema) => Node::Map(self.node(schema, &format!("{at}/additionalProperties"))?),
            };
            return self.here(node, at);
        }
        if additional.is_some_and(|a| !a.is_boolean()) {
            return Err(err(
                &format!("{at}/additionalProperties"),
                "a schema for further properties beside `properties` is not supported (give false)",
            ));
        }
        let mut list = Vec::with_capacity(props.len());
        for (name, schema) in props {
            let node = self.node(schema, &format!("{at}/properties/{}", token(name)))?;
            list.push(Prop {
                key: Value::String(name.clone()).to_string(),
                node,
                required: required.contains(&name.as_str()),
            });
        }
        let required = list.iter().enumerate().filter(|(_, p)| p.required).fold(0u64, |m, (i, _)| m | 1 << i);
        self.here(Node::Object { props: list, required }, at)
    }
}
