//! The sampling switches of `generate` and `chat`, with llama.cpp's names and meanings; the
//! arithmetic is `k3_generate::sample`'s.

use anyhow::Result;
use k3_generate::sample::SamplerConfig;

/// The sampling switches of `generate` and `chat` (llama.cpp's names and meanings). A switch not
/// given takes the model's recommended setting (its `generation_config.json`, shown by
/// `k3-cli inspect`), else the command's fallback.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Softmax temperature: 0 = greedy (reproducible), higher = more varied [default: the
    /// model's generation_config.json (see `k3-cli inspect`), else 0.6 for chat and serve, 0
    /// (greedy) for generate].
    #[arg(long, visible_alias = "temp", value_parser = parse_temperature)]
    temperature: Option<f32>,
    /// Sample only from the most likely tokens whose probabilities sum to this (1 = off)
    /// [default: the model's generation_config.json, else 0.95 for chat and serve, 1 for generate].
    #[arg(long, value_parser = parse_top_p)]
    top_p: Option<f32>,
    /// Sample only from this many most likely tokens (0 = off) [default: the model's
    /// generation_config.json, else 0].
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample only from tokens at least this fraction as likely as the most likely one (0 = off)
    /// [default: the model's generation_config.json, else 0].
    #[arg(long, value_parser = parse_min_p)]
    min_p: Option<f32>,
    /// Penalize tokens among the last --repeat-last-n: a positive logit divided by this, a
    /// negative one multiplied (1 = off) [default: the model's generation_config.json
    /// `repetition_penalty`, else 1].
    #[arg(long, value_parser = parse_repeat_penalty)]
    repeat_penalty: Option<f32>,
    /// Subtract this times a token's count among the last --repeat-last-n (0 = off; -2..2)
    /// [default: 0].
    #[arg(long, allow_negative_numbers = true, value_parser = |s: &str| parse_penalty("frequency_penalty", s))]
    frequency_penalty: Option<f32>,
    /// Subtract this from every token among the last --repeat-last-n (0 = off; -2..2) [default: 0].
    #[arg(long, allow_negative_numbers = true, value_parser = |s: &str| parse_penalty("presence_penalty", s))]
    presence_penalty: Option<f32>,
    /// How many of the latest tokens (prompt included) the penalties look at (-1 = all).
    #[arg(long, value_name = "N", default_value_t = 64, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    repeat_last_n: i64,
    /// Add BIAS to token ID's logit before sampling, e.g. 13=-inf bans token 13; repeat the flag
    /// [default: none].
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler: the same seed and settings give the same text [default: a fresh
    /// one each run, printed with --stats].
    #[arg(short = 's', long)]
    seed: Option<u64>,
    /// Draft up to N tokens from the context (prompt lookup) and verify them with each token in
    /// one step (0 = off). The text is the same either way; speculation turns itself off while
    /// its drafts are not accepted often enough to pay.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub speculate: u16,
}

impl SamplingArgs {
    /// The settings: what was given, else `model`'s recommended settings, else the command's
    /// fallback (`conversation`: chat and serve); checks that every biased token is in the
    /// vocabulary of `vocab`.
    pub fn config(&self, model: &k3_engine::Model, conversation: bool, vocab: usize) -> Result<SamplerConfig> {
        let default = k3_generate::generation_config::defaults(model, conversation)
            .map_err(|e| anyhow::anyhow!("{}: {e}", model.dir().display()))?;
        if let Some(&(id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            anyhow::bail!("--logit-bias: token {id} is outside the vocabulary of {vocab}");
        }
        Ok(SamplerConfig {
            temperature: self.temperature.unwrap_or(default.temperature),
            top_k: self.top_k.unwrap_or(default.top_k),
            top_p: self.top_p.unwrap_or(default.top_p),
            seed: self.seed.unwrap_or_else(k3_generate::sample::fresh_seed),
            min_p: self.min_p.unwrap_or(default.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(default.repeat_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(default.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(default.presence_penalty),
            penalty_last_n: usize::try_from(self.repeat_last_n).unwrap_or(usize::MAX),
            logit_bias: self.logit_bias.clone(),
        })
    }
}

impl SamplingArgs {
    /// With --stats, the settings and the seed a sampled run drew (so it can be repeated).
    pub fn say_seed(&self, cfg: &SamplerConfig, stats: bool) {
        if stats {
            eprintln!("sampling: {}", k3_generate::generation_config::describe(cfg));
        }
        if stats && cfg.temperature > 0.0 && self.seed.is_none() {
            eprintln!("sampling with seed {} (--seed {} repeats this run)", cfg.seed, cfg.seed);
        }
    }
}

fn parse_min_p(s: &str) -> Result<f32, String> {
    k3_generate::sample::check_min_p(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_repeat_penalty(s: &str) -> Result<f32, String> {
    k3_generate::sample::check_repeat_penalty(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_penalty(name: &str, s: &str) -> Result<f32, String> {
    k3_generate::sample::check_penalty(name, s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

/// `ID=BIAS`, BIAS a number or `-inf`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("`{s}`: give ID=BIAS, e.g. 13=-inf"))?;
    let id = id.trim().parse().map_err(|_| format!("`{id}` is not a token id"))?;
    let bias: f32 = bias.trim().parse().map_err(|_| format!("`{bias}` is not a number (or -inf)"))?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("the bias {bias} is not usable: give a number, or -inf to ban the token"));
    }
    Ok((id, bias))
}

fn parse_temperature(s: &str) -> Result<f32, String> {
    k3_generate::sample::check_temperature(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_top_p(s: &str) -> Result<f32, String> {
    k3_generate::sample::check_top_p(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}
