//! `k3-cli convert` (and `cargo xtask convert`, which runs this same code): a Hugging Face
//! checkpoint or a WASTE model to a WASTE model, through `k3-convert`, with progress on standard
//! error and a summary on standard output.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use indicatif::DecimalBytes;
use k3_convert::calibrate::PeakMemory;

use crate::progress;
use k3_convert::{ConvertOptions, ExpertFormat, Progress, TrunkFormat, Unit, convert as run_convert};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Experts {
    Keep,
    Mxfp4,
    Bf16,
    Vq3,
    /// Exact f32: for checking a checkpoint's parity (4 bytes a weight: 8x INT4, 4x FP8).
    F32,
    /// Round-to-nearest INT4 in groups of 32 (K2-Thinking's encoding; INT4 checkpoints keep theirs).
    Int4,
    /// 3-bit round-to-nearest in groups of 32 stored as int4: the baseline VQ3 is measured against.
    Rtn3,
    /// 2-bit round-to-nearest in groups of 32 (16 or 8 where a row's length needs them): HOBBIT's
    /// low-bit copies, read instead of the full record on a cache miss of a light expert
    /// (`--low-bit-copies`); too coarse to run a model on alone.
    Int2,
    /// FP8 e4m3 in 128 x 128 blocks by DeepSeek's quantization (how K2-Instruct was made): for
    /// measuring what FP8 costs; FP8 checkpoints keep their own bytes with `keep`.
    Fp8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Trunk {
    Keep,
    F32,
    Bf16,
    Int8,
    Int4,
}

/// `k3-cli convert` / `cargo xtask convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The source: a Hugging Face checkpoint (config.json, *.safetensors, perhaps
    /// model.safetensors.index.json, tokenizer files), or a WASTE model to re-encode (f32 / bf16
    /// trunk, BF16 or MXFP4 experts; checked whole first).
    #[arg(long, visible_alias = "from")]
    pub hf: PathBuf,
    /// The WASTE model directory to create (or to resume) [default: none: give --out or --name].
    #[arg(long, required_unless_present = "name", conflicts_with = "name")]
    pub out: Option<PathBuf>,
    /// Keep the model in k3's model store under this name (`<data dir>/models/NAME`), for
    /// `--model NAME`, `run NAME`, `list`, `rm` and `serve` [default: none: give --out].
    #[arg(long, value_name = "NAME", value_parser = crate::store::parse_name)]
    pub name: Option<String>,
    /// Routed expert encoding; `keep` uses what the checkpoint has, byte for byte (MXFP4 for K3,
    /// BF16 for Kimi-Linear, FP8 blocks for K2-Instruct and DeepSeek-V3, INT4 for K2-Thinking),
    /// read in place from the checkpoint's files where it can be (nothing copied: keep the
    /// checkpoint as it is), else copied.
    #[arg(long, value_enum, default_value = "keep")]
    pub experts: Experts,
    /// Copy experts kept as stored into the model's own shards instead of reading them in place
    /// from the checkpoint (which can then be deleted or moved).
    #[arg(long)]
    pub copy_experts: bool,
    /// Check everything and print the plan (what is written where, the free space there, what
    /// is read and how long that takes at a rate measured now); write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Trunk encoding; `keep` stores what the checkpoint has (FP8 blocks as FP8, but an FP8
    /// embedding table widened to f32); int8 / int4 quantize the projection matrices and the
    /// embedding table (int4: groups of 32, the output matrix and the embedding table in int8
    /// rows), not the router gates, norms or MLA's kv_b_proj, and keep the rest as stored.
    #[arg(long, value_enum, default_value = "keep")]
    pub trunk: Trunk,
    /// Expert record alignment in bytes: a power of two from 4096 (the default) to 1 GiB
    /// (2097152 for huge pages).
    #[arg(long, default_value_t = k3_format::DEFAULT_ALIGNMENT)]
    pub align: u64,
    /// Number of expert shard files (at most one per expert record).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub shards: u16,
    /// Stripe the shards over these directories (one per drive; created if missing); repeat the flag
    /// [default: none: every shard beside the header in --out].
    #[arg(long = "shard-dir")]
    pub shard_dirs: Vec<PathBuf>,
    /// Calibrate VQ experts on this text: the source model reads it a layer at a time (a
    /// checkpoint is converted as stored first, beside the output), each expert's inputs are
    /// sampled, and its matrices are encoded to minimize the error on them [default: none:
    /// uncalibrated].
    #[arg(long, conflicts_with = "calibrate_ids")]
    pub calibrate: Option<PathBuf>,
    /// Calibrate on these token ids instead of a text (a JSON array, or ids separated by
    /// whitespace): for a model whose tokenizer is not embedded [default: none: a text, or no
    /// calibration].
    #[arg(long, value_name = "FILE")]
    pub calibrate_ids: Option<PathBuf>,
    /// Tokens of the calibration text to run (in 256-token windows spread evenly over the text).
    #[arg(long, default_value_t = 16384)]
    pub calibrate_tokens: usize,
    /// Inputs sampled per expert (a larger sample estimates an expert's input statistics better;
    /// memory is checked before the run).
    #[arg(long, default_value_t = 4096)]
    pub calibrate_samples: usize,
}

/// Tokens per calibration window, each read from an empty state (as `k3-cli perplexity` scores).
const CALIBRATION_WINDOW: usize = 256;

impl ConvertArgs {
    /// `--out`, or the store's directory for `--name`.
    pub fn out_dir(&self) -> Result<PathBuf> {
        match (&self.out, &self.name) {
            (Some(out), _) => Ok(out.clone()),
            (None, Some(name)) => crate::store::target(name),
            (None, None) => bail!("give --out DIR, or --name NAME to keep the model in k3's store"),
        }
    }
}

pub fn run(args: ConvertArgs) -> Result<()> {
    if args.dry_run && (args.calibrate.is_some() || args.calibrate_ids.is_some()) {
        bail!(
            "--dry-run cannot plan a calibrated conversion (the calibration converts the checkpoint first); plan it without --calibrate"
        );
    }
    let out = args.out_dir()?;
    // The scratch copy a checkpoint's calibration runs on lives until the conversion ends.
    let (calibration, _scratch) = match calibration_plan(&args, &out)? {
        Some((plan, scratch)) => (Some(std::sync::Arc::new(plan)), scratch),
        None => (None, None),
    };
    let ConvertArgs { hf, experts, trunk, align, shards, shard_dirs, copy_experts, dry_run, .. } = args;
    let experts = match experts {
        Experts::Keep => ExpertFormat::Keep,
        Experts::Mxfp4 => ExpertFormat::Mxfp4,
        Experts::Bf16 => ExpertFormat::Bf16,
        Experts::Vq3 => ExpertFormat::Vq3,
        Experts::F32 => ExpertFormat::F32,
        Experts::Int4 => ExpertFormat::Int4,
        Experts::Rtn3 => ExpertFormat::Rtn3,
        Experts::Int2 => ExpertFormat::Int2,
        Experts::Fp8 => ExpertFormat::Fp8,
    };
    let trunk = match trunk {
        Trunk::Keep => TrunkFormat::Keep,
        Trunk::F32 => TrunkFormat::F32,
        Trunk::Bf16 => TrunkFormat::Bf16,
        Trunk::Int8 => TrunkFormat::Int8,
        Trunk::Int4 => TrunkFormat::Int4,
    };
    let opts = ConvertOptions {
        experts,
        trunk,
        alignment: align,
        shards,
        shard_dirs,
        calibration,
        copy_experts,
        ..ConvertOptions::new(&hf, &out)
    };
    // The plan first (everything checked, nothing written): said before any byte is written.
    let planned = run_convert(&ConvertOptions { dry_run: true, ..opts.clone() }, &mut |_| {})
        .with_context(|| format!("converting {} to {}", hf.display(), out.display()))?;
    if let Some(needs) = &planned.needs {
        print_needs(needs, &planned.in_place);
    }
    if dry_run {
        println!("dry run: nothing written");
        return Ok(());
    }
    say_how_to_resume_when_interrupted();
    let mut bar = PhaseBar::default();
    let report = run_convert(&opts, &mut |p| bar.show(p))
        .with_context(|| format!("converting {} to {}", hf.display(), out.display()))?;
    bar.finish();
    if report.already_complete {
        println!("{} already holds this model, converted with these options; nothing to do.", out.display());
        return Ok(());
    }
    if report.resumed_items > 0 {
        println!("resumed: kept {} items written by the interrupted run", report.resumed_items);
    }
    println!(
        "wrote {} items ({}) to {}; verified {}",
        report.written_items,
        DecimalBytes(report.written_bytes),
        out.display(),
        DecimalBytes(report.verified_bytes)
    );
    match &report.in_place {
        Some(Ok(files)) => println!(
            "experts: read in place from {files} checkpoint file(s) in {}: keep them as they are \
             (a changed or moved file is refused; --copy-experts copies them instead)",
            hf.display()
        ),
        Some(Err(why)) if !copy_experts && matches!(experts, ExpertFormat::Keep) => {
            println!("experts: copied, not read in place: {why}")
        }
        _ => {}
    }
    if let Some((n, why)) = &report.copied_experts {
        println!("experts: {n} copied into the model, not read in place (e.g. {why})");
    }
    for r in &report.re_encoded {
        println!("re-encoded {} tensor(s) {} -> {} (e.g. {}): {}", r.count, r.from, r.to, r.example, r.why);
    }
    print_calibration(&report.calibrated, report.calibration_peak);
    if !report.ignored.is_empty() {
        println!(
            "ignored {} tensors k3 does not run (a vision tower, multi-token-prediction layers; e.g. {})",
            report.ignored.len(),
            report.ignored[0]
        );
    }
    Ok(())
}

/// The plan in words: what is written where against the space free there, what is read and how
/// long that takes at the rate just measured.
fn print_needs(n: &k3_convert::Needs, in_place: &Option<std::result::Result<usize, String>>) {
    let experts = match in_place {
        Some(Ok(files)) if n.expert_bytes == 0 => {
            format!("experts read in place from {files} checkpoint file(s), none written")
        }
        Some(Ok(files)) => format!(
            "experts read in place from {files} checkpoint file(s), {} copied (those that cannot be)",
            DecimalBytes(n.expert_bytes)
        ),
        _ => format!("experts {}", DecimalBytes(n.expert_bytes)),
    };
    println!("plan: trunk {}, {experts}", DecimalBytes(n.trunk_bytes));
    for t in &n.targets {
        let dirs: Vec<String> = t.dirs.iter().map(|d| d.display().to_string()).collect();
        let fits = if t.bytes <= t.free { "fits" } else { "DOES NOT FIT" };
        println!("  writes {} to {} ({} free: {fits})", DecimalBytes(t.bytes), dirs.join(", "), DecimalBytes(t.free));
    }
    match n.read_seconds() {
        Some(s) => println!(
            "  reads {} of the checkpoint: ~{} at the {}/s measured now (re-encoding adds its own time)",
            DecimalBytes(n.read_bytes),
            indicatif::HumanDuration(std::time::Duration::from_secs_f64(s)),
            DecimalBytes(n.read_rate.unwrap_or(0.0) as u64)
        ),
        None => println!("  reads {} of the checkpoint", DecimalBytes(n.read_bytes)),
    }
}

/// The calibration to run, if asked for: the source as a WASTE model (a checkpoint converted as
/// stored into a scratch directory beside the output, returned to be kept until the end) and the
/// token ids, spread over the text.
fn calibration_plan(
    args: &ConvertArgs,
    out: &Path,
) -> Result<Option<(k3_convert::calibrate::CalibrationPlan, Option<tempfile::TempDir>)>> {
    // From a text (the tokenizer reads it) or from ids.
    let (text, ids_file) = match (&args.calibrate, &args.calibrate_ids) {
        (None, None) if args.calibrate_tokens != 16384 || args.calibrate_samples != 4096 => {
            bail!("--calibrate-tokens and --calibrate-samples need --calibrate TEXT or --calibrate-ids FILE")
        }
        (None, None) => return Ok(None),
        (text, ids) => (text.as_deref(), ids.as_deref()),
    };
    if !matches!(args.experts, Experts::Vq3) {
        bail!("calibration weights VQ encodings: use --calibrate or --calibrate-ids with --experts vq3");
    }
    if args.calibrate_samples == 0 {
        bail!("--calibrate-samples must be at least 1");
    }
    let mut scratch = None;
    let source = if args.hf.join(k3_format::HEADER_FILE).exists() {
        args.hf.clone()
    } else {
        let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let dir =
            tempfile::tempdir_in(parent).with_context(|| format!("a scratch directory in {}", parent.display()))?;
        let as_stored = dir.path().join("as-stored");
        println!("calibration runs the model: converting {} as stored first", args.hf.display());
        run_convert(&ConvertOptions::new(&args.hf, &as_stored), &mut |_| {})?;
        scratch = Some(dir);
        as_stored
    };
    let model = k3_format::Model::open(&source)?;
    let (all, what) = match (text, ids_file) {
        (Some(text), _) => {
            let tok = k3_generate::model_tokenizer(&model).with_context(|| {
                format!(
                    "{} embeds no tokenizer to read the calibration text with (use --calibrate-ids)",
                    args.hf.display()
                )
            })??;
            let words = crate::text_file::read_text(text, "a calibration text is")?;
            (tok.encode(&words), text)
        }
        (None, file) => {
            let file = file.context("--calibrate-ids names no file")?;
            (read_ids(file, model.manifest().architecture.vocab)?, file)
        }
    };
    let ids = k3_convert::calibrate::spread(&all, args.calibrate_tokens, CALIBRATION_WINDOW);
    if ids.is_empty() {
        bail!("{} has no tokens to calibrate on", what.display());
    }
    println!(
        "calibrating on {} of the {} tokens of {} (windows spread over it), a layer at a time",
        ids.len(),
        all.len(),
        what.display()
    );
    let plan =
        k3_convert::calibrate::CalibrationPlan { source, ids, window: CALIBRATION_WINDOW, cap: args.calibrate_samples };
    Ok(Some((plan, scratch)))
}

/// Token ids from `file`: a JSON array of integers, or integers separated by whitespace; each
/// below `vocab`.
fn read_ids(file: &Path, vocab: u64) -> Result<Vec<u32>> {
    let text = crate::text_file::read_text(file, "--calibrate-ids reads")?;
    let ids: Vec<u64> = if text.trim_start().starts_with('[') {
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a JSON array of non-negative integer token ids", file.display()))?
    } else {
        let parse = |(i, t): (usize, &str)| {
            t.parse::<u64>().with_context(|| format!("{}: item {} (`{t}`) is not a token id", file.display(), i + 1))
        };
        text.split_whitespace().enumerate().map(parse).collect::<Result<_>>()?
    };
    if let Some((i, bad)) = ids.iter().enumerate().find(|(_, t)| **t >= vocab) {
        bail!("{}: item {} is token id {bad}, outside the model's vocabulary of {vocab}", file.display(), i + 1);
    }
    Ok(ids.into_iter().map(|t| t as u32).collect())
}

/// Per calibrated layer, how its experts' inputs were weighted (and how many fell back).
fn print_calibration(layers: &[k3_convert::calibrate::LayerCalibration], peak: Option<PeakMemory>) {
    if let Some(p) = peak {
        println!(
            "calibration's peak memory: {} (engine {}, tokens' states between layers {}, one layer's samples {}, \
             experts encoded at once {})",
            DecimalBytes(p.total()),
            DecimalBytes(p.engine),
            DecimalBytes(p.boundary),
            DecimalBytes(p.samples),
            DecimalBytes(p.encoding)
        );
    }
    if layers.is_empty() {
        return;
    }
    let (shrunk, pooled): (u32, u32) = layers.iter().fold((0, 0), |(s, p), l| (s + l.shrunk, p + l.pooled));
    println!(
        "calibrated {} MoE layer(s): experts weighted by their own inputs, shrunk toward their layer's (fewer \
         inputs than their width), or by the layer's alone (fewer than {}):",
        layers.len(),
        k3_convert::calibrate::MIN_OWN_INPUTS
    );
    for l in layers {
        println!(
            "  layer {:>3}: {:>5} own, {:>5} shrunk, {:>5} fell back; {} inputs",
            l.layer, l.own, l.shrunk, l.pooled, l.inputs
        );
    }
    println!("  in all: {shrunk} shrunk, {pooled} fell back");
}

/// A conversion's (or `synth`'s) progress on standard error ([`crate::progress`]): one bar, or
/// one series of lines, a phase over what this run has left to do, so its rate and ETA are this
/// run's (what an interrupted run wrote is said once, not counted).
#[derive(Debug, Default)]
pub struct PhaseBar {
    shown: Option<progress::Progress>,
    phase: &'static str,
}

impl PhaseBar {
    pub fn show(&mut self, p: Progress) {
        // A calibrated conversion's layers, said above the experts' bar (whose rate and ETA
        // include the walk) without resetting it.
        if p.phase == "calibrate" {
            let line = format!("calibrating MoE layer {} of {}: the source model reads the tokens", p.done, p.total);
            match &self.shown {
                Some(shown) => shown.say(&line),
                None => progress::say(&line),
            }
            return;
        }
        if p.phase != self.phase || self.shown.is_none() {
            if let Some(done) = self.shown.take() {
                done.finish();
            }
            self.phase = p.phase;
            let unit = match p.unit {
                Unit::Bytes => progress::Unit::Bytes,
                Unit::Layers => progress::Unit::Items("layers"),
            };
            let shown = progress::Progress::new(p.phase, p.total - p.resumed, unit);
            if p.resumed > 0 {
                let (resumed, total) = (DecimalBytes(p.resumed), DecimalBytes(p.total));
                shown.say(&format!("resuming {}: {resumed} of {total} already written", p.phase));
            }
            self.shown = Some(shown);
        }
        if let Some(shown) = &self.shown {
            shown.set_position(p.done.saturating_sub(p.resumed));
        }
    }

    pub fn finish(self) {
        if let Some(shown) = self.shown {
            shown.finish();
        }
    }
}

/// Ctrl-C, SIGTERM or SIGHUP during a conversion: say how to go on, then end as the signal would.
/// Every point of a conversion is resumable (the writer's journal), so nothing needs finishing.
fn say_how_to_resume_when_interrupted() {
    extern "C" fn interrupted(sig: libc::c_int) {
        const MSG: &[u8] = b"\ninterrupted; run the same command to resume\n";
        // SAFETY: `write` and `_exit` are async-signal-safe; MSG is a static buffer.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(128 + sig);
        }
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only calls async-signal-safe functions.
        unsafe {
            libc::signal(sig, interrupted as *const () as libc::sighandler_t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read_ids;

    #[test]
    fn calibration_ids_are_read_as_json_or_words_and_checked() {
        let d = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = d.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        assert_eq!(read_ids(&file("a.json", " [1, 2,3]\n"), 10).unwrap(), [1, 2, 3]);
        assert_eq!(read_ids(&file("a.txt", "4 5\n6\t7\n"), 10).unwrap(), [4, 5, 6, 7]);
        let err = |name: &str, text: &str| format!("{:#}", read_ids(&file(name, text), 10).unwrap_err());
        let e = err("b.txt", "1 two 3");
        assert!(e.contains("b.txt") && e.contains("item 2") && e.contains("`two`"), "{e}");
        let e = err("c.txt", "1 2 10");
        assert!(e.contains("item 3") && e.contains("token id 10") && e.contains("vocabulary of 10"), "{e}");
        let e = err("d.json", "[1, -2]");
        assert!(e.contains("d.json") && e.contains("JSON array"), "{e}");
    }
}
