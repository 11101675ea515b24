//! A quantized trunk keeps exact what must stay exact. Every `--trunk` option leaves the
//! protected tensors (norms, router gates and biases, `A_log`, `dt_bias`, convolutions, AttnRes
//! projections) bit for bit as the checkpoint has them, and a bf16 trunk gives the reference's
//! logits within the cost of rounding the matrices alone, with the same experts chosen at every
//! layer and position.
//!
//! References: the golden logits (an independent numpy K3, transformers for Kimi-Linear), and for
//! an f32 checkpoint — where rounding matrices to bf16 really costs something — the logits
//! transformers computes on it (`fixtures/golden/tiny-kimi-linear-f32`, made by
//! `tools/golden/f32_kimi_linear.py` from the same rule as [`f32_checkpoint`]).

use std::path::{Path, PathBuf};

use k3_convert::tensors::{Storage, table};
use k3_convert::{ConvertOptions, Source, TrunkFormat, convert};
use k3_engine::config::ModelConfig;
use k3_engine::{Engine, RoutedToken};
use k3_format::{Encoding, Model};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(name)
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn ids(name: &str) -> Vec<u32> {
    std::fs::read_to_string(golden(name).join("golden/ids.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    (num / den).sqrt()
}

const TRUNKS: [TrunkFormat; 4] = [TrunkFormat::F32, TrunkFormat::Bf16, TrunkFormat::Int8, TrunkFormat::Int4];

/// A copy of the checkpoint `hf` with every tensor rewritten by `f(name, dtype, bytes)` into
/// (dtype, bytes).
fn rewritten(
    hf: &Path,
    f: impl Fn(&str, safetensors::Dtype, &[u8]) -> (safetensors::Dtype, Vec<u8>),
) -> tempfile::TempDir {
    let src = Source::open(hf).unwrap();
    let d = tempfile::tempdir().unwrap();
    let tensors: Vec<(String, Vec<usize>, safetensors::Dtype, Vec<u8>)> = src
        .names()
        .map(|name| {
            let t = src.get(name).unwrap();
            let (dtype, bytes) = f(name, t.dtype, src.bytes(t));
            (name.to_string(), t.shape.iter().map(|&s| s as usize).collect(), dtype, bytes)
        })
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, s, dt, b)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &d.path().join("model.safetensors")).unwrap();
    std::fs::copy(hf.join("config.json"), d.path().join("config.json")).unwrap();
    d
}

fn bf16_values(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
}

/// The golden Kimi-Linear widened to f32 with every BF16 tensor perturbed (the rule of
/// `tools/golden/f32_kimi_linear.py`, element `i` times `1 + (frac(i * 2654435761 / 2^32) - 0.5) *
/// 0.02` in f64), so its matrices hold values bf16 cannot.
fn f32_checkpoint() -> tempfile::TempDir {
    rewritten(&golden("tiny-kimi-linear"), |_, dtype, bytes| match dtype {
        safetensors::Dtype::BF16 => {
            let out = bf16_values(bytes)
                .enumerate()
                .flat_map(|(i, w)| {
                    let u = ((i as u64 * 2_654_435_761) % (1 << 32)) as f64 / 4_294_967_296.0;
                    ((f64::from(w) * (1.0 + (u - 0.5) * 0.02)) as f32).to_le_bytes()
                })
                .collect();
            (safetensors::Dtype::F32, out)
        }
        _ => (dtype, bytes.to_vec()),
    })
}

/// The checkpoint with its F32 tensors rounded to bf16 values (still stored as F32): the model the
/// old converter's `--trunk bf16` made, which rounded every tensor.
fn f32_tensors_rounded(hf: &Path) -> tempfile::TempDir {
    rewritten(hf, |_, dtype, bytes| match dtype {
        safetensors::Dtype::F32 => {
            let out = bytes
                .chunks_exact(4)
                .flat_map(|c| half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_f32().to_le_bytes())
                .collect();
            (dtype, out)
        }
        _ => (dtype, bytes.to_vec()),
    })
}

/// A converted model in a temporary directory.
struct Converted {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn converted(hf: &Path, trunk: TrunkFormat) -> Converted {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m");
    let opts = ConvertOptions { trunk, ..ConvertOptions::new(hf, &path) };
    convert(&opts, &mut |_| {}).unwrap();
    Converted { _dir: dir, path }
}

/// Logits at every position of `ids`, and every token's experts at every MoE layer.
fn run(model: &Path, ids: &[u32]) -> (Vec<f32>, Vec<RoutedToken>) {
    let m = Model::open(model).unwrap();
    let engine = Engine::load(&m).unwrap();
    let mut s = engine.session();
    s.routing_trace = Some(Vec::new());
    let logits = engine.forward(&mut s, ids, None).unwrap();
    let mut routing = s.routing_trace.take().unwrap();
    for r in &mut routing {
        r.experts.sort_unstable();
    }
    routing.sort_by_key(|r| (r.layer, r.position));
    (logits, routing)
}

/// Fraction of (layer, position) whose chosen experts are the same set.
/// The share of (token, layer) routings that chose the same experts (weights aside).
fn routing_agreement(a: &[RoutedToken], b: &[RoutedToken]) -> f64 {
    assert_eq!(a.len(), b.len());
    let same =
        |x: &RoutedToken, y: &RoutedToken| (x.position, x.layer, &x.experts) == (y.position, y.layer, &y.experts);
    a.iter().zip(b).filter(|(x, y)| same(x, y)).count() as f64 / a.len() as f64
}

/// A trunk tensor read back from a WASTE file: its dtype and bytes (f32 or bf16 only).
fn stored(m: &Model, name: &str) -> (safetensors::Dtype, Vec<u8>) {
    let t = m.tensor(name).unwrap();
    let dtype = match t.encoding {
        Encoding::F32 => safetensors::Dtype::F32,
        Encoding::Bf16 => safetensors::Dtype::BF16,
        other => panic!("{name} is stored as {}", other.label()),
    };
    (dtype, t.part("data").unwrap().bytes.to_vec())
}

/// A tensor's values as f32 bit patterns, from its bytes.
fn values(dtype: safetensors::Dtype, bytes: &[u8]) -> Vec<u32> {
    match dtype {
        safetensors::Dtype::F32 => bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect(),
        safetensors::Dtype::BF16 => {
            bytes.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).collect()
        }
        other => panic!("{other:?}"),
    }
}

/// The protected tensors come back from the WASTE file bit for bit as the checkpoint stores
/// them (`--trunk f32` widens bf16 ones, which is exact: the same values).
#[test]
fn protected_tensors_are_bit_identical_for_every_trunk_option() {
    let f32_ckpt = f32_checkpoint();
    for hf in [golden("tiny-k3"), golden("tiny-kimi-linear"), f32_ckpt.path().to_path_buf()] {
        let cfg_path = hf.join("config.json");
        let cfg = ModelConfig::parse(&cfg_path, &std::fs::read(&cfg_path).unwrap()).unwrap();
        let tbl = table(&cfg);
        let src = Source::open(&hf).unwrap();
        for trunk in TRUNKS {
            let c = converted(&hf, trunk);
            let m = Model::open(&c.path).unwrap();
            let mut checked = 0;
            for e in tbl.trunk.iter().filter(|e| e.storage == Storage::Exact) {
                let a = src.get(&e.name).unwrap();
                let (dtype, bytes) = stored(&m, &e.name);
                if trunk != TrunkFormat::F32 {
                    assert_eq!(a.dtype, dtype, "{} {}: stored type", e.name, trunk.name());
                }
                assert_eq!(
                    values(a.dtype, src.bytes(a)),
                    values(dtype, &bytes),
                    "{}: {} under --trunk {}",
                    hf.display(),
                    e.name,
                    trunk.name()
                );
                checked += 1;
            }
            assert!(checked > 20, "{checked}");
        }
    }
}

/// The matrices take the trunk type asked for, the embedding table int8 rows (a 4-bit trunk
/// keeps it and the output matrix at 8 bits); `kv_b_proj` and the exact tensors never go below
/// bf16.
#[test]
fn matrices_take_the_requested_encoding() {
    let int4 = Encoding::Int4Group { group: 32 };
    for (trunk, matrices) in [(TrunkFormat::Int8, Encoding::Int8Row), (TrunkFormat::Int4, int4)] {
        let c = converted(&golden("tiny-kimi-linear"), trunk);
        let m = Model::open(&c.path).unwrap();
        let enc = |n: &str| m.manifest().trunk_tensor(n).unwrap().tensor.encoding.clone();
        assert_eq!(enc("model.layers.1.self_attn.q_proj.weight"), matrices);
        assert_eq!(enc("lm_head.weight"), Encoding::Int8Row);
        assert_eq!(enc("model.embed_tokens.weight"), Encoding::Int8Row);
        assert_eq!(enc("model.layers.3.self_attn.kv_b_proj.weight"), Encoding::Bf16);
        assert_eq!(enc("model.layers.1.block_sparse_moe.gate.weight"), Encoding::Bf16);
        assert_eq!(enc("model.layers.1.self_attn.A_log"), Encoding::F32);
    }
}

/// The golden checkpoints store their matrices in bf16 already, so a bf16 trunk must cost
/// nothing: the logits stay within the parity bound of the golden references (1e-4: float
/// summation noise is ~3e-6) and every token picks the same experts as with the trunk kept.
#[test]
fn a_bf16_trunk_of_a_bf16_checkpoint_is_the_reference_model() {
    for name in ["tiny-k3", "tiny-kimi-linear"] {
        let ids = ids(name);
        let want = f32s(&golden(name).join("golden/logits.f32"));
        let (kept, kept_routing) = run(&converted(&golden(name), TrunkFormat::Keep).path, &ids);
        let (bf16, routing) = run(&converted(&golden(name), TrunkFormat::Bf16).path, &ids);
        let (e_kept, e_bf16) = (rel_l2(&kept, &want), rel_l2(&bf16, &want));
        eprintln!("{name}: logits rel L2 vs golden: keep {e_kept:.2e}, bf16 trunk {e_bf16:.2e}");
        assert!(e_bf16 < 1e-4, "{name}: {e_bf16}");
        assert_eq!(routing, kept_routing, "{name}: the same experts at every layer and position");
    }
}

/// An f32 checkpoint (trunk and experts) converts exactly: with `--trunk f32` and the experts
/// kept, the logits match what transformers computes on it in f32 within the parity bound.
#[test]
fn an_f32_checkpoint_converts_exactly() {
    let ckpt = f32_checkpoint();
    let want = f32s(&golden("tiny-kimi-linear-f32").join("golden/logits.f32"));
    let (got, _) = run(&converted(ckpt.path(), TrunkFormat::F32).path, &ids("tiny-kimi-linear"));
    let e = rel_l2(&got, &want);
    eprintln!("f32 Kimi-Linear, f32 trunk and experts: logits rel L2 vs transformers {e:.2e}");
    assert!(e < 1e-4, "{e}");
}

/// The table in LEARNED.md: every trunk type on every model, against its reference.
/// `cargo test -p k3-convert --test trunk_policy -- --nocapture measure`
#[test]
fn measure_every_trunk_type() {
    let f32_ckpt = f32_checkpoint();
    let models = [
        ("tiny K3", golden("tiny-k3"), golden("tiny-k3"), ids("tiny-k3")),
        ("tiny Kimi-Linear", golden("tiny-kimi-linear"), golden("tiny-kimi-linear"), ids("tiny-kimi-linear")),
        (
            "tiny Kimi-Linear f32",
            f32_ckpt.path().to_path_buf(),
            golden("tiny-kimi-linear-f32"),
            ids("tiny-kimi-linear"),
        ),
    ];
    for (label, hf, reference, ids) in models {
        let want = f32s(&reference.join("golden/logits.f32"));
        let (_, base_routing) = run(&converted(&hf, TrunkFormat::F32).path, &ids);
        let rounded = f32_tensors_rounded(&hf);
        let variants = [
            ("f32", hf.clone(), TrunkFormat::F32),
            ("bf16", hf.clone(), TrunkFormat::Bf16),
            ("bf16, every tensor rounded (before #21)", rounded.path().to_path_buf(), TrunkFormat::Bf16),
            ("int8", hf.clone(), TrunkFormat::Int8),
            ("int4", hf.clone(), TrunkFormat::Int4),
        ];
        for (trunk_label, source, trunk) in variants {
            let (got, routing) = run(&converted(&source, trunk).path, &ids);
            let e = rel_l2(&got, &want);
            let agree = routing_agreement(&routing, &base_routing);
            eprintln!("| {label} | {trunk_label} | {e:.2e} | {:.1}% |", agree * 100.0);
            // Sanity: correlated with the reference (uncorrelated logits of equal norm: ~1.41).
            assert!(e < 1.2, "{label} {trunk_label}: {e}");
        }
    }
}

/// The default model (a trained Kimi-Linear, BF16 throughout) re-encoded from its WASTE file:
/// logits and routing over the first 512 held-out tokens against the model as shipped (whose
/// per-window NLL matches the trainer's to 1e-9). Perplexity: `k3-cli perplexity` (LEARNED.md).
#[test]
fn measure_the_default_model() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let shipped = fixtures.join("default.waste");
    let m = Model::open(&shipped).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let text = std::fs::read_to_string(fixtures.join("default-model/heldout.txt")).unwrap();
    let ids: Vec<u32> = tok.encode(&text).into_iter().take(512).collect();
    let (want, base_routing) = run(&shipped, &ids);
    for trunk in TRUNKS {
        let (got, routing) = run(&converted(&shipped, trunk).path, &ids);
        let (e, agree) = (rel_l2(&got, &want), routing_agreement(&routing, &base_routing));
        eprintln!("| default model | {} | {e:.2e} | {:.1}% |", trunk.name(), agree * 100.0);
        // Its weights are bf16 already: a bf16 trunk is the same bytes, an f32 one the same
        // values through another kernel (float summation noise).
        match trunk {
            TrunkFormat::Bf16 => assert!(got == want, "bf16: the same model"),
            TrunkFormat::F32 => assert!(e < 1e-6 && agree == 1.0, "f32: {e}"),
            _ => {}
        }
    }
}
