//! Converting the golden checkpoints: byte-exact experts and trunk, resumable, refusing to
//! overwrite, clear errors on broken checkpoints.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k3_convert::{ConvertOptions, ExpertFormat, Source, TrunkFormat, convert};
use k3_format::Model;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(name)
}

/// Copied experts (these tests are of the copying conversion; `in_place.rs` has the other).
fn opts(hf: &Path, out: &Path) -> ConvertOptions {
    ConvertOptions { shards: 2, copy_experts: true, ..ConvertOptions::new(hf, out) }
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

#[test]
fn k3_experts_and_trunk_are_copied_byte_exact() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("m");
    let hf = golden("tiny-k3");
    let report = convert(&opts(&hf, &dir), &mut |_| {}).unwrap();
    assert_eq!(report.written_items, 156 + 160);
    let m = Model::open(&dir).unwrap();
    let src = Source::open(&hf).unwrap();
    assert_eq!(m.blob("config.json").unwrap(), std::fs::read(hf.join("config.json")).unwrap());
    for name in src.names() {
        if name.contains(".experts.") {
            continue;
        }
        let t = m.tensor(name).unwrap();
        let s = src.get(name).unwrap();
        assert_eq!(t.shape, s.shape.as_slice(), "{name}");
        assert_eq!(t.parts[0].bytes, src.bytes(s), "{name}");
    }
    let mut buf = Vec::new();
    for (layer, expert) in [(1, 0), (3, 17), (5, 31)] {
        let loc = m.expert(layer, expert).unwrap();
        m.read_expert(&loc, &mut buf).unwrap();
        let v = loc.parse(&buf, true).unwrap();
        for w in ["w1", "w2", "w3"] {
            let base = format!("model.layers.{layer}.block_sparse_moe.experts.{expert}.{w}");
            let mat = v.matrix(w).unwrap();
            assert_eq!(
                mat.part("packed").unwrap().bytes,
                src.bytes(src.get(&format!("{base}.weight_packed")).unwrap())
            );
            assert_eq!(mat.part("scale").unwrap().bytes, src.bytes(src.get(&format!("{base}.weight_scale")).unwrap()));
        }
    }
}

#[test]
fn an_interrupted_conversion_resumes_to_identical_bytes() {
    let hf = golden("tiny-kimi-linear");
    let root = tempfile::tempdir().unwrap();
    let (whole, cut) = (root.path().join("whole"), root.path().join("cut"));
    convert(&opts(&hf, &whole), &mut |_| {}).unwrap();
    for stop_at in [0.3, 0.8] {
        let _ = std::fs::remove_dir_all(&cut);
        // Kill the conversion part way: a panic unwinds out of it, as far as the files know. The
        // later stop comes more than a second into the experts: progress is journaled at least
        // every second, so a small conversion does not start over.
        let mut slept = false;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            convert(&opts(&hf, &cut), &mut |p| {
                let at = p.done as f64 / p.total.max(1) as f64;
                if p.phase == "experts" && stop_at > 0.5 && at > 0.5 && !slept {
                    std::thread::sleep(std::time::Duration::from_millis(1100));
                    slept = true;
                }
                if p.phase == "experts" && at > stop_at {
                    panic!("interrupted");
                }
            })
        }));
        assert!(r.is_err());
        assert!(Model::open(&cut).is_err(), "a half-written model must not open");
        let report = convert(&opts(&hf, &cut), &mut |_| {}).unwrap();
        assert!(report.written_items > 0);
        if stop_at > 0.5 {
            assert!(report.resumed_items > 0, "work done more than a second before the stop is kept");
        }
        assert_eq!(files(&cut), files(&whole), "stopped at {stop_at}");
    }
    let again = convert(&opts(&hf, &whole), &mut |_| {}).unwrap();
    assert!(again.already_complete);
}

#[test]
fn refuses_to_write_into_a_directory_it_did_not_start() {
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("thesis.tex"), b"precious").unwrap();
    let err = convert(&opts(&golden("tiny-k3"), out.path()), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("refusing"), "{err}");
    assert_eq!(std::fs::read(out.path().join("thesis.tex")).unwrap(), b"precious");
}

/// Writes a copy of the golden K3 checkpoint with `edit` applied to its tensor list.
fn broken_checkpoint(
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    edited_checkpoint(golden("tiny-k3"), edit)
}

/// A copy of checkpoint `hf` (its config and every tensor) with `edit` applied to the tensors.
fn edited_checkpoint(
    hf: PathBuf,
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    let src = Source::open(&hf).unwrap();
    let mut tensors: Vec<_> = src
        .names()
        .map(|n| {
            let t = src.get(n).unwrap();
            (n.to_string(), t.dtype, t.shape.iter().map(|&d| d as usize).collect(), src.bytes(t).to_vec())
        })
        .collect();
    edit(&mut tensors);
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(hf.join("config.json"), d.path().join("config.json")).unwrap();
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, dt, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &d.path().join("model.safetensors")).unwrap();
    d
}

#[test]
fn a_missing_expert_tensor_is_named() {
    let hf =
        broken_checkpoint(|t| t.retain(|(n, ..)| n != "model.layers.4.block_sparse_moe.experts.9.w2.weight_scale"));
    let out = tempfile::tempdir().unwrap();
    let err = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("model.layers.4.block_sparse_moe.experts.9.w2.weight_scale"), "{err}");
}

#[test]
fn a_misshaped_expert_tensor_names_both_shapes() {
    let hf = broken_checkpoint(|t| {
        let e = t.iter_mut().find(|(n, ..)| n == "model.layers.2.block_sparse_moe.experts.5.w3.weight_packed").unwrap();
        e.2 = vec![32, 128];
    });
    let out = tempfile::tempdir().unwrap();
    let err = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap_err().to_string();
    assert!(
        err.contains("experts.5.w3.weight_packed") && err.contains("[64, 64]") && err.contains("[32, 128]"),
        "{err}"
    );
}

#[test]
fn vision_tensors_are_ignored_and_the_prefix_stripped() {
    let hf = broken_checkpoint(|t| {
        for e in t.iter_mut() {
            e.0 = format!("language_model.{}", e.0);
        }
        t.push(("vision_tower.patch_embed.weight".into(), safetensors::Dtype::BF16, vec![4], vec![0; 8]));
    });
    let out = tempfile::tempdir().unwrap();
    let report = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap();
    assert_eq!(report.ignored, vec!["vision_tower.patch_embed.weight".to_string()]);
    assert!(Model::open(out.path().join("m")).unwrap().has_tensor("model.norm.weight"));
}

/// DeepSeek-V3's multi-token-prediction layer (after the model's own layers, under DeepSeek's MoE
/// names) is not part of the model k3 runs: ignored and reported, the rest converted.
#[test]
fn deepseek_mtp_layers_are_ignored() {
    let hf = edited_checkpoint(golden("deepseek-v3/bf16"), |t| {
        t.push(("model.layers.3.eh_proj.weight".into(), safetensors::Dtype::BF16, vec![4, 4], vec![0; 32]));
        t.push(("model.layers.3.mlp.experts.0.gate_proj.weight".into(), safetensors::Dtype::BF16, vec![4], vec![0; 8]));
    });
    let out = tempfile::tempdir().unwrap();
    let report = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap();
    assert_eq!(report.ignored.len(), 2, "{:?}", report.ignored);
    assert!(report.ignored.iter().all(|n| n.starts_with("model.layers.3.")), "{:?}", report.ignored);
}

/// The committed fixtures are what today's converter makes from the golden checkpoints (all but
/// the provenance's source path, which depends on where the command ran).
#[test]
fn committed_fixtures_are_current() {
    for name in ["tiny-k3", "tiny-kimi-linear"] {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("m");
        let mut o = opts(&golden(name), &dir);
        o.shards = 1;
        convert(&o, &mut |_| {}).unwrap();
        let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../fixtures/{name}.waste"));
        let (a, b) = (Model::open(&dir).unwrap(), Model::open(&committed).unwrap());
        let strip = |m: &Model| {
            let mut m = m.manifest().clone();
            m.provenance["source"] = serde_json::Value::Null;
            m
        };
        assert_eq!(strip(&a), strip(&b), "{name}: regenerate with `cargo xtask convert`");
        assert_eq!(a.header().index, b.header().index, "{name}");
        for f in ["trunk.waste", "experts-00000.waste"] {
            assert!(std::fs::read(dir.join(f)).unwrap() == std::fs::read(committed.join(f)).unwrap(), "{name}/{f}");
        }
    }
}

/// The golden K3 checkpoint rewritten the way the release ships: three shards, every name with
/// the `language_model.` prefix, experts scattered over the shards in no particular order, an
/// index naming the shard of each tensor. It must convert to the same model.
#[test]
fn sharded_prefixed_shuffled_checkpoint_converts_to_the_same_model() {
    let hf = golden("tiny-k3");
    let src = Source::open(&hf).unwrap();
    let mut names: Vec<String> = src.names().map(str::to_string).collect();
    // A fixed shuffle (xorshift), so a failure reproduces.
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..names.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        names.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let d = tempfile::tempdir().unwrap();
    let shards: Vec<Vec<String>> = names.chunks(names.len().div_ceil(3)).map(<[String]>::to_vec).collect();
    common::write_sharded(&src, &shards, &hf.join("config.json"), d.path());

    let out = tempfile::tempdir().unwrap();
    let (a, b) = (out.path().join("a"), out.path().join("b"));
    convert(&opts(&hf, &a), &mut |_| {}).unwrap();
    convert(&opts(d.path(), &b), &mut |_| {}).unwrap();
    let (ma, mb) = (Model::open(&a).unwrap(), Model::open(&b).unwrap());
    let strip = |m: &Model| {
        let mut m = m.manifest().clone();
        m.provenance = serde_json::Value::Null;
        m
    };
    assert_eq!(strip(&ma), strip(&mb));
    assert_eq!(ma.header().index, mb.header().index);
    for f in ["trunk.waste", "experts-00000.waste", "experts-00001.waste"] {
        assert!(std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(), "{f}");
    }
}

/// Trunk tensors whose shapes disagree with the config are refused before anything is written,
/// naming the tensor: a transposed matrix, a missing row, a short embedding table.
#[test]
fn a_trunk_tensor_of_the_wrong_shape_is_refused_before_writing() {
    type Edit = fn(&mut (String, safetensors::Dtype, Vec<usize>, Vec<u8>));
    let cases: [(&str, Edit, &str); 3] = [
        ("model.layers.1.self_attn.o_proj.weight", |t| t.2.reverse(), "[256, 128]"),
        (
            "model.layers.3.self_attn.q_b_proj.weight",
            |t| {
                t.2[0] -= 1;
                t.3.truncate(t.2.iter().product::<usize>() * 2);
            },
            "[192, 96]",
        ),
        (
            "model.embed_tokens.weight",
            |t| {
                t.2[0] -= 8;
                t.3.truncate(t.2.iter().product::<usize>() * 2);
            },
            "[512, 256]",
        ),
    ];
    for (name, edit, expected) in cases {
        let hf = broken_checkpoint(|t| edit(t.iter_mut().find(|(n, ..)| n == name).unwrap()));
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("m");
        let err = convert(&opts(hf.path(), &dir), &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(expected), "{name}: {err}");
        assert!(!dir.exists(), "{name}: nothing written");
    }
}

/// A reshaped packed expert matrix is named itself, not its untouched scale tensor.
#[test]
fn a_reshaped_expert_matrix_is_named_itself() {
    let name = "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed";
    let hf = broken_checkpoint(|t| t.iter_mut().find(|(n, ..)| n == name).unwrap().2 = vec![128, 32]);
    let out = tempfile::tempdir().unwrap();
    let err = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains(name) && err.contains("[64, 64]") && err.contains("[128, 32]"), "{err}");
}

#[test]
fn a_tensor_the_config_does_not_have_is_refused() {
    let hf = broken_checkpoint(|t| {
        t.push(("model.layers.1.self_attn.extra.weight".into(), safetensors::Dtype::BF16, vec![2, 2], vec![0; 8]));
    });
    let out = tempfile::tempdir().unwrap();
    let err = convert(&opts(hf.path(), &out.path().join("m")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("model.layers.1.self_attn.extra.weight") && err.contains("not part of"), "{err}");
}

/// An interrupted conversion into `out`, stopped half way through the experts after progress was
/// journaled.
fn interrupted(hf: &Path, out: &Path) {
    let mut slept = false;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        convert(&opts(hf, out), &mut |p| {
            if p.phase == "experts" && p.done * 4 > p.total && !slept {
                std::thread::sleep(std::time::Duration::from_millis(1100));
                slept = true;
            }
            if p.phase == "experts" && p.done * 2 > p.total {
                panic!("interrupted");
            }
        })
    }));
    assert!(r.is_err());
}

/// The same checkpoint spelled another way (relative, trailing slash) resumes; other settings are
/// refused with the values that differ, and advice that keeps the finished part.
#[test]
fn resume_recognises_the_checkpoint_however_it_is_spelled() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("m");
    // Relative to the test's working directory (the crate), then absolute with a trailing slash.
    let relative = PathBuf::from("../../fixtures/golden/tiny-kimi-linear");
    interrupted(&relative, &out);
    let mut other = opts(&golden("tiny-kimi-linear"), &out);
    other.experts = ExpertFormat::Mxfp4;
    let err = convert(&other, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("experts: started with \"keep\", now \"mxfp4\""), "{err}");
    // Only the settings a person changed, not the layouts and encodings they imply.
    assert!(!err.contains("expert_layouts") && !err.contains("encodings"), "{err}");
    assert!(err.contains("with the settings it was started with"), "{err}");
    let spelled = PathBuf::from(format!("{}/", std::fs::canonicalize(&relative).unwrap().display()));
    let report = convert(&opts(&spelled, &out), &mut |_| {}).unwrap();
    assert!(report.resumed_items > 0, "the finished part is kept");
    assert!(Model::open(&out).is_ok());
}

/// Two conversions into one directory: the second is refused while the first holds it.
#[test]
fn a_second_conversion_into_the_same_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("m");
    let hf = golden("tiny-k3");
    let second = std::sync::Mutex::new(None);
    let _ = convert(&opts(&hf, &out), &mut |p| {
        let mut s = second.lock().unwrap();
        if p.phase == "experts" && s.is_none() {
            *s = Some(convert(&opts(&hf, &out), &mut |_| {}).map(|_| ()).unwrap_err().to_string());
        }
    })
    .unwrap();
    let err = second.into_inner().unwrap().unwrap();
    assert!(err.contains("another conversion is writing into it") && err.contains("pid"), "{err}");
}

#[test]
fn impossible_layouts_are_refused() {
    let out = tempfile::tempdir().unwrap();
    for (align, shards, says) in [(0, 1, "alignment 0"), (1000, 1, "alignment 1000"), (4096, 500, "500 expert shards")]
    {
        let o = ConvertOptions { alignment: align, shards, ..opts(&golden("tiny-k3"), &out.path().join("m")) };
        let err = convert(&o, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
        assert!(!out.path().join("m").exists());
    }
}

/// Shard directories on other drives are created, as the README's two-drive example expects.
#[test]
fn shard_directories_are_created() {
    let root = tempfile::tempdir().unwrap();
    let (out, second) = (root.path().join("m"), root.path().join("drive2/experts"));
    let o = ConvertOptions { shard_dirs: vec![out.clone(), second.clone()], ..opts(&golden("tiny-k3"), &out) };
    convert(&o, &mut |_| {}).unwrap();
    assert!(second.join("experts-00001.waste").exists());
}

/// A WASTE model is a conversion source: re-encoded with the same options it gives the same
/// bytes, without its original checkpoint; exported to safetensors and converted again, too.
#[test]
fn a_waste_model_converts_and_exports_without_its_checkpoint() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    for name in ["tiny-k3.waste", "tiny-kimi-linear.waste", "default.waste"] {
        let original = fixtures.join(name);
        let root = tempfile::tempdir().unwrap();
        let again = root.path().join("again");
        convert(&ConvertOptions { shards: 1, ..opts(&original, &again) }, &mut |_| {}).unwrap();
        let exported = root.path().join("hf");
        let src = Source::open(&original).unwrap();
        let report = k3_convert::export(&src, &exported, &mut |_, _| {}).unwrap();
        assert!(report.files.contains(&"config.json".to_string()), "{:?}", report.files);
        let round = root.path().join("round");
        convert(&ConvertOptions { shards: 1, ..opts(&exported, &round) }, &mut |_| {}).unwrap();
        for dir in [&again, &round] {
            for f in ["trunk.waste", "experts-00000.waste"] {
                assert!(std::fs::read(dir.join(f)).unwrap() == std::fs::read(original.join(f)).unwrap(), "{name} {f}");
            }
            let (a, b) = (Model::open(dir).unwrap(), Model::open(&original).unwrap());
            assert_eq!(a.manifest().blobs, b.manifest().blobs, "{name}: config and tokenizer carried over");
        }
    }
}

#[test]
fn a_waste_source_that_cannot_be_read_back_exactly_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let int8 = root.path().join("int8");
    convert(&ConvertOptions { trunk: TrunkFormat::Int8, ..opts(&golden("tiny-k3"), &int8) }, &mut |_| {}).unwrap();
    let err = convert(&opts(&int8, &root.path().join("out")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("int8") && err.contains("original checkpoint"), "{err}");
    // A damaged source is refused, not copied.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3.waste");
    let damaged = root.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), damaged.join(e.file_name())).unwrap();
    }
    let shard = damaged.join("experts-00000.waste");
    let mut b = std::fs::read(&shard).unwrap();
    b[10_000] ^= 1;
    std::fs::write(&shard, b).unwrap();
    let err = convert(&opts(&damaged, &root.path().join("out2")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("expert record (layer"), "{err}");
}

#[test]
fn a_converted_model_is_readable_as_the_umask_allows() {
    use std::os::unix::fs::PermissionsExt;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = u32::from_str_radix(status.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap().trim(), 8).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("m");
    convert(&opts(&golden("tiny-kimi-linear"), &dir), &mut |_| {}).unwrap();
    for f in ["header.waste", "trunk.waste", "experts-00000.waste"] {
        let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !mask, "{f}: {mode:o} (another user of a shared model must be able to read it)");
    }
}

/// FP8 checkpoints convert as stored by default: nothing is re-encoded, every FP8 matrix's bytes
/// and block scales are the checkpoint's; explicit choices are listed with their reason.
#[test]
fn fp8_is_kept_as_stored_and_re_encodings_are_reported() {
    let hf = golden("deepseek-v3/fp8");
    let out = tempfile::tempdir().unwrap();
    let report = convert(&ConvertOptions::new(&hf, out.path().join("keep")), &mut |_| {}).unwrap();
    assert!(report.re_encoded.is_empty(), "{:?}", report.re_encoded);
    let m = Model::open(out.path().join("keep")).unwrap();
    let src = Source::open(&hf).unwrap();
    let name = "model.layers.1.self_attn.q_a_proj.weight";
    let t = m.tensor(name).unwrap();
    assert_eq!(t.parts[0].bytes, src.bytes(src.get(name).unwrap()));
    assert_eq!(t.parts[1].bytes, src.bytes(src.get(&format!("{name}_scale_inv")).unwrap()));
    let o = ConvertOptions {
        experts: ExpertFormat::Mxfp4,
        trunk: TrunkFormat::Int4,
        ..ConvertOptions::new(&hf, out.path().join("int4"))
    };
    let report = convert(&o, &mut |_| {}).unwrap();
    let find = |from: &str, to: &str| report.re_encoded.iter().find(|r| r.from == from && r.to == to).cloned();
    let experts = find("fp8", "mxfp4").expect("experts re-encoded");
    assert_eq!((experts.count, experts.why.as_str()), (2 * 16 * 3, "--experts mxfp4"));
    // q_b_proj [96, 48] and kv_b ... : rows of 48 do not split into groups of 32.
    assert!(find("fp8", "int8-row").unwrap().why.contains("groups of 32"));
    let kept = find("bf16", "int8-row").expect("the output matrix and the embedding table at 8 bits");
    assert_eq!(
        (kept.count, kept.why.as_str()),
        (2, "--trunk int4: the output matrix and the embedding table keep 8 bits")
    );
    // Its only bf16 matrix is the output: nothing bf16 becomes int4.
    assert_eq!(find("bf16", "int4-g32"), None);
    // Run again: already complete, the same list.
    assert_eq!(convert(&o, &mut |_| {}).unwrap().re_encoded, report.re_encoded);
    // Exported back to safetensors, the FP8 model is the checkpoint's tensors byte for byte.
    let hf_again = out.path().join("hf");
    k3_convert::export(&Source::open(&out.path().join("keep")).unwrap(), &hf_again, &mut |_, _| {}).unwrap();
    let back = Source::open(&hf_again).unwrap();
    for name in src.names() {
        assert_eq!(back.bytes(back.get(name).unwrap()), src.bytes(src.get(name).unwrap()), "{name}");
    }
}

/// A NaN byte in FP8 weights kept as stored is refused, naming the tensor and the weight.
#[test]
fn an_fp8_nan_is_refused_by_name() {
    // DeepSeek's `mlp.experts.5.up_proj` in Kimi's spelling, as the source reads it.
    let name = "model.layers.2.block_sparse_moe.experts.5.w3.weight";
    let d = edited_checkpoint(golden("deepseek-v3/fp8"), |t| {
        let w = t.iter_mut().find(|t| t.0 == name).unwrap();
        w.3[77] = 0xFF;
    });
    std::fs::copy(golden("deepseek-v3/fp8/config.json"), d.path().join("config.json")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = convert(&ConvertOptions::new(d.path(), out.path().join("m")), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("experts.5") && err.contains("weight 77") && err.contains("NaN"), "{err}");
}
