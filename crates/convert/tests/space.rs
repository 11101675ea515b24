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
        let written: u64 = n.targets.iter().map(|t| t.bytes).sum();
        assert!(written >= n.trunk_bytes + n.expert_bytes, "{n:?}");
        assert!(n.short().is_none());
    }
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
