//! A block of int8 rows in the two layouts the products stream (see the module's header). Both
//! only move bytes, so every level packs the same bytes.

use super::BLOCK;
use crate::cpu::{Level, level, supported};

/// A block's rows packed as keys `[ceil(k / 4)][BLOCK][4]`, written only by [`pack_keys`]: so it
/// never holds -128 (AVX2's sign trick could not negate it), which the products rely on without
/// looking.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedKeys(Vec<i8>);

impl PackedKeys {
    pub fn as_slice(&self) -> &[i8] {
        &self.0
    }
}

/// `n <= BLOCK` rows of `k` (`rows` `[n, k]`) as keys into `out`. A value -128 is taken as -127
/// (a cache never stores it).
pub fn pack_keys(rows: &[i8], k: usize, out: &mut PackedKeys) {
    let n = rows.len() / k.max(1);
    assert!(k > 0 && n <= BLOCK && rows.len() == n * k, "pack_keys: shapes do not match");
    let k4 = k.div_ceil(4);
    let out = &mut out.0;
    out.clear();
    out.resize(k4 * BLOCK * 4, 0);
    let words = out.as_chunks_mut::<4>().0;
    for (j, row) in rows.chunks_exact(k).enumerate() {
        let (whole, tail) = row.as_chunks::<4>();
        for (g, w) in whole.iter().enumerate() {
            words[g * BLOCK + j] = w.map(|v| v.max(-127));
        }
        if !tail.is_empty() {
            let last = &mut words[whole.len() * BLOCK + j];
            last.iter_mut().zip(tail).for_each(|(o, v)| *o = (*v).max(-127));
        }
    }
}

/// `n <= BLOCK` rows of `k` (`rows` `[n, k]`) as values: `out` `[BLOCK / 4][k][4]`.
pub fn pack_values(rows: &[i8], k: usize, out: &mut Vec<i8>) {
    pack_values_at(level(), rows, k, out)
}

pub fn pack_values_at(level: Level, rows: &[i8], k: usize, out: &mut Vec<i8>) {
    let n = rows.len() / k.max(1);
    assert!(k > 0 && n <= BLOCK && rows.len() == n * k, "pack_values: shapes do not match");
    out.clear();
    out.resize(BLOCK * k, 0);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 or above only when the CPU has AVX2; shapes checked.
        Level::Avx2 | Level::Avx512 => unsafe { super::avx2::pack_values(rows, k, out) },
        Level::Scalar => values_cols(rows, k, 0..k, out),
    }
}

/// Columns `cols` of [`pack_values`] (the reference, and the SIMD version's tail).
pub(super) fn values_cols(rows: &[i8], k: usize, cols: std::ops::Range<usize>, out: &mut [i8]) {
    for (j, row) in rows.chunks_exact(k).enumerate() {
        let (g, i) = (j / 4, j % 4);
        for t in cols.clone() {
            out[(g * k + t) * 4 + i] = row[t];
        }
    }
}
