//! Every kind of damage gives a typed error that names the file and the tensor or record; none panics.

mod common;

use std::path::Path;

use common::{build, plan};
use k3_format::{FormatError, HEADER_FILE, Model, Place, TRUNK_FILE, shard_file_name};
use k3_format::{Header, seal};
use proptest::prelude::*;

fn model(experts: u32, shards: u16) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), &plan(experts, shards, 4096, 5));
    dir
}

fn header_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join(HEADER_FILE)).unwrap()
}

/// Re-encodes the header after `edit`, with a valid checksum, so only the edit is wrong.
fn patch_header(dir: &Path, edit: impl FnOnce(&mut Header)) {
    let path = dir.join(HEADER_FILE);
    let mut h = Header::parse(&path, &header_bytes(dir)).unwrap();
    edit(&mut h);
    std::fs::write(&path, Header::encode(&h.manifest, &h.index, &h.blobs)).unwrap();
}

fn open_err(dir: &Path) -> (FormatError, String) {
    let e = Model::open(dir).unwrap_err();
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn bad_magic() {
    let d = model(2, 1);
    let mut b = header_bytes(d.path());
    b[0] ^= 0xff;
    std::fs::write(d.path().join(HEADER_FILE), b).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::BadMagic { .. }), "{msg}");
    assert!(msg.contains(HEADER_FILE), "{msg}");
}

#[test]
fn unknown_major_version_is_refused_with_the_version() {
    let d = model(2, 1);
    let mut b = header_bytes(d.path());
    b[8..10].copy_from_slice(&2u16.to_le_bytes());
    seal(&mut b);
    std::fs::write(d.path().join(HEADER_FILE), b).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::UnsupportedVersion { major: 2, .. }), "{msg}");
    assert!(msg.contains("2.0") && msg.contains("1.x"), "{msg}");
}

#[test]
fn newer_minor_version_is_read() {
    let d = model(2, 1);
    let mut b = header_bytes(d.path());
    b[10..12].copy_from_slice(&7u16.to_le_bytes());
    seal(&mut b);
    std::fs::write(d.path().join(HEADER_FILE), b).unwrap();
    assert_eq!(Model::open(d.path()).unwrap().header().version, (1, 7));
}

#[test]
fn header_checksum_mismatch() {
    let d = model(2, 1);
    let mut b = header_bytes(d.path());
    let at = b.len() / 2;
    b[at] ^= 1;
    std::fs::write(d.path().join(HEADER_FILE), b).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::HeaderChecksum { .. }), "{msg}");
}

#[test]
fn record_offset_past_the_end_of_its_shard() {
    let d = model(3, 1);
    patch_header(d.path(), |h| h.index[4].offset = h.manifest.shards[0].bytes);
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::OutOfBounds { place: Place::Expert { layer: 2, expert: 1 }, .. }), "{msg}");
    assert!(msg.contains("experts-00000.waste"), "{msg}");
}

#[test]
fn tensor_past_the_end_of_the_trunk() {
    let d = model(2, 1);
    patch_header(d.path(), |h| {
        let t = &mut h.manifest.trunk.tensors[1];
        let shift = h.manifest.trunk.bytes;
        t.offset += shift;
        for p in &mut t.tensor.parts {
            p.offset += shift;
        }
    });
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::OutOfBounds { .. }), "{msg}");
    assert!(msg.contains("model.norm.weight") && msg.contains(TRUNK_FILE), "{msg}");
}

#[test]
fn overlapping_records() {
    let d = model(3, 1);
    patch_header(d.path(), |h| h.index[2].offset = h.index[1].offset);
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::Overlap { .. }), "{msg}");
    assert!(msg.contains("layer 1, expert 1") && msg.contains("layer 1, expert 2"), "{msg}");
}

#[test]
fn missing_record_is_named() {
    let d = model(3, 1);
    patch_header(d.path(), |h| {
        h.index.remove(4);
    });
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::MissingExpert { layer: 2, expert: 1, .. }), "{msg}");
}

#[test]
fn tensor_shape_that_its_bytes_cannot_hold() {
    let d = model(2, 1);
    patch_header(d.path(), |h| h.manifest.trunk.tensors[0].tensor.shape = vec![32, 65]);
    let (_, msg) = open_err(d.path());
    assert!(msg.contains("model.embed_tokens.weight") && msg.contains("[32, 65]"), "{msg}");
}

#[test]
fn unknown_encoding_is_a_clear_error() {
    let d = model(2, 1);
    let mut b = header_bytes(d.path());
    let needle = b"\"kind\": \"bf16\"";
    let at = b.windows(needle.len()).position(|w| w == needle).expect("the manifest names bf16");
    b[at + needle.len() - 2] = b'7';
    seal(&mut b);
    std::fs::write(d.path().join(HEADER_FILE), b).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::Manifest { .. }) && msg.contains("bf17"), "{msg}");
}

#[test]
fn truncated_shard_names_the_first_record_cut() {
    let d = model(4, 2);
    let shard = d.path().join(shard_file_name(1));
    let len = std::fs::metadata(&shard).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(len - 4096 - 1).unwrap();
    let (e, msg) = open_err(d.path());
    // Shard 1 holds records 1, 3, 5, 7 of (layer, expert) order; the last one, (2, 3), was cut.
    assert!(matches!(e, FormatError::OutOfBounds { place: Place::Expert { layer: 2, expert: 3 }, .. }), "{msg}");
    assert!(msg.contains("truncated") && msg.contains("experts-00001.waste"), "{msg}");
}

#[test]
fn truncated_trunk_names_a_tensor() {
    let d = model(2, 1);
    let trunk = d.path().join(TRUNK_FILE);
    std::fs::OpenOptions::new().write(true).open(&trunk).unwrap().set_len(100).unwrap();
    let (_, msg) = open_err(d.path());
    assert!(msg.contains("truncated") && msg.contains("tensor `"), "{msg}");
}

#[test]
fn missing_shard_lists_where_it_looked() {
    let d = model(2, 2);
    std::fs::remove_file(d.path().join(shard_file_name(1))).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, FormatError::MissingShard { .. }) && msg.contains("experts-00001.waste"), "{msg}");
}

#[test]
fn missing_tensor_and_expert_lookups() {
    let d = model(2, 1);
    let m = Model::open(d.path()).unwrap();
    assert!(matches!(m.tensor("nope"), Err(FormatError::MissingTensor { .. })));
    assert!(matches!(m.expert(0, 0), Err(FormatError::MissingExpert { layer: 0, .. })), "layer 0 is dense");
    assert!(matches!(m.expert(1, 2), Err(FormatError::MissingExpert { .. })));
}

#[test]
fn an_unfinished_model_never_opens() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(3, 1, 4096, 9);
    assert!(common::write(common::writer(dir.path(), &p.spec), &p, Some(5)).is_none());
    let (_, msg) = open_err(dir.path());
    assert!(msg.contains("unfinished conversion"), "{msg}");
}

#[test]
fn record_read_for_the_wrong_expert_is_refused() {
    let d = model(3, 1);
    let m = Model::open(d.path()).unwrap();
    let (a, b) = (m.expert(1, 0).unwrap(), m.expert(1, 1).unwrap());
    let mut buf = Vec::new();
    m.read_expert(&a, &mut buf).unwrap();
    // Skipping the checksum, the record header still catches a mix-up.
    let msg = b.parse(&buf, false).unwrap_err().to_string();
    assert!(msg.contains("layer 1, expert 1") && msg.contains("claims (layer 1, expert 0"), "{msg}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// A byte flipped anywhere in any record (header, data or padding) is found by verify, which
    /// names exactly that record; everything else still checks out.
    #[test]
    fn flipped_record_byte_is_found(record in 0usize..8, frac in 0.0f64..1.0, bit in 0u8..8) {
        let d = model(4, 2);
        let m = Model::open(d.path()).unwrap();
        let e = m.header().index[record];
        let path = m.expert(e.layer, e.expert).unwrap().path.to_path_buf();
        drop(m);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = e.offset as usize + ((e.length - 1) as f64 * frac) as usize;
        bytes[at] ^= 1 << bit;
        std::fs::write(&path, bytes).unwrap();
        let m = Model::open(d.path()).unwrap();
        let problems = m.verify(&mut |_| {});
        prop_assert_eq!(problems.len(), 1);
        prop_assert_eq!(&problems[0].place, &Place::Expert { layer: e.layer, expert: e.expert });
        let msg = problems[0].error.to_string();
        prop_assert!(msg.contains("checksum mismatch") && msg.contains(&format!("offset {}", e.offset)), "{}", msg);
    }

    /// A flipped byte inside any trunk tensor is found and the tensor named.
    #[test]
    fn flipped_trunk_byte_is_found(tensor in 0usize..6, frac in 0.0f64..1.0) {
        let d = model(2, 1);
        let m = Model::open(d.path()).unwrap();
        let t = m.manifest().trunk.tensors[tensor].clone();
        drop(m);
        let path = d.path().join(TRUNK_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[t.offset as usize + ((t.len - 1) as f64 * frac) as usize] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
        let problems = Model::open(d.path()).unwrap().verify(&mut |_| {});
        prop_assert_eq!(problems.len(), 1);
        prop_assert_eq!(&problems[0].place, &Place::Tensor(t.tensor.name.clone()));
    }
}
