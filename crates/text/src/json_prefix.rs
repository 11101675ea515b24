//! A JSON object, checked as it is written: [`JsonPrefix`] accepts a character only when the text
//! so far can still be completed into one JSON object (RFC 8259 syntax, an object at the top),
//! and says when the object is complete. Constrained generation (`response_format: json_object`)
//! masks every token whose text it would refuse.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (after `:`, `[` or `,` in an array).
    Value,
    /// A value or `]` (just after `[`).
    ValueOrClose,
    /// A key string or `}` (just after `{`).
    KeyOrClose,
    /// A key string (after `,` in an object).
    Key,
    Colon,
    /// `,` or the container's close.
    CommaOrClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Number {
    /// The state after a number's first character, if it can start one.
    pub(crate) fn start(c: char) -> Option<Number> {
        match c {
            '-' => Some(Number::Minus),
            '0' => Some(Number::Zero),
            '1'..='9' => Some(Number::Int),
            _ => None,
        }
    }

    /// Whether the number is an integer so far (no fraction or exponent begun).
    pub(crate) fn integral(self) -> bool {
        matches!(self, Number::Minus | Number::Zero | Number::Int)
    }

    pub(crate) fn next(self, c: char) -> Option<Number> {
        use Number::*;
        Some(match (self, c) {
            (Minus, '0') => Zero,
            (Minus, '1'..='9') => Int,
            (Int, '0'..='9') => Int,
            (Zero | Int, '.') => Dot,
            (Dot | Frac, '0'..='9') => Frac,
            (Zero | Int | Frac, 'e' | 'E') => E,
            (E, '+' | '-') => ESign,
            (E | ESign | Exp, '0'..='9') => Exp,
            _ => return None,
        })
    }

    pub(crate) fn complete(self) -> bool {
        matches!(self, Number::Zero | Number::Int | Number::Frac | Number::Exp)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Lexeme {
    None,
    /// Inside a string: after a backslash, or in a `\u` escape with this many hex digits left.
    String {
        key: bool,
        escape: bool,
        hex: u8,
    },
    Number(Number),
    /// A literal (`true`, `false`, `null`) and how much of it is written.
    Literal(&'static str, usize),
}

/// The checker's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPrefix {
    /// Open containers: `true` for an object.
    stack: Vec<bool>,
    expect: Expect,
    lexeme: Lexeme,
    started: bool,
    done: bool,
    /// Whitespace outside strings allowed in a row (and before the object) at most.
    max_space: usize,
    space: usize,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix {
            stack: Vec::new(),
            expect: Expect::Value,
            lexeme: Lexeme::None,
            started: false,
            done: false,
            max_space: usize::MAX,
            space: 0,
        }
    }
}

/// Whitespace a generated object may have in a row: enough for any layout, too little to loop in.
pub(crate) const GENERATION_SPACE: usize = 16;

impl JsonPrefix {
    /// A checker for generating: the object starts at once, and whitespace comes in runs of at
    /// most 16 (valid JSON either way; a model that prefers spaces cannot stall in them).
    pub fn for_generation() -> Self {
        JsonPrefix { max_space: GENERATION_SPACE, ..JsonPrefix::default() }
    }

    /// Whether the text so far is one complete JSON object.
    pub fn complete(&self) -> bool {
        self.done
    }

    /// Takes `s` if every character keeps the text a prefix of a JSON object; otherwise leaves
    /// the state as it was and returns `false`.
    pub fn push_str(&mut self, s: &str) -> bool {
        let mut next = self.clone();
        if s.chars().all(|c| next.push(c)) {
            *self = next;
            true
        } else {
            false
        }
    }

    /// Takes `c` if it keeps the text a prefix of an object; on a refusal the state is spoilt, so
    /// callers push onto a copy they drop then (a mask's trie walk: no second copy per character).
    pub(crate) fn push_char(&mut self, c: char) -> bool {
        self.push(c)
    }

    /// Whether `s` would be taken (the state is unchanged).
    pub fn accepts(&self, s: &str) -> bool {
        let mut next = self.clone();
        s.chars().all(|c| next.push(c))
    }

    fn push(&mut self, c: char) -> bool {
        if self.done {
            return false;
        }
        match self.lexeme.clone() {
            Lexeme::String { key, escape, hex } => return self.string(c, key, escape, hex),
            Lexeme::Literal(word, at) => {
                if word[at..].starts_with(c) {
                    self.lexeme = if at + 1 == word.len() {
                        self.value_done();
                        Lexeme::None
                    } else {
                        Lexeme::Literal(word, at + 1)
                    };
                    return true;
                }
                return false;
            }
            Lexeme::Number(n) => match n.next(c) {
                Some(m) => {
                    self.lexeme = Lexeme::Number(m);
                    return true;
                }
                None if n.complete() => {
                    self.lexeme = Lexeme::None;
                    self.value_done();
                    // The character that ended the number is the container's.
                }
                None => return false,
            },
            Lexeme::None => {}
        }
        if matches!(c, ' ' | '\t' | '\n' | '\r') {
            let before = !self.started && self.max_space != usize::MAX;
            self.space += 1;
            return !before && self.space <= self.max_space;
        }
        self.space = 0;
        match self.expect {
            Expect::KeyOrClose if c == '}' => self.close(true),
            Expect::ValueOrClose if c == ']' => self.close(false),
            Expect::KeyOrClose | Expect::Key => {
                if c != '"' {
                    return false;
                }
                self.lexeme = Lexeme::String { key: true, escape: false, hex: 0 };
                true
            }
            Expect::Colon => {
                if c != ':' {
                    return false;
                }
                self.expect = Expect::Value;
                true
            }
            Expect::CommaOrClose => {
                let object = *self.stack.last().expect("after a value inside a container");
                match c {
                    ',' => {
                        self.expect = if object { Expect::Key } else { Expect::Value };
                        true
                    }
                    '}' if object => self.close(true),
                    ']' if !object => self.close(false),
                    _ => false,
                }
            }
            Expect::Value | Expect::ValueOrClose => self.value(c),
        }
    }

    /// The first character of a value.
    fn value(&mut self, c: char) -> bool {
        // The top level is an object.
        if !self.started && c != '{' {
            return false;
        }
        self.started = true;
        match c {
            '{' => {
                self.stack.push(true);
                self.expect = Expect::KeyOrClose;
            }
            '[' => {
                self.stack.push(false);
                self.expect = Expect::ValueOrClose;
            }
            '"' => self.lexeme = Lexeme::String { key: false, escape: false, hex: 0 },
            '-' => self.lexeme = Lexeme::Number(Number::Minus),
            '0' => self.lexeme = Lexeme::Number(Number::Zero),
            '1'..='9' => self.lexeme = Lexeme::Number(Number::Int),
            't' => self.lexeme = Lexeme::Literal("true", 1),
            'f' => self.lexeme = Lexeme::Literal("false", 1),
            'n' => self.lexeme = Lexeme::Literal("null", 1),
            _ => return false,
        }
        true
    }

    fn string(&mut self, c: char, key: bool, escape: bool, hex: u8) -> bool {
        let next = if hex > 0 {
            if !c.is_ascii_hexdigit() {
                return false;
            }
            Lexeme::String { key, escape: false, hex: hex - 1 }
        } else if escape {
            match c {
                '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Lexeme::String { key, escape: false, hex: 0 },
                'u' => Lexeme::String { key, escape: false, hex: 4 },
                _ => return false,
            }
        } else {
            match c {
                '"' => {
                    self.lexeme = Lexeme::None;
                    if key {
                        self.expect = Expect::Colon;
                    } else {
                        self.value_done();
                    }
                    return true;
                }
                '\\' => Lexeme::String { key, escape: true, hex: 0 },
                c if (c as u32) < 0x20 => return false,
                _ => Lexeme::String { key, escape: false, hex: 0 },
            }
        };
        self.lexeme = next;
        true
    }

    fn value_done(&mut self) {
        self.expect = Expect::CommaOrClose;
    }

    fn close(&mut self, object: bool) -> bool {
        if self.stack.pop() != Some(object) {
            return false;
        }
        if self.stack.is_empty() {
            self.done = true;
        } else {
            self.value_done();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_accepted_and_completed_character_by_character() {
        for ok in [
            r#"{}"#,
            r#"{"a": 1}"#,
            r#" { "a" : [1, -2.5e+3, 0, true, false, null, "x\"\u00e9\n"], "b": {"c": {}} } "#.trim_end(),
            r#"{"k": [], "l": [[]], "m": -0.0}"#,
            "{\"π\": \"日本\"}",
        ] {
            let mut p = JsonPrefix::default();
            assert!(p.push_str(ok), "{ok}");
            assert!(p.complete(), "{ok}");
            assert!(!p.accepts("x"), "nothing after the object");
        }
    }

    #[test]
    fn what_cannot_become_an_object_is_refused() {
        for bad in [
            "[1]",
            "1",
            "\"s\"",
            "{1",
            "{\"a\" 1",
            "{\"a\": 01",
            "{\"a\": tru e",
            "{\"a\": 1,}",
            "{\"a\": [1 2]",
            "{\"a\": 1]",
            "{\"a\": \"\\x\"",
            "{\"a\": \"\\u12g\"",
            "{\"a\": -}",
            "{\"a\": 1.}",
            "{\"a\":\"\n\"}",
        ] {
            let mut p = JsonPrefix::default();
            assert!(!p.push_str(bad), "{bad:?} was accepted");
        }
        let mut p = JsonPrefix::default();
        assert!(p.push_str("{\"a\": 1") && !p.complete(), "a prefix is not complete");
        assert!(!p.push_str("}x") && p.push_str("}") && p.complete(), "a refused string leaves the state");
        let mut g = JsonPrefix::for_generation();
        assert!(!g.accepts(" "), "a generated object starts at once");
        assert!(g.push_str("{") && g.push_str(&" ".repeat(16)) && !g.accepts(" "), "runs of 16 spaces at most");
        assert!(g.push_str("\"a\":") && g.accepts(" "));
    }
}
