//! The JSON manifest inside the header: what the model is, where every tensor and record lives.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::encoding::{CodebookSource, Dtype, Encoding};
use crate::error::{FormatError, Place, Result};
use crate::{IN_PLACE_ALIGN, PART_ALIGN, RECORD_HEADER_LEN};

/// A u64 written as a `"0x…"` hex string, so JSON readers without 64-bit integers keep it exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hex64(pub u64);

impl Serialize for Hex64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:#018x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Hex64 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let digits = s.strip_prefix("0x").ok_or_else(|| serde::de::Error::custom("checksum must start with 0x"))?;
        u64::from_str_radix(digits, 16).map(Hex64).map_err(serde::de::Error::custom)
    }
}

/// Model facts a reader needs without parsing the architecture-specific config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Architecture {
    /// `kimi_k3`, `kimi_linear`, … (the engine maps it to a forward pass).
    pub name: String,
    pub layers: u32,
    pub hidden: u64,
    pub vocab: u64,
    /// Routed experts per MoE layer.
    pub experts: u32,
    pub experts_per_token: u32,
    /// Layers (0-based) that have routed experts; each has exactly `experts` records.
    pub moe_layers: Vec<u32>,
}

/// One stored part of a tensor. `offset` is absolute in the trunk file for trunk tensors and
/// relative to the record start for expert matrices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub offset: u64,
    pub len: u64,
}

/// A tensor: its logical shape, its encoding, and the parts that encoding stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub encoding: Encoding,
    pub shape: Vec<u64>,
    pub parts: Vec<PartEntry>,
}

/// A trunk tensor: its parts lie in `[offset, offset + len)` of the trunk file, checksummed whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrunkTensor {
    #[serde(flatten)]
    pub tensor: TensorEntry,
    pub offset: u64,
    pub len: u64,
    pub xxh3: Hex64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrunkInfo {
    pub file: String,
    pub bytes: u64,
    pub tensors: Vec<TrunkTensor>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub file: String,
    pub bytes: u64,
    /// Set for a checkpoint's own file whose experts are read in place (`file` is then its
    /// absolute path, `bytes` its size): its modification time when converted, in nanoseconds
    /// since the epoch. A file of another size or time is refused when the model is opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_mtime_ns: Option<u64>,
}

impl ShardInfo {
    /// A checkpoint's file read in place (not one of the model's own shards).
    pub fn in_place(&self) -> bool {
        self.checkpoint_mtime_ns.is_some()
    }
}

/// The layout shared by all expert records that name it: the matrices of one expert, with part
/// offsets relative to the record start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayout {
    pub matrices: Vec<TensorEntry>,
    /// Bytes of header + parts, before padding.
    pub payload_bytes: u64,
    /// Bytes on disk: `payload_bytes` rounded up to the alignment.
    pub record_bytes: u64,
    /// Records read in place from a checkpoint's file ([`ShardInfo::in_place`]): no record
    /// header; part offsets relative to the expert's first byte; `payload_bytes` the run of bytes
    /// from its first part's start to its last part's end; `record_bytes` the longest read that
    /// run can need ([`IN_PLACE_ALIGN`]-aligned reads starting up to `IN_PLACE_ALIGN - 1` bytes
    /// before it). Each record says where the run starts in its read (`IndexEntry::phase`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_place: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A file embedded in the header (`config.json`, tokenizer files), stored byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobInfo {
    pub name: String,
    /// Relative to the start of the header's blob section.
    pub offset: u64,
    pub len: u64,
    pub xxh3: Hex64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub architecture: Architecture,
    /// Alignment of expert records (offset and length), a power of two and a multiple of 4096.
    pub alignment: u64,
    /// Encoding of each tensor class, for people (`{"experts": "mxfp4", "trunk": "bf16"}`).
    pub encodings: std::collections::BTreeMap<String, String>,
    /// Source checkpoint, converter version, options: free-form JSON.
    pub provenance: serde_json::Value,
    pub trunk: TrunkInfo,
    pub shards: Vec<ShardInfo>,
    pub expert_layouts: Vec<ExpertLayout>,
    pub blobs: Vec<BlobInfo>,
}

/// Checks that the spans `(start, end, place)` do not overlap; names the first overlapping pair.
pub(crate) fn check_disjoint(path: &Path, spans: &mut [(u64, u64, Place)]) -> Result<()> {
    spans.sort_by_key(|s| (s.0, s.1));
    for w in spans.windows(2) {
        let ((a0, a1, a), (b0, b1, b)) = (&w[0], &w[1]);
        if b0 < a1 {
            return Err(FormatError::Overlap {
                path: path.to_path_buf(),
                a: a.clone(),
                a_start: *a0,
                a_end: *a1,
                b: b.clone(),
                b_start: *b0,
                b_end: *b1,
            });
        }
    }
    Ok(())
}

/// Checks that `parts` are exactly what `encoding` stores for `shape`, each aligned and inside
/// `[lo, hi)`, and disjoint. Returns the end of the last part.
/// `part_aligned`: every part [`PART_ALIGN`]-aligned (in the trunk and our own records; a part
/// read in place is where its checkpoint put it, checked against its element size per record).
pub(crate) fn check_tensor_parts(
    path: &Path,
    place: &Place,
    t: &TensorEntry,
    lo: u64,
    hi: u64,
    part_aligned: bool,
) -> Result<u64> {
    let invalid = |reason: String| FormatError::Invalid { path: path.to_path_buf(), place: place.clone(), reason };
    let want = t.encoding.parts(&t.shape).map_err(invalid)?;
    if want.len() != t.parts.len() {
        return Err(invalid(format!(
            "{} stores {} parts, the manifest lists {}",
            t.encoding.label(),
            want.len(),
            t.parts.len()
        )));
    }
    let mut spans = Vec::with_capacity(want.len());
    let mut end = lo;
    for (w, p) in want.iter().zip(&t.parts) {
        if p.name != w.name || p.dtype != w.dtype || p.shape != w.shape || p.len != w.bytes() {
            return Err(invalid(format!(
                "part `{}` is {} {:?} ({} bytes) but {} {:?} needs `{}` {} {:?} ({} bytes)",
                p.name,
                p.dtype.name(),
                p.shape,
                p.len,
                t.encoding.label(),
                t.shape,
                w.name,
                w.dtype.name(),
                w.shape,
                w.bytes()
            )));
        }
        if part_aligned && p.offset % PART_ALIGN != 0 {
            return Err(invalid(format!("part `{}` offset {} is not {PART_ALIGN}-byte aligned", p.name, p.offset)));
        }
        let p_end = p.offset.checked_add(p.len).ok_or_else(|| invalid("part offset overflows".into()))?;
        if p.offset < lo || p_end > hi {
            return Err(FormatError::OutOfBounds {
                path: path.to_path_buf(),
                place: place.clone(),
                what: "its span",
                offset: p.offset,
                end: p_end,
                limit: hi,
            });
        }
        end = end.max(p_end);
        spans.push((p.offset, p_end, place.clone()));
    }
    check_disjoint(path, &mut spans)?;
    Ok(end)
}

impl Manifest {
    /// Structural checks that need no data file: shapes against encodings, spans inside their
    /// files, nothing overlapping. `path` is the header file, for messages.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| FormatError::Manifest { path: path.to_path_buf(), reason };
        let a = &self.architecture;
        if !self.alignment.is_power_of_two() || self.alignment < 4096 {
            return Err(bad(format!("alignment {} is not a power of two >= 4096", self.alignment)));
        }
        if a.moe_layers.windows(2).any(|w| w[0] >= w[1]) || a.moe_layers.iter().any(|&l| l >= a.layers) {
            return Err(bad(format!("moe_layers {:?} must be increasing and below {} layers", a.moe_layers, a.layers)));
        }
        if a.experts_per_token > a.experts {
            return Err(bad(format!("{} experts per token of {}", a.experts_per_token, a.experts)));
        }
        if self.shards.is_empty() && !a.moe_layers.is_empty() {
            return Err(bad("MoE layers but no expert shards".into()));
        }
        if self.shards.len() > usize::from(u16::MAX) || self.expert_layouts.len() > usize::from(u16::MAX) {
            return Err(bad("too many shards or layouts".into()));
        }
        let mut files = HashSet::new();
        for f in std::iter::once(&self.trunk.file).chain(self.shards.iter().filter(|s| !s.in_place()).map(|s| &s.file))
        {
            if !is_plain_file_name(f) || !files.insert(f) {
                return Err(bad(format!("data file name `{f}` is not a plain, unique file name")));
            }
        }
        for f in self.shards.iter().filter(|s| s.in_place()).map(|s| &s.file) {
            let p = Path::new(f);
            let plain =
                p.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
            // Only a checkpoint's weights files: a header cannot point the reader anywhere else.
            let weights = p.extension().is_some_and(|e| e == "safetensors");
            if !p.is_absolute() || !plain || !weights || !files.insert(f) {
                return Err(bad(format!(
                    "checkpoint file `{f}` is not a unique absolute path to a .safetensors file without `..`"
                )));
            }
        }

        let trunk_path = Path::new(&self.trunk.file);
        let mut names = HashSet::new();
        let mut spans = Vec::with_capacity(self.trunk.tensors.len());
        for t in &self.trunk.tensors {
            let place = Place::Tensor(t.tensor.name.clone());
            if !names.insert(t.tensor.name.as_str()) {
                return Err(bad(format!("tensor `{}` is listed twice", t.tensor.name)));
            }
            let end = t.offset.checked_add(t.len).filter(|&e| e <= self.trunk.bytes).ok_or_else(|| {
                FormatError::OutOfBounds {
                    path: trunk_path.to_path_buf(),
                    place: place.clone(),
                    what: "the trunk file",
                    offset: t.offset,
                    end: t.offset.saturating_add(t.len),
                    limit: self.trunk.bytes,
                }
            })?;
            check_tensor_parts(trunk_path, &place, &t.tensor, t.offset, end, true)?;
            spans.push((t.offset, end, place));
        }
        check_disjoint(trunk_path, &mut spans)?;

        for (i, l) in self.expert_layouts.iter().enumerate() {
            self.validate_layout(path, i, l, &names)?;
        }
        let mut blob_names = HashSet::new();
        for b in &self.blobs {
            if !blob_names.insert(b.name.as_str()) {
                return Err(bad(format!("embedded file `{}` is listed twice", b.name)));
            }
        }
        Ok(())
    }

    /// One expert layout: sized for its alignment (an in-place layout for any phase), its parts
    /// inside its payload and disjoint, its codebooks in the trunk.
    fn validate_layout(&self, path: &Path, i: usize, l: &ExpertLayout, names: &HashSet<&str>) -> Result<()> {
        let bad = |reason: String| FormatError::Manifest { path: path.to_path_buf(), reason };
        let place = Place::Tensor(format!("expert layout {i}"));
        let (align, start) = if l.in_place { (IN_PLACE_ALIGN, 0) } else { (self.alignment, RECORD_HEADER_LEN) };
        let longest_read =
            l.payload_bytes.checked_add(IN_PLACE_ALIGN - 1).and_then(|b| b.checked_next_multiple_of(IN_PLACE_ALIGN));
        if !l.record_bytes.is_multiple_of(align)
            || l.payload_bytes > l.record_bytes
            || l.matrices.is_empty()
            || (l.in_place && Some(l.record_bytes) != longest_read)
        {
            return Err(bad(format!(
                "expert layout {i}: record of {} bytes (payload {}) is not a non-empty multiple of the alignment {align}{}",
                l.record_bytes,
                l.payload_bytes,
                if l.in_place { " that holds the payload at any offset" } else { "" }
            )));
        }
        let mut spans = Vec::new();
        for m in &l.matrices {
            let end = check_tensor_parts(path, &place, m, start, l.payload_bytes, !l.in_place)?;
            spans.push((m.parts[0].offset, end, Place::Tensor(m.name.clone())));
            if let Encoding::Vq { codebook: CodebookSource::Trunk { tensor }, .. } = &m.encoding
                && !names.contains(tensor.as_str())
            {
                return Err(bad(format!(
                    "expert matrix `{}` names codebook tensor `{tensor}`, absent from the trunk",
                    m.name
                )));
            }
        }
        check_disjoint(path, &mut spans)?;
        Ok(())
    }

    pub fn trunk_tensor(&self, name: &str) -> Option<&TrunkTensor> {
        self.trunk.tensors.iter().find(|t| t.tensor.name == name)
    }
}

/// A file name with no directory part, so a manifest cannot point outside the model's folders.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

impl TensorEntry {
    /// Places the parts `encoding` stores for `shape` one after another from `start`, each on a
    /// [`PART_ALIGN`] boundary. Returns the entry and the end of its last part.
    pub fn lay_out(
        name: &str,
        encoding: Encoding,
        shape: &[u64],
        start: u64,
    ) -> std::result::Result<(Self, u64), String> {
        let mut at = start;
        let mut parts = Vec::new();
        for p in encoding.parts(shape).map_err(|e| format!("{name}: {e}"))? {
            at = at.next_multiple_of(PART_ALIGN);
            let len = p.bytes();
            parts.push(PartEntry { name: p.name.to_string(), dtype: p.dtype, shape: p.shape, offset: at, len });
            at += len;
        }
        Ok((TensorEntry { name: name.to_string(), encoding, shape: shape.to_vec(), parts }, at))
    }
}

impl ExpertLayout {
    /// Lays out one expert's matrices `(name, encoding, shape)` after the record header, padded to
    /// `alignment`.
    pub fn build(alignment: u64, matrices: &[(&str, Encoding, Vec<u64>)]) -> std::result::Result<Self, String> {
        check_alignment(alignment)?;
        let mut at = RECORD_HEADER_LEN;
        let mut out = Vec::with_capacity(matrices.len());
        for (name, enc, shape) in matrices {
            let (t, end) = TensorEntry::lay_out(name, enc.clone(), shape, at)?;
            out.push(t);
            at = end;
        }
        if out.is_empty() {
            return Err("an expert layout needs at least one matrix".into());
        }
        Ok(ExpertLayout {
            matrices: out,
            payload_bytes: at,
            record_bytes: at.next_multiple_of(alignment),
            in_place: false,
        })
    }

    /// The layout of experts read in place: `matrices` with part offsets relative to the first
    /// byte of the expert's run of `run` bytes in its checkpoint file.
    pub fn in_place(matrices: Vec<TensorEntry>, run: u64) -> Self {
        let record_bytes = (run + IN_PLACE_ALIGN - 1).next_multiple_of(IN_PLACE_ALIGN);
        ExpertLayout { matrices, payload_bytes: run, record_bytes, in_place: true }
    }
}

/// Expert records are read with O_DIRECT: their alignment must be a power of two of at least
/// 4096 bytes (and at most 1 GiB, past which nothing is gained).
pub fn check_alignment(alignment: u64) -> std::result::Result<(), String> {
    if alignment.is_power_of_two() && (4096..=1 << 30).contains(&alignment) {
        Ok(())
    } else {
        Err(format!("alignment {alignment} is not a power of two between 4096 and 1 GiB"))
    }
}
