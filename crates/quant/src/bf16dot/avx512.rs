//! The `vdpbf16ps` kernel: register lanes are vectors.

use std::arch::x86_64::*;

use super::{Bf16Batch, LANES, Weights};

/// Rows a tile decodes together, and groups of [`LANES`] vectors it applies them to: 12
/// accumulators (24 with the per-group dots of int4), the activations and a broadcast weight
/// word in the rest of the 32 registers.
const R: usize = 4;
const G: usize = 3;
// The output transpose (`Out::store`) is written for 4 rows.
const _: () = assert!(R == 4);

/// `ys` `[n, rows]` = `W X`. Rows are decoded a tile at a time into pair words, then applied to
/// the vectors sixteen to a register: lane `l` of an accumulator is vector `l` of its group, so
/// each (row, vector) runs the reference's order exactly, whatever tile, group or lane it falls
/// in: the reference's bits.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and BF16; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn matmul(w: &Weights<'_>, rows: usize, x: &Bf16Batch, ys: &mut [f32]) {
    let (cols, n) = (x.cols(), x.vectors());
    let (pairs, per_group) = (cols / 2, w.group_pairs(cols));
    let scale_groups = pairs / per_group;
    let grouped = w.grouped();
    // Decoded rows (int8, int4), and a row of zeros for the rows past the end of the matrix
    // (they multiply zeros; their outputs are not stored).
    let mut decoded = vec![0u32; (R + 1) * pairs];
    let mut tile = Tile { rows: [std::ptr::null(); R], scales: vec![0.0; R * scale_groups], pairs, per_group };
    let groups = n.div_ceil(LANES);
    // Groups in sets of at most G, as even as they go (4 groups: 2 + 2, not 3 + 1, which would
    // leave a set of four dependent chains).
    let per_set = groups.div_ceil(groups.div_ceil(G));
    for r0 in (0..rows).step_by(R) {
        let rn = R.min(rows - r0);
        for i in 0..R {
            let row = &mut decoded[i * pairs..][..pairs];
            tile.rows[i] = if i >= rn {
                decoded[R * pairs..].as_ptr()
            } else {
                for g in 0..scale_groups {
                    tile.scales[i * scale_groups + g] = w.group_scale(r0 + i, g, cols).unwrap_or(1.0);
                }
                // SAFETY: row r0 + i exists (the caller's contract) and `row` holds its pairs.
                unsafe { decode(w, r0 + i, cols, row) }
            };
        }
        let scaled = w
            .row_scale(0)
            .map(|_| std::array::from_fn(|i| if i < rn { w.row_scale(r0 + i).unwrap_or(1.0) } else { 0.0 }));
        for g0 in (0..groups).step_by(per_set) {
            let out = Out { ys: ys.as_mut_ptr(), rows, n, r0, rn, g0, row_scale: scaled };
            // SAFETY: groups g0.. exist in `x` (at most `per_set`, at most G); every tile row
            // points at `pairs` words; outputs go to (vector < n, row < rows) only.
            unsafe {
                match (per_set.min(groups - g0), grouped) {
                    (1, false) => out.store(&tile.run::<1, false>(x, g0)),
                    (2, false) => out.store(&tile.run::<2, false>(x, g0)),
                    (3, false) => out.store(&tile.run::<3, false>(x, g0)),
                    (1, true) => out.store(&tile.run::<1, true>(x, g0)),
                    (2, true) => out.store(&tile.run::<2, true>(x, g0)),
                    (3, true) => out.store(&tile.run::<3, true>(x, g0)),
                    _ => unreachable!("G is 3"),
                }
            }
        }
    }
}

/// Row `r` as pair words: bf16 rows are used where they lie (`vdpbf16ps` treats subnormals as
/// zero, as the reference's decoding flushes them); int8 and int4 levels are decoded into `out`.
/// Returns where the row's words are.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and BF16; row `r` exists and `out` holds `cols / 2` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn decode(w: &Weights<'_>, r: usize, cols: usize, out: &mut [u32]) -> *const u32 {
    match *w {
        Weights::Bf16(b) => b[r * cols..][..cols].as_ptr().cast(),
        Weights::Int8 { q, .. } => {
            let (q, o) = (q[r * cols..][..cols].as_ptr(), out.as_mut_ptr());
            let mut c = 0;
            while c + 32 <= cols {
                // SAFETY: columns c..c + 32 of the row, words c/2..c/2 + 16 of `out`.
                unsafe {
                    let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(c).cast())));
                    let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(c + 16).cast())));
                    // Whole numbers up to 128 convert exactly; `cvtne2ps` puts its second
                    // operand's values first, so the 32 bf16 come out in column order.
                    _mm512_storeu_si512(
                        o.add(c / 2).cast(),
                        std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)),
                    );
                }
                c += 32;
            }
            w.decode_tail(r, cols, c, out);
            out.as_ptr()
        }
        Weights::Int4 { q, .. } => {
            let (q, o) = (q[r * cols / 2..][..cols / 2].as_ptr(), out.as_mut_ptr());
            // Each 16-bit half of a word looks its nibble's level up in this table.
            // SAFETY: the table is 32 words, 64 bytes.
            let levels = unsafe { _mm512_loadu_si512(super::INT4_LEVELS_X2.as_ptr().cast()) };
            let mut c = 0;
            while c + 32 <= cols {
                // SAFETY: bytes c/2..c/2 + 16 of the row, words c/2..c/2 + 16 of `out`.
                unsafe {
                    let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.add(c / 2).cast()));
                    let idx = _mm512_or_si512(
                        _mm512_and_si512(b, _mm512_set1_epi32(15)),
                        _mm512_slli_epi32(_mm512_srli_epi32(b, 4), 16),
                    );
                    _mm512_storeu_si512(o.add(c / 2).cast(), _mm512_permutexvar_epi16(idx, levels));
                }
                c += 32;
            }
            w.decode_tail(r, cols, c, out);
            out.as_ptr()
        }
    }
}

/// `R` rows: where each row's pair words are (`pairs` of them), and each (row, group)'s scale.
struct Tile {
    rows: [*const u32; R],
    scales: Vec<f32>,
    pairs: usize,
    per_group: usize,
}

impl Tile {
    /// The tile's rows against groups `g0..g0 + GT` of `x`. Register tiles are indexed by (row,
    /// group); indices read clearer than iterators here.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and BF16; groups `g0..g0 + GT` exist in `x`, whose columns are the
    /// tile's.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[inline]
    #[allow(clippy::needless_range_loop)]
    unsafe fn run<const GT: usize, const GROUPED: bool>(&self, x: &Bf16Batch, g0: usize) -> [[__m512; GT]; R] {
        let xs: [*const u32; GT] = std::array::from_fn(|g| x.group(g0 + g).as_ptr());
        let mut acc = [[_mm512_setzero_ps(); GT]; R];
        let scale_groups = self.pairs / self.per_group;
        for sg in 0..scale_groups {
            let mut dot = [[_mm512_setzero_ps(); GT]; R];
            for p in sg * self.per_group..(sg + 1) * self.per_group {
                // SAFETY: each group holds `pairs` words of LANES vectors; p < pairs.
                let a: [__m512bh; GT] = std::array::from_fn(|g| unsafe {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(xs[g].add(p * LANES).cast()))
                });
                for i in 0..R {
                    // SAFETY: row i of the tile points at `pairs` words.
                    let wv = unsafe {
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*self.rows[i].add(p) as i32))
                    };
                    for g in 0..GT {
                        dot[i][g] = _mm512_dpbf16_ps(dot[i][g], wv, a[g]);
                    }
                }
            }
            if GROUPED {
                for i in 0..R {
                    let s = _mm512_set1_ps(self.scales[i * scale_groups + sg]);
                    for g in 0..GT {
                        acc[i][g] = _mm512_fmadd_ps(dot[i][g], s, acc[i][g]);
                    }
                }
            } else {
                acc = dot;
            }
        }
        acc
    }
}

/// Where a tile's outputs go: rows `r0..r0 + rn` of `rows`, groups `g0..` of `n` vectors.
struct Out {
    ys: *mut f32,
    rows: usize,
    n: usize,
    r0: usize,
    rn: usize,
    g0: usize,
    /// Each row's scale (int8), else `None`.
    row_scale: Option<[f32; R]>,
}

impl Out {
    /// Stores each (row, vector) sum, times its row's scale when given. The 4 rows' registers
    /// are transposed so each vector's 4 consecutive outputs go out in one 128-bit store (the
    /// matrix's rows are `ys`'s columns) rather than 4 scalar ones.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/VL; `ys` holds `n * rows` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[inline]
    #[allow(clippy::needless_range_loop)]
    unsafe fn store<const GT: usize>(&self, acc: &[[__m512; GT]; R]) {
        // Rows past the end are not written: a mask of the first `rn` of 4.
        let rows_mask: __mmask8 = (1u8 << self.rn) - 1;
        for g in 0..GT {
            let y: [__m512; R] = std::array::from_fn(|i| match self.row_scale {
                Some(s) => _mm512_mul_ps(acc[i][g], _mm512_set1_ps(s[i])),
                None => acc[i][g],
            });
            // Per 128-bit lane j: `by_vector[m]` holds vector 4j + m's four rows.
            let (lo01, hi01) = (_mm512_unpacklo_ps(y[0], y[1]), _mm512_unpackhi_ps(y[0], y[1]));
            let (lo23, hi23) = (_mm512_unpacklo_ps(y[2], y[3]), _mm512_unpackhi_ps(y[2], y[3]));
            let by_vector = [
                _mm512_shuffle_ps::<0x44>(lo01, lo23),
                _mm512_shuffle_ps::<0xee>(lo01, lo23),
                _mm512_shuffle_ps::<0x44>(hi01, hi23),
                _mm512_shuffle_ps::<0xee>(hi01, hi23),
            ];
            for (m, reg) in by_vector.into_iter().enumerate() {
                let quarters = [
                    _mm512_extractf32x4_ps::<0>(reg),
                    _mm512_extractf32x4_ps::<1>(reg),
                    _mm512_extractf32x4_ps::<2>(reg),
                    _mm512_extractf32x4_ps::<3>(reg),
                ];
                for (j, rows4) in quarters.into_iter().enumerate() {
                    let v = (self.g0 + g) * LANES + 4 * j + m;
                    if v < self.n {
                        // SAFETY: (vector v < n, rows r0..r0 + rn <= rows) are inside `ys`; the
                        // mask writes only those.
                        unsafe { _mm_mask_storeu_ps(self.ys.add(v * self.rows + self.r0), rows_mask, rows4) };
                    }
                }
            }
        }
    }
}
