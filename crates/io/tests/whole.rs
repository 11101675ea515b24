//! A whole file read through the reader is the file, byte for byte, at every size around the
//! 4 KiB blocks and the chunks (the reference is `std::fs::read`).

use k3_io::whole::{CHUNK, DEPTH, WholeRead, read_file};

#[test]
fn a_whole_file_reads_as_std_reads_it() {
    // On the target's disk, not a tmpfs: there O_DIRECT is really used.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for len in [0, 1, 4095, 4096, 4097, 3 * 4096, CHUNK - 1, CHUNK, CHUNK + 4096 + 17, (DEPTH + 3) * CHUNK + 123] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let path = dir.path().join(format!("f{len}"));
        std::fs::write(&path, &bytes).unwrap();
        let want = std::fs::read(&path).unwrap();
        for how in [WholeRead::Direct, WholeRead::Buffered] {
            let got = read_file(&path, how).unwrap();
            assert!(got == want, "{len} bytes, {how:?}: contents differ");
        }
    }
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let err = read_file(std::path::Path::new("/nonexistent/k3/state"), WholeRead::Direct).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/k3/state"), "{err}");
}
