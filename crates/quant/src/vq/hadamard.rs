//! Randomized block-Hadamard rotation `R = H D / sqrt(B)` of the input dimension (`D` random
//! signs from a seed, `H` the Sylvester Hadamard matrix of size `B`). Orthogonal, so
//! `(R w) . (R x) = w . x`: rotate the weight rows once at encoding, the activations at run time.
//! It spreads outliers across a block, which makes one small codebook fit every chunk.

use crate::cpu::{Level, level};

#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    pub block: usize,
    pub seed: u64,
    signs: Vec<f32>,
}

impl Rotation {
    /// A rotation of `cols` inputs in blocks of `block` (a power of two dividing `cols`).
    pub fn new(cols: usize, block: usize, seed: u64) -> Rotation {
        assert!(
            block.is_power_of_two() && cols.is_multiple_of(block),
            "rotation block {block} must be a power of two dividing {cols}"
        );
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let signs = (0..cols)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if s & 1 == 0 { 1.0 } else { -1.0 }
            })
            .collect();
        Rotation { block, seed, signs }
    }

    /// The largest power-of-two block up to `max` that divides `cols`.
    pub fn block_for(cols: usize, max: usize) -> usize {
        let mut b = max.next_power_of_two();
        while b > 1 && !cols.is_multiple_of(b) {
            b /= 2;
        }
        b
    }

    /// `v <- R v` for one vector of `cols` values.
    pub fn apply(&self, v: &mut [f32]) {
        self.run(v, true)
    }

    /// `v <- R^T v` (the inverse).
    pub(crate) fn apply_inverse(&self, v: &mut [f32]) {
        self.run(v, false)
    }

    /// The rotation, compiled for AVX2 where the CPU has it (the crate's baseline is SSE2): the
    /// same operations in the same order, so the same bits.
    fn run(&self, v: &mut [f32], forward: bool) {
        assert_eq!(v.len(), self.signs.len(), "a rotation of {} inputs", self.signs.len());
        match level() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `level` returns Avx2 or above only when the CPU has AVX2 and FMA.
            Level::Avx2 | Level::Avx512 => unsafe { self.run_avx2(v, forward) },
            Level::Scalar => self.run_with(v, forward, |b| fwht_any(b, 1)),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn run_avx2(&self, v: &mut [f32], forward: bool) {
        self.run_with(v, forward, |b| fwht_avx2(b))
    }

    /// `H D / sqrt(B)` forward, its transpose `D H / sqrt(B)` otherwise.
    #[inline(always)]
    fn run_with(&self, v: &mut [f32], forward: bool, fwht: impl Fn(&mut [f32])) {
        let signs = |v: &mut [f32]| v.iter_mut().zip(&self.signs).for_each(|(x, s)| *x *= s);
        if forward {
            signs(v);
        }
        let norm = 1.0 / (self.block as f32).sqrt();
        for b in v.chunks_exact_mut(self.block) {
            fwht(b);
            b.iter_mut().for_each(|x| *x *= norm);
        }
        if !forward {
            signs(v);
        }
    }
}

/// In-place fast Walsh-Hadamard transform (unnormalized), the first three levels in AVX2
/// registers: each is `x * sign + partner`, where `partner` swaps the lanes `h` apart and `sign`
/// is -1 on the upper lane of each pair. `fma` rounds `b - a` once, as the subtraction does, so
/// the bits are the butterfly loop's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fwht_avx2(v: &mut [f32]) {
    use std::arch::x86_64::*;
    if !v.len().is_multiple_of(8) {
        return fwht_any(v, 1);
    }
    let sign = |m: [f32; 8]| {
        // SAFETY: 8 floats.
        unsafe { _mm256_loadu_ps(m.as_ptr()) }
    };
    let s1 = sign([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0]);
    let s2 = sign([1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0]);
    let s4 = sign([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]);
    for c in v.chunks_exact_mut(8) {
        // SAFETY: 8 floats, unaligned load and store.
        unsafe {
            let mut x = _mm256_loadu_ps(c.as_ptr());
            x = _mm256_fmadd_ps(x, s1, _mm256_permute_ps::<0b1011_0001>(x));
            x = _mm256_fmadd_ps(x, s2, _mm256_permute_ps::<0b0100_1110>(x));
            x = _mm256_fmadd_ps(x, s4, _mm256_permute2f128_ps::<1>(x, x));
            _mm256_storeu_ps(c.as_mut_ptr(), x);
        }
    }
    fwht_any(v, 8)
}

/// The levels from `h` up (1 or 8), the first three within each group of 8 on whole arrays, the
/// rest on the two halves of each group of `2h` (forms the compiler vectorizes; the loop with
/// strides 1, 2, 4 it does not); every butterfly is the same `a + b`, `a - b`.
#[inline(always)]
fn fwht_any(v: &mut [f32], mut h: usize) {
    if h == 1 && v.len().is_multiple_of(8) {
        for c in v.chunks_exact_mut(8) {
            let c: &mut [f32; 8] = c.try_into().expect("8 values");
            for h in [1, 2, 4] {
                let x = *c;
                *c = std::array::from_fn(|j| if j & h == 0 { x[j] + x[j + h] } else { x[j - h] - x[j] });
            }
        }
        h = 8;
    }
    while h < v.len() {
        for g in v.chunks_exact_mut(2 * h) {
            let (a, b) = g.split_at_mut(h);
            for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                (*x, *y) = (*x + *y, *x - *y);
            }
        }
        h *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_and_invertible() {
        let r = Rotation::new(384, 128, 5);
        let x: Vec<f32> = (0..384).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..384).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut rx, mut rw) = (x.clone(), w.clone());
        r.apply(&mut rx);
        r.apply(&mut rw);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&x, &w) - dot(&rx, &rw)).abs() < 1e-3);
        r.apply_inverse(&mut rx);
        assert!(x.iter().zip(&rx).all(|(a, b)| (a - b).abs() < 1e-5));
        assert_eq!(Rotation::block_for(3584, 128), 128);
        assert_eq!(Rotation::block_for(96, 128), 32);
    }

    /// The transform, in each version the CPU runs, is the textbook butterfly loop bit for bit
    /// (stored codes were encoded against the rotation, and inputs are rotated at run time: both
    /// must stay the same), at every block size the codecs use, including ones below the 8-group.
    #[test]
    fn fwht_is_the_butterfly_loop() {
        for n in [2, 4, 8, 32, 128] {
            let x: Vec<f32> = crate::rng::noise(n, n as u64, 3.0);
            let mut want = x.clone();
            let mut h = 1;
            while h < n {
                for i in (0..n).step_by(2 * h) {
                    for j in i..i + h {
                        let (a, b) = (want[j], want[j + h]);
                        want[j] = a + b;
                        want[j + h] = a - b;
                    }
                }
                h *= 2;
            }
            let mut got = vec![x.clone()];
            fwht_any(&mut got[0], 1);
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::detect() >= Level::Avx2 {
                got.push(x.clone());
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                unsafe { fwht_avx2(&mut got[1]) };
            }
            for g in got {
                assert_eq!(
                    g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "n = {n}"
                );
            }
        }
    }
}
