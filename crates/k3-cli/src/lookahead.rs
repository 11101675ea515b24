//! `lookahead`: how well each predictor would have guessed every MoE layer's experts on a prompt.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use k3_engine::Predictor;
use serde_json::{Value, json};

use crate::prompt::PromptArgs;
use crate::run::{EngineArgs, Needs, open_model};

#[derive(clap::Args)]
pub struct LookaheadArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Experts predicted beyond top-k [default: half of top-k].
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=65536))]
    margin: Option<u32>,
    /// Prompt tokens per forward call (prefill chunk).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: LookaheadArgs) -> Result<ExitCode> {
    let path = crate::default_model::or_default(a.model)?;
    let m = open_model(&path, &a.engine.knobs.shard_dirs)?;
    let tok = k3_generate::model_tokenizer(&m).transpose()?;
    let most = crate::prompt::RunContext::of(&m, a.engine.knobs.context);
    let ids = a.prompt.ids(tok.as_ref(), &path, &most.text())?;
    // This command is about the predictors: measure all three.
    let needs = Needs::exact(ids.len() as u64, a.chunk as usize);
    let mut engine = a.engine.load_with(&m, &path, needs, |o| o.lookahead_stats = true)?;
    if let Some(g) = a.margin {
        engine.set_lookahead_margin(g as usize);
    }
    let mut session = engine.session();
    for c in ids.chunks(a.chunk as usize) {
        engine.forward_last(&mut session, c)?;
    }
    a.engine.report(&engine, &session.stats, None)?;
    a.engine.finish(&session)?;
    let st = &session.lookahead;
    let layers: Vec<Value> = (0..st.layers())
        .filter(|&l| st.counts(Predictor::AfterMoe, l).tokens + st.counts(Predictor::PreviousToken, l).tokens > 0)
        .map(|l| {
            let mut o = serde_json::Map::new();
            o.insert("layer".into(), l.into());
            for p in Predictor::ALL {
                let c = st.counts(p, l);
                o.insert(
                    p.name().into(),
                    json!({"recall": c.recall(), "wasted_per_token": c.wasted_per_token(), "tokens": c.tokens}),
                );
            }
            Value::Object(o)
        })
        .collect();
    let total: serde_json::Map<String, Value> = Predictor::ALL
        .iter()
        .map(|p| {
            let c = st.total(*p);
            (p.name().to_string(), json!({"recall": c.recall(), "wasted_per_token": c.wasted_per_token()}))
        })
        .collect();
    if a.json {
        println!("{}", json!({"tokens": ids.len(), "layers": layers, "total": total}));
        return Ok(ExitCode::SUCCESS);
    }
    println!("lookahead recall of each MoE layer's experts over {} tokens (wasted predictions per token):", ids.len());
    println!("{:>5}  {:>22}  {:>22}  {:>22}", "layer", "after-attention", "after-moe", "previous-token");
    // One row: a label and, per predictor, "recall (wasted per token)" from `by_name[predictor]`.
    let row = |label: String, by_name: &Value| {
        let cell = |p: Predictor| {
            let c = &by_name[p.name()];
            format!("{:.3} ({:.1})", c["recall"].as_f64().unwrap_or(0.0), c["wasted_per_token"].as_f64().unwrap_or(0.0))
        };
        println!(
            "{label:>5}  {:>22}  {:>22}  {:>22}",
            cell(Predictor::AfterAttention),
            cell(Predictor::AfterMoe),
            cell(Predictor::PreviousToken)
        );
    };
    for l in &layers {
        row(l["layer"].to_string(), l);
    }
    row("all".into(), &Value::Object(total));
    Ok(ExitCode::SUCCESS)
}
