//! Why a conversion in progress cannot be resumed with other settings, in words a person acts
//! on: the leaves of the two writer specs that differ, the options the user gave first.

/// The differences a person acts on: those in the options the writer was given
/// (`provenance.options`, and the source), which the rest (layouts, encodings) follow from; or,
/// when none of those differ, the first few of the rest.
pub(crate) fn what_the_user_changed(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    const SHOWN: usize = 4;
    let mut all = Vec::new();
    differences(a, b, "", &mut all);
    let options: Vec<String> = all
        .iter()
        .filter_map(|d| d.strip_prefix("provenance.options.").or(d.strip_prefix("provenance.")).map(str::to_string))
        .filter(|d| !d.starts_with("source_files"))
        .collect();
    if !options.is_empty() {
        return options;
    }
    let mut shown: Vec<String> = all.iter().take(SHOWN).cloned().collect();
    if all.len() > SHOWN {
        shown.push(format!("and {} more", all.len() - SHOWN));
    }
    shown
}

/// Where two JSON values differ, as `path: old -> new` (leaves only, so a long spec shows just
/// what changed).
fn differences(a: &serde_json::Value, b: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                differences(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &p, out);
            }
        }
        // Lists of the same length item by item (an expert layout's matrices, say), so a changed
        // encoding is named by its path rather than shown as the whole list.
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (a, b)) in x.iter().zip(y).enumerate() {
                differences(a, b, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => {
            let show = |v: &Value| {
                let s = v.to_string();
                if s.len() > 120 { format!("{}...", &s[..s.floor_char_boundary(117)]) } else { s }
            };
            out.push(format!("{path}: started with {}, now {}", show(a), show(b)));
        }
        _ => {}
    }
}
