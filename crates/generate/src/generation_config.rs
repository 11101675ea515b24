//! A release's recommended sampling settings: its `generation_config.json` (Hugging Face's
//! file), embedded at conversion and used as the defaults of generate, chat and serve.
//!
//! Only the fields the file states are taken (as vLLM does), not transformers' implicit
//! defaults behind them (top-k 50); `do_sample: false` means greedy. Fields k3 does not sample
//! with (`eos_token_id`, `max_length`, ...) are not settings here: the end of a turn comes from
//! the chat template, the length from the command.

use serde_json::Value;

use crate::sample::{SamplerConfig, check_min_p, check_repeat_penalty, check_temperature, check_top_p};

/// The file's name, in a checkpoint and among a WASTE model's embedded files.
pub const FILE: &str = "generation_config.json";

/// Why a `generation_config.json` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("generation_config.json: {field}: {reason}")]
pub struct GenerationConfigError {
    pub field: String,
    pub reason: String,
}

/// The sampling settings a release recommends; `None` where its file says nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Recommended {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl Recommended {
    /// Reads and checks a `generation_config.json`; a value out of range is refused, naming it.
    pub fn parse(bytes: &[u8]) -> Result<Recommended, GenerationConfigError> {
        let bad = |field: &str, reason: String| GenerationConfigError { field: field.into(), reason };
        let v: Value = serde_json::from_slice(bytes).map_err(|e| bad("(file)", format!("not JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| bad("(file)", "not a JSON object".into()))?;
        let number = |field: &str| -> Result<Option<f64>, GenerationConfigError> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| bad(field, format!("{x} is not a number"))),
            }
        };
        let float =
            |field: &str, check: fn(f32) -> Result<f32, String>| -> Result<Option<f32>, GenerationConfigError> {
                number(field)?.map(|x| check(x as f32).map_err(|e| bad(field, e))).transpose()
            };
        let greedy = match obj.get("do_sample") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => !b,
            Some(x) => return Err(bad("do_sample", format!("{x} is not true or false"))),
        };
        let top_k = match number("top_k")? {
            None => None,
            Some(k) if k >= 0.0 && k.fract() == 0.0 && k <= 1e9 => Some(k as usize),
            Some(k) => return Err(bad("top_k", format!("{k} is not a count of tokens (0 = off)"))),
        };
        Ok(Recommended {
            temperature: if greedy { Some(0.0) } else { float("temperature", check_temperature)? },
            top_p: float("top_p", check_top_p)?,
            top_k,
            min_p: float("min_p", check_min_p)?,
            repeat_penalty: float("repetition_penalty", check_repeat_penalty)?,
        })
    }

    /// The settings a model embeds (`None` when it embeds no `generation_config.json`).
    pub fn of_model(m: &k3_format::Model) -> Result<Option<Recommended>, GenerationConfigError> {
        m.blob(FILE).map(Recommended::parse).transpose()
    }

    /// `base` with what the file states put over it.
    pub fn apply(&self, base: SamplerConfig) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_p: self.top_p.unwrap_or(base.top_p),
            top_k: self.top_k.unwrap_or(base.top_k),
            min_p: self.min_p.unwrap_or(base.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            ..base
        }
    }

    /// Whether the file states anything k3 samples with.
    pub fn is_empty(&self) -> bool {
        *self == Recommended::default()
    }
}

/// The defaults when a model recommends nothing: the Kimi releases' recommended temperature 0.6
/// and top-p 0.95 for chat and serve; `generate` (a plain completion) is greedy.
pub fn fallback(conversation: bool) -> SamplerConfig {
    if conversation {
        SamplerConfig { temperature: 0.6, top_p: 0.95, ..SamplerConfig::default() }
    } else {
        SamplerConfig::default()
    }
}

/// A command's sampling defaults for `m`: its recommended settings over [`fallback`].
pub fn defaults(m: &k3_format::Model, conversation: bool) -> Result<SamplerConfig, GenerationConfigError> {
    let base = fallback(conversation);
    Ok(Recommended::of_model(m)?.map_or(base.clone(), |r| r.apply(base)))
}

/// The sampling settings in a line: `temperature 0.6, top-p 0.95` (only those not off).
pub fn describe(c: &SamplerConfig) -> String {
    let mut parts =
        vec![if c.temperature == 0.0 { "greedy".to_string() } else { format!("temperature {}", c.temperature) }];
    if c.temperature > 0.0 {
        if c.top_p < 1.0 {
            parts.push(format!("top-p {}", c.top_p));
        }
        if c.top_k > 0 {
            parts.push(format!("top-k {}", c.top_k));
        }
        if c.min_p > 0.0 {
            parts.push(format!("min-p {}", c.min_p));
        }
    }
    if c.repeat_penalty != 1.0 {
        parts.push(format!("repeat-penalty {}", c.repeat_penalty));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's release file, as published.
    const DEEPSEEK_V3: &str = r#"{"_from_model_config": true, "bos_token_id": 0, "eos_token_id": 1,
        "do_sample": true, "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"}"#;

    #[test]
    fn a_release_file_sets_what_it_states_and_nothing_else() {
        let r = Recommended::parse(DEEPSEEK_V3.as_bytes()).unwrap();
        assert_eq!(r, Recommended { temperature: Some(0.6), top_p: Some(0.95), ..Recommended::default() });
        let c = r.apply(fallback(false));
        assert_eq!((c.temperature, c.top_p, c.top_k, c.min_p), (0.6, 0.95, 0, 0.0));
        assert_eq!(describe(&c), "temperature 0.6, top-p 0.95");
    }

    #[test]
    fn do_sample_false_is_greedy_and_a_file_of_other_fields_is_empty() {
        let r = Recommended::parse(br#"{"do_sample": false, "temperature": 0.7, "repetition_penalty": 1.1}"#).unwrap();
        assert_eq!((r.temperature, r.repeat_penalty), (Some(0.0), Some(1.1)));
        assert_eq!(describe(&r.apply(fallback(true))), "greedy, repeat-penalty 1.1");
        assert!(Recommended::parse(br#"{"eos_token_id": [1, 2], "max_length": 131072}"#).unwrap().is_empty());
    }

    #[test]
    fn unusable_values_are_refused_by_field() {
        for (json, field) in [
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_k": 2.5}"#, "top_k"),
            (r#"{"min_p": 3}"#, "min_p"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"do_sample": "yes"}"#, "do_sample"),
            (r#"[1]"#, "(file)"),
            (r#"{"#, "(file)"),
        ] {
            let e = Recommended::parse(json.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
        }
    }
}
