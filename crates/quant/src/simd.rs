//! Small AVX2 helpers shared by the kernels.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Sum of the 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0x55>(s, s));
    _mm_cvtss_f32(s)
}

/// The least of 16 values (two registers), in every lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn hmin16(lo: __m256, hi: __m256) -> __m256 {
    let m = _mm256_min_ps(lo, hi);
    let m = _mm256_min_ps(m, _mm256_permute2f128_ps::<1>(m, m));
    let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
    _mm256_min_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m))
}

/// `x` with NaN lanes as +infinity (a NaN distance is never near).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn unnan(x: __m256) -> __m256 {
    _mm256_blendv_ps(x, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// How far ahead of the weights being multiplied the kernels ask for more (bytes): enough to cover
/// DRAM latency at one core's streaming rate, so a matrix far larger than the caches streams near
/// the memory's bandwidth rather than its latency (cold MXFP4: 4.6 -> 8-10 Gw/s; EFFICIENCY.md).
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH: usize = 2048;

/// Asks for the cache line `PREFETCH` bytes past `p` (a hint: any address is harmless).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(p: *const T) {
    prefetch_at::<PREFETCH, T>(p)
}

/// Asks for the cache line `D` bytes past `p` (a hint: any address is harmless): for kernels
/// that stream their weights faster than `PREFETCH` covers.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_at<const D: usize, T>(p: *const T) {
    // SAFETY: a prefetch never faults, whatever the address; `wrapping_add` computes it without
    // claiming it is in bounds.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(D)) }
}

/// A batch `xs` `[n, cols]` / `ys` `[n, rows]` in groups of at most four vectors (fours first,
/// then the remaining 3, 2 or 1), each group's (width, vectors, outputs): every group reads the
/// weights once, so a batch of 2 or 3 is one pass over them, not 2 or 3.
pub(crate) fn groups<'a>(
    xs: &'a [f32],
    ys: &'a mut [f32],
    cols: usize,
    rows: usize,
) -> impl Iterator<Item = (usize, &'a [f32], &'a mut [f32])> {
    let n = xs.len() / cols.max(1);
    let quads = n / 4 * 4;
    let (xq, xr) = xs.split_at(quads * cols);
    let (yq, yr) = ys.split_at_mut(quads * rows);
    let rest = (n > quads).then_some((n - quads, xr, yr));
    xq.chunks_exact(4 * cols).zip(yq.chunks_exact_mut(4 * rows)).map(|(x, y)| (4, x, y)).chain(rest)
}

/// Checks the shapes every matrix-vector kernel shares: `w` holds `rows` rows of `row_bytes`
/// elements, `x` has `cols` entries, `y` has `rows`.
#[track_caller]
pub(crate) fn check_dims(w_len: usize, row_len: usize, x_len: usize, cols: usize, y_len: usize) {
    assert_eq!(x_len, cols, "x has {x_len} entries for {cols} columns");
    assert_eq!(w_len, y_len * row_len, "weights hold {w_len} elements, not {y_len} rows of {row_len}");
}

use std::cell::RefCell;

thread_local! {
    /// Activations reordered to nibble-decode order, reused across calls (no allocation per matvec).
    static PERMUTED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Reorders each 32-block of every `cols`-vector in `xs` to even columns first, then odd columns:
/// the order in which a row of packed nibbles (low nibble = even column) decodes.
pub(crate) fn permute_nibble_order(xs: &[f32], out: &mut Vec<f32>) {
    out.clear();
    for b in xs.chunks_exact(32) {
        out.extend((0..16).map(|i| b[2 * i]));
        out.extend((0..16).map(|i| b[2 * i + 1]));
    }
}

/// Runs `f` on `xs` in nibble-decode order, in a per-thread scratch buffer.
pub(crate) fn with_nibble_order<R>(xs: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
    PERMUTED.with_borrow_mut(|buf| {
        permute_nibble_order(xs, buf);
        f(buf)
    })
}

/// Like [`with_nibble_order`] for a batch of `cols`-vectors, laid out `stride()` floats apart:
/// a stride of a multiple of 4 KiB would map every vector's block to the same cache sets.
pub(crate) fn with_nibble_order_padded<R>(xs: &[f32], cols: usize, f: impl FnOnce(&[f32], usize) -> R) -> R {
    let stride = padded_stride(cols);
    PERMUTED.with_borrow_mut(|buf| {
        buf.clear();
        buf.resize(xs.len() / cols * stride, 0.0);
        for (x, dst) in xs.chunks_exact(cols).zip(buf.chunks_exact_mut(stride)) {
            for (b, d) in x.chunks_exact(32).zip(dst.chunks_exact_mut(32)) {
                for i in 0..16 {
                    d[i] = b[2 * i];
                    d[16 + i] = b[2 * i + 1];
                }
            }
        }
        f(buf, stride)
    })
}

/// `cols` rounded up so that vectors are an odd number of 64-byte cache lines apart: then the
/// same block of consecutive vectors falls in different cache sets.
fn padded_stride(cols: usize) -> usize {
    let s = cols.next_multiple_of(32);
    if (s / 16).is_multiple_of(2) { s + 16 } else { s }
}
