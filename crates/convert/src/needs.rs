//! What a conversion will write, where, and whether it fits, known from the plan before a byte is
//! written: the trunk as its encodings store it, the experts it copies striped over their
//! directories, the header; against the free space of each filesystem they land on (what an
//! interrupted run already wrote is counted as written). A conversion that cannot fit is refused
//! with the numbers instead of failing part way with "No space left on device".

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use k3_format::{PART_ALIGN, shard_file_name};
use safetensors::Dtype as StDtype;

use super::plan::Plan;
use super::source::Source;
use super::{ConvertError, ConvertOptions, encode};
use crate::tensors::Storage;

/// A header's bytes beyond its index entries and embedded files: a bound per trunk tensor's
/// manifest entry, and for the rest of the manifest.
const HEADER_TENSOR: u64 = 1024;
/// A journal line's bytes, a bound (a trunk tensor's names its parts).
const JOURNAL_LINE: u64 = 1024;
const HEADER_SLACK: u64 = 1 << 20;

/// One filesystem the conversion writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The directories on it that receive files.
    pub dirs: Vec<PathBuf>,
    /// Bytes still to write there.
    pub bytes: u64,
    /// Bytes free there for this user.
    pub free: u64,
}

/// What a conversion needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Needs {
    /// The trunk file as its encodings store it.
    pub trunk_bytes: u64,
    /// Expert records copied into the model's shards (0 when they are read in place).
    pub expert_bytes: u64,
    /// Bytes of the checkpoint the conversion reads (the trunk, and every expert: copied or
    /// checksummed in place).
    pub read_bytes: u64,
    pub targets: Vec<Target>,
    /// A measured rate of reading the checkpoint (bytes a second, a sample of its largest file;
    /// the page cache may flatter it), for the time a conversion takes: a dry run's only.
    pub read_rate: Option<f64>,
}

impl Needs {
    /// The first filesystem the conversion does not fit on.
    pub fn short(&self) -> Option<&Target> {
        self.targets.iter().find(|t| t.bytes > t.free)
    }

    /// Seconds to read what the conversion reads at the measured rate.
    pub fn read_seconds(&self) -> Option<f64> {
        self.read_rate.map(|r| self.read_bytes as f64 / r)
    }
}

/// What `plan` will write under `opts`, and where.
pub(super) fn needs(plan: &Plan, src: &Source, opts: &ConvertOptions) -> Result<Needs, ConvertError> {
    let trunk_bytes = trunk_bytes(plan, src, opts)?;
    let trunk_read: u64 = plan.trunk_names.iter().map(|n| src.get(n).map_or(0, |t| src.bytes(t).len() as u64)).sum();
    let experts = u64::from(plan.arch.experts);
    let records = plan.arch.moe_layers.len() as u64 * experts;
    // Files still to be written, by directory: (directory, file, bytes in the finished model).
    let mut files: Vec<(PathBuf, PathBuf, u64)> =
        vec![(opts.out_dir.clone(), opts.out_dir.join(k3_format::TRUNK_FILE), trunk_bytes)];
    let embedded: u64 = super::plan::EMBEDDED_FILES
        .iter()
        .filter_map(|f| std::fs::metadata(src.path_of(f)).ok())
        .map(|m| m.len())
        .sum();
    // The journal lives beside the header while the conversion runs: a line an item.
    let items = records + plan.trunk_names.len() as u64;
    let header = 40 * records + HEADER_TENSOR * plan.trunk_names.len() as u64 + embedded + HEADER_SLACK;
    files.push((opts.out_dir.clone(), opts.out_dir.join(k3_format::JOURNAL_FILE), JOURNAL_LINE * items));
    files.push((opts.out_dir.clone(), opts.out_dir.join(k3_format::HEADER_FILE), header));
    // Per expert: Some(run bytes read in place) or None (its record copied).
    let placed: Vec<Vec<Option<u64>>> = match &plan.in_place {
        Ok(ip) => ip
            .runs
            .iter()
            .map(|rs| rs.iter().map(|r| r.as_ref().map(|r| ip.layout(r).payload_bytes)).collect())
            .collect(),
        Err(_) => plan.layers.iter().map(|_| vec![None; experts as usize]).collect(),
    };
    // Copied records stripe over the shards as the writer puts them (the one shard beside
    // experts read in place).
    let shards = match &plan.in_place {
        Ok(_) => 1,
        Err(_) => u64::from(opts.shards.max(1)),
    };
    let (mut per_shard, mut n, mut read_experts) = (vec![0u64; shards as usize], 0u64, 0u64);
    for (p, runs) in plan.layers.iter().zip(&placed) {
        let rb = plan.layouts[usize::from(p.layout)].record_bytes;
        // A copied expert reads what any expert of its layer reads in the checkpoint.
        let source = expert_source_bytes(src, p);
        for r in runs {
            match r {
                Some(run) => read_experts += run,
                None => {
                    per_shard[(n % shards) as usize] += rb;
                    read_experts += source;
                    n += 1;
                }
            }
        }
    }
    for (i, bytes) in per_shard.iter().enumerate().filter(|(_, b)| **b > 0) {
        let dir = match opts.shard_dirs.len() {
            0 => opts.out_dir.clone(),
            k => opts.shard_dirs[i % k].clone(),
        };
        files.push((dir.clone(), dir.join(shard_file_name(i)), *bytes));
    }
    let expert_bytes = per_shard.iter().sum();
    Ok(Needs {
        trunk_bytes,
        expert_bytes,
        read_bytes: trunk_read + read_experts,
        targets: targets(&files)?,
        // Sampled for the plan a dry run shows; a conversion that writes (after its caller's dry
        // run) does not read the sample again.
        read_rate: if opts.dry_run { read_rate(src) } else { None },
    })
}

/// The trunk's bytes as its encodings store them (parts padded to [`PART_ALIGN`]).
fn trunk_bytes(plan: &Plan, src: &Source, opts: &ConvertOptions) -> Result<u64, ConvertError> {
    let mut total = 0;
    for name in &plan.trunk_names {
        let t = src.get(name)?;
        let storage = plan.table.get(name).map_or(Storage::Exact, |e| e.storage);
        let enc = match t.dtype {
            StDtype::F8_E4M3 if encode::keeps_fp8(opts.trunk, storage) => encode::fp8_encoding(plan.fp8_block),
            StDtype::F8_E4M3 => {
                encode::trunk_encoding(name, StDtype::F32, &t.shape, encode::widened_fp8(opts.trunk), storage)?
            }
            d => encode::trunk_encoding(name, d, &t.shape, opts.trunk, storage)?,
        };
        let parts = enc.parts(&t.shape).map_err(|e| ConvertError::Unsupported(format!("`{name}`: {e}")))?;
        total += parts.iter().map(|p| p.bytes() + PART_ALIGN).sum::<u64>();
    }
    Ok(total)
}

/// One expert's bytes in the checkpoint (its first expert's tensors; they are all alike).
fn expert_source_bytes(src: &Source, p: &super::plan::LayerPlan) -> u64 {
    use k3_engine::names::{EXPERT_MATRICES, expert as expert_name};
    let mut total = 0;
    for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
        for (name, ..) in super::plan::expert_sources(p.kind, &expert_name(p.layer, 0, m), shape) {
            total += src.get(&name).map_or(0, |t| src.bytes(t).len() as u64);
        }
    }
    total
}

/// The files grouped by the filesystem they land on: bytes still to write (what an interrupted
/// run left counts as written) against the space free there.
fn targets(files: &[(PathBuf, PathBuf, u64)]) -> Result<Vec<Target>, ConvertError> {
    let mut by_fs: BTreeMap<u64, Target> = BTreeMap::new();
    for (dir, file, bytes) in files {
        let existing = std::fs::metadata(file).map_or(0, |m| m.len());
        let (dev, free) = filesystem(dir)?;
        let t = by_fs.entry(dev).or_insert_with(|| Target { dirs: Vec::new(), bytes: 0, free });
        if !t.dirs.contains(dir) {
            t.dirs.push(dir.clone());
        }
        t.bytes += bytes.saturating_sub(existing);
    }
    Ok(by_fs.into_values().collect())
}

/// The filesystem `dir` is (or will be) on: its device and the bytes free there for this user
/// (asked of the nearest existing ancestor: nothing is created to ask).
fn filesystem(dir: &Path) -> Result<(u64, u64), ConvertError> {
    let at = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("."));
    let dev = std::fs::metadata(at).map_err(|e| ConvertError::io(at, e))?.dev();
    let s = rustix::fs::statvfs(at).map_err(|e| ConvertError::io(at, e.into()))?;
    Ok((dev, s.f_bavail.saturating_mul(s.f_frsize)))
}

/// A sample of reading the checkpoint: up to 256 MiB of its largest file, timed.
fn read_rate(src: &Source) -> Option<f64> {
    let bytes = (0..src.file_count()).map(|i| src.file_at(i).1).max_by_key(|b| b.len())?;
    let sample = &bytes[..bytes.len().min(256 << 20)];
    if sample.len() < 1 << 20 {
        return None;
    }
    let t = Instant::now();
    let sum = sample.chunks(4096).fold(0u64, |acc, page| acc.wrapping_add(u64::from(page[0])));
    std::hint::black_box(sum);
    Some(sample.len() as f64 / t.elapsed().as_secs_f64().max(1e-6))
}
