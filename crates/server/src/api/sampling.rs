//! The sampling and stopping fields both endpoints take, checked into the engine's
//! [`GenerateParams`]: each honoured (see `k3_generate::sample` for their meanings) or refused
//! with a 400 naming it.

use k3_generate::GenerateParams;
use k3_generate::sample::{
    PENALTY_LAST_N, SamplerConfig, check_min_p, check_penalty, check_repeat_penalty, check_temperature, check_top_p,
};
use serde::Deserialize;

use crate::error::ApiError;
use crate::job::ModelInfo;

/// Sampling and stopping fields both endpoints take.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// llama.cpp's.
    pub repeat_penalty: Option<f32>,
    /// llama.cpp's: the latest tokens the penalties look at (-1: all, 0: none).
    pub repeat_last_n: Option<i64>,
    /// Token id (as a string, OpenAI's shape) to a bias added to its logit, in [-100, 100].
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// Fields no answer here honours: refused by name rather than ignored.
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Sampling {
    /// The engine's parameters for a prompt of `prompt_len` tokens.
    pub(super) fn params(
        &self,
        info: &ModelInfo,
        prompt_len: usize,
        stop_ids: Vec<u32>,
        stop_bytes: usize,
    ) -> Result<GenerateParams, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::bad("n", format!("n = {n}: this server returns one choice per request (n = 1)")));
        }
        let room = info.context.saturating_sub(prompt_len as u64);
        if room == 0 {
            // OpenAI's code for it: clients (LiteLLM, agent CLIs) compact the conversation on it.
            return Err(ApiError::context_exceeded(
                "messages",
                prompt_len as u64,
                info.context,
                format!("the prompt is {prompt_len} tokens, which leaves no room in the context of {}", info.context),
            ));
        }
        let asked = self.max_completion_tokens.or(self.max_tokens);
        if asked == Some(0) {
            return Err(ApiError::bad("max_tokens", "max_tokens must be at least 1"));
        }
        // What the request leaves out is the model's recommended setting (`info.sampling`).
        let d = &info.sampling;
        let temperature = check_temperature(self.temperature.unwrap_or(d.temperature))
            .map_err(|e| ApiError::bad("temperature", e))?;
        let top_p = check_top_p(self.top_p.unwrap_or(d.top_p)).map_err(|e| ApiError::bad("top_p", e))?;
        let stop_strings = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= 16 => v.clone(),
            Some(Stop::Many(v)) => return Err(ApiError::bad("stop", format!("{} stop strings; at most 16", v.len()))),
        };
        // Every step checks the held-back text against every stop string.
        let total: usize = stop_strings.iter().map(String::len).sum();
        if total > stop_bytes {
            return Err(ApiError::bad(
                "stop",
                format!("the stop strings are {total} bytes; at most {stop_bytes} in all"),
            ));
        }
        if stop_strings.iter().any(String::is_empty) {
            return Err(ApiError::bad("stop", "a stop string is empty"));
        }
        self.refuse_unsupported()?;
        let sampler = SamplerConfig {
            temperature,
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p,
            seed: self.seed.unwrap_or_else(k3_generate::sample::fresh_seed),
            min_p: check_min_p(self.min_p.unwrap_or(d.min_p)).map_err(|e| ApiError::bad("min_p", e))?,
            repeat_penalty: check_repeat_penalty(self.repeat_penalty.unwrap_or(d.repeat_penalty))
                .map_err(|e| ApiError::bad("repeat_penalty", e))?,
            frequency_penalty: check_penalty("frequency_penalty", self.frequency_penalty.unwrap_or(0.0))
                .map_err(|e| ApiError::bad("frequency_penalty", e))?,
            presence_penalty: check_penalty("presence_penalty", self.presence_penalty.unwrap_or(0.0))
                .map_err(|e| ApiError::bad("presence_penalty", e))?,
            penalty_last_n: match self.repeat_last_n {
                None => PENALTY_LAST_N,
                Some(-1) => usize::MAX,
                Some(n) if n >= 0 => n as usize,
                Some(n) => return Err(ApiError::bad("repeat_last_n", format!("{n}: give -1 (all), 0 (off) or more"))),
            },
            logit_bias: self.logit_bias(info)?,
        };
        Ok(GenerateParams {
            max_tokens: asked.unwrap_or(room).min(room),
            sampler,
            stop_ids,
            stop_strings,
            ..GenerateParams::default()
        })
    }

    /// `logit_bias` as (id, bias): ids in the vocabulary, biases in OpenAI's [-100, 100].
    fn logit_bias(&self, info: &ModelInfo) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else { return Ok(Vec::new()) };
        if map.len() > 1024 {
            return Err(ApiError::bad("logit_bias", format!("{} tokens; at most 1024", map.len())));
        }
        map.iter()
            .map(|(k, &b)| {
                let id: u32 = k.trim().parse().map_err(|_| {
                    ApiError::bad("logit_bias", format!("`{k}` is not a token id (keys are ids as strings)"))
                })?;
                if id as usize >= info.vocab {
                    return Err(ApiError::bad(
                        "logit_bias",
                        format!("token {id} is outside the vocabulary of {}", info.vocab),
                    ));
                }
                if !(-100.0..=100.0).contains(&b) {
                    return Err(ApiError::bad(
                        "logit_bias",
                        format!("the bias {b} of token {id} is outside [-100, 100]"),
                    ));
                }
                // OpenAI: -100 bans the token, 100 makes it the only choice.
                let b = if b <= -100.0 { f32::NEG_INFINITY } else { b };
                Ok((id, b))
            })
            .collect()
    }

    /// What this server cannot do is refused by name, never accepted and then ignored.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        if let Some(b) = self.best_of.filter(|&b| b != 1) {
            return Err(ApiError::bad(
                "best_of",
                format!("best_of = {b}: this server returns one sample (best_of = 1)"),
            ));
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad("echo", "echo is not supported: the prompt is not returned with the answer"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad("suffix", "suffix (fill in the middle) is not supported"));
        }
        Ok(())
    }
}
