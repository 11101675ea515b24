//! Experts read in place: where a conversion keeps the experts byte for byte, the model's index
//! points into the checkpoint's own safetensors files instead of a copy (K3: 1.45 TB not
//! written). Each expert must lie in one file as one run of bytes (its tensors back to back, as
//! every release we know stores them; a little of something else between them is read along),
//! each tensor where its element type can be viewed; an expert that does not (its tensors cut
//! across two shard files, say) is copied into the model's one shard, the rest stay in place.
//! The engine reads an expert as the aligned read around its run, so it still arrives as one
//! unit.

use std::collections::HashMap;
use std::path::Path;

use k3_engine::names::{EXPERT_MATRICES, expert as expert_name};
use k3_format::{ExpertLayout, IN_PLACE_ALIGN, PartEntry, ShardInfo, TensorEntry};
use xxhash_rust::xxh3::Xxh3;

use super::ConvertError;
use super::plan::{LayerPlan, SourceExperts, expert_sources};
use super::source::Source;

/// An expert's run may hold at most this share more than its own tensors' bytes (what lies
/// between them is read along with them).
const MAX_RUN_OVERHEAD: u64 = 8;

/// Where every expert is read from.
#[derive(Debug)]
pub(super) struct InPlace {
    /// The checkpoint files that hold experts, as they are now (size, modification time).
    pub files: Vec<ShardInfo>,
    /// Each of `files` as the source's file index.
    pub sources: Vec<usize>,
    /// Numbered after the copied layouts (which the experts copied use).
    pub layouts: Vec<ExpertLayout>,
    /// Per MoE layer (in order), per expert; `None`: copied.
    pub runs: Vec<Vec<Option<Run>>>,
    /// How many experts are copied, and why the first of them is.
    pub copied: usize,
    pub why_copied: Option<String>,
    /// The id of the first in-place layout: the number of copied layouts.
    first_layout: u16,
}

impl InPlace {
    /// The layout a record read in place names (after the copied layouts).
    pub fn layout_id(&self, r: &Run) -> u16 {
        self.first_layout + r.layout
    }

    /// The in-place layout of `r`.
    pub fn layout(&self, r: &Run) -> &ExpertLayout {
        &self.layouts[usize::from(r.layout)]
    }
}

/// One expert's run of bytes in a checkpoint file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    /// Index into [`InPlace::files`].
    pub file: u16,
    pub start: u64,
    pub layout: u16,
}

/// The aligned read of one expert read in place: where it starts, its length, where the run
/// starts in it, and the checksum of its bytes (zeros past the file's end).
pub(super) struct Read {
    pub offset: u64,
    pub length: u64,
    pub phase: u32,
    pub xxh3: u64,
}

/// The plan to read every expert in place, or why they cannot be (then they are copied).
pub(super) fn plan(
    src: &Source,
    layers: &[LayerPlan],
    copied: &[ExpertLayout],
    experts: u32,
) -> Result<Result<InPlace, String>, ConvertError> {
    if !src.is_checkpoint() {
        return Ok(Err("the source is a WASTE model, not a checkpoint".into()));
    }
    if let Some(p) = layers.iter().find(|p| p.target.is_some() || matches!(p.kind, SourceExperts::Int4 { .. })) {
        return Ok(Err(format!("layer {}'s experts are re-encoded, not kept as stored", p.layer)));
    }
    let first_layout = u16::try_from(copied.len()).map_err(|_| too_many("expert layouts"))?;
    let mut ip = InPlace {
        files: Vec::new(),
        sources: Vec::new(),
        layouts: Vec::new(),
        runs: Vec::new(),
        copied: 0,
        why_copied: None,
        first_layout,
    };
    let mut file_ids: HashMap<usize, u16> = HashMap::new();
    let mut layout_ids: HashMap<(u16, Vec<u64>, u64), u16> = HashMap::new();
    for p in layers {
        let mut runs = Vec::with_capacity(experts as usize);
        for expert in 0..experts {
            let (file, start, offsets, run) = match expert_run(src, p, expert)? {
                Ok(r) => r,
                Err(why) => {
                    ip.copied += 1;
                    ip.why_copied.get_or_insert_with(|| format!("layer {} expert {expert}: {why}", p.layer));
                    runs.push(None);
                    continue;
                }
            };
            let file = match file_ids.get(&file) {
                Some(&f) => f,
                None => {
                    let f = u16::try_from(ip.files.len()).map_err(|_| too_many("checkpoint files"))?;
                    ip.files.push(identity(src.file_at(file).0)?);
                    ip.sources.push(file);
                    file_ids.insert(file, f);
                    f
                }
            };
            let key = (p.layout, offsets, run);
            let layout = match layout_ids.get(&key) {
                Some(&l) => l,
                None => {
                    let l = u16::try_from(ip.layouts.len())
                        .ok()
                        .filter(|l| l.checked_add(first_layout).is_some())
                        .ok_or_else(|| too_many("expert layouts"))?;
                    let Some(built) = layout(&copied[usize::from(p.layout)], &key.1, run) else {
                        return Ok(Err(format!(
                            "layer {}'s experts have another number of tensors than their layout",
                            p.layer
                        )));
                    };
                    ip.layouts.push(built);
                    layout_ids.insert(key, l);
                    l
                }
            };
            runs.push(Some(Run { file, start, layout }));
        }
        ip.runs.push(runs);
    }
    if ip.files.is_empty() {
        return Ok(Err(ip.why_copied.unwrap_or_else(|| "there are no experts".into())));
    }
    Ok(Ok(ip))
}

fn too_many(what: &str) -> ConvertError {
    ConvertError::Unsupported(format!("more than {} {what} for experts read in place", u16::MAX))
}

/// An expert's (source file, run start, each part's offset in the run, run length), or why it
/// cannot be read in place.
type ExpertRun = (usize, u64, Vec<u64>, u64);

fn expert_run(src: &Source, p: &LayerPlan, expert: u32) -> Result<Result<ExpertRun, String>, ConvertError> {
    let mut parts = Vec::new();
    for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
        for (name, dtype, shape) in expert_sources(p.kind, &expert_name(p.layer, expert, m), shape) {
            let t = src.check(&name, dtype, &shape)?;
            parts.push((src.location(t), (dtype.bitsize() as u64).div_ceil(8).max(1), name));
        }
    }
    let file = parts[0].0.0;
    if let Some((_, _, name)) = parts.iter().find(|((f, ..), ..)| *f != file) {
        return Ok(Err(format!("its tensors are in more than one file (`{name}`)")));
    }
    let start = parts.iter().map(|((_, s, _), ..)| *s).min().unwrap_or(0);
    let end = parts.iter().map(|((_, _, e), ..)| *e).max().unwrap_or(0);
    let own: u64 = parts.iter().map(|((_, s, e), ..)| e - s).sum();
    if end - start > own + own / MAX_RUN_OVERHEAD {
        return Ok(Err(format!("its tensors are spread over {} bytes for {own} of their own", end - start)));
    }
    if let Some((_, _, name)) = parts.iter().find(|((_, s, _), size, _)| s % size != 0) {
        return Ok(Err(format!("`{name}` is not aligned for its element type in its file")));
    }
    Ok(Ok((file, start, parts.iter().map(|((_, s, _), ..)| s - start).collect(), end - start)))
}

/// The copied layout's matrices with each part at its offset in the run (`None` unless there is
/// one offset a part).
fn layout(copied: &ExpertLayout, offsets: &[u64], run: u64) -> Option<ExpertLayout> {
    let parts: usize = copied.matrices.iter().map(|m| m.parts.len()).sum();
    if parts != offsets.len() {
        return None;
    }
    let mut at = offsets.iter().copied();
    let matrices = copied
        .matrices
        .iter()
        .map(|m| TensorEntry {
            parts: m.parts.iter().zip(at.by_ref()).map(|(p, offset)| PartEntry { offset, ..p.clone() }).collect(),
            ..m.clone()
        })
        .collect();
    Some(ExpertLayout::in_place(matrices, run))
}

/// A checkpoint file as it is now: its real path (links resolved), size and modification time.
fn identity(path: &Path) -> Result<ShardInfo, ConvertError> {
    let real = std::fs::canonicalize(path).map_err(|e| ConvertError::io(path, e))?;
    let meta = std::fs::metadata(&real).map_err(|e| ConvertError::io(&real, e))?;
    let file = real.to_str().ok_or_else(|| ConvertError::Source {
        path: real.clone(),
        reason: "its path is not UTF-8, which a model's header cannot name".into(),
    })?;
    Ok(ShardInfo { file: file.to_string(), bytes: meta.len(), checkpoint_mtime_ns: Some(k3_format::mtime_ns(&meta)) })
}

/// The aligned read of the run of `layout`'s `payload_bytes` starting at `start` in `bytes` (a
/// checkpoint file), and its checksum.
pub(super) fn read(bytes: &[u8], start: u64, layout: &ExpertLayout) -> Read {
    let offset = start / IN_PLACE_ALIGN * IN_PLACE_ALIGN;
    let phase = start - offset;
    let length = (phase + layout.payload_bytes).next_multiple_of(IN_PLACE_ALIGN);
    let end = (offset + length).min(bytes.len() as u64);
    let mut h = Xxh3::new();
    h.update(&bytes[offset as usize..end as usize]);
    h.update(&vec![0u8; (offset + length - end) as usize]);
    Read { offset, length, phase: phase as u32, xxh3: h.digest() }
}
