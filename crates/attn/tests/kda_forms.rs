//! KDA's state pass in both forms against the delta rule in f64, at head sizes and decays the
//! layer tests do not reach: K3's head (128) and one not a multiple of the chunk's blocks (24),
//! a channel whose decay drops by ~100 nats inside a block (so that block's own pairs take the
//! direct exponents while the other channels carry it), runs shorter and longer than a chunk.

use k3_attn::KdaForm;
use k3_attn::kda::state_pass;
use k3_quant::rng::noise;

/// `S <- diag(e^g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q`, in f64, position by position.
fn reference(s: &mut [f64], [q, k, v, g]: [&[f32]; 4], beta: &[f32], hd: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for (t, &b) in beta.iter().enumerate() {
        let row = |x: &[f32], i: usize| f64::from(x[t * hd + i]);
        for i in 0..hd {
            let decay = row(g, i).exp();
            s[i * hd..(i + 1) * hd].iter_mut().for_each(|x| *x *= decay);
        }
        let u: Vec<f64> = (0..hd).map(|j| (0..hd).map(|i| s[i * hd + j] * row(k, i)).sum()).collect();
        for i in 0..hd {
            for j in 0..hd {
                s[i * hd + j] += row(k, i) * f64::from(b) * (row(v, j) - u[j]);
            }
        }
        out.extend((0..hd).map(|j| (0..hd).map(|i| s[i * hd + j] * row(q, i)).sum::<f64>()));
    }
    out
}

fn unit_rows(n: usize, hd: usize, seed: u64) -> Vec<f32> {
    let mut x = noise(n * hd, seed, 1.0);
    for r in x.chunks_mut(hd) {
        let norm = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        r.iter_mut().for_each(|v| *v /= norm);
    }
    x
}

fn rel(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - y).powi(2)).sum();
    (num / b.iter().map(|y| y * y).sum::<f64>()).sqrt()
}

#[test]
fn both_forms_match_the_delta_rule_in_f64() {
    for (hd, n) in [(128, 100), (24, 75), (24, 7)] {
        let (q, k, v) = (unit_rows(n, hd, 1), unit_rows(n, hd, 2), noise(n * hd, 3, 1.0));
        // Slow decays (the state carries across chunks), and in channel 5 a drop of 100 nats at
        // position 40 (inside a block of 16).
        let mut g: Vec<f32> = noise(n * hd, 4, 1.0).iter().map(|x| -0.02 * (1.0 + x.clamp(-1.0, 1.0))).collect();
        if n > 40 {
            g[40 * hd + 5] = -100.0;
        }
        let beta: Vec<f32> = noise(n, 5, 1.0).iter().map(|x| 0.5 + 0.4 * x.clamp(-1.0, 1.0)).collect();
        let s0: Vec<f32> = noise(hd * hd, 6, 0.3);
        let mut want_s: Vec<f64> = s0.iter().map(|&x| f64::from(x)).collect();
        let want = reference(&mut want_s, [&q, &k, &v, &g], &beta, hd);
        for form in [KdaForm::Recurrent, KdaForm::Chunked] {
            let (mut s, mut gw, mut out) = (s0.clone(), g.clone(), Vec::new());
            state_pass(form, &mut s, [&q, &k, &v], &mut gw, &beta, |t, o| {
                assert_eq!(t * hd, out.len(), "positions in order");
                out.extend_from_slice(o);
            });
            // f32 against f64 over sums of <= 128 terms and 100 steps of a contracting
            // recurrence: ~1e-6; a wrong term gives > 1e-2.
            let (eo, es) = (rel(&out, &want), rel(&s, &want_s));
            assert!(eo < 1e-5 && es < 1e-5, "{form:?} hd={hd} n={n}: outputs {eo:e}, state {es:e}");
            for t in [0, 15, 16, 31, 32, 40, 41, 47, 48, n - 1] {
                if t < n {
                    let e = rel(&out[t * hd..(t + 1) * hd], &want[t * hd..(t + 1) * hd]);
                    assert!(e < 1e-5, "{form:?} hd={hd}: position {t} off by {e:e}");
                }
            }
        }
    }
}
