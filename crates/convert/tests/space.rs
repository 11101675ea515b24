//! A conversion says what it needs before it writes: a dry run writes and creates nothing; a
//! conversion that cannot fit is refused with the numbers before any byte is written.

use std::path::{Path, PathBuf};

use k3_convert::{ConvertError, ConvertOptions, convert};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(name)
}

#[test]
fn a_dry_run_plans_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let shard_dir = d.path().join("drive2/k3");
    for copy in [false, true] {
        let o = ConvertOptions {
            dry_run: true,
            copy_experts: copy,
            shard_dirs: if copy { vec![shard_dir.clone()] } else { Vec::new() },
            ..ConvertOptions::new(golden("tiny-k3"), &out)
        };
        let r = convert(&o, &mut |_| {}).unwrap();
        let n = r.needs.unwrap();
        assert!(!out.exists() && !shard_dir.exists(), "nothing created");
        assert!(n.trunk_bytes > 4_000_000 && n.read_bytes > n.trunk_bytes, "{n:?}");
        // Copied, the experts' records are written (into the shard directory); in place, none.
        assert_eq!(n.expert_bytes > 2_000_000, copy, "{n:?}");
        assert!(n.short().is_none());
        // The plan against what the conversion then writes: it covers it, and not by much: the
        // journal (gone at the end) and the header are bounded from above by fixed amounts, 1 KB
        // a journal line and 1 MB of header slack, which on this tiny model are ~1.5 MB.
        let real = d.path().join(if copy { "real-copy" } else { "real" });
        let real_shards = d.path().join(if copy { "real-copy-drive2" } else { "real-drive2" });
        let o = ConvertOptions {
            copy_experts: copy,
            shard_dirs: if copy { vec![real_shards.clone()] } else { Vec::new() },
            ..ConvertOptions::new(golden("tiny-k3"), &real)
        };
        convert(&o, &mut |_| {}).unwrap();
        let planned: u64 = n.targets.iter().map(|t| t.bytes).sum();
        let written = bytes_under(&real) + if copy { bytes_under(&real_shards) } else { 0 };
        assert!(
            planned >= written && planned <= written + written / 20 + (2 << 20),
            "{planned} planned, {written} written"
        );
        let trunk = std::fs::metadata(real.join(k3_format::TRUNK_FILE)).unwrap().len();
        assert!(n.trunk_bytes >= trunk && n.trunk_bytes <= trunk + trunk / 20, "{n:?}: trunk {trunk}");
    }
}

/// Bytes of the files under `dir`, recursively.
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() { bytes_under(&e.path()) } else { m.len() }
        })
        .sum()
}

/// Into a 1 MB filesystem (tmpfs, mounted when the test runs as root).
#[test]
fn a_conversion_that_cannot_fit_is_refused_before_writing() {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map_or(1, |m| m.uid()) != 0 {
        eprintln!("skipped: mounting a small filesystem needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let small = d.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", small.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: could not mount a tmpfs");
        return;
    }
    let out = small.join("m");
    let r = convert(&ConvertOptions::new(golden("tiny-k3"), &out), &mut |_| {});
    let listing: Vec<_> = std::fs::read_dir(&small).unwrap().collect();
    let _ = std::process::Command::new("umount").arg(&small).status();
    match r {
        Err(e @ ConvertError::NoSpace { need, free, .. }) => {
            assert!(need > free && free <= 1 << 20, "{e}");
            let s = e.to_string();
            assert!(s.contains("not enough free space in") && s.contains(" GB are free"), "{s}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(listing.is_empty(), "nothing written: {listing:?}");
}
