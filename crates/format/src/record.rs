//! Expert records: a 64-byte header, then the parts of every matrix at the offsets its layout
//! gives, zero padding up to the alignment. One record is one aligned read. A record read in
//! place from a checkpoint's file is the aligned read around the expert's run of bytes there.

use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::RECORD_HEADER_LEN;
use crate::error::{FormatError, Result};
use crate::index::IndexEntry;
use crate::manifest::ExpertLayout;
use crate::view::{ExpertView, TensorView};

pub const RECORD_MAGIC: [u8; 8] = *b"K3EXPERT";

/// Writes the record for `(layer, expert)` into `out` (cleared first): header, `parts` (in layout
/// order: matrix by matrix, part by part) and zero padding to `layout.record_bytes`.
pub fn encode_record(
    layer: u32,
    expert: u32,
    layout_id: u16,
    layout: &ExpertLayout,
    parts: &[&[u8]],
    out: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let want: Vec<_> = layout.matrices.iter().flat_map(|m| m.parts.iter().map(move |p| (m, p))).collect();
    if want.len() != parts.len() {
        return Err(format!("layout {layout_id} has {} parts, {} were given", want.len(), parts.len()));
    }
    out.clear();
    out.resize(layout.record_bytes as usize, 0);
    out[..8].copy_from_slice(&RECORD_MAGIC);
    out[8..12].copy_from_slice(&layer.to_le_bytes());
    out[12..16].copy_from_slice(&expert.to_le_bytes());
    out[16..18].copy_from_slice(&layout_id.to_le_bytes());
    out[24..32].copy_from_slice(&layout.payload_bytes.to_le_bytes());
    for ((m, p), bytes) in want.into_iter().zip(parts) {
        if bytes.len() as u64 != p.len {
            return Err(format!("{}.{}: {} bytes given, {} expected", m.name, p.name, bytes.len(), p.len));
        }
        out[p.offset as usize..(p.offset + p.len) as usize].copy_from_slice(bytes);
    }
    Ok(())
}

/// Checks a record read from disk against its index entry (checksum when `verify`, then the header)
/// and returns views of its matrices. `path` names the shard for messages.
pub fn parse_record<'a>(
    path: &Path,
    bytes: &'a [u8],
    entry: &IndexEntry,
    layout: &'a ExpertLayout,
    verify: bool,
) -> Result<ExpertView<'a>> {
    let invalid = |reason: String| FormatError::Invalid { path: path.to_path_buf(), place: entry.place(), reason };
    if bytes.len() as u64 != entry.length {
        return Err(invalid(format!("record buffer holds {} bytes, the index says {}", bytes.len(), entry.length)));
    }
    check_sum(path, bytes, entry, verify)?;
    if let Some(phase) = entry.phase {
        // Read in place: no record header; the index (checked against the layout when the
        // model was opened) says where the run starts.
        let run = &bytes[phase as usize..];
        let matrices = layout.matrices.iter().map(|m| TensorView::new(m, run, 0)).collect();
        return Ok(ExpertView { layer: entry.layer, expert: entry.expert, matrices });
    }
    if bytes.len() < RECORD_HEADER_LEN as usize || bytes[..8] != RECORD_MAGIC {
        return Err(invalid(format!("record at offset {} does not start with the record magic", entry.offset)));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let (layer, expert) = (u32_at(8), u32_at(12));
    let layout_id = u16::from_le_bytes([bytes[16], bytes[17]]);
    let payload = u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
    if (layer, expert, layout_id, payload) != (entry.layer, entry.expert, entry.layout, layout.payload_bytes) {
        return Err(invalid(format!(
            "record at offset {} claims (layer {layer}, expert {expert}, layout {layout_id}, {payload} payload bytes); \
             the index expects (layer {}, expert {}, layout {}, {} bytes)",
            entry.offset, entry.layer, entry.expert, entry.layout, layout.payload_bytes
        )));
    }
    let matrices = layout.matrices.iter().map(|m| TensorView::new(m, bytes, 0)).collect();
    Ok(ExpertView { layer, expert, matrices })
}

/// The record's checksum against its index entry, when `verify`.
fn check_sum(path: &Path, bytes: &[u8], entry: &IndexEntry, verify: bool) -> Result<()> {
    let computed = if verify { xxh3_64(bytes) } else { return Ok(()) };
    if computed != entry.xxh3 {
        return Err(FormatError::Checksum {
            path: path.to_path_buf(),
            place: entry.place(),
            offset: entry.offset,
            len: entry.length,
            stored: entry.xxh3,
            computed,
        });
    }
    Ok(())
}
