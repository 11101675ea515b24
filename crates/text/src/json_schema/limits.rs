//! How big a schema may be: bounds on its compiled form, so that compiling a request's schema
//! cannot exhaust a thread's stack or make every character's check slow, and the room an answer
//! has, so that a schema whose shortest answer cannot fit is refused before generation.

/// Schemas nested in one another, `$ref` hops included, at most: what `compile`'s recursion may
/// reach. A nested pydantic model costs 2 to 5 levels (the property, `anyOf` of `Optional`, a
/// list's `items`, the `$ref` hop, its `allOf` wrapper), so OpenAI's 10 levels of object nesting
/// fit. 64 levels compile within 48 KiB of stack, debug or release (measured): a fortieth of a
/// tokio worker's 2 MiB.
pub const MOST_DEPTH: usize = 64;

/// Compiled nodes at most: one per schema, a type in a `type` list, a definition and a `$ref`
/// (a `$ref` is two: its place and the definition, made once). OpenAI's structured outputs take
/// 5,000 properties in all; with their containers that is a few thousand nodes.
pub const MOST_NODES: usize = 8192;

/// The alternatives one value may be, at most: each `anyOf` (and `type` list), and all the
/// alternatives it comes to once nested `anyOf`s and `$ref`s to them are flattened. Each is tried
/// on a value's first character; pydantic's unions have a handful.
pub const MOST_ANY_OF: usize = 256;

/// What the answer must fit in.
///
/// The rule: no token's text is longer than `max_token_bytes` bytes, so an answer of `b` bytes
/// takes at least `b / max_token_bytes` tokens; and a character is at least one byte. A schema
/// whose shortest answer is longer than `context_tokens * max_token_bytes` bytes can therefore not
/// be written within the context by any tokenization, and is refused. This is the loosest honest
/// bound: counting one character per token would refuse answers a tokenizer with long tokens can
/// write, and anything tighter would depend on the text. (The prompt's share of the context is
/// not known when the schema is compiled; an answer that runs out of room ends as `length`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaLimits {
    /// The model's context, in tokens.
    pub context_tokens: u64,
    /// The longest token's text, in bytes (at least 1).
    pub max_token_bytes: u64,
}

impl SchemaLimits {
    pub fn new(context_tokens: u64, max_token_bytes: u64) -> Self {
        SchemaLimits { context_tokens, max_token_bytes }
    }

    /// The most bytes an answer can have within the context.
    pub fn room(&self) -> u64 {
        self.context_tokens.saturating_mul(self.max_token_bytes.max(1))
    }

    /// The room, said for an error: `a context of N tokens of at most M bytes each (R bytes)`.
    pub(super) fn said(&self) -> String {
        format!(
            "a context of {} tokens of at most {} bytes each ({} bytes)",
            self.context_tokens,
            self.max_token_bytes.max(1),
            self.room()
        )
    }
}
