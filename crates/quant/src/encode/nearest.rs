//! The nearest of 16 centroids for each of many vectors (k-means' assignment step for the
//! fast-scan codec's 16-entry stages): the distances as [`stage_dists_n`] sums them, and the
//! first least. The SIMD versions find it without a branch per entry (the least of the lanes,
//! then one compare against it); the scalar loop is their reference.

use super::distance::{Data, stage_dists_n};
use crate::cpu::{Level, level};

/// `assign[i]` = the nearest of the 16 centroids `soa` (transposed, `[dim][16]`) to vector
/// `first + i` of `data`: the first of equals, NaN distances never nearest, 0 if none is below
/// infinity (the loop `if d < best { best = d }` from infinity).
pub fn nearest16(data: Data<'_>, first: usize, soa: &[f32], assign: &mut [u32]) {
    at(level(), data, first, soa, assign);
}

/// [`nearest16`] at an explicit level (tests compare levels).
fn at(level: Level, data: Data<'_>, first: usize, soa: &[f32], assign: &mut [u32]) {
    assert_eq!(soa.len(), 16 * data.dim, "16 centroids of {} dims", data.dim);
    assert!((first + assign.len()) * data.dim <= data.vecs.len(), "vectors past the data's end");
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers pass levels the CPU has (`level`, or `levels` in tests); the sizes are
        // checked above.
        Level::Avx512 => unsafe { simd::avx512(data, first, soa, assign) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 => unsafe { simd::avx2(data, first, soa, assign) },
        Level::Scalar => {
            for (k, a) in assign.iter_mut().enumerate() {
                let mut ds = [0f32; 16];
                stage_dists_n(data.vec(first + k), data.weight(first + k), soa, &mut ds);
                let mut best = (f32::INFINITY, 0);
                for (c, &e) in ds.iter().enumerate() {
                    if e < best.0 {
                        best = (e, c);
                    }
                }
                *a = best.1 as u32;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::Data;
    use crate::simd::{hmin16, unnan};
    use std::arch::x86_64::*;

    /// The distances in one register: `sum_j (w_j (v_j - c_j)) (v_j - c_j)` (unweighted
    /// `(v_j - c_j)²`) over `j` in order, NaN as infinity; then the first lane with the least.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512(data: Data<'_>, first: usize, soa: &[f32], assign: &mut [u32]) {
        let inf = _mm512_set1_ps(f32::INFINITY);
        for (k, a) in assign.iter_mut().enumerate() {
            let (v, w) = (data.vec(first + k), data.weight(first + k));
            let mut acc = _mm512_setzero_ps();
            for (j, &vj) in v.iter().enumerate() {
                // SAFETY: `soa` holds 16 values per dimension (checked by the caller).
                let diff = _mm512_sub_ps(_mm512_set1_ps(vj), unsafe { _mm512_loadu_ps(soa.as_ptr().add(16 * j)) });
                let wd = match w {
                    None => diff,
                    Some(w) => _mm512_mul_ps(_mm512_set1_ps(w[j]), diff),
                };
                acc = _mm512_add_ps(acc, _mm512_mul_ps(wd, diff));
            }
            let d = _mm512_mask_mov_ps(acc, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(acc, acc), inf);
            let m = _mm512_reduce_min_ps(d);
            let hits = u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(d, _mm512_set1_ps(m)));
            *a = if m < f32::INFINITY { hits.trailing_zeros() } else { 0 };
        }
    }

    /// [`avx512`] with two 8-lane halves.
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(data: Data<'_>, first: usize, soa: &[f32], assign: &mut [u32]) {
        for (k, a) in assign.iter_mut().enumerate() {
            let (v, w) = (data.vec(first + k), data.weight(first + k));
            let mut acc = [_mm256_setzero_ps(); 2];
            for (j, &vj) in v.iter().enumerate() {
                for (h, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `soa` holds 16 values per dimension (checked by the caller).
                    let c = unsafe { _mm256_loadu_ps(soa.as_ptr().add(16 * j + 8 * h)) };
                    let diff = _mm256_sub_ps(_mm256_set1_ps(vj), c);
                    let wd = match w {
                        None => diff,
                        Some(w) => _mm256_mul_ps(_mm256_set1_ps(w[j]), diff),
                    };
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(wd, diff));
                }
            }
            let d = acc.map(|x| unnan(x));
            let m = hmin16(d[0], d[1]);
            let hit = |x: __m256| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, m)) as u32;
            let least = _mm256_cvtss_f32(m);
            *a = if least < f32::INFINITY { (hit(d[0]) | hit(d[1]) << 8).trailing_zeros() } else { 0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::levels;
    use proptest::prelude::*;

    proptest! {
        /// Every level assigns what the scalar loop does: on distinct values, and on vectors
        /// and centroids from a small set (ties), with NaNs and infinities, weighted or not.
        #[test]
        fn levels_agree(seed in 0u64..1000, ties: bool, weighted: bool) {
            let special = |x: f32| match (x.to_bits() % 23, ties) {
                (0, true) => f32::NAN,
                (1, true) => f32::INFINITY,
                (_, true) => (x * 2.0).round() * 0.5,
                _ => x,
            };
            let vs: Vec<f32> = crate::rng::noise(64 * 4, seed, 1.0).into_iter().map(special).collect();
            let soa: Vec<f32> = crate::rng::noise(64, seed + 1, 1.0).into_iter().map(special).collect();
            let ws: Vec<f32> = crate::rng::noise(64 * 4, seed + 2, 1.0).iter().map(|v| v.abs() + 0.05).collect();
            let data = Data { dim: 4, vecs: &vs, weights: weighted.then_some(&ws[..]) };
            let mut want = vec![0u32; 60];
            at(Level::Scalar, data, 4, &soa, &mut want);
            for lvl in levels().into_iter().skip(1) {
                let mut got = vec![9u32; 60];
                at(lvl, data, 4, &soa, &mut got);
                prop_assert_eq!(&got, &want, "{:?}", lvl);
            }
        }
    }
}
