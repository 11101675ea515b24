//! Int8 products for attention over int8 rows (an MLA cache stored `int8`): all heads' scores
//! against a block of up to [`BLOCK`] cached rows, and the block's weighted sum, as integer dot
//! products (`vpdpbusd` with AVX512-VNNI, 64 multiply-adds an instruction; `vpmaddubsw` with
//! AVX2). Every result is an exact integer, so every level gives the same bits.
//!
//! The cached rows are int8 already (rounded once, when appended). What these products round in
//! addition is the other side: each head's query to int8 (one step a head, its largest magnitude
//! / 127: [`quantize_queries`]) and each head's block of weights to 7 bits (one step a head and
//! block, its largest / 127: [`quantize_weights`]; 7 bits keep `vpmaddubsw`'s pair sums within
//! i16, so AVX2 gives VNNI's integers). What that costs a model is measured
//! (`k3-cli perplexity --kv-cache int8 --against`, docs/EFFICIENCY.md).
//!
//! A block is packed twice, once per product, so both stream whole registers:
//! - keys `[k4][BLOCK][4]` (`k4 = ceil(k / 4)`): row `j`'s values `4g..4g + 4` are bytes
//!   `(g * BLOCK + j) * 4..`; a register holds 16 rows' same four columns, a broadcast query word
//!   feeds all of them ([`pack_keys`]).
//! - values `[BLOCK / 4][k][4]`: rows `4g..4g + 4`'s value `t` are bytes `(g * k + t) * 4..`; a
//!   broadcast word of four weights feeds 16 columns ([`pack_values`]).
//!
//! Rows short of a block, and columns short of a word, are zeros.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod pack;
pub mod reference;

pub use pack::{PackedKeys, pack_keys, pack_values, pack_values_at};

use crate::cpu::{Level, level, supported};

/// Rows of a block.
pub const BLOCK: usize = 32;
/// The largest weight level (7 bits).
pub const WEIGHT_MAX: u8 = 127;

/// Each `k`-value row of `q` (heads' queries) rounded to int8 with one step a row (`max|q| /
/// 127`), into `out` rows of `4 ceil(k / 4)` (zero-padded) and `steps`. A zero row gets step 0;
/// a row holding a NaN or an infinity gets zeros and step NaN, so its scores come out NaN as
/// they would in f32.
pub fn quantize_queries(q: &[f32], k: usize, out: &mut Vec<i8>, steps: &mut Vec<f32>) {
    assert!(k > 0 && q.len().is_multiple_of(k), "quantize_queries: rows of {k} do not match");
    let k4 = k.div_ceil(4) * 4;
    out.clear();
    steps.clear();
    for row in q.chunks_exact(k) {
        let most = row.iter().fold(0f32, |m, x| if m.is_nan() || !x.is_finite() { f32::NAN } else { m.max(x.abs()) });
        let step = if most.is_nan() { f32::NAN } else { step_of(most, 127.0) };
        let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
        // `as` saturates, a NaN to 0.
        out.extend(row.iter().map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8));
        out.resize(out.len() + k4 - k, 0);
        steps.push(step);
    }
}

/// Each head's `n` non-negative weights (rows of `w`, `[heads, n]`) rounded to `0..=127` with one
/// step a row (its largest / 127; halves round up), into `out` rows of [`BLOCK`] (zero past
/// `n`) and `steps`. What a softmax never makes: a negative weight or NaN counts as zero, and a
/// row holding an infinity gets step 0 (zeros).
pub fn quantize_weights(w: &[f32], n: usize, out: &mut Vec<u8>, steps: &mut Vec<f32>) {
    assert!(n <= BLOCK && (n == 0 || w.len().is_multiple_of(n)), "quantize_weights: shapes do not match");
    let rows = w.len().checked_div(n).unwrap_or(0);
    out.clear();
    out.resize(rows * BLOCK, 0);
    steps.clear();
    for (row, o) in w.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(BLOCK)) {
        // `f32::max` passes over NaN.
        let step = step_of(row.iter().fold(0f32, |m, x| m.max(*x)), f32::from(WEIGHT_MAX));
        let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
        // `as` saturates (NaN to 0); `+ 0.5` then truncation rounds a non-negative value.
        o.iter_mut().zip(row).for_each(|(o, x)| *o = (x * inv + 0.5).clamp(0.0, 127.0) as u8);
        steps.push(step);
    }
}

fn step_of(most: f32, levels: f32) -> f32 {
    if most.is_finite() && most > 0.0 { most / levels } else { 0.0 }
}

/// `out[i][j] = sum_t a[i][t] * b[j][t]` for the `n` rows of a block packed by [`pack_keys`]
/// (never a -128: AVX2 could not negate it): `a` `[m, 4 ceil(k / 4)]` (as [`quantize_queries`]
/// writes), `out` `[m, n]`. Exact.
pub fn scores(a: &[i8], keys: &PackedKeys, k: usize, n: usize, out: &mut [i32]) {
    scores_at(level(), a, keys, k, n, out)
}

pub fn scores_at(level: Level, a: &[i8], keys: &PackedKeys, k: usize, n: usize, out: &mut [i32]) {
    let keys = keys.as_slice();
    let k4 = k.div_ceil(4) * 4;
    let m = a.len() / k4.max(1);
    assert!(
        k > 0 && n <= BLOCK && a.len() == m * k4 && keys.len() == k4 * BLOCK && out.len() == m * n,
        "gemm8::scores: shapes do not match"
    );
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F/BW/VNNI; shapes checked.
        Level::Avx512 => unsafe { avx512::scores(a, keys, k4, n, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2; shapes checked.
        Level::Avx2 => unsafe { avx2::scores(a, keys, k4, n, out) },
        Level::Scalar => reference::scores(a, keys, k4, n, out),
    }
}

/// `out[i][t] = sum_j w[i][j] * b[j][t]` for a block packed by [`pack_values`]: `w` `[m, BLOCK]`
/// levels in `0..=127` (as [`quantize_weights`] writes), `out` `[m, k]`. Exact.
pub fn weighted(w: &[u8], values: &[i8], k: usize, out: &mut [i32]) {
    weighted_at(level(), w, values, k, out)
}

pub fn weighted_at(level: Level, w: &[u8], values: &[i8], k: usize, out: &mut [i32]) {
    let m = w.len() / BLOCK;
    assert!(
        k > 0 && w.len() == m * BLOCK && values.len() == k * BLOCK && out.len() == m * k,
        "gemm8::weighted: shapes do not match"
    );
    assert!(w.iter().all(|x| *x <= WEIGHT_MAX), "gemm8::weighted: a weight level above {WEIGHT_MAX}");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `scores_at`.
        Level::Avx512 => unsafe { avx512::weighted(w, values, k, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `scores_at`.
        Level::Avx2 => unsafe { avx2::weighted(w, values, k, out) },
        Level::Scalar => reference::weighted(w, values, k, out),
    }
}
