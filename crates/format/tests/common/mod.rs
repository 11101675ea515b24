//! A small model built with the writer, with the bytes that went in kept for comparison.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k3_format::{Architecture, Encoding, ExpertLayout, ModelWriter, Opened, WriterSpec};

/// Deterministic bytes (xorshift), so failures reproduce.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// (name, encoding, shape, parts)
pub type TensorData = (String, Encoding, Vec<u64>, Vec<Vec<u8>>);

#[derive(Debug, Clone)]
pub struct Plan {
    pub spec: WriterSpec,
    pub tensors: Vec<TensorData>,
    /// (layer, expert, layout, parts)
    pub experts: Vec<(u32, u32, u16, Vec<Vec<u8>>)>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

pub fn parts_for(enc: &Encoding, shape: &[u64], seed: u64) -> Vec<Vec<u8>> {
    enc.parts(shape)
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| bytes(seed.wrapping_mul(31).wrapping_add(i as u64), p.bytes() as usize))
        .collect()
}

/// A K3-like miniature: 3 layers (layer 0 dense), `experts` experts per MoE layer, MXFP4 experts in
/// layer 1 and an int4 + VQ layout in layer 2, a few trunk tensors of every plain encoding.
pub fn plan(experts: u32, shards: u16, alignment: u64, seed: u64) -> Plan {
    let architecture = Architecture {
        name: "kimi_k3".into(),
        layers: 3,
        hidden: 64,
        vocab: 32,
        experts,
        experts_per_token: 2.min(experts),
        moe_layers: vec![1, 2],
    };
    let mxfp4 = ExpertLayout::build(
        alignment,
        &[
            ("w1", Encoding::Mxfp4, vec![32, 64]),
            ("w2", Encoding::Mxfp4, vec![64, 32]),
            ("w3", Encoding::Mxfp4, vec![32, 64]),
        ],
    )
    .unwrap();
    let vq = Encoding::Vq {
        stages: 3,
        entries: 16,
        dim: 4,
        rotation_block: 32,
        rotation_seed: 7,
        codebook: k3_format::CodebookSource::Inline,
        interleave: 32,
    };
    let mixed = ExpertLayout::build(
        alignment,
        &[
            ("w1", vq.clone(), vec![32, 64]),
            ("w2", Encoding::Int4Group { group: 32 }, vec![64, 32]),
            ("w3", vq, vec![32, 64]),
        ],
    )
    .unwrap();
    let layouts = vec![mxfp4, mixed];
    let tensor_specs: Vec<(&str, Encoding, Vec<u64>)> = vec![
        ("model.embed_tokens.weight", Encoding::Bf16, vec![32, 64]),
        ("model.norm.weight", Encoding::F32, vec![64]),
        ("model.layers.0.mlp.up_proj.weight", Encoding::Int8Row, vec![48, 64]),
        ("model.layers.0.mlp.down_proj.weight", Encoding::Int4Group { group: 16 }, vec![64, 48]),
        ("model.layers.0.self_attn.A_log", Encoding::F32, vec![1, 1, 4, 1]),
        ("lm_head.weight", Encoding::F16, vec![32, 64]),
    ];
    let tensors = tensor_specs
        .into_iter()
        .enumerate()
        .map(|(i, (n, e, s))| {
            let p = parts_for(&e, &s, seed.wrapping_add(i as u64));
            (n.to_string(), e, s, p)
        })
        .collect();
    let mut list = Vec::new();
    for (li, &layer) in architecture.moe_layers.iter().enumerate() {
        for e in 0..experts {
            let layout = &layouts[li];
            let parts = layout
                .matrices
                .iter()
                .flat_map(|m| m.parts.iter())
                .enumerate()
                .map(|(pi, p)| bytes(seed ^ (u64::from(layer) << 40 | u64::from(e) << 8 | pi as u64), p.len as usize))
                .collect();
            list.push((layer, e, li as u16, parts));
        }
    }
    let spec = WriterSpec {
        architecture,
        alignment,
        shards,
        shard_dirs: Vec::new(),
        expert_layouts: layouts,
        encodings: BTreeMap::from([
            ("experts".to_string(), "mxfp4".to_string()),
            ("trunk".to_string(), "mixed".to_string()),
        ]),
        provenance: serde_json::json!({"source": "test", "seed": seed}),
        checkpoint_files: Vec::new(),
    };
    let blobs = vec![("config.json".to_string(), b"{\"model_type\": \"test\"}".to_vec())];
    Plan { spec, tensors, experts: list, blobs }
}

pub fn writer(dir: &Path, spec: &WriterSpec) -> Box<ModelWriter> {
    match ModelWriter::open(dir, spec.clone()).unwrap() {
        Opened::Writer(w) => w,
        Opened::Complete => panic!("unexpectedly complete"),
    }
}

/// Writes the items of `plan` that `w` does not have yet; stops after `limit` items if given
/// (without finishing), else finishes.
pub fn write(mut w: Box<ModelWriter>, plan: &Plan, limit: Option<usize>) -> Option<PathBuf> {
    let mut n = 0;
    for (name, enc, shape, parts) in &plan.tensors {
        if w.has_tensor(name) {
            continue;
        }
        if limit == Some(n) {
            w.sync().unwrap();
            return None;
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        w.write_tensor(name, enc.clone(), shape, &refs).unwrap();
        n += 1;
    }
    for (layer, expert, layout, parts) in &plan.experts {
        if w.has_expert(*layer, *expert) {
            continue;
        }
        if limit == Some(n) {
            w.sync().unwrap();
            return None;
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        w.write_expert(*layer, *expert, *layout, &refs).unwrap();
        n += 1;
    }
    let blobs: Vec<(&str, &[u8])> = plan.blobs.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    Some(w.finish(&blobs).unwrap())
}

pub fn build(dir: &Path, plan: &Plan) {
    write(writer(dir, &plan.spec), plan, None).unwrap();
}
