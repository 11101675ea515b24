//! A Hugging Face checkpoint read lazily: every shard is memory-mapped and only its JSON header is
//! parsed, so a 1.5 TB checkpoint costs address space, not RAM.

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
    files: Vec<(PathBuf, Mmap)>,
    tensors: BTreeMap<String, SourceTensor>,
}

/// The prefix the K3 release puts before every text tensor.
const LM_PREFIX: &str = "language_model.";

impl Source {
    /// Opens `model.safetensors.index.json` if present (every shard it names), else every
    /// `*.safetensors` file in `dir`. Names lose the `language_model.` prefix.
    pub fn open(dir: &Path) -> Result<Source, ConvertError> {
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
            let f = File::open(&path).map_err(|e| ConvertError::io(&path, e))?;
            // SAFETY: read-only private map of a checkpoint file that the conversion does not
            // modify; a concurrent truncation by another program would fault, not corrupt output.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| ConvertError::io(&path, e))?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| ConvertError::Source { path: path.clone(), reason: e.to_string() })?;
            let base = 8 + n;
            let fi = files.len();
            for (tname, info) in meta.tensors() {
                let clean = tname.strip_prefix(LM_PREFIX).unwrap_or(&tname).to_string();
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
        Ok(Source { files, tensors })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Result<&SourceTensor, ConvertError> {
        self.tensors.get(name).ok_or_else(|| ConvertError::MissingTensor { name: name.to_string() })
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
