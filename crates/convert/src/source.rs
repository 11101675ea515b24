//! A checkpoint read lazily: a Hugging Face directory (every safetensors shard memory-mapped, only
//! its JSON header parsed, so a 1.5 TB checkpoint costs address space, not RAM) or a WASTE model
//! (its trunk and shards mapped, its tensors named as the checkpoint named them), so a model can
//! be re-encoded or exported without its original checkpoint.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use super::ConvertError;

/// Where one tensor lives.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    pub dtype: StDtype,
    pub shape: Vec<u64>,
    file: usize,
    start: usize,
    end: usize,
}

#[derive(Debug)]
pub struct Source {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    tensors: BTreeMap<String, SourceTensor>,
    /// A WASTE source's embedded files (config, tokenizer); a checkpoint's are read from `dir`.
    blobs: Option<BTreeMap<String, Vec<u8>>>,
}

/// Maps a file read-only.
fn map(path: &Path) -> Result<Mmap, ConvertError> {
    // A FIFO or a device would block the open or the map: only regular files are read.
    let meta = std::fs::metadata(path).map_err(|e| ConvertError::io(path, e))?;
    if !meta.is_file() {
        return Err(ConvertError::Source { path: path.to_path_buf(), reason: "is not a regular file".into() });
    }
    let f = File::open(path).map_err(|e| ConvertError::io(path, e))?;
    // SAFETY: read-only private map of a file the conversion does not modify; a concurrent
    // truncation by another program would fault, not corrupt the output.
    unsafe { Mmap::map(&f) }.map_err(|e| ConvertError::io(path, e))
}

/// The prefix the K3 release puts before every text tensor.
const LM_PREFIX: &str = "language_model.";

impl Source {
    /// A WASTE model directory, or a Hugging Face checkpoint: `model.safetensors.index.json` if
    /// present (every shard it names), else every `*.safetensors` file in `dir`. Names lose the
    /// `language_model.` prefix and take Kimi's spelling of MoE tensors (`names::canonical`).
    pub fn open(dir: &Path) -> Result<Source, ConvertError> {
        if dir.join(k3_format::HEADER_FILE).exists() {
            return Self::open_waste(dir);
        }
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index.exists() {
            let text = std::fs::read(&index).map_err(|e| ConvertError::io(&index, e))?;
            let v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| ConvertError::Source { path: index.clone(), reason: e.to_string() })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ConvertError::Source { path: index.clone(), reason: "no `weight_map` object".into() })?;
            let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
            files.sort();
            files.dedup();
            files
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| ConvertError::io(dir, e))?;
            let mut files: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            files
        };
        if names.is_empty() {
            return Err(ConvertError::Source { path: dir.to_path_buf(), reason: "no .safetensors files".into() });
        }
        if let Some(bad) = names.iter().find(|n| n.contains(['/', '\\']) || *n == "..") {
            return Err(ConvertError::Source {
                path: index,
                reason: format!("shard name `{bad}` is not a plain file name"),
            });
        }
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for name in names {
            let path = dir.join(&name);
            let map = map(&path)?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| ConvertError::Source { path: path.clone(), reason: e.to_string() })?;
            let base = 8 + n;
            let fi = files.len();
            for (tname, info) in meta.tensors() {
                let clean = k3_engine::names::canonical(tname.strip_prefix(LM_PREFIX).unwrap_or(&tname));
                let t = SourceTensor {
                    dtype: info.dtype,
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    file: fi,
                    start: base + info.data_offsets.0,
                    end: base + info.data_offsets.1,
                };
                if tensors.insert(clean.clone(), t).is_some() {
                    return Err(ConvertError::Source {
                        path: path.clone(),
                        reason: format!("tensor `{clean}` appears twice"),
                    });
                }
            }
            files.push((path, map));
        }
        Ok(Source { dir: dir.to_path_buf(), files, tensors, blobs: None })
    }

    /// A WASTE model, checked whole first (a damaged source must not become a damaged copy).
    /// Trunk tensors stored as f32 / bf16 / f16 / u8 and experts stored as BF16 or MXFP4 come out
    /// under the checkpoint's names, dtypes and shapes; anything else (a quantized trunk, VQ
    /// experts) cannot be read back exactly and is refused.
    fn open_waste(dir: &Path) -> Result<Source, ConvertError> {
        use k3_format::{Dtype, Encoding, Model};
        let model = Model::open(dir)?;
        if let Some(p) = model.verify(&mut |_| {}).into_iter().next() {
            return Err(ConvertError::Source { path: dir.to_path_buf(), reason: format!("{}: {}", p.place, p.error) });
        }
        let m = model.manifest();
        let mut files = vec![(dir.join(&m.trunk.file), map(&dir.join(&m.trunk.file))?)];
        for p in model.shard_paths() {
            files.push((p.clone(), map(p)?));
        }
        let mut tensors = BTreeMap::new();
        let unreadable = |name: &str, enc: &Encoding| {
            ConvertError::Unsupported(format!(
                "{}: `{name}` is stored as {}, which cannot be read back exactly; convert from the original checkpoint",
                dir.display(),
                enc.label()
            ))
        };
        let dtype = |d: Dtype| match d {
            Dtype::F32 => Some(StDtype::F32),
            Dtype::Bf16 => Some(StDtype::BF16),
            Dtype::F16 => Some(StDtype::F16),
            Dtype::U8 => Some(StDtype::U8),
            _ => None,
        };
        let mut add = |name: String, d: StDtype, shape: &[u64], file: usize, start: u64, len: u64| {
            let t = SourceTensor {
                dtype: d,
                shape: shape.to_vec(),
                file,
                start: start as usize,
                end: (start + len) as usize,
            };
            tensors.insert(name, t);
        };
        for t in &m.trunk.tensors {
            let e = &t.tensor;
            if let (Encoding::Fp8Block { .. }, [q, scale]) = (&e.encoding, e.parts.as_slice()) {
                add(e.name.clone(), StDtype::F8_E4M3, &e.shape, 0, q.offset, q.len);
                add(format!("{}_scale_inv", e.name), StDtype::F32, &scale.shape, 0, scale.offset, scale.len);
                continue;
            }
            let d = match (&e.encoding, e.parts.as_slice()) {
                (Encoding::F32 | Encoding::Bf16 | Encoding::F16 | Encoding::U8, [part]) => dtype(part.dtype),
                _ => None,
            };
            let (Some(d), [part]) = (d, e.parts.as_slice()) else { return Err(unreadable(&e.name, &e.encoding)) };
            add(e.name.clone(), d, &e.shape, 0, part.offset, part.len);
        }
        for entry in &model.header().index {
            let layout = &m.expert_layouts[usize::from(entry.layout)];
            for mat in &layout.matrices {
                let base = k3_engine::names::expert(entry.layer, entry.expert, &mat.name);
                let file = 1 + usize::from(entry.shard);
                // A record read in place starts its run `phase` bytes into its read.
                let start = entry.offset + u64::from(entry.phase.unwrap_or(0));
                let part = |name: &str| mat.parts.iter().find(|p| p.name == name);
                match (&mat.encoding, part("data"), part("packed"), part("scale")) {
                    (Encoding::Bf16, Some(p), _, _) => {
                        add(format!("{base}.weight"), StDtype::BF16, &mat.shape, file, start + p.offset, p.len)
                    }
                    (Encoding::F32, Some(p), _, _) => {
                        add(format!("{base}.weight"), StDtype::F32, &mat.shape, file, start + p.offset, p.len)
                    }
                    (Encoding::Mxfp4, _, Some(p), Some(s)) => {
                        let (rows, cols) = (mat.shape[0], mat.shape[1]);
                        add(
                            format!("{base}.weight_packed"),
                            StDtype::U8,
                            &[rows, cols / 2],
                            file,
                            start + p.offset,
                            p.len,
                        );
                        add(
                            format!("{base}.weight_scale"),
                            StDtype::U8,
                            &[rows, cols / 32],
                            file,
                            start + s.offset,
                            s.len,
                        );
                    }
                    (Encoding::Fp8Block { .. }, _, _, Some(s)) => {
                        let q = part("q").ok_or_else(|| unreadable(&base, &mat.encoding))?;
                        let at = start;
                        add(format!("{base}.weight"), StDtype::F8_E4M3, &mat.shape, file, at + q.offset, q.len);
                        add(format!("{base}.weight_scale_inv"), StDtype::F32, &s.shape, file, at + s.offset, s.len);
                    }
                    _ => return Err(unreadable(&base, &mat.encoding)),
                }
            }
        }
        let blobs =
            m.blobs.iter().map(|b| (b.name.clone(), model.blob(&b.name).unwrap_or_default().to_vec())).collect();
        Ok(Source { dir: dir.to_path_buf(), files, tensors, blobs: Some(blobs) })
    }

    /// A small file of the checkpoint (`config.json`, tokenizer files), if it has one.
    pub fn file(&self, name: &str) -> Result<Option<Vec<u8>>, ConvertError> {
        if let Some(blobs) = &self.blobs {
            return Ok(blobs.get(name).cloned());
        }
        let path = self.dir.join(name);
        if !path.exists() {
            return Ok(None);
        }
        if !path.is_file() {
            return Err(ConvertError::Source { path, reason: "is not a regular file".into() });
        }
        std::fs::read(&path).map(Some).map_err(|e| ConvertError::io(&path, e))
    }

    /// Where a file of the checkpoint is (named in errors).
    pub fn path_of(&self, name: &str) -> PathBuf {
        if self.blobs.is_some() { self.dir.join(k3_format::HEADER_FILE) } else { self.dir.join(name) }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Result<&SourceTensor, ConvertError> {
        self.tensors.get(name).ok_or_else(|| ConvertError::MissingTensor { name: name.to_string() })
    }

    /// Where a tensor's bytes lie: (file, start, end), start and end from the file's beginning.
    pub(crate) fn location(&self, t: &SourceTensor) -> (usize, u64, u64) {
        (t.file, t.start as u64, t.end as u64)
    }

    /// A Hugging Face checkpoint (its tensors lie in its own safetensors files), not a WASTE model.
    pub(crate) fn is_checkpoint(&self) -> bool {
        self.blobs.is_none()
    }

    /// How many files the source reads.
    pub(crate) fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Source file `i`: its path and its bytes (mapped).
    pub(crate) fn file_at(&self, i: usize) -> (&Path, &[u8]) {
        (&self.files[i].0, &self.files[i].1)
    }

    /// The raw little-endian bytes of a tensor (bounds were checked by the header parser).
    pub fn bytes(&self, t: &SourceTensor) -> &[u8] {
        &self.files[t.file].1[t.start..t.end]
    }

    /// A tensor that must have this dtype and shape.
    pub fn expect(&self, name: &str, dtype: StDtype, shape: &[u64]) -> Result<&[u8], ConvertError> {
        Ok(self.bytes(self.check(name, dtype, shape)?))
    }

    /// Checks that a tensor exists with this dtype and shape (reads nothing).
    pub fn check(&self, name: &str, dtype: StDtype, shape: &[u64]) -> Result<&SourceTensor, ConvertError> {
        let t = self.get(name)?;
        if t.dtype != dtype || t.shape != shape {
            return Err(ConvertError::Shape {
                name: name.to_string(),
                expected: format!("{dtype:?} {shape:?}"),
                found: format!("{:?} {:?}", t.dtype, t.shape),
            });
        }
        Ok(t)
    }

    /// Which files the tensors came from, for provenance.
    pub fn file_sizes(&self) -> HashMap<String, u64> {
        self.files
            .iter()
            .map(|(p, m)| (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), m.len() as u64))
            .collect()
    }
}
