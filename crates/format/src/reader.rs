//! Opening a model: header checked, trunk mapped, shards found and sized; views and verification.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{FormatError, Place, Result};
use crate::header::Header;
use crate::index::IndexEntry;
use crate::manifest::{ExpertLayout, Manifest, TrunkTensor};
use crate::record::parse_record;
use crate::view::{ExpertView, TensorView};
use crate::{HEADER_FILE, JOURNAL_FILE};

/// Where to look for expert shards besides the model directory (one directory per drive).
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub shard_dirs: Vec<PathBuf>,
}

/// An open WASTE model. The files must not be modified while it is open (the trunk is mapped).
#[derive(Debug)]
pub struct Model {
    dir: PathBuf,
    header_path: PathBuf,
    header: Header,
    trunk_path: PathBuf,
    /// `None` for an empty trunk file (an empty file cannot be mapped).
    trunk: Option<Mmap>,
    shard_paths: Vec<PathBuf>,
    shard_files: Vec<File>,
    tensors: HashMap<String, usize>,
    /// For each layer, its position among the MoE layers.
    moe_pos: Vec<Option<usize>>,
}

/// Everything needed to read one expert record and check it.
#[derive(Debug, Clone, Copy)]
pub struct ExpertLocation<'a> {
    pub entry: IndexEntry,
    pub path: &'a Path,
    pub layout: &'a ExpertLayout,
}

impl<'a> ExpertLocation<'a> {
    /// Checks a record read into `bytes` (checksum when `verify`) and returns views of its matrices.
    pub fn parse<'b>(&self, bytes: &'b [u8], verify: bool) -> Result<ExpertView<'b>>
    where
        'a: 'b,
    {
        parse_record(self.path, bytes, &self.entry, self.layout, verify)
    }
}

/// One thing `verify` found wrong.
#[derive(Debug)]
pub struct Problem {
    pub place: Place,
    pub error: FormatError,
}

/// A regular file's length: a FIFO, a device or a directory where a model file belongs is
/// refused (reading a FIFO would wait forever for a writer).
fn file_len(path: &Path) -> Result<u64> {
    let m = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
    if !m.is_file() {
        return Err(FormatError::Invalid {
            path: path.to_path_buf(),
            place: Place::Header,
            reason: "is not a regular file".into(),
        });
    }
    Ok(m.len())
}

/// A data file shorter than the manifest says: name the first item that does not fit.
fn truncated(path: &Path, actual: u64, expected: u64, spans: impl Iterator<Item = (u64, u64, Place)>) -> FormatError {
    match spans.filter(|s| s.1 > actual).min_by_key(|s| s.0) {
        Some((offset, end, place)) => FormatError::OutOfBounds {
            path: path.to_path_buf(),
            place,
            what: "the file on disk (truncated)",
            offset,
            end,
            limit: actual,
        },
        None => FormatError::FileSize { path: path.to_path_buf(), expected, actual },
    }
}

impl Model {
    pub fn open(dir: impl AsRef<Path>) -> Result<Model> {
        Self::open_with(dir, &OpenOptions::default())
    }

    pub fn open_with(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Model> {
        let dir = dir.as_ref().to_path_buf();
        let header_path = dir.join(HEADER_FILE);
        let bytes = match file_len(&header_path)
            .and_then(|_| std::fs::read(&header_path).map_err(|e| FormatError::io(&header_path, e)))
        {
            Ok(b) => b,
            Err(FormatError::Io { source: e, .. }) if e.kind() == std::io::ErrorKind::NotFound => {
                let reason = if dir.join(JOURNAL_FILE).exists() {
                    "it holds an unfinished conversion (waste.journal); run the same convert command again to resume it"
                } else if dir.join("config.json").is_file() {
                    "this is a Hugging Face checkpoint, not a WASTE model: convert it first \
                     (k3-cli convert --hf DIR --out MODEL)"
                } else if dir.is_dir() {
                    "there is no header.waste: this is not a WASTE model directory"
                } else {
                    "no such directory"
                };
                return Err(FormatError::Invalid { path: dir, place: Place::Header, reason: reason.into() });
            }
            Err(e) => return Err(e),
        };
        let header = Header::parse(&header_path, &bytes)?;
        let m = &header.manifest;

        let trunk_path = dir.join(&m.trunk.file);
        let actual = file_len(&trunk_path)?;
        if actual != m.trunk.bytes {
            let spans =
                m.trunk.tensors.iter().map(|t| (t.offset, t.offset + t.len, Place::Tensor(t.tensor.name.clone())));
            return Err(truncated(&trunk_path, actual, m.trunk.bytes, spans));
        }
        let trunk = if actual == 0 {
            None
        } else {
            let f = File::open(&trunk_path).map_err(|e| FormatError::io(&trunk_path, e))?;
            // SAFETY: the map is read-only and private to this process. Its contents stay valid as
            // long as nobody truncates or rewrites the file while the model is open, which the
            // type's contract forbids (a truncation would fault on access, not return garbage).
            Some(unsafe { Mmap::map(&f) }.map_err(|e| FormatError::io(&trunk_path, e))?)
        };

        let mut shard_paths = Vec::with_capacity(m.shards.len());
        let mut shard_files = Vec::with_capacity(m.shards.len());
        for (i, s) in m.shards.iter().enumerate() {
            if s.in_place() {
                let (path, file) = open_checkpoint_file(&header, i)?;
                shard_files.push(file);
                shard_paths.push(path);
                continue;
            }
            let candidates: Vec<PathBuf> =
                std::iter::once(&dir).chain(&opts.shard_dirs).map(|d| d.join(&s.file)).collect();
            if let Some(odd) = candidates.iter().find(|p| p.exists() && !p.is_file()) {
                file_len(odd)?;
            }
            let Some(path) = candidates.iter().find(|p| p.is_file()).cloned() else {
                let searched = std::iter::once(&dir).chain(&opts.shard_dirs).map(|d| d.display().to_string());
                return Err(FormatError::MissingShard {
                    file: s.file.clone(),
                    searched: searched.collect::<Vec<_>>().join(", "),
                });
            };
            let actual = file_len(&path)?;
            if actual != s.bytes {
                let spans = header
                    .index
                    .iter()
                    .filter(|e| usize::from(e.shard) == i)
                    .map(|e| (e.offset, e.offset + e.length, e.place()));
                return Err(truncated(&path, actual, s.bytes, spans));
            }
            shard_files.push(File::open(&path).map_err(|e| FormatError::io(&path, e))?);
            shard_paths.push(path);
        }

        let tensors = m.trunk.tensors.iter().enumerate().map(|(i, t)| (t.tensor.name.clone(), i)).collect();
        let mut moe_pos = vec![None; m.architecture.layers as usize];
        for (pos, &l) in m.architecture.moe_layers.iter().enumerate() {
            moe_pos[l as usize] = Some(pos);
        }
        Ok(Model { dir, header_path, header, trunk_path, trunk, shard_paths, shard_files, tensors, moe_pos })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn header_path(&self) -> &Path {
        &self.header_path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn manifest(&self) -> &Manifest {
        &self.header.manifest
    }

    pub fn shard_paths(&self) -> &[PathBuf] {
        &self.shard_paths
    }

    /// An embedded file (`config.json`, tokenizer files), byte for byte.
    pub fn blob(&self, name: &str) -> Option<&[u8]> {
        self.header.blob(name)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A zero-copy view of a trunk tensor.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let i = *self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor { path: self.header_path.clone(), name: name.to_string() })?;
        let t = &self.manifest().trunk.tensors[i];
        Ok(TensorView::new(&t.tensor, self.trunk_bytes(), 0))
    }

    fn trunk_bytes(&self) -> &[u8] {
        self.trunk.as_deref().unwrap_or(&[])
    }

    /// Where the record of `(layer, expert)` lives.
    pub fn expert(&self, layer: u32, expert: u32) -> Result<ExpertLocation<'_>> {
        let m = self.manifest();
        let pos = self.moe_pos.get(layer as usize).copied().flatten().filter(|_| expert < m.architecture.experts);
        let Some(pos) = pos else {
            return Err(FormatError::MissingExpert { path: self.header_path.clone(), layer, expert });
        };
        let entry = self.header.index[pos * m.architecture.experts as usize + expert as usize];
        Ok(ExpertLocation {
            entry,
            path: &self.shard_paths[usize::from(entry.shard)],
            layout: &m.expert_layouts[usize::from(entry.layout)],
        })
    }

    /// Reads a record with ordinary buffered I/O into `buf` (for tools and tests; the engine reads
    /// through `k3-io`). A record read in place ends with zeros past its file's end, as its
    /// checksum was taken.
    pub fn read_expert(&self, loc: &ExpertLocation<'_>, buf: &mut Vec<u8>) -> Result<()> {
        // Sized without zeroing what the read overwrites: only a tail past the file's end is
        // filled below.
        buf.resize(loc.entry.length as usize, 0);
        let file = &self.shard_files[usize::from(loc.entry.shard)];
        // Only a read in place may run past its file's end (as the manifest says it is).
        let end = match loc.entry.phase {
            Some(_) => self.manifest().shards[usize::from(loc.entry.shard)].bytes,
            None => u64::MAX,
        };
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], loc.entry.offset + done as u64) {
                Ok(0) if loc.entry.offset + done as u64 >= end => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(0) => return Err(FormatError::io(loc.path, std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FormatError::io(loc.path, e)),
            }
        }
        Ok(())
    }

    /// Checks one trunk tensor's bytes against its checksum (independent of the others, so callers
    /// can check several at once on several cores).
    pub fn check_tensor(&self, t: &TrunkTensor) -> Result<()> {
        // Offsets were checked against the trunk's size when the header was opened.
        let computed = xxh3_64(&self.trunk_bytes()[t.offset as usize..(t.offset + t.len) as usize]);
        if computed == t.xxh3.0 {
            return Ok(());
        }
        Err(FormatError::Checksum {
            path: self.trunk_path.clone(),
            place: Place::Tensor(t.tensor.name.clone()),
            offset: t.offset,
            len: t.len,
            stored: t.xxh3.0,
            computed,
        })
    }

    /// Bytes `verify` reads: trunk plus every record.
    pub fn verify_bytes(&self) -> u64 {
        self.verify_bytes_of(true)
    }

    /// The records a verify reads: all of them, or (`in_place` false) only the model's own.
    fn records_checked(&self, in_place: bool) -> impl Iterator<Item = &IndexEntry> {
        self.header.index.iter().filter(move |e| in_place || e.phase.is_none())
    }

    /// The bytes [`verify_of`](Self::verify_of) reads.
    pub fn verify_bytes_of(&self, in_place: bool) -> u64 {
        let trunk: u64 = self.manifest().trunk.tensors.iter().map(|t| t.len).sum();
        trunk + self.records_checked(in_place).map(|e| e.length).sum::<u64>()
    }

    /// Checks every checksum: embedded files, trunk tensors, expert records (and each record's
    /// header). Returns every problem found; `progress` gets the bytes checked so far.
    pub fn verify(&self, progress: &mut dyn FnMut(u64)) -> Vec<Problem> {
        self.verify_of(true, progress)
    }

    /// [`verify`](Self::verify), records read in place from a checkpoint's files only when
    /// `in_place` (a conversion has just checksummed them there).
    pub fn verify_of(&self, in_place: bool, progress: &mut dyn FnMut(u64)) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut done = 0u64;
        let m = self.manifest();
        for b in &m.blobs {
            let computed = xxh3_64(self.blob(&b.name).unwrap_or_default());
            if computed != b.xxh3.0 {
                let place = Place::Blob(b.name.clone());
                let error = FormatError::Checksum {
                    path: self.header_path.clone(),
                    place: place.clone(),
                    offset: b.offset,
                    len: b.len,
                    stored: b.xxh3.0,
                    computed,
                };
                problems.push(Problem { place, error });
            }
        }
        for t in &m.trunk.tensors {
            if let Err(error) = self.check_tensor(t) {
                problems.push(Problem { place: Place::Tensor(t.tensor.name.clone()), error });
            }
            done += t.len;
            progress(done);
        }
        let mut buf = Vec::new();
        for e in self.records_checked(in_place) {
            let checked = self.expert(e.layer, e.expert).and_then(|loc| {
                self.read_expert(&loc, &mut buf)?;
                loc.parse(&buf, true).map(|_| ())
            });
            if let Err(error) = checked {
                problems.push(Problem { place: e.place(), error });
            }
            done += e.length;
            progress(done);
        }
        problems
    }
}

/// Shard `i` of `header`: a checkpoint's file whose experts are read in place, as it was when
/// the model was converted (its size and modification time), else an error naming it and the
/// first record read from it.
fn open_checkpoint_file(header: &Header, i: usize) -> Result<(PathBuf, File)> {
    let s = &header.manifest.shards[i];
    let path = PathBuf::from(&s.file);
    let place = header.index.iter().find(|e| usize::from(e.shard) == i).map_or(Place::Header, |e| e.place());
    let changed = |reason: String| FormatError::CheckpointChanged { path: path.clone(), place: place.clone(), reason };
    // Not a FIFO or a device (opening one could block), and opened before it is looked at, so
    // what is checked is what is read.
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(changed("is no longer a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(changed("is gone (moved or removed)".into())),
        Err(e) => return Err(FormatError::io(&path, e)),
    }
    let file = File::open(&path).map_err(|e| FormatError::io(&path, e))?;
    let meta = file.metadata().map_err(|e| FormatError::io(&path, e))?;
    if meta.len() != s.bytes {
        return Err(changed(format!("is {} bytes, not {}", meta.len(), s.bytes)));
    }
    let mtime = mtime_ns(&meta);
    if Some(mtime) != s.checkpoint_mtime_ns {
        return Err(changed("was modified (its modification time changed)".into()));
    }
    Ok((path, file))
}

/// A file's modification time in nanoseconds since the epoch (0 before it).
pub fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime().max(0) as u64).saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec().max(0) as u64)
}
