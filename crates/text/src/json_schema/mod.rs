//! A JSON schema compiled into what constrained generation checks the answer against
//! (`response_format: json_schema`): objects with their properties in any order, each once
//! (required ones always, optional ones may be left out, nothing else), dictionaries
//! (`additionalProperties` a schema), arrays with bounds, strings with length bounds, numbers,
//! integers, booleans, null, `enum`, `const`, `anyOf` (and a `type` list), `$ref` into `$defs` /
//! `definitions` (recursion allowed). Anything else that would constrain the answer is refused
//! by keyword and place, never ignored; annotations (`title`, `description`, `default`, ...)
//! are ignored. A schema is refused, naming the limit and the place, when it is deeper, larger or
//! has more alternatives than [`limits`] allows, when some part of it is satisfied by nothing (a
//! `$ref` cycle with nothing that can end it), or when its shortest answer cannot fit in the
//! context. [`SchemaPrefix`] checks an answer as it is written.

mod compile;
mod flatten;
pub mod limits;
mod matcher;
mod satisfiable;

use serde_json::Value;

pub use limits::SchemaLimits;
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

/// A compiled schema. A `$ref` is an `anyOf` of one; after compile every `anyOf` lists the
/// nodes it flattens to, none of them an `anyOf`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// Not compiled yet (a definition being compiled); none is left once compiled.
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
    /// Compiles `schema` for answers within `limits`; the answer's top level must be an object
    /// (as OpenAI requires).
    pub fn compile(schema: &Value, limits: &SchemaLimits) -> Result<JsonSchema, SchemaError> {
        let mut c = compile::compile(schema)?;
        satisfiable::check(&c, limits)?;
        flatten::flatten(&mut c)?;
        let s = JsonSchema { nodes: c.nodes, root: c.root };
        if !s.object_at_top() {
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

    /// Whether every value the root may be is an object (the root is an `anyOf`, flattened).
    fn object_at_top(&self) -> bool {
        let is_object = |n: &u32| matches!(self.nodes[*n as usize], Node::Object { .. } | Node::Map(_));
        match &self.nodes[self.root as usize] {
            Node::AnyOf(alts) => alts.iter().all(is_object),
            _ => is_object(&self.root),
        }
    }
}
