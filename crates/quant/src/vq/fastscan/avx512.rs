//! AVX-512 kernels: a step covers 64 code bytes (four items of a block, one per 16-byte lane).
//! Rather than `pshufb` within lanes and widening u8 sums to u16 (as AVX2 must), the step's code
//! bytes are transposed with one `vpermb` so that each dword holds one row's four items; the
//! nibbles then index the step's 64-byte table (four items x 16 entries) with `vpermb`, and
//! `vpdpbusd` against ones adds a row's four entries straight into its u32 sum. 8 operations per
//! step instead of 11, and no periodic widening (EFFICIENCY.md, "The fast-scan kernel at the L3's
//! rate").

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
