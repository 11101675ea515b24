//! WASTE (or checkpoint) -> Hugging Face safetensors: the inverse of conversion for encodings that
//! hold their values exactly (f32 / bf16 / f16 / FP8-block trunk, BF16, MXFP4 or FP8-block experts),
//! so a model can be run
//! by `transformers`, re-converted with other options, or compared with another engine.

use std::collections::BTreeMap;
use std::path::Path;

use k3_format::OutputFile;

use super::plan::EMBEDDED_FILES;
use super::{ConvertError, Source};

/// Shards are cut at this size, as Hugging Face checkpoints are.
const SHARD_BYTES: u64 = 4 << 30;

/// What `export` wrote.
#[derive(Debug, Clone, Default)]
pub struct ExportReport {
    pub tensors: usize,
    pub bytes: u64,
    pub files: Vec<String>,
}

/// Writes `src`'s tensors and files into `out` (created; refused if it holds anything).
pub fn export(src: &Source, out: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<ExportReport, ConvertError> {
    if out.exists() && std::fs::read_dir(out).map_err(|e| ConvertError::io(out, e))?.next().is_some() {
        return Err(ConvertError::Source {
            path: out.to_path_buf(),
            reason: "is not empty; export writes only into a new or empty directory".into(),
        });
    }
    std::fs::create_dir_all(out).map_err(|e| ConvertError::io(out, e))?;
    let names: Vec<&str> = src.names().collect();
    let total: u64 = names.iter().map(|n| src.get(n).map_or(0, |t| src.bytes(t).len() as u64)).sum();
    // Consecutive tensors, a shard at a time.
    let mut shards: Vec<Vec<&str>> = vec![Vec::new()];
    let mut size = 0u64;
    for n in &names {
        let b = src.bytes(src.get(n)?).len() as u64;
        if size + b > SHARD_BYTES && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            size = 0;
        }
        size += b;
        shards.last_mut().expect("one shard at least").push(n);
    }
    let count = shards.len();
    let mut report = ExportReport::default();
    let mut weight_map = serde_json::Map::new();
    let mut done = 0u64;
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let mut views = Vec::with_capacity(shard.len());
        for n in shard {
            let t = src.get(n)?;
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            let view = safetensors::tensor::TensorView::new(t.dtype, shape, src.bytes(t))
                .map_err(|e| ConvertError::Unsupported(format!("tensor `{n}`: {e}")))?;
            views.push((n.to_string(), view));
            weight_map.insert(n.to_string(), serde_json::Value::String(file.clone()));
            done += src.bytes(t).len() as u64;
        }
        let target = out.join(&file);
        let o = OutputFile::create(&target)?;
        safetensors::tensor::serialize_to_file(views, None, o.temp_path())
            .map_err(|e| ConvertError::Source { path: target.clone(), reason: e.to_string() })?;
        o.finish()?;
        progress(done, total);
        report.files.push(file);
    }
    report.tensors = names.len();
    report.bytes = total;
    if count > 1 {
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        k3_format::write_atomic(out.join("model.safetensors.index.json"), index.to_string().as_bytes())?;
        report.files.push("model.safetensors.index.json".into());
    }
    let mut extras = BTreeMap::new();
    for name in EMBEDDED_FILES {
        if let Some(bytes) = src.file(name)? {
            extras.insert(name, bytes);
        }
    }
    for (name, bytes) in extras {
        k3_format::write_atomic(out.join(name), &bytes)?;
        report.files.push(name.to_string());
    }
    Ok(report)
}
