//! `cargo xtask bench ...`: measurements run side by side in one process, medians reported.

pub mod attn;
pub mod cache_sim;
pub mod decode;
pub mod encode;
pub mod io;
pub mod json_mask;
pub mod kernels;
pub mod peak;
pub mod prompt_cache;
pub mod routing;
pub mod serve;
pub mod threads;
pub mod timeline;
pub mod verify;
mod vision;

use std::time::Instant;

use anyhow::Result;
use clap::Subcommand;

use std::path::PathBuf;

use crate::{bounded, reps, size_gb};

#[derive(Subcommand)]
pub enum Bench {
    /// The engine decoding: read-then-compute, overlap, overlap + lookahead, cache policies.
    Decode(decode::Args),
    /// The expert reader against the drive's O_DIRECT rate (fio's, or a raw io_uring loop's),
    /// same read size and queue depth.
    Io {
        /// File to read (default: bench-out/io-test.bin, created if missing).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Size of the created test file, GB (only when it is created).
        #[arg(long, default_value_t = 4.0, value_parser = size_gb)]
        size_gb: f64,
        /// Bytes per read (default: a K3 MXFP4 expert record); rounded up to 4 KiB.
        #[arg(long, default_value_t = io::K3_RECORD, value_parser = |s: &str| bounded(s, 1, 1 << 30))]
        record: usize,
        /// Reads in flight at once.
        #[arg(long, default_value_t = 32, value_parser = |s: &str| bounded(s, 1, 4096))]
        queue_depth: usize,
        /// Reads per repetition.
        #[arg(long, default_value_t = 96, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
        reads: usize,
        /// Repetitions, interleaved (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = reps)]
        reps: usize,
        /// Use the pread thread pool instead of io_uring.
        #[arg(long)]
        pread: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The HTTP server under concurrent clients, and the first token of a follow-up turn, of the
    /// same request again and of a new question under a shared system prompt, with the prefix
    /// cache and without.
    Serve {
        /// The WASTE model to serve (default: fixtures/default.waste).
        #[arg(long, default_value = "fixtures/default.waste")]
        model: PathBuf,
        /// Comma-separated numbers of concurrent clients.
        #[arg(long, value_name = "N,N,..", default_value = "1,2,4,8")]
        clients: String,
        /// Tokens each client asks for.
        #[arg(long, default_value_t = 64, value_parser = |s: &str| bounded(s, 1, 100_000))]
        tokens: usize,
        #[command(flatten)]
        run: EngineRun,
    },
    /// The first token after a long shared prefix: computed, from a state kept in RAM, restored
    /// from disk and after a restart; the state's size and its read rate against the drive's.
    PromptCache {
        /// The WASTE model (default: fixtures/default.waste).
        #[arg(long, default_value = "fixtures/default.waste")]
        model: PathBuf,
        /// Tokens of the shared prefix (a system prompt).
        #[arg(long, default_value_t = 4000, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
        prefix: usize,
        /// Tokens of the question after it.
        #[arg(long, default_value_t = 16, value_parser = |s: &str| bounded(s, 1, 10_000))]
        question: usize,
        #[command(flatten)]
        run: EngineRun,
    },
    /// What constrained JSON (json_object, json_schema) costs per token: the vocabulary mask
    /// against the sampling step, on a 200k and a 4k vocabulary.
    JsonMask {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 5, value_parser = reps)]
        reps: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A model's routing statistics (next-token reuse, union factors, weight by rank, flatness,
    /// overlap of two texts, lookahead recall) next to the published K3 figures.
    Routing {
        /// The WASTE model [default: fixtures/default.waste].
        #[arg(long, default_value = "fixtures/default.waste")]
        model: PathBuf,
        /// The text whose start and second half are the two prompts [default:
        /// fixtures/default-model/heldout.txt; a model without a tokenizer gets seeded random ids].
        #[arg(long, value_name = "FILE")]
        prompt_file: Option<PathBuf>,
        /// Tokens of each prompt.
        #[arg(long, default_value_t = 512, value_parser = |s: &str| bounded(s, 32, 1 << 20))]
        prompt_tokens: usize,
        /// Tokens decoded greedily after the first prompt.
        #[arg(long, default_value_t = 64, value_parser = |s: &str| bounded(s, 4, 1 << 20))]
        tokens: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The expert cache's levers on K3-like routing without reading a byte: LRU / LFU / LFRU, a
    /// learned policy and Belady's optimum against cache size; lookahead, HOBBIT, DynaExq and
    /// top-k at one size; batches, speculation and pruning.
    CacheSim {
        /// Simulate this model's own routing of a text instead of the K3-like process (its first
        /// half fits the learned policy, the second is the test) [default: the K3-like process].
        #[arg(long)]
        model: Option<PathBuf>,
        /// The text a `--model` routes [default: fixtures/default-model/heldout.txt].
        #[arg(long, value_name = "FILE")]
        prompt_file: Option<PathBuf>,
        /// Cache sizes in percent of the experts, comma-separated.
        #[arg(long, default_value = "0.5,1,1.7,2.9,5")]
        sizes: String,
        /// The size the levers are compared at, in percent of the experts.
        #[arg(long, default_value_t = 2.9)]
        lever_size: f64,
        /// MoE layers simulated (each routed independently, as K3's 92 are).
        #[arg(long, default_value_t = 8, value_parser = |s: &str| bounded(s, 1, 92))]
        layers: usize,
        /// Tokens decoded after the warm-up.
        #[arg(long, default_value_t = 512, value_parser = |s: &str| bounded(s, 16, 1 << 16))]
        tokens: usize,
        /// Tokens decoded first to fill the cache (not counted).
        #[arg(long, default_value_t = 256, value_parser = |s: &str| bounded(s, 0, 1 << 16))]
        warm: usize,
        /// A low-bit copy's size over the record's (HOBBIT, DynaExq): 0.5 is a 2-bit copy of
        /// 4-bit MXFP4 or a 1.5-bit copy of VQ3.
        #[arg(long, default_value_t = 0.5)]
        low_ratio: f64,
        /// Seed of the simulated text.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// KDA and MLA at K3's dimensions and long contexts, beside the memory and FMA bounds, and
    /// K3's attention per token projected to 8 cores.
    Attn {
        /// Cached positions to measure MLA at (4k, 64k, 1m or a number).
        #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "4k,16k,64k,128k", value_parser = attn::context)]
        context: Vec<usize>,
        /// Queries of a prefill chunk (KDA's state pass and MLA's last chunk of the prompt).
        #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=16384))]
        chunk: u64,
        /// Threads of the pool [default: every core].
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 7, value_parser = reps)]
        reps: usize,
        /// MLA cache encodings whose decode to time besides f32 (`int8`, `bf16`).
        #[arg(long = "kv-cache", value_name = "LIST", value_delimiter = ',', default_value = "int8")]
        kv_cache: Vec<k3_attn::KvCacheType>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// What checking the trunk's checksums at load costs: xxh3 on 1 and every thread, a model's
    /// load with and without the check, and the projection for K3's trunk.
    Verify {
        /// A WASTE model to load with and without the check [default: none: the hash rates and
        /// the K3 projection only].
        #[arg(long)]
        model: Option<PathBuf>,
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 5, value_parser = reps)]
        reps: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The VQ3 encoder on a K3-shaped expert matrix: core-seconds, error, and the full K3 and K2
    /// conversions that rate implies per core count.
    Encode {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = reps)]
        reps: usize,
        /// Beam width of the code search [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 1, 256))]
        beam: Option<usize>,
        /// Rounds of re-encoding and codebook refitting [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 0, 64))]
        refine: Option<usize>,
        /// k-means iterations per stage [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 1, 1000))]
        kmeans_iters: Option<usize>,
        /// Vectors (whole rows) GPTQ's refinement rounds encode, calibrated only; a matrix's
        /// size or more refines on every row [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 1, 1 << 30))]
        refine_sample: Option<usize>,
        /// Sweeps of coordinate descent after GPTQ (calibrated only) [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 0, 64))]
        descent_rounds: Option<usize>,
        /// First-stage entries each descent step searches (16: all) [default: the converter's].
        #[arg(long, value_parser = |s: &str| bounded(s, 1, 16))]
        descent_width: Option<usize>,
        /// Encode as a calibrated conversion does, for this many sampled inputs (the converter's
        /// `--calibrate-samples`, 4096 by default): their preparation (second moments, GPTQ's
        /// factor) and GPTQ with descent are timed too. Slow: minutes a repetition.
        #[arg(long, value_parser = |s: &str| bounded(s, 1, 1 << 20))]
        calibrated: Option<usize>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// K3's vision tower on an 896 x 896 image at the release's shape (random weights): seconds
    /// per thread count, the FLOP rate, and the 8-core projection.
    Vision {
        /// Blocks timed (of 27; each costs the same, the rest is scaled).
        #[arg(long, default_value_t = 3, value_parser = |s: &str| bounded(s, 1, 27))]
        blocks: usize,
        /// Thread counts 1..=N.
        #[arg(long, default_value_t = 2, value_parser = |s: &str| bounded(s, 1, 1024))]
        threads: usize,
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = reps)]
        reps: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every k3-quant kernel on K3's expert shapes, hot and cold, next to memory bandwidth; with
    /// --threads, trunk and expert matvecs split over 1..N threads against the bandwidth.
    Kernels {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 7, value_parser = reps)]
        reps: usize,
        /// Measure thread scaling on 1..N threads instead (the decode step's products) [default:
        /// off].
        #[arg(long, value_name = "N", value_parser = |s: &str| bounded(s, 1, 1024))]
        threads: Option<usize>,
        /// Also the gate/up shape cut to these row counts (multiples of 32, comma-separated): a
        /// kernel's fixed cost per call against its rate per row [default: none].
        #[arg(long, value_name = "ROWS", value_delimiter = ',', value_parser = whole_blocks, conflicts_with = "threads")]
        rows: Vec<usize>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// A row count the fast-scan codec takes: a positive multiple of 32.
fn whole_blocks(s: &str) -> Result<usize, String> {
    let n = bounded(s, 32, 1 << 20)?;
    if n % 32 == 0 { Ok(n) } else { Err(format!("{n} rows: the fast-scan codec needs a multiple of 32")) }
}

/// Runs one benchmark; with `json`, its report goes to standard output as one object.
pub fn run(what: Bench) -> Result<()> {
    let (report, json) = match what {
        Bench::Decode(args) => return decode::task(args),
        Bench::Io { file, size_gb, record, queue_depth, reads, reps, pread, json } => {
            let o = io::Options {
                file,
                file_bytes: (size_gb * 1e9) as u64 / 4096 * 4096,
                record: record.next_multiple_of(4096),
                queue_depth,
                reads,
                reps,
                backend: if pread { k3_io::BackendChoice::Pread } else { k3_io::BackendChoice::IoUring },
            };
            (io::run(&o, json)?, json)
        }
        Bench::Attn { context, chunk, threads, reps, kv_cache, json } => {
            let threads = threads.map_or_else(rayon::current_num_threads, usize::from);
            (attn::run(&context, chunk as usize, threads, reps, &kv_cache, json), json)
        }
        Bench::CacheSim { model, prompt_file, sizes, lever_size, layers, tokens, warm, low_ratio, seed, json } => {
            let sizes = percents(&sizes)?;
            anyhow::ensure!(
                lever_size > 0.0 && lever_size < 100.0 && low_ratio > 0.0 && low_ratio < 1.0,
                "--lever-size is a percentage in (0, 100), --low-ratio a fraction in (0, 1)"
            );
            let o = cache_sim::Options {
                model,
                prompt_file,
                sizes,
                layers: layers as u32,
                warm,
                tokens,
                seed,
                lever_size: lever_size / 100.0,
                low_ratio,
            };
            (cache_sim::run(&o, json)?, json)
        }
        Bench::JsonMask { reps, json } => (json_mask::run(reps, json)?, json),
        Bench::Routing { model, prompt_file, prompt_tokens, tokens, json } => {
            let o = routing::Options { model, prompt_file, prompt_tokens, decode_tokens: tokens };
            (routing::run(&o, json)?, json)
        }
        Bench::Serve { model, clients, tokens, run } => {
            let clients = crate::thread_list(Some(&clients))?;
            let (reps, mem) = (run.reps, run.mem()?);
            (serve::run(&serve::Options { model, clients, tokens, reps, mem }, run.json)?, run.json)
        }
        Bench::PromptCache { model, prefix, question, run } => {
            let (reps, mem) = (run.reps, run.mem()?);
            (prompt_cache::run(&prompt_cache::Options { model, prefix, question, reps, mem }, run.json)?, run.json)
        }
        Bench::Verify { model, reps, json } => (verify::run(model.as_deref(), reps, json)?, json),
        Bench::Encode {
            reps,
            beam,
            refine,
            refine_sample,
            kmeans_iters,
            descent_rounds,
            descent_width,
            calibrated,
            json,
        } => {
            let d = k3_quant::encode::EncodeOptions::default();
            let opts = k3_quant::encode::EncodeOptions {
                beam: beam.unwrap_or(d.beam),
                refine_rounds: refine.unwrap_or(d.refine_rounds),
                kmeans_iters: kmeans_iters.unwrap_or(d.kmeans_iters),
                descent_rounds: descent_rounds.unwrap_or(d.descent_rounds),
                refine_sample: refine_sample.unwrap_or(d.refine_sample),
                descent_width: descent_width.unwrap_or(d.descent_width),
                ..d
            };
            (encode::run(reps, &opts, calibrated, json)?, json)
        }
        Bench::Vision { blocks, threads, reps, json } => (vision::run(blocks, threads, reps, json)?, json),
        Bench::Kernels { reps, threads: Some(n), json, .. } => (threads::run(n, reps, json), json),
        Bench::Kernels { reps, threads: None, rows, json } => (kernels::run(reps, &rows, json), json),
    };
    if json {
        println!("{report}");
    }
    Ok(())
}

/// What the benchmarks that run a whole engine take besides their own options.
#[derive(clap::Args, Debug)]
pub struct EngineRun {
    /// Repetitions, interleaved (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = reps)]
    reps: usize,
    /// Memory budget for the engine (e.g. 3G, for a model larger than memory) [default: the
    /// engine's: an expert cache of up to half the memory available].
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

impl EngineRun {
    fn mem(&self) -> Result<Option<u64>> {
        self.mem.as_deref().map(k3_engine::budget::parse_size).transpose().map_err(anyhow::Error::msg)
    }
}

/// Median of a non-empty sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Seconds taken by `f`.
pub fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The CPU's model name and the instruction sets k3's kernels choose between, for a result's
/// heading (every number is stated with the CPU it ran on).
pub fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("?");
    let mut flags: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    for (on, f) in [
        (is_x86_feature_detected!("avx2"), "avx2"),
        (is_x86_feature_detected!("fma"), "fma"),
        (is_x86_feature_detected!("avx512f"), "avx512f"),
        (is_x86_feature_detected!("avx512vnni"), "avx512_vnni"),
        (is_x86_feature_detected!("avx512bf16"), "avx512_bf16"),
        (is_x86_feature_detected!("avxvnni"), "avx_vnni"),
    ] {
        if on {
            flags.push(f);
        }
    }
    format!("{} ({})", name.trim(), flags.join(" "))
}

/// The CPU clock the kernel reports (virtual machines report the nominal clock).
pub fn cpu_mhz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()
}

/// Single-core streaming read bandwidth over `bytes` (far beyond the caches), GB/s, median of `reps`.
pub fn mem_read_gbps(bytes: usize, reps: usize) -> f64 {
    let buf: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut samples = Vec::new();
    for _ in 0..reps {
        let mut acc = [0u64; 8];
        let t = time(|| {
            for c in buf.chunks_exact(8) {
                for (a, v) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(*v);
                }
            }
        });
        std::hint::black_box(acc);
        samples.push(bytes as f64 / t / 1e9);
    }
    median(samples)
}

/// A comma-separated list of percentages in (0, 100), as fractions.
fn percents(s: &str) -> Result<Vec<f64>> {
    s.split(',')
        .map(|p| {
            let v: f64 = p.trim().parse().map_err(|_| anyhow::anyhow!("`{p}` in --sizes is not a number"))?;
            anyhow::ensure!(v > 0.0 && v < 100.0, "--sizes: {v} is not a percentage in (0, 100)");
            Ok(v / 100.0)
        })
        .collect()
}
