//! The vectors an encoder works on and the distances every part of it measures, in one place
//! so that training, search and the nearest-entry kernels sum in the same order (the same bits).

/// Vectors to encode: `n x dim` values, with optional per-value weights (same shape).
#[derive(Debug, Clone, Copy)]
pub struct Data<'a> {
    pub dim: usize,
    pub vecs: &'a [f32],
    pub weights: Option<&'a [f32]>,
}

impl Data<'_> {
    pub fn len(&self) -> usize {
        self.vecs.len() / self.dim
    }

    pub(crate) fn vec(&self, i: usize) -> &[f32] {
        &self.vecs[i * self.dim..][..self.dim]
    }

    pub(crate) fn weight(&self, i: usize) -> Option<&[f32]> {
        self.weights.map(|w| &w[i * self.dim..][..self.dim])
    }
}

#[inline]
pub(super) fn dist(a: &[f32], b: &[f32], w: Option<&[f32]>) -> f32 {
    match w {
        None => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Some(w) => a.iter().zip(b).zip(w).map(|((x, y), w)| w * (x - y) * (x - y)).sum(),
    }
}

/// Largest vector dimension and stage count the encoder handles (codecs use 4 or 8 and 3).
pub(crate) const MAX_DIM: usize = 8;
pub(super) const MAX_STAGES: usize = 8;
/// `dists[e] = sum_j w_j (r_j - c_j)^2` over one stage's entries (`soa`: `[dim][entry]`), summed
/// over `j` in order with the same operations as [`dist`], so the same bits.
pub(super) fn stage_dists(r: &[f32], w: Option<&[f32]>, soa: &[f32], dists: &mut [f32]) {
    // The fast-scan codec's 16 entries as a fixed-size array: the compiler keeps them in registers.
    if let Ok(d16) = <&mut [f32; 16]>::try_from(&mut *dists) {
        return stage_dists_n(r, w, soa, d16);
    }
    let e_n = dists.len();
    dists.fill(0.0);
    for (j, rj) in r.iter().enumerate() {
        let col = &soa[j * e_n..(j + 1) * e_n];
        match w {
            None => dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += (rj - c) * (rj - c)),
            Some(w) => {
                let wj = w[j];
                dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += wj * (rj - c) * (rj - c));
            }
        }
    }
}

#[inline(always)]
pub(super) fn stage_dists_n<const N: usize>(r: &[f32], w: Option<&[f32]>, soa: &[f32], dists: &mut [f32; N]) {
    *dists = [0.0; N];
    for (j, rj) in r.iter().enumerate() {
        let col: &[f32; N] = soa[j * N..(j + 1) * N].try_into().expect("N entries");
        match w {
            None => dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += (rj - c) * (rj - c)),
            Some(w) => {
                let wj = w[j];
                dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += wj * (rj - c) * (rj - c));
            }
        }
    }
}
