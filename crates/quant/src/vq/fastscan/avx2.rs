//! AVX2 kernels: `pshufb` looks up one item per 16-byte lane for 16 rows, the u8 entries are
//! summed in u16 lanes and widened per row every 256 steps; the table build stores its f32 table.

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
/// Row blocks scanned together, one table load for all (EFFICIENCY.md): two, as four blocks'
/// 16 accumulators spilled AVX2's 16 registers to the stack on every step (1.15x slower).
const BLOCKS: usize = 2;

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
    let m = _mm256_set1_epi8(15);
    for (b, (oa, ob)) in sa.chunks_exact_mut(32).zip(sb.chunks_exact_mut(32)).enumerate() {
        oa.fill(0);
        ob.fill(0);
        let base = &codes[b * items * 16..][..items * 16];
        let (mut a, mut c) = (Acc::new(), Acc::new());
        for (step, at) in (0..items * 16).step_by(32).enumerate() {
            // SAFETY: `at + 32 <= items * 16`, the length of the block's codes and of each table.
            let load = |bytes: &[u8]| unsafe { _mm256_loadu_si256(bytes.as_ptr().add(at).cast()) };
            let (lo, hi) = nibbles(load(base), m);
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

/// The codes of one step, split into low and high nibbles; `m` is 15 in every byte (the caller
/// holds it, so a loop keeps it in a register).
#[target_feature(enable = "avx2")]
#[inline]
fn nibbles(c: __m256i, m: __m256i) -> (__m256i, __m256i) {
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
    let m = _mm256_set1_epi8(15);
    // Runs of FLUSH steps with no test inside, each flushed after: a branch per step kept the
    // compiler from holding the nibble mask in a register.
    for run in (0..block).step_by(32 * FLUSH) {
        for at in (run..block.min(run + 32 * FLUSH)).step_by(32) {
            // SAFETY: `at + 32 <= block` (blocks are whole item pairs of 32 bytes), and `codes`
            // holds N blocks.
            let l = unsafe { _mm256_loadu_si256(lut.as_ptr().add(at).cast()) };
            for (b, a) in acc.iter_mut().enumerate() {
                crate::simd::prefetch_ahead(codes.as_ptr().wrapping_add(b * block + at));
                // SAFETY: as above.
                let (lo, hi) = nibbles(unsafe { _mm256_loadu_si256(codes.as_ptr().add(b * block + at).cast()) }, m);
                a.add(l, lo, hi);
            }
        }
        for (a, o) in acc.iter_mut().zip(out.chunks_exact_mut(32)) {
            a.flush(o);
        }
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
