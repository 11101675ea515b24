//! MLA against a plain f64 oracle that materializes every head's keys and values (models.md),
//! in both forms (absorbed and expanded); prefill against stepping; saved caches against
//! continuing; compact caches within their rounding.

mod exact;

use exact::{attend_f64, bits, m, mv, rand, rel, rms, rows_f64, sig};
use k3_attn::KvCacheType;
use k3_attn::mla::{MlaForm, Rope, Yarn};
use k3_attn::{Mla, MlaConfig, MlaWeights, PositionEmbedding, QPath};
use k3_quant::Matrix;

const D: usize = 64;
const H: usize = 4;

const L: usize = 32;
const NOPE: usize = 16;
const ROPE: usize = 8;
const V: usize = 16;
const QL: usize = 24;

struct MlaData {
    w: Vec<Vec<f32>>,
}

impl MlaData {
    fn new(seed: u64) -> Self {
        let qd = H * (NOPE + ROPE);
        let sizes = [QL * D, QL, qd * QL, qd * D, (L + ROPE) * D, L, H * (NOPE + V) * L, H * V * D, D * H * V];
        MlaData { w: sizes.iter().enumerate().map(|(i, n)| rand(*n, seed * 100 + i as u64, 0.4)).collect() }
    }

    fn layer(&self, lowrank: bool, gated: bool) -> Mla<'_> {
        self.layer_at(lowrank, gated, PositionEmbedding::None)
    }

    fn layer_at(&self, lowrank: bool, gated: bool, positions: PositionEmbedding) -> Mla<'_> {
        let w = &self.w;
        let qd = H * (NOPE + ROPE);
        let norm = |v: &[f32]| v.iter().map(|x| 1.0 + x).collect::<Vec<f32>>();
        let weights = MlaWeights {
            q: if lowrank {
                QPath::LowRank { a: m(&w[0], QL, D), norm: norm(&w[1]), b: m(&w[2], qd, QL) }
            } else {
                QPath::Direct(m(&w[3], qd, D))
            },
            kv_a: m(&w[4], L + ROPE, D),
            kv_a_norm: norm(&w[5]),
            kv_b: m(&w[6], H * (NOPE + V), L),
            g_proj: gated.then(|| m(&w[7], H * V, D)),
            o_proj: m(&w[8], D, H * V),
        };
        let cfg = MlaConfig {
            hidden: D,
            heads: H,
            kv_lora: L,
            nope: NOPE,
            rope: ROPE,
            v_dim: V,
            lowrank_eps: 1e-6,
            positions,
        };
        Mla::new("layer 3 (MLA)", cfg, weights).unwrap()
    }

    /// Non-absorbed attention in f64: per-head keys and values materialized from the cache.
    fn oracle(&self, lowrank: bool, gated: bool, xs: &[f32]) -> Vec<f64> {
        self.oracle_at(lowrank, gated, false, xs)
    }

    /// With `k2_rope`: K2's RoPE as transformers applies it (rope dims de-interleaved, then
    /// `x cos + rotate_half(x) sin`), with the frequencies and softmax scale transformers 5.24
    /// computes for K2's YaRN (theta 50000, factor 32, beta 1/1, mscale 1/1, original 4096) at 8
    /// rope dims and a 24-dim query head (printed from `DeepseekV3ForCausalLM`).
    fn oracle_at(&self, lowrank: bool, gated: bool, k2_rope: bool, xs: &[f32]) -> Vec<f64> {
        const INV_FREQ: [f64; 4] = [1.0, 0.06687403470277786, 0.004472136031836271, 9.345930266135838e-06];
        let rotate = |v: &[f64], pos: usize| -> Vec<f64> {
            if !k2_rope {
                return v.to_vec();
            }
            let half = v.len() / 2;
            let de: Vec<f64> = (0..half).map(|i| v[2 * i]).chain((0..half).map(|i| v[2 * i + 1])).collect();
            (0..v.len())
                .map(|j| {
                    let (c, s) = ((pos as f64 * INV_FREQ[j % half]).cos(), (pos as f64 * INV_FREQ[j % half]).sin());
                    let rot = if j < half { -de[j + half] } else { de[j - half] };
                    de[j] * c + rot * s
                })
                .collect()
        };
        let scale = if k2_rope { 0.37013023618119323 } else { 1.0 / ((NOPE + ROPE) as f64).sqrt() };
        let w = &self.w;
        let norm = |v: &[f32]| v.iter().map(|x| 1.0 + x).collect::<Vec<f32>>();
        let mut keys: Vec<Vec<Vec<f64>>> = Vec::new(); // [t][h] = [nope + rope]
        let mut vals: Vec<Vec<Vec<f64>>> = Vec::new(); // [t][h] = [v]
        let mut out = Vec::new();
        for (pos, x) in xs.chunks(D).enumerate() {
            let x: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
            let q = if lowrank { mv(&w[2], &rms(&mv(&w[0], &x), &norm(&w[1]), 1e-6)) } else { mv(&w[3], &x) };
            let q: Vec<f64> =
                q.chunks(NOPE + ROPE).flat_map(|qh| [&qh[..NOPE], &rotate(&qh[NOPE..], pos)[..]].concat()).collect();
            let ckv = mv(&w[4], &x);
            let c = rms(&ckv[..L], &norm(&w[5]), 1e-6);
            let kb = mv(&w[6], &c); // [H * (nope + v)]
            let kpe = rotate(&ckv[L..], pos);
            keys.push((0..H).map(|h| [&kb[h * (NOPE + V)..h * (NOPE + V) + NOPE], &kpe[..]].concat()).collect());
            vals.push((0..H).map(|h| kb[h * (NOPE + V) + NOPE..(h + 1) * (NOPE + V)].to_vec()).collect());
            let gate = mv(&w[7], &x);
            let mut ctx = vec![0f64; H * V];
            for h in 0..H {
                let qh = &q[h * (NOPE + ROPE)..(h + 1) * (NOPE + ROPE)];
                let scores: Vec<f64> =
                    keys.iter().map(|k| k[h].iter().zip(qh).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for (t, p) in e.iter().enumerate() {
                    for i in 0..V {
                        ctx[h * V + i] += p / z * vals[t][h][i];
                    }
                }
            }
            if gated {
                ctx.iter_mut().zip(&gate).for_each(|(c, g)| *c *= sig(*g));
            }
            out.extend(mv(&w[8], &ctx));
        }
        out
    }
}

/// The forms a chunk can run in, each forced.
const FORMS: [MlaForm; 2] = [MlaForm::Absorbed, MlaForm::Expanded];

#[test]
fn mla_in_both_forms_matches_the_materialized_f64_oracle() {
    let data = MlaData::new(7);
    // More tokens than one softmax block and one block of queries, so the online rescaling and
    // the expanded form's partly masked blocks are exercised.
    let n = 70;
    let xs = rand(n * D, 8, 1.0);
    for (lowrank, gated) in [(true, true), (false, false), (true, false)] {
        let want = data.oracle(lowrank, gated, &xs);
        for form in FORMS {
            let mut layer = data.layer(lowrank, gated);
            layer.set_form(form);
            let mut cache = layer.cache();
            let mut out = vec![0f32; n * D];
            layer.prefill(&mut cache, &xs, &mut out);
            assert_eq!(cache.len(), n);
            let e = rel(&out, &want);
            assert!(e < 1e-4, "{form:?} lowrank={lowrank} gated={gated}: relative error {e}");
        }
    }
}

/// Past a decompressed span (1,024 positions) in chunks that cut blocks and spans anywhere: the
/// expanded form gives the bits of stepping in that form, and both forms match the f64 oracle
/// over the whole span (bound as above).
#[test]
fn mla_expanded_chunks_equal_expanded_steps_past_a_span() {
    let data = MlaData::new(21);
    let n = 1100;
    let xs = rand(n * D, 22, 1.0);
    let run = |form: MlaForm, cuts: &[usize]| {
        let mut layer = data.layer(true, true);
        layer.set_form(form);
        let mut cache = layer.cache();
        let mut out = vec![0f32; n * D];
        let mut at = 0;
        for &end in cuts.iter().chain([n].iter()) {
            layer.prefill(&mut cache, &xs[at * D..end * D], &mut out[at * D..end * D]);
            at = end;
        }
        out
    };
    let stepped = run(MlaForm::Expanded, &(1..n).collect::<Vec<_>>());
    for cuts in [&[][..], &[33, 1023, 1025][..], &[500, 1099][..]] {
        assert_eq!(bits(&run(MlaForm::Expanded, cuts)), bits(&stepped), "cuts {cuts:?}");
    }
    let want = data.oracle(true, true, &xs);
    for (form, out) in [(MlaForm::Expanded, &stepped), (MlaForm::Absorbed, &run(MlaForm::Absorbed, &[]))] {
        let e = rel(out, &want);
        eprintln!("{form:?} over {n} positions: relative error {e:.2e} against the f64 oracle");
        assert!(e < 1e-4, "{form:?}: relative error {e}");
    }
    // A chunk this long runs expanded unless told otherwise.
    assert_eq!(bits(&run(MlaForm::Auto, &[])), bits(&stepped));
}

#[test]
fn mla_with_k2_rope_matches_the_oracle_and_prefill_equals_stepping() {
    let data = MlaData::new(13);
    let yarn = Yarn {
        factor: 32.0,
        beta_fast: 1.0,
        beta_slow: 1.0,
        mscale: Some(1.0),
        mscale_all_dim: Some(1.0),
        original_max_positions: 4096,
    };
    let n = 70;
    let xs = rand(n * D, 14, 1.0);
    let want = data.oracle_at(true, false, true, &xs);
    for form in FORMS {
        let mut layer = data.layer_at(true, false, PositionEmbedding::Rope(Rope { theta: 50_000.0, yarn: Some(yarn) }));
        layer.set_form(form);
        let mut cache = layer.cache();
        let mut out = vec![0f32; n * D];
        layer.prefill(&mut cache, &xs, &mut out);
        let e = rel(&out, &want);
        assert!(e < 1e-4, "{form:?}: relative error {e}");
        // Positions matter: without RoPE the answer differs.
        assert!(rel(&out, &data.oracle(true, false, &xs)) > 1e-2);
        let mut stepped = vec![0f32; n * D];
        let mut b = layer.cache();
        for t in 0..n {
            layer.step(&mut b, &xs[t * D..(t + 1) * D], &mut stepped[t * D..(t + 1) * D]);
        }
        assert_eq!(bits(&out), bits(&stepped), "{form:?}");
        assert_eq!(cache, b);
    }
}

#[test]
fn mla_prefill_equals_stepping_and_the_cache_resumes() {
    let data = MlaData::new(9);
    for form in FORMS {
        let mut layer = data.layer(true, true);
        layer.set_form(form);
        let n = 40;
        let xs = rand(n * D, 10, 1.0);
        let (mut a, mut b) = (layer.cache(), layer.cache());
        let mut chunked = vec![0f32; n * D];
        layer.prefill(&mut a, &xs[..33 * D], &mut chunked[..33 * D]);
        let saved = a.to_bytes();
        layer.prefill(&mut a, &xs[33 * D..], &mut chunked[33 * D..]);
        let mut stepped = vec![0f32; n * D];
        for t in 0..n {
            layer.step(&mut b, &xs[t * D..(t + 1) * D], &mut stepped[t * D..(t + 1) * D]);
        }
        assert_eq!(bits(&chunked), bits(&stepped), "{form:?}");
        assert_eq!(a, b);
        let mut resumed = layer.cache();
        resumed.restore(&saved).unwrap();
        assert_eq!(resumed.len(), 33);
        let mut again = vec![0f32; 7 * D];
        layer.prefill(&mut resumed, &xs[33 * D..], &mut again);
        assert_eq!(bits(&again), bits(&chunked[33 * D..]), "{form:?}");
    }
}

#[test]
fn mla_refuses_a_quantized_kv_b() {
    let data = MlaData::new(11);
    let q = vec![0i8; H * (NOPE + V) * L];
    let s = vec![1f32; H * (NOPE + V)];
    let layer = data.layer(false, false);
    let mut w = MlaWeights {
        q: QPath::Direct(m(&data.w[3], H * (NOPE + ROPE), D)),
        kv_a: m(&data.w[4], L + ROPE, D),
        kv_a_norm: vec![1.0; L],
        kv_b: Matrix::Int8Row { q: &q, scale: &s, rows: H * (NOPE + V), cols: L, act: Default::default() },
        g_proj: None,
        o_proj: m(&data.w[8], D, H * V),
    };
    let e = Mla::new("layer 5", layer.config().clone(), w.clone()).unwrap_err().to_string();
    assert!(e.contains("kv_b_proj must be stored f32, bf16 or fp8"), "{e}");
    w.kv_a_norm = vec![1.0; L + 1];
    let e = Mla::new("layer 5", layer.config().clone(), w).unwrap_err().to_string();
    assert!(e.contains("`kv_a_layernorm` has 33 values, expected 32"), "{e}");
}

/// `attend` over more than two groups of positions (groups are merged, blocks rescaled) against a
/// plain f64 softmax; on a pool, with the work split by groups and heads, the same bits as alone.
/// Tolerance: f32 sums over ~4,200 positions of scores ~N(0, 1) and latents ~U(-1, 1); the
/// measured error is ~1e-7, 1e-5 leaves room without hiding a lost group (which costs ~1e-1).
#[test]
fn mla_attend_merges_groups_as_one_softmax() {
    let (h, l, r, len) = (5, 48, 8, 2 * 2048 + 77);
    let (qabs, qext) = (rand(h * l, 31, 0.3), rand(h * r, 32, 0.3));
    let (c, kext) = (rand(len * l, 33, 1.0), rand(len * r, 34, 1.0));
    let scale = 0.25;
    let want = attend_f64(&qabs, &qext, &rows_f64(&c, l), &rows_f64(&kext, r), (l, r), scale);
    let run = |threads: usize, parallel: bool| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut lat = vec![0f32; h * l];
        pool.install(|| k3_attn::mla::attend(&qabs, &qext, &c, &kext, len, l, r, scale, parallel, &mut lat));
        lat
    };
    let alone = run(1, false);
    let e = rel(&alone, &want);
    assert!(e < 1e-5, "relative error {e}");
    for threads in [2, 3, 8] {
        assert_eq!(bits(&run(threads, true)), bits(&alone), "{threads} threads");
    }
}

/// An MLA cache grows with use, doubling (amortized appends), and never past what the memory plan
/// holds room for; a position beyond it still appends.
#[test]
fn mla_cache_grows_with_use_within_its_plan() {
    let data = MlaData::new(3);
    let layer = data.layer(true, true);
    let mut cache = layer.cache();
    cache.plan(1000);
    let per = cache.bytes_per_position();
    let xs = rand(1010 * D, 4, 1.0);
    let mut out = vec![0f32; 1010 * D];
    layer.prefill(&mut cache, &xs[..10 * D], &mut out[..10 * D]);
    assert_eq!(cache.held_bytes(), 10 * per, "room for what is held, not the plan's 1,000");
    layer.prefill(&mut cache, &xs[10 * D..11 * D], &mut out[10 * D..11 * D]);
    assert_eq!(cache.held_bytes(), 20 * per, "doubled");
    layer.prefill(&mut cache, &xs[11 * D..700 * D], &mut out[11 * D..700 * D]);
    layer.prefill(&mut cache, &xs[700 * D..701 * D], &mut out[700 * D..701 * D]);
    assert_eq!(cache.held_bytes(), 1000 * per, "capped at the plan");
    layer.prefill(&mut cache, &xs[701 * D..1010 * D], &mut out[701 * D..1010 * D]);
    assert_eq!((cache.len(), cache.held_bytes()), (1010, 1010 * per));
}

/// A compact cache (bf16 or int8 rows) against the f64 oracle of the exact layer, within its
/// rounding (measured relative errors: bf16 2.3e-3, int8 8.0e-3; bounds of about twice that,
/// which still fail a cache that loses a position or misreads a scale, ~1e-1); prefill equals
/// stepping bit for bit; a saved and restored cache continues with the same bits.
#[test]
fn compact_mla_caches_round_once_and_stay_consistent() {
    let data = MlaData::new(21);
    let n = 70;
    let xs = rand(n * D, 22, 1.0);
    let want = data.oracle(true, true, &xs);
    for ((kind, bound), form) in
        [(KvCacheType::Bf16, 5e-3), (KvCacheType::Int8, 2e-2)].into_iter().flat_map(|k| FORMS.map(|f| (k, f)))
    {
        let mut layer = data.layer(true, true);
        layer.set_form(form);
        let mut cache = layer.cache_of(kind);
        let mut out = vec![0f32; n * D];
        layer.prefill(&mut cache, &xs, &mut out);
        let e = rel(&out, &want);
        eprintln!("{kind:?} {form:?} {e}");
        assert!(e < bound && e > 1e-6, "{kind:?} {form:?}: relative error {e}");
        assert_eq!(cache.bytes_per_position(), kind.row_bytes(L) + kind.row_bytes(ROPE));
        let mut stepped = vec![0f32; n * D];
        let mut s = layer.cache_of(kind);
        for t in 0..n {
            layer.step(&mut s, &xs[t * D..(t + 1) * D], &mut stepped[t * D..(t + 1) * D]);
        }
        assert_eq!(bits(&out), bits(&stepped), "{kind:?} {form:?}: prefill and stepping");
        // Save after 40 positions, restore into a fresh cache of the type, continue.
        let mut a = layer.cache_of(kind);
        layer.prefill(&mut a, &xs[..40 * D], &mut vec![0f32; 40 * D]);
        let mut b = layer.cache_of(kind);
        b.restore(&a.to_bytes()).unwrap();
        assert_eq!(a, b, "{kind:?}: restored rows");
        let mut rest = vec![0f32; (n - 40) * D];
        layer.prefill(&mut b, &xs[40 * D..], &mut rest);
        assert_eq!(bits(&rest), bits(&out[40 * D..]), "{kind:?} {form:?}: continued after a restore");
    }
}
