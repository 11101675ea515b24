//! Writing a model: records stream out as they are produced; a journal makes an interrupted write
//! resumable; the header is written last, atomically, so a half-written model never opens.
//!
//! Durability protocol: data is appended to the trunk and shard files; every `sync_every` bytes
//! the data files are flushed to disk (`fdatasync`) and only then are the journal lines describing
//! that data appended and flushed. A journal line therefore always describes data that is on disk.
//! On resume every journaled item is re-read and checked against its checksum; the first one that
//! fails, and everything after it, is dropped and the files are cut back to what remains.

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions as FsOpen};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use self::data_file::DataFile;

use crate::encoding::Encoding;
use crate::error::{FormatError, Result};
use crate::header::Header;
use crate::index::IndexEntry;
use crate::lock::DirLock;
use crate::manifest::check_alignment;
use crate::manifest::{
    Architecture, BlobInfo, ExpertLayout, Hex64, Manifest, ShardInfo, TensorEntry, TrunkInfo, TrunkTensor,
};
use crate::output::write_atomic;
use crate::record::encode_record;
use crate::{HEADER_FILE, JOURNAL_FILE, PART_ALIGN, TRUNK_FILE, shard_file_name};

mod data_file;
mod resume;

/// Everything that fixes the bytes of a model. A resumed write must be given the same spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriterSpec {
    pub architecture: Architecture,
    /// Expert record alignment (4096 or 2 MiB, say).
    pub alignment: u64,
    /// Number of expert shards; record `n` (in (layer, expert) order) goes to shard `n % shards`,
    /// so every layer's experts are striped over all shards (and drives).
    pub shards: u16,
    /// Shard `i` is written to `shard_dirs[i % len]`; empty means the model directory.
    pub shard_dirs: Vec<PathBuf>,
    pub expert_layouts: Vec<ExpertLayout>,
    /// Encoding of each tensor class, for people.
    pub encodings: BTreeMap<String, String>,
    /// Source checkpoint, converter version, options.
    pub provenance: serde_json::Value,
    /// Checkpoint files whose experts are read in place, as they were when the conversion began
    /// (`ShardInfo::checkpoint_mtime_ns` set): a file changed since is another spec. Index
    /// entries name them after the model's own `shards`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoint_files: Vec<ShardInfo>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum JournalLine {
    Spec {
        journal_version: u32,
        spec: WriterSpec,
    },
    Tensor(TrunkTensor),
    /// A record written, or (with a phase) read in place: then `shard` counts the checkpoint
    /// files after the model's shards.
    Expert {
        layer: u32,
        expert: u32,
        shard: u16,
        layout: u16,
        offset: u64,
        length: u64,
        xxh3: Hex64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<u32>,
    },
}

const JOURNAL_VERSION: u32 = 1;

/// What `ModelWriter::open` found.
#[derive(Debug)]
pub enum Opened {
    /// A new model, or an interrupted one resumed: write what `has_tensor` / `has_expert` say is missing.
    Writer(Box<ModelWriter>),
    /// The directory already holds a finished model written with this spec; nothing to do.
    Complete,
}

/// Streams a model to disk. Items can be written in any order for the trunk and in increasing
/// (layer, expert) order for expert records.
#[derive(Debug)]
pub struct ModelWriter {
    /// No other writer touches the directory while this one lives.
    _lock: DirLock,
    /// Progress is journaled at least this often, so an interruption loses at most this much work
    /// however small the items are.
    last_sync: Instant,
    sync_interval: Duration,
    dir: PathBuf,
    spec: WriterSpec,
    trunk: DataFile,
    shards: Vec<DataFile>,
    journal: File,
    pending: Vec<u8>,
    unsynced: u64,
    sync_every: u64,
    tensors: Vec<TrunkTensor>,
    tensor_names: HashSet<String>,
    index: Vec<IndexEntry>,
    record: Vec<u8>,
    resumed_items: usize,
}

fn writer_err(dir: &Path, reason: impl Into<String>) -> FormatError {
    FormatError::Writer { dir: dir.to_path_buf(), reason: reason.into() }
}

impl ModelWriter {
    /// Starts a new model in `dir`, resumes an interrupted one, or reports it complete.
    /// Refuses a directory that holds anything else, or a conversion started with another spec:
    /// nothing a user owns is overwritten.
    pub fn open(dir: impl AsRef<Path>, spec: WriterSpec) -> Result<Opened> {
        let dir = dir.as_ref().to_path_buf();
        Self::check_spec(&dir, &spec)?;
        // Nothing is decided before the directory is ours: a second writer waits for nobody.
        let existed = dir.exists();
        std::fs::create_dir_all(&dir).map_err(|e| FormatError::io(&dir, e))?;
        let lock = DirLock::acquire(&dir)?;
        let refuse = |e: FormatError| {
            if !existed {
                let _ = std::fs::remove_dir(&dir);
            }
            Err(e)
        };
        if dir.join(HEADER_FILE).exists() {
            let header_path = dir.join(HEADER_FILE);
            let bytes = std::fs::read(&header_path).map_err(|e| FormatError::io(&header_path, e))?;
            let h = Header::parse(&header_path, &bytes)?;
            let in_place: Vec<&ShardInfo> = h.manifest.shards.iter().filter(|s| s.in_place()).collect();
            let same_files = in_place.len() == spec.checkpoint_files.len()
                && in_place.iter().zip(&spec.checkpoint_files).all(|(a, b)| *a == b);
            if h.manifest.provenance == spec.provenance && h.manifest.architecture == spec.architecture {
                if !same_files {
                    return Err(writer_err(
                        &dir,
                        "holds this model, converted in place from checkpoint files that have changed since; \
                         remove the directory and convert again",
                    ));
                }
                return Ok(Opened::Complete);
            }
            return Err(writer_err(
                &dir,
                "already holds a finished WASTE model converted with other options; refusing to overwrite it",
            ));
        }
        let journal_path = dir.join(JOURNAL_FILE);
        if journal_path.exists() {
            return Self::resume(dir, spec, lock).map(|w| Opened::Writer(Box::new(w)));
        }
        let mut entries = std::fs::read_dir(&dir).map_err(|e| FormatError::io(&dir, e))?;
        if let Some(e) = entries.next() {
            let name = e.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default();
            return refuse(writer_err(
                &dir,
                format!(
                    "is not empty (it holds `{name}`) and is not a WASTE conversion in progress; refusing to write into it"
                ),
            ));
        }
        let mut line = serde_json::to_vec(&JournalLine::Spec { journal_version: JOURNAL_VERSION, spec: spec.clone() })
            .map_err(|e| writer_err(&dir, format!("the conversion's settings cannot be recorded: {e}")))?;
        line.push(b'\n');
        let mut journal = FsOpen::new()
            .append(true)
            .create_new(true)
            .open(&journal_path)
            .map_err(|e| FormatError::io(&journal_path, e))?;
        journal.write_all(&line).and_then(|_| journal.sync_data()).map_err(|e| FormatError::io(&journal_path, e))?;
        let trunk = DataFile::open(dir.join(TRUNK_FILE), true)?;
        let mut shards = Vec::with_capacity(usize::from(spec.shards));
        for i in 0..usize::from(spec.shards) {
            shards.push(DataFile::open(Self::shard_path(&dir, &spec, i), true)?);
        }
        Ok(Opened::Writer(Box::new(Self::assemble(dir, spec, trunk, shards, journal, lock))))
    }

    fn check_spec(dir: &Path, spec: &WriterSpec) -> Result<()> {
        check_alignment(spec.alignment).map_err(|e| writer_err(dir, e))?;
        if spec.shards == 0 && spec.checkpoint_files.is_empty() && !spec.architecture.moe_layers.is_empty() {
            return Err(writer_err(dir, "a model with MoE layers needs at least one expert shard"));
        }
        // The journal records the spec as JSON, whose strings are UTF-8.
        if let Some(d) = spec.shard_dirs.iter().find(|d| d.to_str().is_none()) {
            return Err(writer_err(dir, format!("the shard directory {} is not a UTF-8 path", d.display())));
        }
        if spec.checkpoint_files.iter().any(|f| !f.in_place()) {
            return Err(writer_err(dir, "a checkpoint file read in place needs its modification time"));
        }
        for (i, l) in spec.expert_layouts.iter().enumerate() {
            if !l.in_place && l.record_bytes % spec.alignment != 0 {
                return Err(writer_err(dir, format!("expert layout {i} was built for another alignment")));
            }
        }
        Ok(())
    }

    fn shard_path(dir: &Path, spec: &WriterSpec, i: usize) -> PathBuf {
        let base = if spec.shard_dirs.is_empty() { dir } else { &spec.shard_dirs[i % spec.shard_dirs.len()] };
        base.join(shard_file_name(i))
    }

    fn assemble(
        dir: PathBuf,
        spec: WriterSpec,
        trunk: DataFile,
        shards: Vec<DataFile>,
        journal: File,
        lock: DirLock,
    ) -> Self {
        ModelWriter {
            _lock: lock,
            last_sync: Instant::now(),
            sync_interval: Duration::from_secs(1),
            dir,
            spec,
            trunk,
            shards,
            journal,
            pending: Vec::new(),
            unsynced: 0,
            sync_every: 256 << 20,
            tensors: Vec::new(),
            tensor_names: HashSet::new(),
            index: Vec::new(),
            record: Vec::new(),
            resumed_items: 0,
        }
    }

    /// Items (tensors and records) kept from an interrupted run.
    pub fn resumed_items(&self) -> usize {
        self.resumed_items
    }

    pub fn spec(&self) -> &WriterSpec {
        &self.spec
    }

    /// Flush data and journal every this many bytes (default 256 MiB) or this often (default 1 s),
    /// whichever comes first: the most an interruption loses.
    pub fn set_sync_every(&mut self, bytes: u64) {
        self.sync_every = bytes.max(1);
    }

    pub fn set_sync_interval(&mut self, interval: Duration) {
        self.sync_interval = interval;
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensor_names.contains(name)
    }

    pub fn has_expert(&self, layer: u32, expert: u32) -> bool {
        // Records are written in (layer, expert) order, so the written ones are a prefix.
        let a = &self.spec.architecture;
        match a.moe_layers.binary_search(&layer) {
            Ok(pos) if expert < a.experts => pos * a.experts as usize + (expert as usize) < self.index.len(),
            _ => false,
        }
    }

    /// The (layer, expert) the next record must be, or `None` when all are written.
    pub fn expected_next_expert(&self) -> Option<(u32, u32)> {
        let a = &self.spec.architecture;
        let n = self.index.len();
        let per = a.experts as usize;
        if per == 0 {
            return None;
        }
        a.moe_layers.get(n / per).map(|&l| (l, (n % per) as u32))
    }

    /// Appends a trunk tensor; `parts` in the order its encoding stores them.
    pub fn write_tensor(&mut self, name: &str, encoding: Encoding, shape: &[u64], parts: &[&[u8]]) -> Result<()> {
        if self.tensor_names.contains(name) {
            return Err(writer_err(&self.dir, format!("tensor `{name}` is written twice")));
        }
        let start = self.trunk.len.next_multiple_of(PART_ALIGN);
        let (entry, end) = TensorEntry::lay_out(name, encoding, shape, start).map_err(|e| writer_err(&self.dir, e))?;
        if entry.parts.len() != parts.len() {
            return Err(writer_err(
                &self.dir,
                format!("tensor `{name}`: {} parts given, {} expected", parts.len(), entry.parts.len()),
            ));
        }
        let mut h = Xxh3::new();
        for (p, bytes) in entry.parts.iter().zip(parts) {
            if bytes.len() as u64 != p.len {
                return Err(writer_err(
                    &self.dir,
                    format!(
                        "tensor `{name}` part `{}`: {} bytes given, {} expected for shape {shape:?}",
                        p.name,
                        bytes.len(),
                        p.len
                    ),
                ));
            }
        }
        self.trunk.write_at_end(&vec![0; (start - self.trunk.len) as usize])?;
        for (p, bytes) in entry.parts.iter().zip(parts) {
            let pad = vec![0u8; (p.offset - self.trunk.len) as usize];
            h.update(&pad);
            self.trunk.write_at_end(&pad)?;
            h.update(bytes);
            self.trunk.write_at_end(bytes)?;
        }
        debug_assert_eq!(self.trunk.len, end);
        let t = TrunkTensor { tensor: entry, offset: start, len: end - start, xxh3: Hex64(h.digest()) };
        self.journal_line(&JournalLine::Tensor(t.clone()), end - start)?;
        self.tensor_names.insert(name.to_string());
        self.tensors.push(t);
        Ok(())
    }

    /// Appends the record of `(layer, expert)`, which must be the next in (layer, expert) order.
    /// `parts`: each matrix's parts, in layout order.
    pub fn write_expert(&mut self, layer: u32, expert: u32, layout: u16, parts: &[&[u8]]) -> Result<()> {
        self.check_next(layer, expert)?;
        let l = self
            .spec
            .expert_layouts
            .get(usize::from(layout))
            .ok_or_else(|| writer_err(&self.dir, format!("no expert layout {layout}")))?;
        if l.in_place || self.shards.is_empty() {
            return Err(writer_err(&self.dir, format!("expert layout {layout} is read in place, not written")));
        }
        encode_record(layer, expert, layout, l, parts, &mut self.record)
            .map_err(|e| writer_err(&self.dir, format!("expert (layer {layer}, expert {expert}): {e}")))?;
        let shard = (self.index.len() % self.shards.len()) as u16;
        let s = &mut self.shards[usize::from(shard)];
        let offset = s.len;
        let xxh3 = xxh3_64(&self.record);
        s.write_at_end(&self.record)?;
        let length = self.record.len() as u64;
        self.index.push(IndexEntry { layer, expert, shard, layout, offset, length, xxh3, phase: None });
        self.journal_line(
            &JournalLine::Expert { layer, expert, shard, layout, offset, length, xxh3: Hex64(xxh3), phase: None },
            length,
        )
    }

    /// Records `(layer, expert)`, the next in (layer, expert) order, as read in place: from
    /// checkpoint file `file` (of the spec's `checkpoint_files`), the aligned read at `offset` of
    /// `length` bytes whose checksum is `xxh3`, the expert's run starting `phase` bytes into it.
    #[allow(clippy::too_many_arguments)]
    pub fn expert_in_place(
        &mut self,
        (layer, expert): (u32, u32),
        layout: u16,
        file: u16,
        offset: u64,
        length: u64,
        phase: u32,
        xxh3: u64,
    ) -> Result<()> {
        self.check_next(layer, expert)?;
        let in_place = self.spec.expert_layouts.get(usize::from(layout)).is_some_and(|l| l.in_place);
        if !in_place || usize::from(file) >= self.spec.checkpoint_files.len() {
            return Err(writer_err(&self.dir, format!("no in-place layout {layout} or checkpoint file {file}")));
        }
        let shard = self.spec.shards.checked_add(file).ok_or_else(|| writer_err(&self.dir, "too many shards"))?;
        self.index.push(IndexEntry { layer, expert, shard, layout, offset, length, xxh3, phase: Some(phase) });
        let phase = Some(phase);
        let line = JournalLine::Expert { layer, expert, shard, layout, offset, length, xxh3: Hex64(xxh3), phase };
        self.journal_line(&line, 0)
    }

    fn check_next(&self, layer: u32, expert: u32) -> Result<()> {
        if self.expected_next_expert() == Some((layer, expert)) {
            return Ok(());
        }
        Err(writer_err(
            &self.dir,
            format!(
                "expert (layer {layer}, expert {expert}) written out of order; expected {:?}",
                self.expected_next_expert()
            ),
        ))
    }

    fn journal_line(&mut self, line: &JournalLine, bytes: u64) -> Result<()> {
        serde_json::to_writer(&mut self.pending, line).expect("journal lines always serialize");
        self.pending.push(b'\n');
        self.unsynced += bytes;
        if self.unsynced >= self.sync_every || self.last_sync.elapsed() >= self.sync_interval {
            self.sync()
        } else {
            Ok(())
        }
    }

    /// Makes everything written so far durable and journaled.
    pub fn sync(&mut self) -> Result<()> {
        self.trunk.sync()?;
        for s in &mut self.shards {
            s.sync()?;
        }
        let path = self.dir.join(JOURNAL_FILE);
        self.journal
            .write_all(&self.pending)
            .and_then(|_| self.journal.sync_data())
            .map_err(|e| FormatError::io(&path, e))?;
        self.pending.clear();
        self.unsynced = 0;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Writes the header, which makes the model valid, and removes the journal. `blobs` are the
    /// embedded files (`config.json` verbatim, tokenizer files). Fails, naming the first, if any
    /// expert record is missing.
    pub fn finish(mut self, blobs: &[(&str, &[u8])]) -> Result<PathBuf> {
        if let Some((layer, expert)) = self.expected_next_expert() {
            return Err(writer_err(
                &self.dir,
                format!("cannot finish: expert (layer {layer}, expert {expert}) and later were never written"),
            ));
        }
        self.sync()?;
        let mut blob_bytes = Vec::new();
        let mut blob_infos = Vec::new();
        for (name, bytes) in blobs {
            let offset = blob_bytes.len() as u64;
            blob_bytes.extend_from_slice(bytes);
            blob_infos.push(BlobInfo {
                name: name.to_string(),
                offset,
                len: bytes.len() as u64,
                xxh3: Hex64(xxh3_64(bytes)),
            });
        }
        let spec = &self.spec;
        let manifest = Manifest {
            architecture: spec.architecture.clone(),
            alignment: spec.alignment,
            encodings: spec.encodings.clone(),
            provenance: spec.provenance.clone(),
            trunk: TrunkInfo {
                file: TRUNK_FILE.into(),
                bytes: self.trunk.len,
                tensors: std::mem::take(&mut self.tensors),
            },
            shards: (0..self.shards.len())
                .map(|i| ShardInfo { file: shard_file_name(i), bytes: self.shards[i].len, checkpoint_mtime_ns: None })
                .chain(spec.checkpoint_files.iter().cloned())
                .collect(),
            expert_layouts: spec.expert_layouts.clone(),
            blobs: blob_infos,
        };
        let header_path = self.dir.join(HEADER_FILE);
        let bytes = Header::encode(&manifest, &self.index, &blob_bytes);
        // The header this writer made must be one every reader accepts.
        Header::parse(&header_path, &bytes)?;
        write_atomic(&header_path, &bytes)?;
        sync_dir(&self.dir)?;
        let journal = self.dir.join(JOURNAL_FILE);
        std::fs::remove_file(&journal).map_err(|e| FormatError::io(&journal, e))?;
        sync_dir(&self.dir)?;
        Ok(header_path)
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| FormatError::io(dir, e))
}
