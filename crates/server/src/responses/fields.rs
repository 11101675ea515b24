//! Reading a Responses body's JSON: values of the expected type, or a 400 naming the field.

use serde_json::{Map, Value};

use crate::error::{ApiError, short};

pub fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(field, message)
}

/// `field` of `o` unless absent or null.
pub fn get<'v>(o: &'v Map<String, Value>, field: &str) -> Option<&'v Value> {
    o.get(field).filter(|v| !v.is_null())
}

pub fn text_of<'v>(o: &'v Map<String, Value>, key: &str, field: &str) -> Result<Option<&'v str>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad(field, format!("{} is not a string", short(other)))),
    }
}

pub fn bool_of(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(key, format!("{} is not true or false", short(other)))),
    }
}

/// `o` has only `fields`.
pub fn only(o: &Map<String, Value>, fields: &[&str], field: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(k) => Err(bad(&format!("{field}.{k}"), format!("not a field of this item ({})", fields.join(", ")))),
        None => Ok(()),
    }
}
