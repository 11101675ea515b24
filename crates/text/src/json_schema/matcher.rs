//! An answer checked against a compiled schema character by character: [`SchemaPrefix`] accepts a
//! character only while the text can still be completed into a value the schema allows, and
//! says when it is complete. Each way the text so far can be read (`anyOf` alternatives, an
//! `enum` value that may go on) is a path of frames; a character moves every path, and a path
//! that cannot take it is dropped.

use std::sync::Arc;

use super::{JsonSchema, Node};
use crate::json_prefix::Number;

/// Whitespace characters in a row at most between tokens: `{"a": 1, "b": [1, 2]}` and a newline
/// apart, but no indentation. Measured: with 16 (what `json_object` allows) the default model
/// spent 120 tokens of a schema answer on padding; real models pad less, but a pad-happy
/// sampler cannot stall here.
const MOST_SPACE: usize = 1;

/// JSON's object delimiters, named (a brace in a character literal reads as code to a reader
/// counting braces).
const OBJECT_OPEN: char = '\u{7b}';
const OBJECT_CLOSE: char = '\u{7d}';

/// Paths kept at most: a schema of many near-identical alternatives cannot make a step slow.
const MOST_PATHS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// After `{` or `[`.
    Open,
    /// After a key (the object's property index), before `:`.
    Colon(u16),
    AfterValue,
    AfterComma,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Frame {
    /// A value of this node is next.
    Value(u32),
    /// `seen`: the properties written (bits).
    Object {
        node: u32,
        seen: u64,
        phase: Phase,
    },
    Map {
        node: u32,
        phase: Phase,
    },
    Array {
        node: u32,
        count: u32,
        phase: Phase,
    },
    /// A string: its length bounds, characters so far, and escape state (0: none, 1: after a
    /// backslash, 2..=5: hex digits of a `\u` left plus one).
    Str {
        min: u32,
        max: u32,
        len: u32,
        esc: u8,
    },
    /// One of the object's keys being written: candidates still matching (bits), bytes written.
    Key {
        node: u32,
        alive: u64,
        at: u16,
    },
    /// One of a node's literal texts being written.
    Lit {
        node: u32,
        alive: u64,
        at: u16,
    },
    Num {
        n: Number,
        integer: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Path {
    frames: Vec<Frame>,
    /// Whitespace in a row.
    space: usize,
}

/// An answer in the making, checked against a schema.
#[derive(Debug, Clone)]
pub struct SchemaPrefix {
    schema: Arc<JsonSchema>,
    paths: Vec<Path>,
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// The bits of the first `n` alternatives.
fn all(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

impl SchemaPrefix {
    pub(crate) fn new(schema: Arc<JsonSchema>) -> Self {
        let root = schema.root;
        SchemaPrefix { schema, paths: vec![Path { frames: vec![Frame::Value(root)], space: 0 }] }
    }

    /// Whether the text so far is a whole value the schema allows.
    pub fn complete(&self) -> bool {
        self.paths.iter().any(|p| p.frames.is_empty())
    }

    /// Takes `s` if every character keeps the text a prefix of an allowed value; otherwise leaves
    /// the state as it was and returns `false`.
    pub fn push_str(&mut self, s: &str) -> bool {
        match self.after(s) {
            Some(paths) => {
                self.paths = paths;
                true
            }
            None => false,
        }
    }

    /// Whether `s` would be taken (the state is unchanged).
    pub fn accepts(&self, s: &str) -> bool {
        self.after(s).is_some()
    }

    /// Takes `c` if the text stays a prefix of an allowed value; on a refusal the state is spoilt,
    /// so callers push onto a copy they drop then (a mask's trie walk: no second copy per
    /// character).
    pub(crate) fn push_char(&mut self, c: char) -> bool {
        let paths = std::mem::take(&mut self.paths);
        self.paths = self.advance(paths, c);
        !self.paths.is_empty()
    }

    fn after(&self, s: &str) -> Option<Vec<Path>> {
        let mut paths = self.paths.clone();
        for c in s.chars() {
            paths = self.advance(paths, c);
            if paths.is_empty() {
                return None;
            }
        }
        Some(paths)
    }

    /// Every way `paths` go on with `c`, each once, at most [`MOST_PATHS`].
    fn advance(&self, paths: Vec<Path>, c: char) -> Vec<Path> {
        let mut next = Vec::with_capacity(paths.len());
        for p in paths {
            self.step(p, c, &mut next);
        }
        let mut unique: Vec<Path> = Vec::with_capacity(next.len());
        for p in next {
            if unique.len() < MOST_PATHS && !unique.contains(&p) {
                unique.push(p);
            }
        }
        unique
    }

    fn node(&self, n: u32) -> &Node {
        &self.schema.nodes[n as usize]
    }

    /// Every way path `p` goes on with `c`, into `out`.
    fn step(&self, mut p: Path, c: char, out: &mut Vec<Path>) {
        let Some(top) = p.frames.last().cloned() else { return };
        let started = p.frames.len() > 1 || !matches!(top, Frame::Value(_));
        let spaced = matches!(top, Frame::Value(_) | Frame::Object { .. } | Frame::Map { .. } | Frame::Array { .. });
        if is_space(c) && spaced {
            if started && p.space < MOST_SPACE {
                p.space += 1;
                out.push(p);
            }
            return;
        }
        if !matches!(top, Frame::Num { .. }) {
            p.space = 0;
        }
        match top {
            Frame::Value(n) => self.value(p, n, c, out),
            Frame::Str { min, max, len, esc } => string(p, (min, max, len, esc), c, out),
            Frame::Num { n, integer } => match n.next(c).filter(|m| !integer || m.integral()) {
                Some(m) => {
                    p.set_top(Frame::Num { n: m, integer });
                    out.push(p);
                }
                None if n.complete() => {
                    // The character after the number is its container's.
                    p.frames.pop();
                    self.step(p, c, out);
                }
                None => {}
            },
            Frame::Lit { node, alive, at } => self.literal(p, node, alive, at, c, out),
            Frame::Key { node, alive, at } => self.key(p, node, alive, at, c, out),
            Frame::Object { node, seen, phase } => self.object(p, node, seen, phase, c, out),
            Frame::Map { node, phase } => self.map(p, node, phase, c, out),
            Frame::Array { node, count, phase } => self.array(p, node, count, phase, c, out),
        }
    }

    /// The nodes a value of `n` may be: `n`, or its `anyOf` alternatives, nested ones flattened.
    /// Each node is visited once, so a schema whose `anyOf` refers back to itself (`$ref`
    /// without anything in between) ends here instead of recursing without end.
    fn alternatives(&self, n: u32) -> Vec<u32> {
        let (mut leaves, mut seen, mut todo) = (Vec::new(), Vec::new(), vec![n]);
        while let Some(x) = todo.pop() {
            if seen.contains(&x) {
                continue;
            }
            seen.push(x);
            match self.node(x) {
                Node::AnyOf(alts) => todo.extend(alts.iter().rev()),
                _ => leaves.push(x),
            }
        }
        leaves
    }

    /// The first character of a value of node `n` (whose frame is on top of `p`).
    fn value(&self, p: Path, n: u32, c: char, out: &mut Vec<Path>) {
        for leaf in self.alternatives(n) {
            let mut q = p.clone();
            let frame = match self.node(leaf) {
                Node::Object { .. } if c == OBJECT_OPEN => Frame::Object { node: leaf, seen: 0, phase: Phase::Open },
                Node::Map(_) if c == OBJECT_OPEN => Frame::Map { node: leaf, phase: Phase::Open },
                Node::Array { .. } if c == '[' => Frame::Array { node: leaf, count: 0, phase: Phase::Open },
                &Node::String { min, max } if c == '"' => Frame::Str { min, max, len: 0, esc: 0 },
                &Node::Number { integer } => match Number::start(c) {
                    Some(m) => Frame::Num { n: m, integer },
                    None => continue,
                },
                Node::Lits(texts) => {
                    self.literal(q, leaf, all(texts.len()), 0, c, out);
                    continue;
                }
                _ => continue,
            };
            q.set_top(frame);
            out.push(q);
        }
    }

    /// `c` against the literal texts of node `n` still matching after `at` bytes.
    fn literal(&self, mut p: Path, n: u32, alive: u64, at: u16, c: char, out: &mut Vec<Path>) {
        let Node::Lits(texts) = self.node(n) else { return };
        let (alive, at, done) = advance(texts.iter().map(String::as_str), alive, at, c);
        if alive & !done != 0 {
            let mut q = p.clone();
            q.set_top(Frame::Lit { node: n, alive: alive & !done, at });
            out.push(q);
        }
        if done != 0 {
            p.frames.pop();
            out.push(p);
        }
    }

    /// `c` against the keys of object `n` still matching after `at` bytes (a `Key` frame on top).
    fn key(&self, mut p: Path, n: u32, alive: u64, at: u16, c: char, out: &mut Vec<Path>) {
        let Node::Object { props, .. } = self.node(n) else { return };
        let (alive, at, done) = advance(props.iter().map(|p| p.key.as_str()), alive, at, c);
        p.frames.pop();
        if done != 0 {
            // Keys end with their closing quote, so no key is a prefix of another: one is done.
            let i = done.trailing_zeros() as u16;
            if let Some(&Frame::Object { seen, .. }) = p.frames.last() {
                p.set_top(Frame::Object { node: n, seen: seen | 1 << i, phase: Phase::Colon(i) });
                out.push(p);
            }
        } else if alive != 0 {
            p.frames.push(Frame::Key { node: n, alive, at });
            out.push(p);
        }
    }

    fn object(&self, mut p: Path, n: u32, seen: u64, phase: Phase, c: char, out: &mut Vec<Path>) {
        let Node::Object { props, required } = self.node(n) else { return };
        let unseen = all(props.len()) & !seen;
        match (phase, c) {
            (Phase::Open | Phase::AfterValue, OBJECT_CLOSE) if required & !seen == 0 => {
                p.frames.pop();
            }
            (Phase::AfterValue, ',') if unseen != 0 => {
                p.set_top(Frame::Object { node: n, seen, phase: Phase::AfterComma })
            }
            // Every key's text starts with the quote: the unseen ones are the candidates.
            (Phase::Open | Phase::AfterComma, '"') if unseen != 0 => {
                p.frames.push(Frame::Key { node: n, alive: unseen, at: 1 })
            }
            (Phase::Colon(i), ':') => {
                p.set_top(Frame::Object { node: n, seen, phase: Phase::AfterValue });
                p.frames.push(Frame::Value(props[i as usize].node));
            }
            _ => return,
        }
        out.push(p);
    }

    fn map(&self, mut p: Path, n: u32, phase: Phase, c: char, out: &mut Vec<Path>) {
        let &Node::Map(value) = self.node(n) else { return };
        match (phase, c) {
            (Phase::Open | Phase::AfterValue, OBJECT_CLOSE) => {
                p.frames.pop();
            }
            (Phase::AfterValue, ',') => p.set_top(Frame::Map { node: n, phase: Phase::AfterComma }),
            (Phase::Open | Phase::AfterComma, '"') => {
                p.set_top(Frame::Map { node: n, phase: Phase::Colon(0) });
                p.frames.push(Frame::Str { min: 0, max: u32::MAX, len: 0, esc: 0 });
            }
            (Phase::Colon(_), ':') => {
                p.set_top(Frame::Map { node: n, phase: Phase::AfterValue });
                p.frames.push(Frame::Value(value));
            }
            _ => return,
        }
        out.push(p);
    }

    fn array(&self, mut p: Path, n: u32, count: u32, phase: Phase, c: char, out: &mut Vec<Path>) {
        let &Node::Array { items, min, max } = self.node(n) else { return };
        match (phase, c) {
            (Phase::Open | Phase::AfterValue, ']') if count >= min => {
                p.frames.pop();
                out.push(p);
            }
            (Phase::AfterValue, ',') if count < max => {
                p.set_top(Frame::Array { node: n, count, phase: Phase::AfterComma });
                out.push(p);
            }
            (Phase::Open | Phase::AfterComma, c) if count < max && c != ']' => {
                p.set_top(Frame::Array { node: n, count: count + 1, phase: Phase::AfterValue });
                p.frames.push(Frame::Value(items));
                self.step(p, c, out);
            }
            _ => {}
        }
    }
}

impl Path {
    /// Replaces the top frame (there is one: a path without frames takes no character).
    fn set_top(&mut self, f: Frame) {
        if let Some(top) = self.frames.last_mut() {
            *top = f;
        }
    }
}

/// `c` in a string with length bounds `min..=max`, `len` characters so far and escape state
/// `esc` (0: none, 1: after a backslash, 2..=5: hex digits of a `\u` left plus one).
fn string(mut p: Path, (min, max, len, esc): (u32, u32, u32, u8), c: char, out: &mut Vec<Path>) {
    let next = match (esc, c) {
        (0, '"') if len >= min => {
            p.frames.pop();
            return out.push(p);
        }
        (0, '\\') if len < max => (len, 1),
        (0, c) if (c as u32) < 0x20 || len >= max || c == '"' => return,
        (0, _) => (len + 1, 0),
        (1, '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't') => (len + 1, 0),
        (1, 'u') => (len, 5),
        (2, c) if c.is_ascii_hexdigit() => (len + 1, 0),
        (3..=5, c) if c.is_ascii_hexdigit() => (len, esc - 1),
        _ => return,
    };
    p.set_top(Frame::Str { min, max, len: next.0, esc: next.1 });
    out.push(p);
}

/// Texts (among bits `alive`) whose byte at `at..` is `c`: (still matching, new `at`, those now
/// whole).
fn advance<'a>(texts: impl Iterator<Item = &'a str>, alive: u64, at: u16, c: char) -> (u64, u16, u64) {
    let mut buf = [0u8; 4];
    let bytes = c.encode_utf8(&mut buf).as_bytes();
    let end = at as usize + bytes.len();
    let (mut keep, mut done) = (0u64, 0u64);
    for (i, t) in texts.enumerate().take(64) {
        if alive & 1 << i != 0 && t.as_bytes().get(at as usize..end) == Some(bytes) {
            keep |= 1 << i;
            if t.len() == end {
                done |= 1 << i;
            }
        }
    }
    (keep, end as u16, done)
}
