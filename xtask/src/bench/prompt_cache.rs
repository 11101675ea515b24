//! `cargo xtask bench prompt-cache`: the first token after a long shared prefix (a system
//! prompt) and a short question, computed, resumed from a state kept in RAM, restored from disk
//! (O_DIRECT: the page cache plays no part) and restored by a store opened afresh (a restart);
//! the state's bytes per token; the restore's read rate against the drive's ceiling measured in
//! the same run by `dd iflag=direct` over the model's largest file. Repetitions interleaved,
//! medians.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use k3_engine::{Engine, EngineOptions, Model, Session};
use k3_generate::cache::disk::DiskTier;
use k3_io::whole::{WholeRead, read_file};
use serde_json::{Value, json};

use super::median;

pub struct Options {
    pub model: PathBuf,
    pub prefix: usize,
    pub question: usize,
    pub reps: usize,
    pub mem: Option<u64>,
}

fn ids(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = k3_quant::rng::XorShift::new(seed);
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// Runs `tokens` after `session`'s state; seconds to the first token (the argmax of the last
/// logits).
fn first_token(engine: &Engine<'_>, mut session: Session, tokens: &[u32], t0: Instant) -> Result<f64> {
    let mut last = Vec::new();
    for c in tokens.chunks(engine.prefill_chunk().max(1)) {
        last = engine.forward_last(&mut session, c)?;
    }
    let _id = last.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
    Ok(t0.elapsed().as_secs_f64())
}

/// The drive's O_DIRECT read rate over `file` (bytes/s), by `dd`.
fn dd_ceiling(file: &Path) -> Result<f64> {
    let len = std::fs::metadata(file)?.len();
    let blocks = len / (4 << 20);
    let t0 = Instant::now();
    let out = Command::new("dd")
        .arg(format!("if={}", file.display()))
        .args(["of=/dev/null", "bs=4M", "iflag=direct", &format!("count={blocks}")])
        .output()
        .context("running dd")?;
    if !out.status.success() {
        bail!("dd failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((blocks * (4 << 20)) as f64 / t0.elapsed().as_secs_f64())
}

/// Read rate of `path` (bytes/s) by `how`, the page cache emptied of it first.
fn read_rate(path: &Path, how: WholeRead) -> Result<f64> {
    let f = std::fs::File::open(path)?;
    // SAFETY: posix_fadvise only reads its arguments; the descriptor is open for the call.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let t0 = Instant::now();
    let n = read_file(path, how)?.len();
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    let model = Model::open(&o.model)?;
    let context = (o.prefix + o.question + 64) as u64;
    let engine = Engine::load_with(&model, EngineOptions { mem_budget: o.mem, context, ..EngineOptions::default() })?;
    let prefix = ids(engine.vocab(), o.prefix, 1);
    let dir = tempfile::tempdir_in(o.model.parent().unwrap_or(Path::new(".")))?;
    let mut s = engine.session();
    for c in prefix.chunks(engine.prefill_chunk().max(1)) {
        engine.forward_last(&mut s, c)?;
    }
    let kept = engine.keep(&s)?;
    {
        let mut store = DiskTier::open(dir.path(), u64::MAX, &engine)?;
        store.save(&engine, 0, &kept, None);
        store.settle(std::time::Duration::from_secs(600));
        if store.stats().entries != 1 {
            bail!("the state was not written: {:?}", store.take_warnings());
        }
    }
    let file = std::fs::read_dir(dir.path())?.next().context("a state file")??.path();
    let state_bytes = std::fs::metadata(&file)?.len();
    let (c, r, d, rs, restore_rate) = first_tokens(&engine, o, &prefix, &kept, dir.path())?;
    let big = largest_file(&o.model)?;
    let (ceil, direct, buffered, check) = read_rates(&engine, o.reps, &file, &big)?;
    let report = json!({
        "model": o.model.display().to_string(), "prefix_tokens": o.prefix, "question_tokens": o.question,
        "reps": o.reps, "state_bytes": state_bytes, "state_bytes_per_token": state_bytes as f64 / o.prefix as f64,
        "first_token_s": {"computed": c, "ram": r, "disk": d, "restart": rs},
        "vs_computed": {"ram": r / c, "disk": d / c, "restart": rs / c},
        "restore_bytes_per_s": restore_rate, "drive_ceiling_bytes_per_s": ceil,
        "restore_vs_ceiling": restore_rate / ceil,
        "large_file": {"bytes": std::fs::metadata(&big)?.len(), "direct_bytes_per_s": direct,
                       "buffered_cold_bytes_per_s": buffered, "direct_vs_ceiling": direct / ceil},
        "check_bytes_per_s": check,
    });
    if !json_out {
        println!(
            "{}: a {}-token prefix and a {}-token question ({} reps, medians)",
            o.model.display(),
            o.prefix,
            o.question,
            o.reps
        );
        println!(
            "  state: {:.1} MB ({:.0} bytes a token of context)",
            state_bytes as f64 / 1e6,
            state_bytes as f64 / o.prefix as f64
        );
        for (name, t) in [("computed", c), ("from RAM", r), ("from disk", d), ("after a restart", rs)] {
            println!("  first token {name:>16}: {:>9.1} ms ({:.3}x computed)", t * 1e3, t / c);
        }
        println!(
            "  restore (read and check) of the state file: {:.2} GB/s; the drive's O_DIRECT ceiling by dd over {}: {:.2} GB/s",
            restore_rate / 1e9,
            big.display(),
            ceil / 1e9
        );
        println!(
            "  the restore's read over that file: {:.2} GB/s ({:.2}x the ceiling; buffered from a cold page cache {:.2} GB/s); the check in memory: {:.2} GB/s",
            direct / 1e9,
            direct / ceil,
            buffered / 1e9,
            check / 1e9
        );
    }
    Ok(report)
}

/// Medians of the first token computed, from RAM, from disk and after a restart, and of the
/// restore's rate (bytes/s), over `o.reps` interleaved repetitions, each with its own question.
fn first_tokens(
    engine: &Engine<'_>,
    o: &Options,
    prefix: &[u32],
    kept: &Session,
    dir: &Path,
) -> Result<(f64, f64, f64, f64, f64)> {
    let mut store = DiskTier::open(dir, u64::MAX, engine)?;
    let (mut computed, mut ram, mut disk, mut restart, mut rates) = (vec![], vec![], vec![], vec![], vec![]);
    for rep in 0..o.reps {
        eprintln!("  rep {rep}");
        let q = ids(engine.vocab(), o.question, 100 + rep as u64);
        let all: Vec<u32> = prefix.iter().chain(&q).copied().collect();
        computed.push(first_token(engine, engine.session(), &all, Instant::now())?);
        let t0 = Instant::now();
        ram.push(first_token(engine, engine.fork(kept)?, &q, t0)?);
        let t0 = Instant::now();
        let before = store.stats();
        let saved = store.restore(engine, 0, &all).context("restored from disk")?;
        let after = store.stats();
        rates.push((after.bytes_read - before.bytes_read) as f64 / (after.read_seconds - before.read_seconds));
        disk.push(first_token(engine, saved.session, &q, t0)?);
        let t0 = Instant::now();
        let mut fresh = DiskTier::open(dir, u64::MAX, engine)?;
        let saved = fresh.restore(engine, 0, &all).context("restored after a restart")?;
        restart.push(first_token(engine, saved.session, &q, t0)?);
    }
    Ok((median(computed), median(ram), median(disk), median(restart), median(rates)))
}

/// The model's largest file, for the drive's ceiling.
fn largest_file(model: &Path) -> Result<PathBuf> {
    ["experts-00000.waste", "trunk.waste"]
        .iter()
        .map(|n| model.join(n))
        .filter(|p| p.exists())
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .context("the model's largest file, for the drive's ceiling")
}

/// Medians of dd's O_DIRECT rate over `big`, the restore's read over it (direct, and buffered
/// from a cold page cache), and the check of `file`'s state in memory (bytes/s). The restore's
/// read is measured over a file as large as K3's states: the small state file fits in a
/// throttle's first burst.
fn read_rates(engine: &Engine<'_>, reps: usize, file: &Path, big: &Path) -> Result<(f64, f64, f64, f64)> {
    let (mut ceiling, mut direct, mut buffered, mut check) = (vec![], vec![], vec![], vec![]);
    let bytes = std::fs::read(file)?;
    for _ in 0..reps {
        ceiling.push(dd_ceiling(big)?);
        direct.push(read_rate(big, WholeRead::Direct)?);
        buffered.push(read_rate(big, WholeRead::Buffered)?);
        let t0 = Instant::now();
        engine.read_state_file(&bytes)?;
        check.push(bytes.len() as f64 / t0.elapsed().as_secs_f64());
    }
    Ok((median(ceiling), median(direct), median(buffered), median(check)))
}
