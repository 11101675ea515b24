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
use crate::cpu::{Level, level, supported};

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
/// `work` is working memory (the f32 table, where a kernel keeps it).
pub fn build_lut(codebooks: &[f32], x: &[f32], work: &mut Vec<f32>, lut: &mut Vec<u8>) -> f32 {
    build_lut_at(level(), codebooks, x, work, lut)
}

/// [`build_lut`] with an explicit kernel level.
pub fn build_lut_at(level: Level, codebooks: &[f32], x: &[f32], work: &mut Vec<f32>, lut: &mut Vec<u8>) -> f32 {
    assert!(
        x.len().is_multiple_of(8) && codebooks.len() == 3 * 16 * 4,
        "fast-scan tables need 3 x 16 x 4 codebooks and 8k inputs"
    );
    lut.resize(x.len() / 4 * 3 * 16, 0);
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
        Level::Scalar => reference::build_lut(&ct, x, lut),
    }
}

/// The exact table `T` (f32, `items x 16`) that [`build_lut`] quantizes: for error bounds.
pub fn table(codebooks: &[f32], x: &[f32]) -> Vec<f32> {
    reference::table(&transposed(codebooks), x)
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
    let mut deltas = Vec::with_capacity(n);
    scratch.luts.resize(n * items * 16, 0);
    for (x, lut) in scratch.xs.chunks_exact(cols).zip(scratch.luts.chunks_exact_mut(items * 16)) {
        deltas.push(build_lut_at(level, m.codebooks, x, &mut scratch.table, &mut scratch.lut));
        lut.copy_from_slice(&scratch.lut);
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
    for ((y, s), d) in ys.chunks_exact_mut(rows).zip(scratch.sums.chunks_exact(rows)).zip(deltas) {
        finish(level, m, items, d, s, y);
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
    /// Table values from the transposed codebooks `ct[stage][dim][entry]`.
    pub fn table(ct: &[f32; 192], x: &[f32]) -> Vec<f32> {
        let mut table = vec![0f32; x.len() / 4 * 3 * 16];
        for (k, xc) in x.chunks_exact(4).enumerate() {
            for s in 0..3 {
                for e in 0..16 {
                    table[(k * 3 + s) * 16 + e] = (0..4).map(|d| ct[(s * 4 + d) * 16 + e] * xc[d]).sum();
                }
            }
        }
        table
    }

    /// The u8 table; returns delta.
    pub fn build_lut(ct: &[f32; 192], x: &[f32], lut: &mut [u8]) -> f32 {
        let table = table(ct, x);
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
mod avx2 {
    use std::arch::x86_64::*;

    /// The f32 table stored in `table`, then quantized: on 8-wide registers this beats computing
    /// the products twice (EFFICIENCY.md), unlike on AVX-512.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn build_lut(ct: &[f32; 192], x: &[f32], table: &mut [f32], lut: &mut [u8]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        let c = |i: usize| {
            // SAFETY: i + 8 <= 192.
            unsafe { _mm256_loadu_ps(ct.as_ptr().add(i)) }
        };
        for (k, xc) in x.chunks_exact(4).enumerate() {
            let xb = [_mm256_set1_ps(xc[0]), _mm256_set1_ps(xc[1]), _mm256_set1_ps(xc[2]), _mm256_set1_ps(xc[3])];
            for s in 0..3 {
                let mut lo = _mm256_mul_ps(c(s * 64), xb[0]);
                let mut hi = _mm256_mul_ps(c(s * 64 + 8), xb[0]);
                for (d, xd) in xb.iter().enumerate().skip(1) {
                    lo = _mm256_fmadd_ps(c(s * 64 + d * 16), *xd, lo);
                    hi = _mm256_fmadd_ps(c(s * 64 + d * 16 + 8), *xd, hi);
                }
                let at = (k * 3 + s) * 16;
                // SAFETY: item k * 3 + s has 16 table slots.
                unsafe {
                    _mm256_storeu_ps(table.as_mut_ptr().add(at), lo);
                    _mm256_storeu_ps(table.as_mut_ptr().add(at + 8), hi);
                }
                amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_andnot_ps(sign, lo), _mm256_andnot_ps(sign, hi)));
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), amax) };
        let delta = super::step(lanes.iter().fold(0f32, |m, v| m.max(*v)));
        let inv = _mm256_set1_ps(1.0 / delta);
        let flip = _mm256_set1_epi8(-128);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (t, l) in table.chunks_exact(32).zip(lut.chunks_exact_mut(32)) {
            // SAFETY: 32 floats in, 32 bytes out.
            unsafe {
                let q = |i: usize| _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(t.as_ptr().add(i)), inv));
                let ab = _mm256_packs_epi32(q(0), q(8));
                let cd = _mm256_packs_epi32(q(16), q(24));
                let v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
                _mm256_storeu_si256(l.as_mut_ptr().cast(), _mm256_xor_si256(v, flip));
            }
        }
        delta
    }

    /// [`super::finish`] on 8 rows at a time, the same operations in the same order; returns how
    /// many rows it did.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn finish(delta: f32, offset: f32, sums: &[u32], scale: &[half::f16], y: &mut [f32]) -> usize {
        let n = y.len().min(sums.len()).min(scale.len()) / 8 * 8;
        let (d, o) = (_mm256_set1_ps(delta), _mm256_set1_ps(offset));
        for r in (0..n).step_by(8) {
            // SAFETY: r + 8 <= n, within all three slices; f16 is 2 bytes, as the load assumes.
            unsafe {
                let s = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().add(r).cast()));
                let sc = _mm256_cvtph_ps(_mm_loadu_si128(scale.as_ptr().add(r).cast()));
                _mm256_storeu_ps(y.as_mut_ptr().add(r), _mm256_mul_ps(sc, _mm256_mul_ps(d, _mm256_sub_ps(s, o))));
            }
        }
        n
    }

    /// Steps between widenings: 256 u8 values summed per u16 lane stay below 65536.
    const FLUSH: usize = 256;
    /// Row blocks scanned together (EFFICIENCY.md: one table load for several blocks).
    const BLOCKS: usize = 4;

    /// Adds the u16 lanes of `a` (each the sum of an even row in its low byte and the odd row
    /// shifted in) and `b` (the odd rows' sums) to the block's 16 rows: lane `k` of each
    /// 16-byte half holds rows `2k` and `2k + 1`.
    #[target_feature(enable = "avx2")]
    fn flush(a: __m256i, b: __m256i, rows: &mut [u32]) {
        let even = _mm256_sub_epi16(a, _mm256_slli_epi16::<8>(b));
        let halves = |v: __m256i| {
            _mm256_add_epi32(
                _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)),
                _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(v)),
            )
        };
        add_rows(halves(even), halves(b), rows);
    }

    /// `rows[2k] += e[k]`, `rows[2k + 1] += o[k]` for `k < 8`, in registers.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn add_rows(e: __m256i, o: __m256i, rows: &mut [u32]) {
        // Per 128-bit lane: [e0 o0 e1 o1 | e4 o4 e5 o5] and [e2 o2 e3 o3 | e6 o6 e7 o7].
        let (lo, hi) = (_mm256_unpacklo_epi32(e, o), _mm256_unpackhi_epi32(e, o));
        let first = _mm256_permute2x128_si256::<0x20>(lo, hi);
        let second = _mm256_permute2x128_si256::<0x31>(lo, hi);
        assert!(rows.len() >= 16, "a half-block of 16 rows");
        // SAFETY: 16 u32 checked above, unaligned loads and stores.
        unsafe {
            let p = rows.as_mut_ptr().cast::<__m256i>();
            _mm256_storeu_si256(p, _mm256_add_epi32(_mm256_loadu_si256(p), first));
            _mm256_storeu_si256(p.add(1), _mm256_add_epi32(_mm256_loadu_si256(p.add(1)), second));
        }
    }

    /// [`sums`] for two tables: the codes' nibbles split once, looked up in both.
    #[target_feature(enable = "avx2")]
    pub(super) fn sums2(codes: &[u8], items: usize, luts: [&[u8]; 2], sums: [&mut [u32]; 2]) {
        let [sa, sb] = sums;
        for (b, (oa, ob)) in sa.chunks_exact_mut(32).zip(sb.chunks_exact_mut(32)).enumerate() {
            oa.fill(0);
            ob.fill(0);
            let base = &codes[b * items * 16..][..items * 16];
            let (mut a, mut c) = (Acc::new(), Acc::new());
            for (step, at) in (0..items * 16).step_by(32).enumerate() {
                // SAFETY: `at + 32 <= items * 16`, the length of the block's codes and of each table.
                let load = |bytes: &[u8]| unsafe { _mm256_loadu_si256(bytes.as_ptr().add(at).cast()) };
                let (lo, hi) = nibbles(load(base));
                a.add(load(luts[0]), lo, hi);
                c.add(load(luts[1]), lo, hi);
                if step % FLUSH == FLUSH - 1 {
                    a.flush(oa);
                    c.flush(ob);
                }
            }
            a.flush(oa);
            c.flush(ob);
        }
    }

    /// The codes of one step, split into low and high nibbles.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn nibbles(c: __m256i) -> (__m256i, __m256i) {
        let m = _mm256_set1_epi8(15);
        (_mm256_and_si256(c, m), _mm256_and_si256(_mm256_srli_epi16::<4>(c), m))
    }

    /// One block's four accumulators (low-nibble rows: even, odd bytes; high-nibble rows).
    struct Acc([__m256i; 4]);

    impl Acc {
        #[target_feature(enable = "avx2")]
        fn new() -> Self {
            Acc([_mm256_setzero_si256(); 4])
        }

        /// Looks the split codes up in `lut` and adds the entries.
        #[target_feature(enable = "avx2")]
        #[inline]
        fn add(&mut self, lut: __m256i, lo: __m256i, hi: __m256i) {
            let rl = _mm256_shuffle_epi8(lut, lo);
            let rh = _mm256_shuffle_epi8(lut, hi);
            let a = &mut self.0;
            a[0] = _mm256_add_epi16(a[0], rl);
            a[1] = _mm256_add_epi16(a[1], _mm256_srli_epi16::<8>(rl));
            a[2] = _mm256_add_epi16(a[2], rh);
            a[3] = _mm256_add_epi16(a[3], _mm256_srli_epi16::<8>(rh));
        }

        #[target_feature(enable = "avx2")]
        fn flush(&mut self, out: &mut [u32]) {
            let (l, h) = out.split_at_mut(16);
            flush(self.0[0], self.0[1], l);
            flush(self.0[2], self.0[3], h);
            *self = Acc::new();
        }
    }

    /// `N` consecutive blocks (`codes` holds them, `out` their `32 N` rows) against one table:
    /// each table load serves all `N`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn blocks<const N: usize>(codes: &[u8], lut: &[u8], out: &mut [u32]) {
        let block = lut.len();
        out.fill(0);
        let mut acc: [Acc; N] = std::array::from_fn(|_| Acc::new());
        for (step, at) in (0..block).step_by(32).enumerate() {
            // SAFETY: `at + 32 <= block` (blocks are whole item pairs of 32 bytes), and `codes`
            // holds N blocks.
            let l = unsafe { _mm256_loadu_si256(lut.as_ptr().add(at).cast()) };
            for (b, a) in acc.iter_mut().enumerate() {
                if step % 2 == 0 {
                    crate::simd::prefetch_ahead(codes.as_ptr().wrapping_add(b * block + at));
                }
                // SAFETY: as above.
                let (lo, hi) = nibbles(unsafe { _mm256_loadu_si256(codes.as_ptr().add(b * block + at).cast()) });
                a.add(l, lo, hi);
            }
            if step % FLUSH == FLUSH - 1 {
                for (a, o) in acc.iter_mut().zip(out.chunks_exact_mut(32)) {
                    a.flush(o);
                }
            }
        }
        for (a, o) in acc.iter_mut().zip(out.chunks_exact_mut(32)) {
            a.flush(o);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn sums(codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
        const N: usize = BLOCKS;
        let block = items * 16;
        let whole = sums.len() / (32 * N) * (32 * N);
        let (many, rest) = sums.split_at_mut(whole);
        for (g, out) in many.chunks_exact_mut(32 * N).enumerate() {
            blocks::<N>(&codes[g * N * block..][..N * block], lut, out);
        }
        for (b, out) in rest.chunks_exact_mut(32).enumerate() {
            blocks::<1>(&codes[(whole / 32 + b) * block..][..block], lut, out);
        }
    }
}

/// AVX-512 kernels: a step covers 64 code bytes (four items of a block, one per 16-byte lane).
/// Rather than `pshufb` within lanes and widening u8 sums to u16 (as AVX2 must), the step's code
/// bytes are transposed with one `vpermb` so that each dword holds one row's four items; the
/// nibbles then index the step's 64-byte table (four items x 16 entries) with `vpermb`, and
/// `vpdpbusd` against ones adds a row's four entries straight into its u32 sum. 8 operations per
/// step instead of 11, and no periodic widening (EFFICIENCY.md, "vpermb + vpdpbusd").
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Row blocks scanned together (EFFICIENCY.md: one table load for several blocks).
    const BLOCKS: usize = 4;

    /// 64 bytes at `at` of `bytes`, the last step's half-vector (two items) zero-filled.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn load(bytes: &[u8], at: usize) -> __m512i {
        let mask = if bytes.len() - at >= 64 { u64::MAX } else { u64::from(u32::MAX) };
        // SAFETY: the mask covers bytes `at..at + 32` at least, all of which are in `bytes`
        // (items are even: a step has two or four items); masked-off bytes are not read.
        unsafe { _mm512_maskz_loadu_epi8(mask, bytes.as_ptr().add(at).cast()) }
    }

    /// [`super::avx2::build_lut`] on 16 entries (one item) per register, in two passes (the
    /// step, then the table) that compute the same products in the same order: recomputing is
    /// cheaper than storing a 4-byte table larger than L1 and reading it back.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn build_lut(ct: &[f32; 192], x: &[f32], lut: &mut [u8]) -> f32 {
        // SAFETY: i + 16 <= 192.
        let c: [__m512; 12] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(ct.as_ptr().add(16 * i)) });
        let item = |xc: &[f32], s: usize| {
            let mut v = _mm512_mul_ps(c[s * 4], _mm512_set1_ps(xc[0]));
            for d in 1..4 {
                v = _mm512_fmadd_ps(c[s * 4 + d], _mm512_set1_ps(xc[d]), v);
            }
            v
        };
        let mut amax = [_mm512_setzero_ps(); 3];
        for xc in x.chunks_exact(4) {
            for (s, m) in amax.iter_mut().enumerate() {
                *m = _mm512_max_ps(*m, _mm512_abs_ps(item(xc, s)));
            }
        }
        let delta = super::step(_mm512_reduce_max_ps(_mm512_max_ps(amax[0], _mm512_max_ps(amax[1], amax[2]))));
        let inv = _mm512_set1_ps(1.0 / delta);
        let flip = _mm_set1_epi8(-128);
        for (xc, l) in x.chunks_exact(4).zip(lut.chunks_exact_mut(48)) {
            for s in 0..3 {
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(item(xc, s), inv));
                // SAFETY: 48 table bytes per chunk, 16 per stage.
                unsafe {
                    _mm_storeu_si128(l.as_mut_ptr().add(16 * s).cast(), _mm_xor_si128(_mm512_cvtsepi32_epi8(q), flip))
                };
            }
        }
        delta
    }

    /// The constants of a step: the transpose, the nibble mask, each byte's item offset in the
    /// step's table, and the ones `vpdpbusd` multiplies by.
    #[derive(Clone, Copy)]
    struct Consts {
        transpose: __m512i,
        nibble: __m512i,
        item: __m512i,
        ones: __m512i,
    }

    impl Consts {
        #[target_feature(enable = "avx512f,avx512bw")]
        fn new() -> Self {
            // Byte 4i + k of the transposed step is byte 16k + i of the codes (row i, item k),
            // and indexes item k's 16 entries at 16k.
            let transpose: [u8; 64] = std::array::from_fn(|p| (16 * (p % 4) + p / 4) as u8);
            let item: [u8; 64] = std::array::from_fn(|p| (16 * (p % 4)) as u8);
            // SAFETY: 64-byte arrays, unaligned loads.
            let (transpose, item) =
                unsafe { (_mm512_loadu_si512(transpose.as_ptr().cast()), _mm512_loadu_si512(item.as_ptr().cast())) };
            Consts { transpose, nibble: _mm512_set1_epi8(15), item, ones: _mm512_set1_epi8(1) }
        }

        /// A step's codes as table indices: rows 0..16 (low nibbles) and 16..32 (high nibbles),
        /// one row per dword.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        #[inline]
        fn indices(&self, codes: __m512i) -> (__m512i, __m512i) {
            const AND_OR: i32 = 0xEA; // (a & b) | c
            let t = _mm512_permutexvar_epi8(self.transpose, codes);
            let lo = _mm512_ternarylogic_epi32::<AND_OR>(t, self.nibble, self.item);
            let hi = _mm512_ternarylogic_epi32::<AND_OR>(_mm512_srli_epi16::<4>(t), self.nibble, self.item);
            (lo, hi)
        }
    }

    /// One block's sums: rows 0..16 and 16..32, one u32 per row.
    struct Acc([__m512i; 2]);

    impl Acc {
        #[target_feature(enable = "avx512f")]
        fn new() -> Self {
            Acc([_mm512_setzero_si512(); 2])
        }

        /// Looks the step's indices up in its table and adds each row's four entries.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
        #[inline]
        fn add(&mut self, k: &Consts, lut: __m512i, (lo, hi): (__m512i, __m512i)) {
            let a = &mut self.0;
            a[0] = _mm512_dpbusd_epi32(a[0], _mm512_permutexvar_epi8(lo, lut), k.ones);
            a[1] = _mm512_dpbusd_epi32(a[1], _mm512_permutexvar_epi8(hi, lut), k.ones);
        }

        #[target_feature(enable = "avx512f")]
        fn store(&self, out: &mut [u32]) {
            assert!(out.len() >= 32, "a block of 32 rows");
            // SAFETY: 32 u32 checked above, unaligned stores.
            unsafe {
                _mm512_storeu_si512(out.as_mut_ptr().cast(), self.0[0]);
                _mm512_storeu_si512(out.as_mut_ptr().add(16).cast(), self.0[1]);
            }
        }
    }

    /// `N` consecutive blocks (`codes` holds them, `out` their `32 N` rows) against one table:
    /// each table load serves all `N`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    #[inline]
    fn blocks<const N: usize>(k: &Consts, codes: &[u8], lut: &[u8], out: &mut [u32]) {
        let block = lut.len();
        let mut acc: [Acc; N] = std::array::from_fn(|_| Acc::new());
        for at in (0..block).step_by(64) {
            let l = load(lut, at);
            for (b, a) in acc.iter_mut().enumerate() {
                crate::simd::prefetch_ahead(codes[b * block..].as_ptr().wrapping_add(at));
                a.add(k, l, k.indices(load(&codes[b * block..][..block], at)));
            }
        }
        for (a, o) in acc.iter().zip(out.chunks_exact_mut(32)) {
            a.store(o);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) fn sums(codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
        const N: usize = BLOCKS;
        let (k, block) = (Consts::new(), items * 16);
        let whole = sums.len() / (32 * N) * (32 * N);
        let (many, rest) = sums.split_at_mut(whole);
        for (g, out) in many.chunks_exact_mut(32 * N).enumerate() {
            blocks::<N>(&k, &codes[g * N * block..][..N * block], lut, out);
        }
        for (b, out) in rest.chunks_exact_mut(32).enumerate() {
            blocks::<1>(&k, &codes[(whole / 32 + b) * block..][..block], lut, out);
        }
    }

    /// [`sums`] for two tables: each step's codes transposed and split once, looked up in both.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) fn sums2(codes: &[u8], items: usize, luts: [&[u8]; 2], sums: [&mut [u32]; 2]) {
        let [sa, sb] = sums;
        let (k, block) = (Consts::new(), items * 16);
        for (b, (oa, ob)) in sa.chunks_exact_mut(32).zip(sb.chunks_exact_mut(32)).enumerate() {
            let base = &codes[b * block..][..block];
            let (mut a, mut c) = (Acc::new(), Acc::new());
            for at in (0..block).step_by(64) {
                let ix = k.indices(load(base, at));
                a.add(&k, load(luts[0], at), ix);
                c.add(&k, load(luts[1], at), ix);
            }
            a.store(oa);
            c.store(ob);
        }
    }
}
