//! Full (bidirectional) attention over one image's patches: every head's queries against every
//! key, softmax, the weighted sum of values; in blocks of queries so the scores of a large image
//! (4,096 patches for 896 x 896) never need more than a block's rows, blocks spread over the
//! pool. Products by `k3_quant::gemm` (register-blocked A B^T and P B).

use k3_quant::gemm;
use rayon::prelude::*;

/// Query rows per task.
const BLOCK: usize = 64;

/// `out [n, heads * hd]` from `qkv [n, 3 * heads * hd]` (queries, keys, values; each head's
/// values contiguous), queries and keys already rotated.
pub fn attend(qkv: &[f32], n: usize, heads: usize, hd: usize) -> Vec<f32> {
    let width = heads * hd;
    // Per head: contiguous [n, hd] keys and values, and queries pre-scaled by 1/sqrt(hd).
    let scale = 1.0 / (hd as f32).sqrt();
    let gather = |which: usize, h: usize, s: f32| -> Vec<f32> {
        (0..n).flat_map(|t| qkv[t * 3 * width + which * width + h * hd..][..hd].iter().map(move |v| v * s)).collect()
    };
    let per_head: Vec<[Vec<f32>; 3]> =
        (0..heads).into_par_iter().map(|h| [gather(0, h, scale), gather(1, h, 1.0), gather(2, h, 1.0)]).collect();
    let tasks: Vec<(usize, usize)> = (0..heads).flat_map(|h| (0..n).step_by(BLOCK).map(move |s| (h, s))).collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(h, start)| {
            let [q, k, v] = &per_head[h];
            let rows = BLOCK.min(n - start);
            let mut scores = vec![0f32; rows * n];
            gemm::abt(&q[start * hd..(start + rows) * hd], k, hd, &mut scores, false);
            for row in scores.chunks_exact_mut(n) {
                softmax(row);
            }
            let mut out = vec![0f32; rows * hd];
            gemm::pb_acc(&scores, v, hd, &mut out);
            out
        })
        .collect();
    let mut out = vec![0f32; n * width];
    for (&(h, start), part) in tasks.iter().zip(&parts) {
        for (r, vals) in part.chunks_exact(hd).enumerate() {
            out[(start + r) * width + h * hd..][..hd].copy_from_slice(vals);
        }
    }
    out
}

fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The vectorized exp (k3_quant::expf): the library's scalar one cost more than the products.
    k3_quant::expf::exp_shifted(row, max);
    let sum: f64 = row.iter().map(|v| f64::from(*v)).sum();
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention by its definition, one score at a time (f64).
    fn naive(qkv: &[f32], n: usize, heads: usize, hd: usize) -> Vec<f32> {
        let w = heads * hd;
        let mut out = vec![0f32; n * w];
        for h in 0..heads {
            for i in 0..n {
                let q = &qkv[i * 3 * w + h * hd..][..hd];
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        let k = &qkv[j * 3 * w + w + h * hd..][..hd];
                        q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (0..n).map(|j| e[j] / z * f64::from(qkv[j * 3 * w + 2 * w + h * hd + d])).sum();
                    out[i * w + h * hd + d] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn blocked_attention_matches_the_definition() {
        // 150 rows: two whole blocks and a partial one.
        let (n, heads, hd) = (150, 3, 16);
        let mut state = 12345u32;
        let qkv: Vec<f32> = (0..n * 3 * heads * hd)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        let got = attend(&qkv, n, heads, hd);
        let want = naive(&qkv, n, heads, hd);
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-5, "max error {err}");
    }
}
