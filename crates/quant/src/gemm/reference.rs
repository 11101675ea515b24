//! The scalar products every SIMD level is tested against.

use super::{Part, put};

/// Each score summed in order, part after part.
pub fn abt_parts(parts: &[Part<'_>], out: &mut [f32], accumulate: bool) {
    let Some(first) = parts.first() else { return };
    let (m, n) = (first.a.len() / first.k, first.b.len() / first.k);
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for p in parts {
                let (ar, br) = (&p.a[i * p.k..(i + 1) * p.k], &p.b[j * p.k..(j + 1) * p.k]);
                s += ar.iter().zip(br).map(|(x, y)| x * y).sum::<f32>();
            }
            put(&mut out[i * n + j], s, accumulate);
        }
    }
}

pub fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    let n = b.len() / k;
    for (pr, ar) in p.chunks_exact(n).zip(acc.chunks_exact_mut(k)) {
        for (pv, br) in pr.iter().zip(b.chunks_exact(k)) {
            for (a, bv) in ar.iter_mut().zip(br) {
                *a += pv * bv;
            }
        }
    }
}
