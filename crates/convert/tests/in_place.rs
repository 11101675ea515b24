//! Experts read in place from the checkpoint's own files: the same experts as a copy, bit for bit;
//! a checkpoint file moved, cut, rewritten or damaged after conversion is refused by name;
//! resumable; a checkpoint whose experts cannot be read in place is copied, saying why.

mod common;

use std::path::{Path, PathBuf};

use k3_convert::{ConvertOptions, Source, convert};
use k3_format::Model;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(name)
}

/// The golden K3 checkpoint as the release ships it: every name with the `language_model.`
/// prefix, three shards, the trunk first, then the experts in a scrambled order (each expert's
/// tensors back to back), an index naming each tensor's shard. `split` names one expert whose
/// w2 goes into the next shard.
fn release_like(split: Option<(u32, u32)>) -> tempfile::TempDir {
    let hf = golden("tiny-k3");
    let src = Source::open(&hf).unwrap();
    let expert_of = |n: &str| {
        let rest = n.split(".experts.").nth(1)?;
        let layer: u32 = n.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()?;
        Some((layer, rest.split('.').next()?.parse::<u32>().ok()?))
    };
    let (mut groups, mut trunk): (Vec<(u32, u32)>, Vec<String>) = (Vec::new(), Vec::new());
    for n in src.names() {
        match expert_of(n) {
            Some(e) if !groups.contains(&e) => groups.push(e),
            Some(_) => {}
            None => trunk.push(n.to_string()),
        }
    }
    // A fixed shuffle (xorshift), so a failure reproduces.
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..groups.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        groups.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let mut shards: Vec<Vec<String>> = vec![trunk, Vec::new(), Vec::new()];
    for (i, &(l, e)) in groups.iter().enumerate() {
        let k = 1 + i * 2 / groups.len();
        for n in src.names().filter(|n| expert_of(n) == Some((l, e))) {
            let moved = split == Some((l, e)) && n.contains(".w2.");
            shards[if moved { (k + 1) % 3 } else { k }].push(n.to_string());
        }
    }
    let d = tempfile::tempdir().unwrap();
    common::write_sharded(&src, &shards, &hf.join("config.json"), d.path());
    d
}

/// Every expert's matrices, part by part, as the model reads them.
fn experts(m: &Model) -> Vec<Vec<u8>> {
    let a = &m.manifest().architecture;
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for &layer in &a.moe_layers {
        for e in 0..a.experts {
            let loc = m.expert(layer, e).unwrap();
            m.read_expert(&loc, &mut buf).unwrap();
            let v = loc.parse(&buf, true).unwrap();
            for t in &v.matrices {
                out.extend(t.parts.iter().map(|p| p.bytes.to_vec()));
            }
        }
    }
    out
}

#[test]
fn experts_read_in_place_are_the_copy_bit_for_bit() {
    let ckpt = release_like(None);
    let out = tempfile::tempdir().unwrap();
    let (placed, copied) = (out.path().join("placed"), out.path().join("copied"));
    let report = convert(&ConvertOptions::new(ckpt.path(), &placed), &mut |_| {}).unwrap();
    assert_eq!(report.in_place, Some(Ok(2)), "the two shards holding experts");
    let trunk = std::fs::metadata(placed.join("trunk.waste")).unwrap().len();
    assert!(report.written_bytes > 0 && report.written_bytes <= trunk, "{} {trunk}", report.written_bytes);
    let copy = ConvertOptions { copy_experts: true, ..ConvertOptions::new(ckpt.path(), &copied) };
    convert(&copy, &mut |_| {}).unwrap();
    // Nothing but the header and the trunk is written; the trunk is the copy's.
    let mut names: Vec<String> =
        std::fs::read_dir(&placed).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["header.waste", "trunk.waste"]);
    assert!(std::fs::read(placed.join("trunk.waste")).unwrap() == std::fs::read(copied.join("trunk.waste")).unwrap());
    let (mp, mc) = (Model::open(&placed).unwrap(), Model::open(&copied).unwrap());
    assert!(mp.shard_paths().iter().all(|p| p.starts_with(std::fs::canonicalize(ckpt.path()).unwrap())));
    let (a, b) = (experts(&mp), experts(&mc));
    assert_eq!(a.len(), b.len());
    assert!(a == b, "every part of every expert");
    assert!(mp.verify(&mut |_| {}).is_empty());
    // A model read in place is a source like any other: converted (copied) and exported back,
    // its experts are the checkpoint's.
    let again = out.path().join("again");
    convert(&ConvertOptions { copy_experts: true, ..ConvertOptions::new(&placed, &again) }, &mut |_| {}).unwrap();
    assert!(experts(&Model::open(&again).unwrap()) == b, "every part of every expert, through a second conversion");
}

#[test]
fn a_checkpoint_file_changed_after_conversion_is_refused_by_name() {
    let ckpt = release_like(None);
    let out = tempfile::tempdir().unwrap();
    let m = out.path().join("m");
    convert(&ConvertOptions::new(ckpt.path(), &m), &mut |_| {}).unwrap();
    let shard = std::fs::canonicalize(ckpt.path().join("model-00002-of-00003.safetensors")).unwrap();
    let open_err = || Model::open(&m).unwrap_err().to_string();
    let named = |e: &str| e.contains(&shard.display().to_string()) && e.contains("(layer ");
    // Moved away.
    let moved = shard.with_extension("moved");
    std::fs::rename(&shard, &moved).unwrap();
    let e = open_err();
    assert!(named(&e) && e.contains("is gone"), "{e}");
    std::fs::rename(&moved, &shard).unwrap();
    let (bytes, meta) = (std::fs::read(&shard).unwrap(), std::fs::metadata(&shard).unwrap());
    let mtime = meta.modified().unwrap();
    // Cut short.
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let e = open_err();
    assert!(named(&e) && e.contains(&format!("not {}", bytes.len())), "{e}");
    // Rewritten with the same size.
    std::fs::write(&shard, &bytes).unwrap();
    let e = open_err();
    assert!(named(&e) && e.contains("modified"), "{e}");
    // Converting again says how to go on (not "already converted", not the same error again).
    let again = convert(&ConvertOptions::new(ckpt.path(), &m), &mut |_| {}).unwrap_err().to_string();
    assert!(again.contains("changed since") && again.contains("remove the directory"), "{again}");
    // A flipped byte with the time put back: opening cannot tell; verify and reading can.
    let mut flipped = bytes.clone();
    let at = flipped.len() - 5000;
    flipped[at] ^= 1;
    std::fs::write(&shard, &flipped).unwrap();
    std::fs::File::options().write(true).open(&shard).unwrap().set_modified(mtime).unwrap();
    let model = Model::open(&m).unwrap();
    let problems = model.verify(&mut |_| {});
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].error.to_string().contains("checksum"), "{}", problems[0].error);
    assert!(matches!(problems[0].place, k3_format::Place::Expert { .. }));
}

#[test]
fn an_interrupted_conversion_in_place_resumes_to_the_same_model() {
    // All in place, and one expert copied beside them (a shard of the model's own to cut back).
    for split in [None, Some((3, 17))] {
        let ckpt = release_like(split);
        let out = tempfile::tempdir().unwrap();
        resumes_to_the_same_model(ckpt.path(), out.path());
    }
}

fn resumes_to_the_same_model(ckpt: &Path, out: &Path) {
    let (whole, cut) = (out.join("whole"), out.join("cut"));
    convert(&ConvertOptions::new(ckpt, &whole), &mut |_| {}).unwrap();
    let o = ConvertOptions::new(ckpt, &cut);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut slept = false;
        convert(&o, &mut |p| {
            if p.phase == "experts" && p.done * 3 > p.total && !slept {
                // Past the writer's journaling interval, so some records were journaled.
                std::thread::sleep(std::time::Duration::from_millis(1100));
                slept = true;
            }
            if p.phase == "experts" && p.done * 3 > 2 * p.total {
                panic!("interrupted");
            }
        })
    }));
    assert!(r.is_err());
    let report = convert(&o, &mut |_| {}).unwrap();
    assert!(report.resumed_items > 0, "{report:?}");
    assert!(std::fs::read(whole.join("header.waste")).unwrap() == std::fs::read(cut.join("header.waste")).unwrap());
}

/// An expert whose tensors are cut across two files is copied into the model's one shard, saying
/// why; every other expert stays in place; all of them the copy's, bit for bit.
#[test]
fn experts_that_cannot_be_read_in_place_are_copied_saying_why() {
    let ckpt = release_like(Some((3, 17)));
    let out = tempfile::tempdir().unwrap();
    let (mixed, copied) = (out.path().join("m"), out.path().join("c"));
    let report = convert(&ConvertOptions::new(ckpt.path(), &mixed), &mut |_| {}).unwrap();
    assert_eq!(report.in_place, Some(Ok(2)), "the shards holding experts");
    let (n, why) = report.copied_experts.unwrap();
    assert!(n == 1 && why.contains("layer 3 expert 17") && why.contains("more than one file"), "{why}");
    let shard = mixed.join("experts-00000.waste");
    let mm = Model::open(&mixed).unwrap();
    assert_eq!(std::fs::metadata(&shard).unwrap().len(), mm.expert(3, 17).unwrap().entry.length, "one record");
    convert(&ConvertOptions { copy_experts: true, ..ConvertOptions::new(ckpt.path(), &copied) }, &mut |_| {}).unwrap();
    assert!(experts(&mm) == experts(&Model::open(&copied).unwrap()));
    // Placing experts that are read in place is a contradiction, said as such.
    let whole = release_like(None);
    let o = ConvertOptions { shards: 2, ..ConvertOptions::new(whole.path(), out.path().join("n")) };
    let e = convert(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("--copy-experts"), "{e}");
}

/// The engine's reads (O_DIRECT where the filesystem allows, the aligned read around each run,
/// zeros past a file's end) give the copy's logits, bit for bit, with the cache so small that
/// experts are read again and again, and with a roomy one.
#[test]
fn logits_in_place_are_the_copy_bit_for_bit() {
    // Every expert in place; one copied beside them.
    for split in [None, Some((3, 17))] {
        let ckpt = release_like(split);
        // On the disk, not /tmp: where O_DIRECT works when the filesystem has it.
        let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        logits_match(ckpt.path(), out.path());
    }
}

fn logits_match(ckpt: &Path, out: &Path) {
    use k3_engine::{Engine, EngineOptions};
    let (placed, copied) = (out.join("placed"), out.join("copied"));
    convert(&ConvertOptions::new(ckpt, &placed), &mut |_| {}).unwrap();
    convert(&ConvertOptions { copy_experts: true, ..ConvertOptions::new(ckpt, &copied) }, &mut |_| {}).unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    let logits = |dir: &Path, slots: Option<u64>| {
        let model = Model::open(dir).unwrap();
        let budget = slots.map(|n| {
            let p = *Engine::load(&model).unwrap().plan();
            p.fixed_bytes() + n * p.slot_bytes
        });
        let engine = Engine::load_with(&model, EngineOptions { mem_budget: budget, ..Default::default() }).unwrap();
        let mut s = engine.session();
        let got: Vec<u32> =
            ids.chunks(5).flat_map(|c| engine.forward(&mut s, c, None).unwrap()).map(f32::to_bits).collect();
        got
    };
    for slots in [Some(3), None] {
        assert!(logits(&placed, slots) == logits(&copied, slots), "{slots:?} slots");
    }
}
