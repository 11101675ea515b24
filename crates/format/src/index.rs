//! The expert index: one fixed-size little-endian entry per (layer, expert) record.

use std::path::Path;

use crate::IN_PLACE_ALIGN;
use crate::error::{FormatError, Place, Result};
use crate::manifest::{ExpertLayout, Manifest, ShardInfo, check_disjoint};

/// Bytes per index entry on disk.
pub const INDEX_ENTRY_LEN: usize = 40;

/// Where one expert record lives and how to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub layer: u32,
    pub expert: u32,
    /// Index into the manifest's `shards`.
    pub shard: u16,
    /// Index into the manifest's `expert_layouts`.
    pub layout: u16,
    /// Byte offset of the record in its shard; a multiple of the alignment.
    pub offset: u64,
    /// Record length on disk (padding included); a multiple of the alignment.
    pub length: u64,
    /// xxh3-64 of all `length` bytes of the record (read in place: of the aligned read, zeros
    /// past the end of its file).
    pub xxh3: u64,
    /// Read in place from a checkpoint's file (`shard` names it; `offset` and `length` are the
    /// [`IN_PLACE_ALIGN`]-aligned read): where the expert's run starts in that read.
    pub phase: Option<u32>,
}

/// Bit of the entry's flags word marking a record read in place (its low bits are the phase).
const IN_PLACE_FLAG: u32 = 1 << 31;

impl IndexEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.layer.to_le_bytes());
        out.extend_from_slice(&self.expert.to_le_bytes());
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.layout.to_le_bytes());
        out.extend_from_slice(&self.phase.map_or(0, |p| IN_PLACE_FLAG | p).to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        out.extend_from_slice(&self.xxh3.to_le_bytes());
    }

    /// Decodes one entry; `b` must hold exactly `INDEX_ENTRY_LEN` bytes.
    pub fn decode(b: &[u8; INDEX_ENTRY_LEN]) -> Self {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        IndexEntry {
            layer: u32_at(0),
            expert: u32_at(4),
            shard: u16_at(8),
            layout: u16_at(10),
            offset: u64_at(16),
            length: u64_at(24),
            xxh3: u64_at(32),
            phase: Some(u32_at(12)).filter(|f| f & IN_PLACE_FLAG != 0).map(|f| f & !IN_PLACE_FLAG),
        }
    }

    pub fn place(&self) -> Place {
        Place::Expert { layer: self.layer, expert: self.expert }
    }
}

/// Checks the index against the manifest: sorted by (layer, expert), exactly one record for every
/// expert of every MoE layer, every record aligned, of its layout's size, inside its shard, and no
/// two records of a shard overlapping.
pub fn validate_index(path: &Path, m: &Manifest, index: &[IndexEntry]) -> Result<()> {
    let a = &m.architecture;
    let expected = a.moe_layers.len() as u64 * u64::from(a.experts);
    let bad =
        |e: &IndexEntry, reason: String| FormatError::Invalid { path: path.to_path_buf(), place: e.place(), reason };
    for w in index.windows(2) {
        if (w[0].layer, w[0].expert) >= (w[1].layer, w[1].expert) {
            return Err(bad(
                &w[1],
                format!("index is not sorted by (layer, expert): follows ({}, {})", w[0].layer, w[0].expert),
            ));
        }
    }
    let mut per_shard: Vec<Vec<(u64, u64, Place)>> = vec![Vec::new(); m.shards.len()];
    for e in index {
        if a.moe_layers.binary_search(&e.layer).is_err() || e.expert >= a.experts {
            return Err(bad(
                e,
                format!("no such expert: the model has {} experts in layers {:?}", a.experts, a.moe_layers),
            ));
        }
        let shard =
            m.shards.get(usize::from(e.shard)).ok_or_else(|| bad(e, format!("shard {} does not exist", e.shard)))?;
        let layout = m
            .expert_layouts
            .get(usize::from(e.layout))
            .ok_or_else(|| bad(e, format!("layout {} does not exist", e.layout)))?;
        if layout.in_place || e.phase.is_some() || shard.in_place() {
            check_in_place(path, e, shard, layout)?;
            continue;
        }
        if e.offset % m.alignment != 0 || e.length != layout.record_bytes {
            return Err(bad(
                e,
                format!(
                    "record at offset {} of {} bytes: must be {}-aligned and {} bytes long",
                    e.offset, e.length, m.alignment, layout.record_bytes
                ),
            ));
        }
        let end = e.offset.checked_add(e.length).filter(|&end| end <= shard.bytes).ok_or(FormatError::OutOfBounds {
            path: Path::new(&shard.file).to_path_buf(),
            place: e.place(),
            what: "the shard",
            offset: e.offset,
            end: e.offset.saturating_add(e.length),
            limit: shard.bytes,
        })?;
        per_shard[usize::from(e.shard)].push((e.offset, end, e.place()));
    }
    if index.len() as u64 != expected {
        // Sorted and in range, so a count mismatch means a record is missing; name the first.
        let mut want = a.moe_layers.iter().flat_map(|&l| (0..a.experts).map(move |x| (l, x)));
        let missing = want
            .by_ref()
            .zip(index.iter().map(|e| (e.layer, e.expert)).chain(std::iter::repeat((u32::MAX, u32::MAX))))
            .find(|(w, h)| w != h)
            .map(|(w, _)| w);
        let (layer, expert) = missing.unwrap_or((u32::MAX, u32::MAX));
        return Err(FormatError::MissingExpert { path: path.to_path_buf(), layer, expert });
    }
    for (s, spans) in m.shards.iter().zip(per_shard.iter_mut()) {
        check_disjoint(Path::new(&s.file), spans)?;
    }
    Ok(())
}

/// A record read in place: an in-place layout in a checkpoint's file, its aligned read holding
/// the run at its phase, the run inside the file, every part where its element type can be
/// viewed. (Neighbouring experts' reads may share a block: no disjointness to check.)
pub(crate) fn check_in_place(path: &Path, e: &IndexEntry, shard: &ShardInfo, layout: &ExpertLayout) -> Result<()> {
    let bad = |reason: String| FormatError::Invalid { path: path.to_path_buf(), place: e.place(), reason };
    let (Some(phase), true, true) = (e.phase, layout.in_place, shard.in_place()) else {
        return Err(bad(format!(
            "a record read in place needs an in-place layout, a checkpoint file and a phase (layout {}, file `{}`)",
            e.layout, shard.file
        )));
    };
    let phase = u64::from(phase);
    let run_end = e.offset.checked_add(phase).and_then(|s| s.checked_add(layout.payload_bytes));
    let want = (phase + layout.payload_bytes).next_multiple_of(IN_PLACE_ALIGN);
    if !e.offset.is_multiple_of(IN_PLACE_ALIGN) || phase >= IN_PLACE_ALIGN || e.length != want {
        return Err(bad(format!(
            "read at offset {} of {} bytes with the run at {phase}: must be {IN_PLACE_ALIGN}-aligned, \
             {want} bytes, the run within its first {IN_PLACE_ALIGN} bytes",
            e.offset, e.length
        )));
    }
    if run_end.is_none_or(|end| end > shard.bytes) {
        return Err(FormatError::OutOfBounds {
            path: Path::new(&shard.file).to_path_buf(),
            place: e.place(),
            what: "the checkpoint file",
            offset: e.offset + phase,
            end: run_end.unwrap_or(u64::MAX),
            limit: shard.bytes,
        });
    }
    for p in layout.matrices.iter().flat_map(|t| &t.parts) {
        if !(phase + p.offset).is_multiple_of(p.dtype.size()) {
            return Err(bad(format!(
                "part `{}` at {} is not aligned for {}",
                p.name,
                e.offset + phase + p.offset,
                p.dtype.name()
            )));
        }
    }
    Ok(())
}
