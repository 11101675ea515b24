//! A lanes kernel's walk over its tiles, and where a tile reads and writes (both levels:
//! `vnni::lanes`, `avx2::lanes`).

use super::{BLOCK, LANES, Q8Batch};

/// Groups `g0..` of `x`'s vectors against rows `r0..` of `rows`, the outputs to `out` `[n, rows]`.
pub(super) struct Tile<'a> {
    pub x: &'a Q8Batch,
    pub r0: usize,
    pub g0: usize,
    pub rows: usize,
    pub n: usize,
    pub out: *mut f32,
}

impl Tile<'_> {
    /// Row `r0 + i`'s outputs for group `g0 + g`, one vector a lane (lanes past the batch's
    /// vectors dropped).
    ///
    /// # Safety
    /// `out` holds `n * rows` values and `r0 + i < rows`.
    #[inline]
    pub(super) unsafe fn store(&self, i: usize, g: usize, lanes: &[f32; LANES]) {
        for (l, y) in lanes.iter().enumerate() {
            let v = (self.g0 + g) * LANES + l;
            if v < self.n {
                // SAFETY: (vector v < n, row r0 + i < rows) is inside `out` (the caller's contract).
                unsafe { *self.out.add(v * self.rows + self.r0 + i) = *y };
            }
        }
    }
}

/// Rows of a tile decoded: bytes `[rows, cols]` and each (row, block)'s scale.
pub(super) struct RowTile {
    pub w: Vec<u8>,
    pub scale: Vec<f32>,
}

impl RowTile {
    pub(super) fn new(rows: usize, cols: usize) -> RowTile {
        RowTile { w: vec![0; rows * cols], scale: vec![0.0; rows * (cols / BLOCK)] }
    }
}

/// Activation bytes a pass over the rows keeps in L2.
const VECTOR_BLOCK_BYTES: usize = 192 << 10;

/// A lanes kernel's walk (`ys` `[n, rows]` for `x`'s vectors): passes over the vector groups
/// whose activations stay in L2; in each, the rows `r` at a time, decoded once into a tile
/// (`decode(tile, r0, rn)`) and applied to the groups `g` at a time (`run(at, tile, rn, gn)`).
#[inline]
pub(super) fn walk(
    x: &Q8Batch,
    rows: usize,
    ys: &mut [f32],
    (r, g): (usize, usize),
    mut decode: impl FnMut(&mut RowTile, usize, usize),
    mut run: impl FnMut(&Tile<'_>, &RowTile, usize, usize),
) {
    let (cols, n) = (x.cols(), x.vectors());
    let groups = n.div_ceil(LANES);
    let per_pass = (VECTOR_BLOCK_BYTES / (cols * LANES)).max(g) / g * g;
    let mut tile = RowTile::new(r, cols);
    let out = ys.as_mut_ptr();
    for g_start in (0..groups).step_by(per_pass) {
        let g_end = groups.min(g_start + per_pass);
        for r0 in (0..rows).step_by(r) {
            let rn = r.min(rows - r0);
            decode(&mut tile, r0, rn);
            for g0 in (g_start..g_end).step_by(g) {
                run(&Tile { x, r0, g0, rows, n, out }, &tile, rn, g.min(g_end - g0));
            }
        }
    }
}
