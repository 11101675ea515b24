//! KDA against a plain f64 oracle written from the equations (models.md), prefill against
//! stepping, and saved state against continuing. (MLA's: `mla_oracle.rs`.)

mod common;
mod exact;

use exact::{bits, m, mv, rand, rel, rms, sig};
use k3_attn::{AttnError, Kda, KdaConfig, KdaForm, KdaGate, KdaState, KdaWeights, OutputGate};

const D: usize = 64;
const H: usize = 4;
const HD: usize = 16;
const K: usize = 4;
const T: usize = 9;

struct KdaData {
    w: Vec<Vec<f32>>,
}

impl KdaData {
    fn new(seed: u64) -> Self {
        let c = H * HD;
        let sizes =
            [c * D, c * D, c * D, c * K, c * K, c * K, H, c, HD * D, c * HD, H * D, HD, c * D, HD * D, c * HD, D * c];
        let scales = [0.3, 0.3, 0.3, 0.5, 0.5, 0.5, 1.0, 1.0, 0.3, 0.5, 0.5, 1.0, 0.3, 0.3, 0.5, 0.3];
        KdaData { w: sizes.iter().zip(scales).enumerate().map(|(i, (n, s))| rand(*n, seed + i as u64, s)).collect() }
    }

    fn layer(&self, gate: KdaGate, full_rank: bool) -> Kda<'_> {
        let w = &self.w;
        let c = H * HD;
        let o_norm: Vec<f32> = w[11].iter().map(|v| 1.0 + 0.5 * v).collect();
        let weights = KdaWeights {
            q_proj: m(&w[0], c, D),
            k_proj: m(&w[1], c, D),
            v_proj: m(&w[2], c, D),
            q_conv: w[3].clone(),
            k_conv: w[4].clone(),
            v_conv: w[5].clone(),
            a_log: w[6].clone(),
            dt_bias: w[7].clone(),
            f_a: m(&w[8], HD, D),
            f_b: m(&w[9], c, HD),
            b_proj: m(&w[10], H, D),
            o_norm,
            gate: if full_rank {
                OutputGate::FullRank(m(&w[12], c, D))
            } else {
                OutputGate::LowRank { a: m(&w[13], HD, D), b: m(&w[14], c, HD) }
            },
            o_proj: m(&w[15], D, c),
        };
        let cfg = KdaConfig { hidden: D, heads: H, head_dim: HD, conv_kernel: K, gate, norm_eps: 1e-5 };
        Kda::new("layer 0 (KDA)", cfg, weights).unwrap()
    }

    /// The equations, in f64, token by token, from an empty state.
    fn oracle(&self, gate: KdaGate, full_rank: bool, xs: &[f32]) -> Vec<f64> {
        let w = &self.w;
        let c = H * HD;
        let mut hist = vec![vec![vec![0f64; K - 1]; c]; 3];
        let mut s = vec![vec![vec![0f64; HD]; HD]; H];
        let mut out = Vec::new();
        for x in xs.chunks(D) {
            let x: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
            let mut qkv = Vec::new();
            for p in 0..3 {
                let raw = mv(&w[p], &x);
                let taps = &w[3 + p];
                let y: Vec<f64> = (0..c)
                    .map(|ch| {
                        let mut acc = f64::from(taps[ch * K + K - 1]) * raw[ch];
                        for j in 0..K - 1 {
                            acc += f64::from(taps[ch * K + j]) * hist[p][ch][j];
                        }
                        hist[p][ch].remove(0);
                        hist[p][ch].push(raw[ch]);
                        acc * sig(acc)
                    })
                    .collect();
                qkv.push(y);
            }
            let z: Vec<f64> = mv(&w[9], &mv(&w[8], &x)).iter().zip(&w[7]).map(|(a, b)| a + f64::from(*b)).collect();
            let b = mv(&w[10], &x);
            let g_out = if full_rank { mv(&w[12], &x) } else { mv(&w[14], &mv(&w[13], &x)) };
            let o_norm: Vec<f32> = w[11].iter().map(|v| 1.0 + 0.5 * v).collect();
            let mut y = vec![0f64; c];
            for h in 0..H {
                let r = h * HD..(h + 1) * HD;
                let mut q = qkv[0][r.clone()].to_vec();
                let mut k = qkv[1][r.clone()].to_vec();
                let v = qkv[2][r.clone()].to_vec();
                let qn = (q.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
                q.iter_mut().for_each(|a| *a = *a / qn / (HD as f64).sqrt());
                let kn = (k.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
                k.iter_mut().for_each(|a| *a /= kn);
                let a_exp = f64::from(w[6][h]).exp();
                let g: Vec<f64> = z[r.clone()]
                    .iter()
                    .map(|zc| match gate {
                        KdaGate::LowerBound(lb) => f64::from(lb) * sig(a_exp * zc),
                        KdaGate::Softplus => -a_exp * if *zc > 20.0 { *zc } else { zc.exp().ln_1p() },
                    })
                    .collect();
                let beta = sig(b[h]);
                let st = &mut s[h];
                for (kk, row) in st.iter_mut().enumerate() {
                    row.iter_mut().for_each(|e| *e *= g[kk].exp());
                }
                let u: Vec<f64> = (0..HD).map(|vv| (0..HD).map(|kk| st[kk][vv] * k[kk]).sum()).collect();
                for kk in 0..HD {
                    for vv in 0..HD {
                        st[kk][vv] += k[kk] * beta * (v[vv] - u[vv]);
                    }
                }
                let o: Vec<f64> = (0..HD).map(|vv| (0..HD).map(|kk| st[kk][vv] * q[kk]).sum()).collect();
                let yn = rms(&o, &o_norm, 1e-5);
                for (i, val) in yn.iter().enumerate() {
                    y[h * HD + i] = val * sig(g_out[h * HD + i]);
                }
            }
            out.extend(mv(&w[15], &y));
        }
        out
    }
}

#[test]
fn kda_matches_the_f64_oracle_in_all_forms() {
    let data = KdaData::new(1);
    let xs = rand(T * D, 99, 1.0);
    for gate in [KdaGate::LowerBound(-5.0), KdaGate::Softplus] {
        for full_rank in [true, false] {
            let layer = data.layer(gate, full_rank);
            let mut st = layer.state();
            let mut out = vec![0f32; T * D];
            layer.prefill(&mut st, &xs, &mut out);
            let want = data.oracle(gate, full_rank, &xs);
            // f32 against f64 over sums of at most 64 terms and 9 recurrent steps: float noise is
            // ~1e-6 relative; 1e-4 leaves room without hiding a wrong equation (those give >1e-2).
            let e = rel(&out, &want);
            assert!(e < 1e-4, "{gate:?} full_rank={full_rank}: relative error {e}");
        }
    }
}

/// Positions over several whole chunks (32 positions, blocks of 16) and a partial one.
const LONG: usize = 2 * 64 + 21;

#[test]
fn kda_chunked_matches_the_f64_oracle_over_several_chunks() {
    // The gate's bias moved: as drawn the state keeps a few positions; by -6 it decays by
    // ~1e-3 a position (the state carries across chunks); by +30 a softplus gate decays by
    // ~20-60 nats a position, far past what a block factors around one row, so its own pairs
    // are exponentiated directly.
    for (seed, shift) in [(11, 0.0), (12, -6.0), (13, 30.0)] {
        let mut data = KdaData::new(seed);
        data.w[7].iter_mut().for_each(|b| *b += shift);
        let xs = rand(LONG * D, seed + 100, 1.0);
        for gate in [KdaGate::LowerBound(-5.0), KdaGate::Softplus] {
            let want = data.oracle(gate, true, &xs);
            for form in [KdaForm::Recurrent, KdaForm::Chunked] {
                let mut layer = data.layer(gate, true);
                layer.set_form(form);
                let mut st = layer.state();
                let mut out = vec![0f32; LONG * D];
                // A prompt cut as a server might: every form meets a run shorter than a chunk.
                layer.prefill(&mut st, &xs[..100 * D], &mut out[..100 * D]);
                layer.prefill(&mut st, &xs[100 * D..], &mut out[100 * D..]);
                // As above (1e-4); the chunked form's exponents are differences of f64 sums
                // rounded once, its products f32 sums over <= 64 positions.
                let e = rel(&out, &want);
                assert!(e < 1e-4, "{form:?} {gate:?} shift={shift}: relative error {e}");
                // Every position, not only the whole run: a wrong row would hide in the mean.
                for t in [0, 31, 32, 63, 64, 65, 100, 127, 128, 148] {
                    let e = rel(&out[t * D..(t + 1) * D], &want[t * D..(t + 1) * D]);
                    assert!(e < 1e-4, "{form:?} {gate:?} shift={shift}: position {t} off by {e}");
                }
            }
        }
    }
}

#[test]
fn kda_prefill_equals_stepping_bit_for_bit() {
    let data = KdaData::new(2);
    let layer = data.layer(KdaGate::LowerBound(-5.0), true);
    let xs = rand(T * D, 5, 1.0);
    let (mut a, mut b) = (layer.state(), layer.state());
    let mut chunked = vec![0f32; T * D];
    layer.prefill(&mut a, &xs[..4 * D], &mut chunked[..4 * D]);
    layer.prefill(&mut a, &xs[4 * D..], &mut chunked[4 * D..]);
    let mut stepped = vec![0f32; T * D];
    for t in 0..T {
        layer.step(&mut b, &xs[t * D..(t + 1) * D], &mut stepped[t * D..(t + 1) * D]);
    }
    assert_eq!(bits(&chunked), bits(&stepped));
    assert_eq!(a, b);
}

#[test]
fn kda_state_saves_and_restores() {
    let data = KdaData::new(3);
    let layer = data.layer(KdaGate::Softplus, false);
    let xs = rand(T * D, 6, 1.0);
    let mut st = layer.state();
    let mut out = vec![0f32; T * D];
    layer.prefill(&mut st, &xs[..3 * D], &mut out[..3 * D]);
    let saved = st.to_bytes();
    layer.prefill(&mut st, &xs[3 * D..], &mut out[3 * D..]);
    let mut resumed: KdaState = layer.state();
    resumed.restore(&saved).unwrap();
    let mut again = vec![0f32; 6 * D];
    layer.prefill(&mut resumed, &xs[3 * D..], &mut again);
    assert_eq!(bits(&again), bits(&out[3 * D..]));
    assert_eq!(resumed, st);
    // Damaged or foreign states are refused with a reason.
    let e = resumed.restore(&saved[..saved.len() - 3]).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let other = KdaData::new(3);
    let mut wrong = saved.clone();
    wrong[16] = 5; // heads
    assert!(resumed.restore(&wrong).unwrap_err().to_string().contains("dimension 0 is 5"));
    let mla = common::MlaParts::new(1);
    let cache = mla.layer().cache().to_bytes();
    assert!(resumed.restore(&cache).unwrap_err().to_string().contains("`MLA1` state"));
    drop(other);
    st.reset();
    assert_eq!(st, layer.state());
}

#[test]
fn kda_shape_errors_name_the_tensor() {
    let data = KdaData::new(4);
    let c = H * HD;
    let mut w = data.layer(KdaGate::Softplus, true);
    let _ = &mut w;
    let bad = KdaWeights {
        q_proj: m(&data.w[0][..(c - 1) * D], c - 1, D),
        k_proj: m(&data.w[1], c, D),
        v_proj: m(&data.w[2], c, D),
        q_conv: data.w[3].clone(),
        k_conv: data.w[4].clone(),
        v_conv: data.w[5].clone(),
        a_log: vec![0.0; HD],
        dt_bias: data.w[7].clone(),
        f_a: m(&data.w[8], HD, D),
        f_b: m(&data.w[9], c, HD),
        b_proj: m(&data.w[10], H, D),
        o_norm: vec![1.0; HD],
        gate: OutputGate::FullRank(m(&data.w[12], c, D)),
        o_proj: m(&data.w[15], D, c),
    };
    let cfg = KdaConfig { hidden: D, heads: H, head_dim: HD, conv_kernel: K, gate: KdaGate::Softplus, norm_eps: 1e-5 };
    let e = Kda::new("layer 7", cfg.clone(), bad.clone()).unwrap_err();
    assert_eq!(e.to_string(), "layer 7: `q_proj` is [63, 64], expected [64, 64]");
    let bad2 = KdaWeights { q_proj: m(&data.w[0], c, D), ..bad };
    let e = Kda::new("layer 7", cfg, bad2).unwrap_err();
    assert!(matches!(e, AttnError::Length { tensor: "A_log", len: 16, want: 4, .. }), "{e}");
}

#[test]
fn a_log_is_read_from_every_stored_shape() {
    use k3_attn::kda::a_log_per_head;
    let h = [0.1f32, 0.2, 0.3, 0.4];
    assert_eq!(a_log_per_head("l", &h, &[4], 4).unwrap(), h);
    assert_eq!(a_log_per_head("l", &h, &[1, 1, 4, 1], 4).unwrap(), h);
    let padded = [0.1f32, 0.2, 0.3, 0.4, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(a_log_per_head("l", &padded, &[8], 4).unwrap(), h);
    let e = a_log_per_head("layer 2", &padded, &[2, 4], 4).unwrap_err().to_string();
    assert_eq!(e, "layer 2: `A_log` of shape [2, 4] does not hold one value per head (4 heads)");
    assert!(a_log_per_head("l", &h[..3], &[3], 4).is_err());
}
