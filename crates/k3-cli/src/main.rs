//! `k3-cli`: the user's entry point. Thin: argument parsing and presentation; the work is done by
//! the library crates.

mod chat;
mod inspect;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use k3_format::{Model, OpenOptions};

#[derive(Parser)]
#[command(name = "k3-cli", version, about = "k3: run Kimi models by streaming experts from disk")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a WASTE model: architecture, experts, encodings, sizes, shard layout.
    Inspect {
        /// The model directory.
        model: PathBuf,
        /// Other directories holding expert shards (one per drive); repeat the flag.
        #[arg(long = "shard-dir")]
        shard_dirs: Vec<PathBuf>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check every checksum of a WASTE model; exits 1 naming each bad record or tensor.
    Verify {
        model: PathBuf,
        #[arg(long = "shard-dir")]
        shard_dirs: Vec<PathBuf>,
    },
    /// Logits at every position of a prompt: writes f32 [tokens, vocab], row-major, little-endian.
    Logits(RunArgs),
    /// The hidden state after every layer: writes f32 [tokens, layers, hidden], token-major.
    Trace(RunArgs),
    /// Continue a prompt, streaming the new text (or ids, for a model without a tokenizer).
    Generate {
        /// The model directory (default: the embedded default model, fixtures/default.waste).
        #[arg(long)]
        model: Option<PathBuf>,
        /// The prompt text (needs a model with an embedded tokenizer).
        prompt: Option<String>,
        /// The prompt as token ids instead.
        #[arg(long)]
        ids: Option<String>,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// 0 = greedy (reproducible).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 32)]
        chunk: usize,
        #[command(flatten)]
        engine: run::EngineArgs,
    },
    /// An interactive conversation in the model's chat format (Ctrl-C stops an answer; Ctrl-D ends).
    Chat {
        /// The model directory (default: the embedded default model, fixtures/default.waste).
        #[arg(long)]
        model: Option<PathBuf>,
        /// A system prompt.
        #[arg(long)]
        system: Option<String>,
        /// Answer without a thinking section (K3).
        #[arg(long)]
        no_think: bool,
        /// Show the model's thinking (hidden by default).
        #[arg(long)]
        show_thinking: bool,
        #[arg(long, default_value_t = 512)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.6)]
        temperature: f32,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        engine: run::EngineArgs,
    },
    /// Text on standard input to token ids, printed as a JSON array.
    Tokenize {
        /// A `tiktoken.model` file (its `tokenizer_config.json` alongside, if any) or a WASTE model
        /// directory (the tokenizer it embeds).
        #[arg(long)]
        tokenizer: PathBuf,
        /// Turn special-token strings such as `<|open|>` into their ids.
        #[arg(long)]
        specials: bool,
    },
    /// Token ids on standard input (a JSON array, or numbers separated by spaces) to text.
    Detokenize {
        #[arg(long)]
        tokenizer: PathBuf,
    },
    /// Held-out perplexity of a text: non-overlapping windows, each from an empty state.
    Perplexity {
        /// The model directory (default: the embedded default model, fixtures/default.waste).
        #[arg(long)]
        model: Option<PathBuf>,
        /// The text file to score (default: standard input).
        file: Option<PathBuf>,
        /// Tokens per window.
        #[arg(long, default_value_t = 256)]
        window: usize,
        /// Tokens per prefill chunk.
        #[arg(long, default_value_t = 256)]
        chunk: usize,
        /// Print one JSON object instead of a line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: run::EngineArgs,
    },
    /// How well the router lookahead would predict each MoE layer's experts on a prompt.
    Lookahead {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        ids: String,
        /// Experts predicted beyond top-k (default: half of top-k).
        #[arg(long)]
        margin: Option<usize>,
        #[arg(long, default_value_t = 32)]
        chunk: usize,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: run::EngineArgs,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The model directory.
    #[arg(long)]
    model: PathBuf,
    /// Token ids, separated by spaces (or commas).
    #[arg(long)]
    ids: String,
    /// Where to write the f32 array.
    #[arg(long)]
    out: PathBuf,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 32)]
    chunk: usize,
    #[command(flatten)]
    engine: run::EngineArgs,
}

/// `--model`, or the embedded default model of this checkout.
fn default_model(model: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(m) = model {
        return Ok(m);
    }
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/default.waste"));
    anyhow::ensure!(
        p.join("header.waste").exists(),
        "no --model given and the embedded default model {} is missing",
        p.display()
    );
    Ok(p)
}

fn load_tokenizer(path: &std::path::Path) -> Result<k3_engine::tokenizer::Tokenizer> {
    use k3_engine::tokenizer::{KIMI_PATTERN, Tokenizer};
    if path.is_dir() {
        let m = open(&path.to_path_buf(), Vec::new())?;
        return Ok(Tokenizer::from_model(&m)
            .with_context(|| format!("{} embeds no tiktoken.model or tokenizer.json", path.display()))??);
    }
    if path.extension().is_some_and(|e| e == "json") {
        let json = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        return Tokenizer::from_hf_json(&json).with_context(|| format!("loading {}", path.display()));
    }
    let ranks = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let cfg_path = path.with_file_name("tokenizer_config.json");
    let cfg = if cfg_path.exists() { Some(std::fs::read(&cfg_path)?) } else { None };
    Tokenizer::from_tiktoken(&ranks, cfg.as_deref(), KIMI_PATTERN)
        .with_context(|| format!("loading {}", path.display()))
}

fn generate(
    path: &std::path::Path,
    prompt: Option<&str>,
    ids: Option<&str>,
    max_tokens: usize,
    cfg: k3_engine::sample::SamplerConfig,
    chunk: usize,
    ea: &run::EngineArgs,
) -> Result<ExitCode> {
    use std::io::Write;
    let model = open(&path.to_path_buf(), ea.shard_dirs.clone())?;
    let tok = k3_engine::tokenizer::Tokenizer::from_model(&model).transpose()?;
    let prompt_ids = match (ids, prompt, &tok) {
        (Some(ids), _, _) => parse_ids(ids)?,
        (None, Some(text), Some(t)) => t.encode_with_specials(text),
        (None, Some(_), None) => anyhow::bail!("{} embeds no tokenizer: give the prompt as --ids", path.display()),
        (None, None, _) => anyhow::bail!("give a prompt (text) or --ids"),
    };
    anyhow::ensure!(!prompt_ids.is_empty(), "the prompt encodes to no tokens");
    let engine =
        k3_engine::Engine::load_with(&model, ea.options()?).with_context(|| format!("loading {}", path.display()))?;
    ea.start(&engine)?;
    // End of message: `eos_token_id` of the config (K3 keeps it at the root, beside text_config).
    let root: serde_json::Value =
        serde_json::from_slice(model.blob("config.json").unwrap_or(b"{}")).unwrap_or_default();
    let eos: Vec<u32> = [root.get("eos_token_id"), engine.config().text.get("eos_token_id")]
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_u64)
        .map(|v| v as u32)
        .collect();
    let mut session = engine.session();
    let t0 = std::time::Instant::now();
    let mut logits = Vec::new();
    for c in prompt_ids.chunks(chunk.max(1)) {
        logits = engine.forward(&mut session, c, None)?;
    }
    let prefill = (prompt_ids.len(), t0.elapsed().as_secs_f64());
    let mut sampler = k3_engine::sample::Sampler::new(cfg);
    let mut stream = k3_engine::tokenizer::StreamDecoder::default();
    let mut out = std::io::stdout().lock();
    let t1 = std::time::Instant::now();
    let v = engine.vocab();
    let mut produced = 0;
    let mut per_token = Vec::new();
    while produced < max_tokens {
        let (t_step, before) = (std::time::Instant::now(), session.stats);
        let next = sampler.sample(&logits[logits.len() - v..]);
        produced += 1;
        match &tok {
            Some(t) => write!(out, "{}", stream.push(t, next)?)?,
            None => write!(out, "{next} ")?,
        }
        out.flush()?;
        if eos.contains(&next) {
            break;
        }
        logits = engine.forward(&mut session, &[next], None)?;
        let after = session.stats;
        per_token.push(serde_json::json!({
            "token": next,
            "seconds": t_step.elapsed().as_secs_f64(),
            "bytes_read": after.cache.bytes_read - before.cache.bytes_read,
            "hits": after.cache.hits - before.cache.hits,
            "misses": after.cache.misses - before.cache.misses,
            "io_wait_seconds": after.io_wait_seconds - before.io_wait_seconds,
        }));
    }
    if tok.is_some() {
        write!(out, "{}", stream.finish())?;
    }
    writeln!(out)?;
    ea.report_split(&session.stats, prefill, (produced, t1.elapsed().as_secs_f64()), per_token)?;
    ea.finish(&session)?;
    Ok(ExitCode::SUCCESS)
}

fn perplexity(
    path: &std::path::Path,
    file: Option<&std::path::Path>,
    window: usize,
    chunk: usize,
    json: bool,
    ea: &run::EngineArgs,
) -> Result<ExitCode> {
    use std::io::Read;
    let text = match file {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading standard input")?;
            s
        }
    };
    let model = open(&path.to_path_buf(), ea.shard_dirs.clone())?;
    let tok = k3_engine::tokenizer::Tokenizer::from_model(&model)
        .with_context(|| format!("{} embeds no tokenizer", path.display()))??;
    let ids = tok.encode(&text);
    let engine =
        k3_engine::Engine::load_with(&model, ea.options()?).with_context(|| format!("loading {}", path.display()))?;
    ea.start(&engine)?;
    let windows = ids.len().div_ceil(window.max(1));
    let pb = progress_bar(windows as u64, "perplexity [{bar:40}] {pos}/{len} windows ETA {eta}");
    let t0 = std::time::Instant::now();
    let r = k3_engine::eval::perplexity(&engine, &ids, window, chunk, &mut |done| pb.set_position(done as u64))?;
    let seconds = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    ea.report(&r.stats)?;
    let window_nll: Vec<f64> = r.windows.iter().map(|w| w.nll).collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "perplexity": r.perplexity(), "mean_nll": r.mean_nll(), "tokens": ids.len(),
                "scored_tokens": r.scored(), "window": window, "windows": r.windows.len(),
                "window_nll": window_nll, "seconds": seconds, "tok_per_s": ids.len() as f64 / seconds,
            })
        );
    } else {
        println!(
            "perplexity {:.4} (mean NLL {:.5} nats) over {} scored tokens in {} windows of {window}; {:.0} tok/s",
            r.perplexity(),
            r.mean_nll(),
            r.scored(),
            r.windows.len(),
            ids.len() as f64 / seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Vec<u32> = s
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("`{t}` is not a token id")))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!ids.is_empty(), "--ids holds no token ids");
    Ok(ids)
}

fn lookahead(
    model: PathBuf,
    ids: &str,
    margin: Option<usize>,
    chunk: usize,
    json: bool,
    ea: run::EngineArgs,
) -> Result<ExitCode> {
    use k3_router::lookahead::Predictor;
    let ids = parse_ids(ids)?;
    let m = open(&model, ea.shard_dirs.clone())?;
    // This command is about the predictors: measure all three.
    let opts = k3_engine::EngineOptions { lookahead_stats: true, ..ea.options()? };
    let mut engine = k3_engine::Engine::load_with(&m, opts).with_context(|| format!("loading {}", model.display()))?;
    ea.start(&engine)?;
    if let Some(g) = margin {
        engine.set_lookahead_margin(g);
    }
    let mut session = engine.session();
    for c in ids.chunks(chunk.max(1)) {
        engine.forward(&mut session, c, None)?;
    }
    ea.report(&session.stats)?;
    ea.finish(&session)?;
    let st = &session.lookahead;
    let layers: Vec<serde_json::Value> = (0..st.layers())
        .filter(|&l| st.counts(Predictor::AfterMoe, l).tokens + st.counts(Predictor::PreviousToken, l).tokens > 0)
        .map(|l| {
            let mut o = serde_json::Map::new();
            o.insert("layer".into(), l.into());
            for p in Predictor::ALL {
                let c = st.counts(p, l);
                o.insert(p.name().into(), serde_json::json!({"recall": c.recall(), "wasted_per_token": c.wasted_per_token(), "tokens": c.tokens}));
            }
            serde_json::Value::Object(o)
        })
        .collect();
    let total: serde_json::Map<String, serde_json::Value> = Predictor::ALL
        .iter()
        .map(|p| {
            let c = st.total(*p);
            (p.name().to_string(), serde_json::json!({"recall": c.recall(), "wasted_per_token": c.wasted_per_token()}))
        })
        .collect();
    if json {
        println!("{}", serde_json::json!({"tokens": ids.len(), "layers": layers, "total": total}));
        return Ok(ExitCode::SUCCESS);
    }
    println!("lookahead recall of each MoE layer's experts over {} tokens (wasted predictions per token):", ids.len());
    println!("{:>5}  {:>22}  {:>22}  {:>22}", "layer", "after-attention", "after-moe", "previous-token");
    // One row: a label and, per predictor, "recall (wasted per token)" from `by_name[predictor]`.
    let row = |label: String, by_name: &serde_json::Value| {
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
    row("all".into(), &serde_json::Value::Object(total));
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs, trace: bool) -> Result<ExitCode> {
    let ids = parse_ids(&args.ids)?;
    let model = open(&args.model, args.engine.shard_dirs.clone())?;
    let engine = k3_engine::Engine::load_with(&model, args.engine.options()?)
        .with_context(|| format!("loading {}", args.model.display()))?;
    args.engine.start(&engine)?;
    let mut session = engine.session();
    let (mut logits, mut layers) = (Vec::new(), Vec::new());
    let mut chunk_trace = Vec::new();
    for chunk in ids.chunks(args.chunk.max(1)) {
        logits.extend(engine.forward(&mut session, chunk, trace.then_some(&mut chunk_trace))?);
        layers.extend_from_slice(&chunk_trace);
    }
    args.engine.report(&session.stats)?;
    args.engine.finish(&session)?;
    let data = if trace { &layers } else { &logits };
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Write next to the target and rename: a reader never sees half an array.
    let tmp = args.out.with_extension("partial");
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let v = engine.vocab();
    let shape = if trace {
        format!("[{}, {}, {}]", ids.len(), engine.layers(), engine.hidden())
    } else {
        format!("[{}, {v}]", ids.len())
    };
    let argmax: Vec<usize> =
        logits.chunks(v).map(|r| r.iter().enumerate().fold(0, |b, (i, x)| if *x > r[b] { i } else { b })).collect();
    println!("wrote f32 {shape} to {}; next-token argmax per position: {argmax:?}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

fn open(model: &PathBuf, shard_dirs: Vec<PathBuf>) -> Result<Model> {
    Model::open_with(model, &OpenOptions { shard_dirs }).with_context(|| format!("opening {}", model.display()))
}

/// A progress bar in the CLI's one style (`template` is a constant, so it parses).
fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    pb
}

fn verify(model: &Model) -> ExitCode {
    let total = model.verify_bytes();
    let pb = progress_bar(total, "verify [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}");
    let problems = model.verify(&mut |done| pb.set_position(done));
    pb.finish_and_clear();
    let m = model.manifest();
    if problems.is_empty() {
        println!(
            "ok: {} embedded files, {} trunk tensors and {} expert records verified ({:.1} MB)",
            m.blobs.len(),
            m.trunk.tensors.len(),
            model.header().index.len(),
            total as f64 / 1e6
        );
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("BAD {}: {}", p.place, p.error);
        }
        eprintln!("{} problem(s) found in {}", problems.len(), model.dir().display());
        ExitCode::FAILURE
    }
}

/// Errors are printed as one tidy chain of causes (no backtrace), then exit status 1.
fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Inspect { model, shard_dirs, json } => {
            let m = open(&model, shard_dirs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&inspect::summary(&m))?);
            } else {
                print!("{}", inspect::table(&m));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { model, shard_dirs } => Ok(verify(&open(&model, shard_dirs)?)),
        Command::Tokenize { tokenizer, specials } => {
            let tok = load_tokenizer(&tokenizer)?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).context("reading standard input")?;
            let ids = if specials { tok.encode_with_specials(&text) } else { tok.encode(&text) };
            println!("{}", serde_json::to_string(&ids)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Detokenize { tokenizer } => {
            let tok = load_tokenizer(&tokenizer)?;
            let mut input = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut input).context("reading standard input")?;
            let ids = parse_ids(input.trim().trim_start_matches('[').trim_end_matches(']'))?;
            let bytes = tok.decode_bytes(&ids)?;
            print!("{}", String::from_utf8_lossy(&bytes));
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate { model, prompt, ids, max_tokens, temperature, top_p, top_k, seed, chunk, engine } => {
            let cfg = k3_engine::sample::SamplerConfig { temperature, top_k, top_p, seed };
            generate(&default_model(model)?, prompt.as_deref(), ids.as_deref(), max_tokens, cfg, chunk, &engine)
        }
        Command::Chat {
            model,
            system,
            no_think,
            show_thinking,
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            engine,
        } => {
            let a = chat::ChatArgs {
                system: system.as_deref(),
                think: !no_think,
                show_thinking,
                max_tokens,
                sampler: k3_engine::sample::SamplerConfig { temperature, top_k, top_p, seed },
            };
            chat::run(&default_model(model)?, a, &engine)
        }
        Command::Logits(args) => run(args, false),
        Command::Trace(args) => run(args, true),
        Command::Perplexity { model, file, window, chunk, json, engine } => {
            perplexity(&default_model(model)?, file.as_deref(), window, chunk, json, &engine)
        }
        Command::Lookahead { model, ids, margin, chunk, json, engine } => {
            lookahead(model, &ids, margin, chunk, json, engine)
        }
    }
}
