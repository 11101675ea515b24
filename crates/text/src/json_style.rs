//! JSON written the way the chat templates write it.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON text as Python's `json.dumps` writes it (what Kimi's chat templates render tool
/// declarations with: key order kept, `", "` and `": "` between items, no ASCII escaping).
pub fn python_json(json: &str) -> Result<String, serde_json::Error> {
    // Validate, then respace the text itself: parsing into a map would lose the key order.
    serde_json::from_str::<serde::de::IgnoredAny>(json)?;
    let mut out = String::with_capacity(json.len() + json.len() / 8);
    let mut chars = json.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                // The whole string token, re-escaped as Python does.
                let mut end = i + 1;
                let mut escaped = false;
                for (j, d) in chars.by_ref() {
                    end = j + d.len_utf8();
                    match (escaped, d) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => break,
                        _ => {}
                    }
                }
                let s: String = serde_json::from_str(&json[i..end])?;
                out.push_str(&serde_json::to_string(&s)?);
            }
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A JSON text compact, every object's keys sorted (K3's template sorts each level with
/// `dictsort`; arrays keep their order; no ASCII escaping).
pub fn sorted_json(json: &str) -> Result<String, serde_json::Error> {
    fn write(v: &serde_json::Value, out: &mut String) -> Result<(), serde_json::Error> {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k)?);
                    out.push(':');
                    write(&m[k], out)?;
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out)?;
                }
                out.push(']');
            }
            scalar => out.push_str(&serde_json::to_string(scalar)?),
        }
        Ok(())
    }
    let mut out = String::with_capacity(json.len());
    write(&serde_json::from_str(json)?, &mut out)?;
    Ok(out)
}

/// The entries of a JSON object in the order written (values as their raw text); `None` when
/// the text is not an object.
pub fn object_entries(json: &str) -> Option<Vec<(String, Box<RawValue>)>> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<(String, Box<RawValue>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let entries = (&mut de).deserialize_map(Entries).ok()?;
    de.end().ok()?;
    Some(entries)
}

/// The JSON type of a raw value, as K3's markup names it.
pub fn json_type(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'"') => "string",
        Some(b'{') => "object",
        Some(b'[') => "array",
        Some(b't' | b'f') => "boolean",
        Some(b'n') => "null",
        _ => "number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_json_sorts_every_level_and_keeps_arrays() {
        let got = sorted_json(r#"{"b": [3, {"z": 1, "a": "é"}], "a": null}"#).unwrap();
        assert_eq!(got, r#"{"a":null,"b":[3,{"a":"é","z":1}]}"#);
    }

    #[test]
    fn object_entries_keep_the_written_order() {
        let e = object_entries(r#"{"z": 1, "a": {"q": [1]}, "m": "x"}"#).unwrap();
        let keys: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
        assert_eq!(keys, [("z", "1"), ("a", r#"{"q": [1]}"#), ("m", r#""x""#)]);
        assert!(object_entries("[1]").is_none());
        assert!(object_entries(r#"{"a": 1} x"#).is_none());
        assert_eq!(json_type(" [1]"), "array");
        assert_eq!(json_type("-2.5"), "number");
    }
}
