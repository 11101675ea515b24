//! Reading Anthropic's JSON as written: objects whose values stay raw text (a schema's or a
//! call's key order kept), fields read by type with errors naming their path, and the
//! [`Renames`] from the OpenAI fields a body is translated into back to the Anthropic ones.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::ApiError;

/// A JSON object with its values as written.
pub type Obj = BTreeMap<String, Box<RawValue>>;

/// OpenAI field paths and the Anthropic ones they came from.
#[derive(Debug, Default)]
pub struct Renames(Vec<(String, String)>);

impl Renames {
    /// Takes `other`'s renames too.
    pub fn extend(&mut self, other: Renames) {
        self.0.extend(other.0);
    }

    pub fn add(&mut self, openai: impl Into<String>, anthropic: impl Into<String>) {
        self.0.push((openai.into(), anthropic.into()));
    }

    /// `e` naming the Anthropic field: the longest translated path the OpenAI one starts with
    /// (whole path segments) is replaced by where it came from.
    pub fn rename(&self, mut e: ApiError) -> ApiError {
        let Some(p) = e.param.clone() else { return e };
        let best = self
            .0
            .iter()
            .filter(|(from, _)| {
                p.strip_prefix(from.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .max_by_key(|(from, _)| from.len());
        if let Some((from, to)) = best {
            e.param = Some(format!("{to}{}", &p[from.len()..]));
        }
        e
    }
}

pub fn bad(at: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(at, message)
}

pub fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }
}

pub fn object(raw: &RawValue, at: &str) -> Result<Obj, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| bad(at, "must be an object"))
}

pub fn list(raw: &RawValue, at: &str) -> Result<Vec<Box<RawValue>>, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| bad(at, "must be a list"))
}

pub fn value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// Refuses the first key of `o` not in `known`, by its path.
pub fn known_keys(o: &Obj, known: &[&str], at: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(bad(
            &join(at, k),
            format!("`{k}` is not a field this server takes here (it takes {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

pub fn string(o: &Obj, key: &str, at: &str) -> Result<Option<String>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad(&join(at, key), format!("{other} is not a string"))),
    }
}

pub fn required_string(o: &Obj, key: &str, at: &str) -> Result<String, ApiError> {
    string(o, key, at)?.ok_or_else(|| bad(&join(at, key), format!("`{key}` is required")))
}

pub fn boolean(o: &Obj, key: &str, at: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(bad(&join(at, key), format!("{other} is not true or false"))),
    }
}

pub fn whole_number(o: &Obj, key: &str) -> Result<Option<u64>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(key, format!("{v} is not a whole number"))),
    }
}
