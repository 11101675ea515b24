//! What the writer puts in, the reader gives back, byte for byte, for any layout.

mod common;

use common::{build, plan};
use k3_format::{Model, OpenOptions};
use proptest::prelude::*;

fn check_roundtrip(experts: u32, shards: u16, alignment: u64, seed: u64, spread: bool) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("model");
    let mut p = plan(experts, shards, alignment, seed);
    let drives: Vec<_> = (0..2).map(|i| root.path().join(format!("drive{i}"))).collect();
    if spread {
        for d in &drives {
            std::fs::create_dir_all(d).unwrap();
        }
        p.spec.shard_dirs = drives.clone();
    }
    build(&dir, &p);
    let opts = OpenOptions { shard_dirs: if spread { drives } else { Vec::new() } };
    let m = Model::open_with(&dir, &opts).unwrap();
    assert_eq!(m.manifest().architecture, p.spec.architecture);
    assert_eq!(m.blob("config.json").unwrap(), p.blobs[0].1.as_slice());
    for (name, enc, shape, parts) in &p.tensors {
        let t = m.tensor(name).unwrap();
        assert_eq!(t.encoding, enc);
        assert_eq!(t.shape, shape.as_slice());
        assert_eq!(t.parts.len(), parts.len());
        for (got, want) in t.parts.iter().zip(parts) {
            assert_eq!(got.bytes, want.as_slice(), "{name}.{}", got.name);
            assert_eq!(got.bytes.as_ptr() as usize % 64, 0, "parts are 64-byte aligned in the map");
        }
    }
    let mut buf = Vec::new();
    for (layer, expert, _, parts) in &p.experts {
        let loc = m.expert(*layer, *expert).unwrap();
        assert_eq!(loc.entry.offset % alignment, 0);
        assert_eq!(loc.entry.length % alignment, 0);
        m.read_expert(&loc, &mut buf).unwrap();
        let view = loc.parse(&buf, true).unwrap();
        let got: Vec<&[u8]> = view.matrices.iter().flat_map(|t| t.parts.iter().map(|p| p.bytes)).collect();
        assert_eq!(got.len(), parts.len());
        for (g, w) in got.iter().zip(parts) {
            assert_eq!(*g, w.as_slice(), "layer {layer} expert {expert}");
        }
    }
    assert!(m.verify(&mut |_| {}).is_empty());
}

#[test]
fn roundtrip_two_mib_alignment_and_striped_shards_on_two_drives() {
    check_roundtrip(5, 3, 2 << 20, 11, true);
}

#[test]
fn typed_views_read_the_values_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(2, 1, 4096, 3);
    build(dir.path(), &p);
    let m = Model::open(dir.path()).unwrap();
    let norm = m.tensor("model.norm.weight").unwrap();
    let f: &[f32] = norm.typed("data").unwrap();
    let want: Vec<f32> = p.tensors[1].3[0].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(f.len(), 64);
    assert_eq!(f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    // The wrong type is refused with a message naming the tensor and part.
    let err = norm.typed::<half::bf16>("data").unwrap_err().to_string();
    assert!(err.contains("model.norm.weight") && err.contains("f32"), "{err}");
    let q: &[i8] = m.tensor("model.layers.0.mlp.up_proj.weight").unwrap().typed("q").unwrap();
    assert_eq!(q.len(), 48 * 64);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn roundtrip_any_model(experts in 1u32..7, shards in 1u16..4, seed in any::<u64>(), spread in any::<bool>()) {
        check_roundtrip(experts, shards, 4096, seed, spread);
    }
}
