//! Codec A kernels: fast-scan over 3 x 16 x 4 additive codes.
//!
//! Storage: rows in blocks of 32. For block `b` and item `j` (chunk `j / 3`, stage `j % 3`),
//! 16 bytes: byte `i` holds the code of row `32b + i` in its low nibble and of row `32b + i + 16`
//! in its high nibble. Items follow each other, so a 32-byte load holds items `2p` and `2p + 1`.
//!
//! A matvec first builds the table `T[j][e] = C_{j%3}[e] . x_chunk(j/3)`, quantizes it to u8 with
//! one step `delta` for all items and a per-item offset (`T ~ delta * L + min_j`), then sums
//! `L[j][code(r, j)]` over items in integers, 32 rows per `pshufb`. The integer sums are exact in
//! the scalar reference and the AVX2 and AVX-512 kernels, so their results are bit-identical.

use super::{Scratch, VqRef};
use crate::cpu::{Level, supported};

/// Packs row-major codes (`rows x items`, each < 16) into the interleaved layout.
pub fn pack(codes: &[u16], rows: usize, items: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * items / 2];
    for b in 0..rows / 32 {
        for j in 0..items {
            for i in 0..16 {
                let lo = codes[(32 * b + i) * items + j] as u8;
                let hi = codes[(32 * b + i + 16) * items + j] as u8;
                out[(b * items + j) * 16 + i] = lo | hi << 4;
            }
        }
    }
    out
}

/// The code of item `j` of row `r`.
pub fn code(codes: &[u8], items: usize, r: usize, j: usize) -> usize {
    let byte = codes[((r / 32) * items + j) * 16 + r % 16];
    usize::from(if r % 32 < 16 { byte & 15 } else { byte >> 4 })
}

/// Builds the u8 table for `x` (already rotated) and returns its step `delta`:
/// `T[j][e] ~ delta * (L[j][e] - 128)` with `delta = max|T| / 127`, so a row's dot product is
/// `delta * (sum_j L[j][code] - 128 * items)`. One step for all items keeps the build a
/// vectorizable pass and a quantizing one (no per-item minimum); codebooks are centred, so little
/// range is lost.
/// `work` is working memory (the f32 table, where a kernel keeps it); `level` picks the kernel.
pub fn build_lut_at(level: Level, codebooks: &[f32], x: &[f32], work: &mut Vec<f32>, lut: &mut Vec<u8>) -> f32 {
    lut.resize(x.len() / 4 * 3 * 16, 0);
    build_into(level, codebooks, x, work, lut)
}

/// [`build_lut_at`] into a table of the right size (`items x 16` bytes).
fn build_into(level: Level, codebooks: &[f32], x: &[f32], work: &mut Vec<f32>, lut: &mut [u8]) -> f32 {
    assert!(
        x.len().is_multiple_of(8) && codebooks.len() == 3 * 16 * 4 && lut.len() == x.len() / 4 * 3 * 16,
        "fast-scan tables need 3 x 16 x 4 codebooks, 8k inputs and 16 bytes per item"
    );
    let ct = transposed(codebooks);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
            work.resize(lut.len(), 0.0);
            // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; sizes set here.
            unsafe { avx2::build_lut(&ct, x, work, lut) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX-512 F and BW.
        Level::Avx512 => unsafe { avx512::build_lut(&ct, x, lut) },
        Level::Scalar => reference::build_lut(&ct, x, work, lut),
    }
}

/// The exact table `T` (f32, `items x 16`) that [`build_lut_at`] quantizes: for error bounds.
pub fn table(codebooks: &[f32], x: &[f32]) -> Vec<f32> {
    let mut table = Vec::new();
    reference::table(&transposed(codebooks), x, &mut table);
    table
}

/// Codebooks transposed to `[stage][dim][entry]`: 16 entries of one dimension are contiguous.
fn transposed(codebooks: &[f32]) -> [f32; 192] {
    std::array::from_fn(|i| {
        let (s, d, e) = (i / 64, i / 16 % 4, i % 16);
        codebooks[(s * 16 + e) * 4 + d]
    })
}

/// The step for a table whose largest magnitude is `amax`.
fn step(amax: f32) -> f32 {
    if amax > 0.0 { amax / 127.0 } else { 1.0 }
}

pub(super) fn matvec(level: Level, m: &VqRef<'_>, scratch: &mut Scratch, y: &mut [f32]) {
    let items = m.cols / 4 * 3;
    let delta = build_lut_at(level, m.codebooks, &scratch.x, &mut scratch.table, &mut scratch.lut);
    scratch.sums.resize(m.rows, 0);
    sums_at(level, m.codes, items, &scratch.lut, &mut scratch.sums);
    finish(level, m, items, delta, &scratch.sums, y);
}

/// `y` from the rows' integer sums: the table's step and offset undone, the row scale applied.
fn finish(level: Level, m: &VqRef<'_>, items: usize, delta: f32, sums: &[u32], y: &mut [f32]) {
    let offset = 128.0 * items as f32;
    let whole = match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 or above only when the CPU has AVX2 and F16C.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::finish(delta, offset, sums, m.scale, y) },
        Level::Scalar => 0,
    };
    for ((out, s), sc) in y.iter_mut().zip(sums).zip(m.scale).skip(whole) {
        // Both terms are integers below 2^24, so the difference is exact.
        *out = sc.to_f32() * (delta * (*s as f32 - offset));
    }
}

/// `Y = W X` for the (rotated) vectors in `scratch.xs`: one table per vector, then the codes
/// scanned once for each pair of vectors. The integer sums are exact, so every vector gets the
/// bits [`matvec`] gives it.
pub(super) fn matmul(level: Level, m: &VqRef<'_>, scratch: &mut Scratch, ys: &mut [f32]) {
    let (items, rows, cols) = (m.cols / 4 * 3, m.rows, m.cols);
    let n = scratch.xs.len() / cols;
    scratch.luts.resize(n * items * 16, 0);
    scratch.deltas.clear();
    for (x, lut) in scratch.xs.chunks_exact(cols).zip(scratch.luts.chunks_exact_mut(items * 16)) {
        scratch.deltas.push(build_into(level, m.codebooks, x, &mut scratch.table, lut));
    }
    scratch.sums.resize(n * rows, 0);
    let (pairs, luts) = (n / 2 * 2, &scratch.luts);
    for (p, s) in scratch.sums[..pairs * rows].chunks_exact_mut(2 * rows).enumerate() {
        let (a, b) = s.split_at_mut(rows);
        let table = |v: usize| &luts[v * items * 16..(v + 1) * items * 16];
        sums2_at(level, m.codes, items, [table(2 * p), table(2 * p + 1)], [a, b]);
    }
    if n > pairs {
        sums_at(level, m.codes, items, &luts[pairs * items * 16..], &mut scratch.sums[pairs * rows..]);
    }
    for ((y, s), d) in ys.chunks_exact_mut(rows).zip(scratch.sums.chunks_exact(rows)).zip(&scratch.deltas) {
        finish(level, m, items, *d, s, y);
    }
}

/// [`sums_at`] for two tables at once: each code byte loaded once for both.
pub fn sums2_at(level: Level, codes: &[u8], items: usize, luts: [&[u8]; 2], sums: [&mut [u32]; 2]) {
    let [sa, sb] = sums;
    assert_eq!(sa.len(), sb.len(), "two sums of one matrix");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        lvl @ (Level::Avx2 | Level::Avx512) => {
            assert!(items.is_multiple_of(2) && sa.len().is_multiple_of(32), "item pairs and 32-row blocks");
            assert_eq!(codes.len(), sa.len() * items / 2, "codes for {} rows of {items} items", sa.len());
            assert!(luts.iter().all(|l| l.len() == items * 16), "tables of {items} items");
            if lvl == Level::Avx512 {
                // SAFETY: as for `sums`, checked above for both tables; AVX-512 BW/VBMI/VNNI present.
                unsafe { avx512::sums2(codes, items, luts, [sa, sb]) }
            } else {
                // SAFETY: as for `sums`, checked above for both tables.
                unsafe { avx2::sums2(codes, items, luts, [sa, sb]) }
            }
        }
        Level::Scalar => {
            sums_at(level, codes, items, luts[0], sa);
            sums_at(level, codes, items, luts[1], sb);
        }
    }
}

/// `sums[r] = sum_j lut[j][code(r, j)]` for every row, with an explicit kernel level.
pub fn sums_at(level: Level, codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
    assert!(
        items.is_multiple_of(2) && sums.len().is_multiple_of(32),
        "fast-scan works on item pairs and 32-row blocks"
    );
    assert_eq!(codes.len(), sums.len() * items / 2, "codes for {} rows of {items} items", sums.len());
    assert_eq!(lut.len(), items * 16, "a table of {items} items");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2; the codes hold rows/32
        // blocks of items x 16 bytes and the table items x 16 bytes (items even: cols % 8 == 0).
        Level::Avx2 => unsafe { avx2::sums(codes, items, lut, sums) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX-512 BW, VBMI and VNNI (which `supported` vouched for).
        Level::Avx512 => unsafe { avx512::sums(codes, items, lut, sums) },
        Level::Scalar => reference::sums(codes, items, lut, sums),
    }
}

pub mod reference {
    /// Table values from the transposed codebooks `ct[stage][dim][entry]`, into `table`.
    pub fn table(ct: &[f32; 192], x: &[f32], table: &mut Vec<f32>) {
        table.resize(x.len() / 4 * 3 * 16, 0.0);
        for (k, xc) in x.chunks_exact(4).enumerate() {
            for s in 0..3 {
                for e in 0..16 {
                    table[(k * 3 + s) * 16 + e] = (0..4).map(|d| ct[(s * 4 + d) * 16 + e] * xc[d]).sum();
                }
            }
        }
    }

    /// The u8 table, the f32 one kept in `work`; returns delta.
    pub fn build_lut(ct: &[f32; 192], x: &[f32], work: &mut Vec<f32>, lut: &mut [u8]) -> f32 {
        table(ct, x, work);
        let table = &*work;
        let delta = super::step(table.iter().fold(0f32, |m, v| m.max(v.abs())));
        let inv = 1.0 / delta;
        for (t, l) in table.iter().zip(lut.iter_mut()) {
            *l = ((t * inv).round_ties_even() as i32 + 128).clamp(0, 255) as u8;
        }
        delta
    }

    /// `sums[r] = sum_j lut[j][code(r, j)]`.
    pub fn sums(codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
        for (r, s) in sums.iter_mut().enumerate() {
            *s = (0..items).map(|j| u32::from(lut[j * 16 + super::code(codes, items, r, j)])).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
