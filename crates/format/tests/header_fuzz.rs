//! The header parser never panics, whatever it is fed.

mod common;

use std::path::Path;

use k3_format::{Header, MAGIC, seal};
use proptest::prelude::*;

fn valid_header() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    common::build(dir.path(), &common::plan(3, 2, 4096, 1));
    std::fs::read(dir.path().join(k3_format::HEADER_FILE)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = Header::parse(Path::new("fuzz"), &bytes);
    }

    /// Arbitrary bytes behind a valid magic and version, with a valid checksum, so the parser
    /// gets past the prologue checks into the section and manifest parsing.
    #[test]
    fn arbitrary_sealed_body(mut bytes in proptest::collection::vec(any::<u8>(), 128..2048), sections in any::<[u16; 6]>()) {
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&[1, 0, 0, 0]);
        for (i, s) in sections.iter().enumerate() {
            bytes[16 + 8 * i..24 + 8 * i].copy_from_slice(&u64::from(*s).to_le_bytes());
        }
        seal(&mut bytes);
        let _ = Header::parse(Path::new("fuzz"), &bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    /// A real header with random bytes changed and the checksum fixed up: every edit is either
    /// harmless or an error, never a panic.
    #[test]
    fn mutated_real_header(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = valid_header();
        for (at, v) in edits {
            let i = at.index(bytes.len() - 8) + 8;
            bytes[i] = v;
        }
        seal(&mut bytes);
        let _ = Header::parse(Path::new("fuzz"), &bytes);
    }
}
