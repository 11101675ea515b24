//! Checkpoints written for tests, as releases ship them.

use std::path::Path;

use k3_convert::Source;

/// `src`'s tensors written as a sharded checkpoint in `dir`: shard `k` holds `shards[k]`'s
/// tensors in that order, every name with the `language_model.` prefix, an index naming each
/// tensor's shard, and `config` copied beside them.
pub fn write_sharded(src: &Source, shards: &[Vec<String>], config: &Path, dir: &Path) {
    std::fs::copy(config, dir.join("config.json")).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (k, names) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards.len());
        let views: Vec<_> = names
            .iter()
            .map(|n| {
                let t = src.get(n).unwrap();
                let shape: Vec<usize> = t.shape.iter().map(|&x| x as usize).collect();
                let full = format!("language_model.{n}");
                weight_map.insert(full.clone(), serde_json::Value::String(file.clone()));
                (full, safetensors::tensor::TensorView::new(t.dtype, shape, src.bytes(t)).unwrap())
            })
            .collect();
        safetensors::tensor::serialize_to_file(views, None, &dir.join(&file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}
