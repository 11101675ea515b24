//! The absorbed attention of one query over cached positions: an online softmax over fixed
//! blocks of [`BLOCK`] positions within fixed groups of [`GROUP`], the groups merged in order;
//! groups and head ranges split over the pool without changing a bit.

use k3_quant::{expf, gemm};
use rayon::prelude::*;

use super::MlaCache;
use super::int8::{Int8Keys, Queries8};
use crate::AttnError;
use crate::latents::Rows;

/// Positions within a block of the online softmax.
pub(super) const BLOCK: usize = 32;
/// Positions of a group: the unit of work split over threads and merged (a multiple of `BLOCK`).
const GROUP: usize = 2048;

/// Attention of every head over the first `len` cached positions: `qabs` `[H, L]`, `qext`
/// `[H, R]`; writes `lat` `[H, L]` = `sum_t p_t c_t`. The positions are cut into groups of
/// [`GROUP`]; each group's softmax is computed alone over blocks of [`BLOCK`] (online), then the
/// groups are merged in order. With `parallel`, groups and head ranges run on the pool: the cut
/// never depends on the pool, so neither do the bits.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    qabs: &[f32],
    qext: &[f32],
    c: &[f32],
    kext: &[f32],
    len: usize,
    l: usize,
    r: usize,
    scale: f32,
    parallel: bool,
    lat: &mut [f32],
) {
    attend_keys(qabs, qext, Keys::F32 { c, kext }, len, l, r, scale, parallel, lat)
}

/// [`attend`] over the first `len` positions of `cache`, read in its encoding (an int8 cache's
/// latents in integers, `super::int8`): `qabs` `[H, l]`, `qext` `[H, r]` and `lat` `[H, l]` for
/// the cache's widths, `1 <= len <= cache.len()`.
#[allow(clippy::too_many_arguments)]
pub fn attend_cache(
    qabs: &[f32],
    qext: &[f32],
    cache: &MlaCache,
    len: usize,
    scale: f32,
    parallel: bool,
    lat: &mut [f32],
) -> Result<(), AttnError> {
    let (l, r) = cache.dims();
    let h = qabs.len().checked_div(l).unwrap_or(0);
    let wrong = |tensor: &'static str, len: usize, want: usize| {
        Err(AttnError::Length { layer: "MLA cache".into(), tensor, len, want })
    };
    if h == 0 || qabs.len() != h * l {
        return wrong("absorbed queries", qabs.len(), h.max(1) * l);
    }
    if qext.len() != h * r {
        return wrong("shared-key queries", qext.len(), h * r);
    }
    if lat.len() != h * l {
        return wrong("output latents", lat.len(), h * l);
    }
    if len == 0 || len > cache.len() {
        return wrong("attended positions", len, cache.len());
    }
    attend_keys(qabs, qext, cache.keys(), len, l, r, scale, parallel, lat);
    Ok(())
}

/// The cached rows attention reads: f32 in place, or a cache's rows widened a block at a time.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a> {
    F32 { c: &'a [f32], kext: &'a [f32] },
    Rows { c: &'a Rows, kext: &'a Rows },
}

impl MlaCache {
    pub(super) fn keys(&self) -> Keys<'_> {
        match (self.c.as_f32(), self.kext.as_f32()) {
            (Some(c), Some(kext)) => Keys::F32 { c, kext },
            _ => Keys::Rows { c: &self.c, kext: &self.kext },
        }
    }
}

impl<'a> Keys<'a> {
    /// The rows of an int8 cache, which attention reads in integers.
    pub(super) fn int8(&self) -> Option<Int8Keys<'a>> {
        match *self {
            Keys::Rows { c, kext } => Some(Int8Keys { c: c.int8()?, kext: kext.int8()? }),
            Keys::F32 { .. } => None,
        }
    }

    /// Positions `start..start + n` as f32 `([n, l], [n, r])`: in place, or widened into `wide`.
    pub(super) fn block<'w>(
        &self,
        start: usize,
        n: usize,
        l: usize,
        r: usize,
        wide: &'w mut (Vec<f32>, Vec<f32>),
    ) -> (&'w [f32], &'w [f32])
    where
        'a: 'w,
    {
        match *self {
            Keys::F32 { c, kext } => (&c[start * l..(start + n) * l], &kext[start * r..(start + n) * r]),
            Keys::Rows { c, kext } => {
                let (wc, wk) = wide;
                wc.resize(n * l, 0.0);
                wk.resize(n * r, 0.0);
                c.widen(start, n, l, wc);
                kext.widen(start, n, r, wk);
                (&wc[..], &wk[..])
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attend_keys<'q>(
    qabs: &'q [f32],
    qext: &'q [f32],
    keys: Keys<'_>,
    len: usize,
    l: usize,
    r: usize,
    scale: f32,
    parallel: bool,
    lat: &mut [f32],
) {
    let h = qabs.len() / l;
    let groups = len.div_ceil(GROUP).max(1);
    let threads = if parallel { rayon::current_num_threads() } else { 1 };
    // Enough (head range, group) tasks for every thread twice over.
    let ranges = (2 * threads).div_ceil(groups).clamp(1, h.max(1));
    let per = h.div_ceil(ranges).max(1);
    // An int8 cache's latents are attended in integers: the queries rounded once.
    let q8 = keys.int8().map(|_| Queries8::new(qabs, qext, l, r));
    let task = |(hr, g): (usize, usize)| {
        let heads = hr * per..((hr + 1) * per).min(h);
        let span = g * GROUP..((g + 1) * GROUP).min(len);
        let mut p = Partial::new(heads.len(), l);
        let ext = |x: &'q [f32], d: usize| -> &'q [f32] { &x[heads.start * d..heads.end * d] };
        match (&q8, keys.int8()) {
            (Some(q8), Some(k8)) => p.attend_int8(q8.heads(heads.clone(), l, r), k8, span, (l, r), scale),
            _ => p.attend(ext(qabs, l), ext(qext, r), keys, span, l, r, scale),
        }
        (hr, p)
    };
    let tasks = (0..h.div_ceil(per)).flat_map(|hr| (0..groups).map(move |g| (hr, g)));
    let parts: Vec<(usize, Partial)> = if threads > 1 && groups * ranges > 1 {
        tasks.collect::<Vec<_>>().into_par_iter().map(task).collect()
    } else {
        tasks.map(task).collect()
    };
    let mut parts = parts.into_iter().peekable();
    while let Some((hr, mut acc)) = parts.next() {
        while let Some((_, next)) = parts.next_if(|(r2, _)| *r2 == hr) {
            acc.merge(&next, l);
        }
        acc.finish(&mut lat[hr * per * l..], l);
    }
}

/// One group's online softmax for some heads: the running maximum and sum of exponentials of each
/// head's scores, and its weighted sum of latents `[heads, L]`.
pub(super) struct Partial {
    m: Vec<f32>,
    sum: Vec<f32>,
    pub(super) lat: Vec<f32>,
}

impl Partial {
    fn new(heads: usize, l: usize) -> Self {
        Partial { m: vec![f32::NEG_INFINITY; heads], sum: vec![0.0; heads], lat: vec![0.0; heads * l] }
    }

    /// Positions `span` (block-aligned at its start), blocks of [`BLOCK`]: all heads' scores in
    /// one register-blocked product, then one weighted sum.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        qabs: &[f32],
        qext: &[f32],
        keys: Keys<'_>,
        span: std::ops::Range<usize>,
        l: usize,
        r: usize,
        scale: f32,
    ) {
        let h = self.m.len();
        let mut s = vec![0f32; h * BLOCK];
        let mut wide = (Vec::new(), Vec::new());
        for start in span.clone().step_by(BLOCK) {
            let nb = BLOCK.min(span.end - start);
            let sb = &mut s[..h * nb];
            let (cb, kb) = keys.block(start, nb, l, r, &mut wide);
            // The latent's and the shared key's scores in one reduction.
            let latent = gemm::Part { a: qabs, b: cb, k: l };
            match r {
                0 => gemm::abt_parts(&[latent], sb, false),
                _ => gemm::abt_parts(&[latent, gemm::Part { a: qext, b: kb, k: r }], sb, false),
            }
            self.fold(sb, nb, l, scale);
            gemm::pb_acc(sb, cb, l, &mut self.lat);
        }
    }

    /// A block's scores `sb` `[heads, nb]` into the running softmax: scaled, the maxima raised
    /// (rescaling what was summed), and turned into their weights `exp(s - m)` in place.
    pub(super) fn fold(&mut self, sb: &mut [f32], nb: usize, l: usize, scale: f32) {
        for hd in 0..self.m.len() {
            let row = &mut sb[hd * nb..(hd + 1) * nb];
            row.iter_mut().for_each(|v| *v *= scale);
            let bm = lanes(row, f32::NEG_INFINITY, f32::max);
            if bm > self.m[hd] {
                let f = (self.m[hd] - bm).exp();
                self.lat[hd * l..(hd + 1) * l].iter_mut().for_each(|v| *v *= f);
                self.sum[hd] *= f;
                self.m[hd] = bm;
            }
            expf::exp_shifted(row, self.m[hd]);
            self.sum[hd] += lanes(row, 0.0, |a, b| a + b);
        }
    }

    /// Folds in `next`, the partial of the positions after this one's.
    fn merge(&mut self, next: &Partial, l: usize) {
        for hd in 0..self.m.len() {
            let m = self.m[hd].max(next.m[hd]);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let (fa, fb) = ((self.m[hd] - m).exp(), (next.m[hd] - m).exp());
            self.sum[hd] = self.sum[hd] * fa + next.sum[hd] * fb;
            let (a, b) = (&mut self.lat[hd * l..(hd + 1) * l], &next.lat[hd * l..(hd + 1) * l]);
            a.iter_mut().zip(b).for_each(|(x, y)| *x = *x * fa + y * fb);
            self.m[hd] = m;
        }
    }

    /// The normalized weighted sums into the first `heads * L` values of `out`.
    fn finish(&self, out: &mut [f32], l: usize) {
        for (hd, (o, a)) in out.chunks_mut(l).zip(self.lat.chunks(l)).enumerate() {
            let inv = 1.0 / self.sum[hd];
            o.iter_mut().zip(a).for_each(|(o, a)| *o = a * inv);
        }
    }
}

/// `row` folded by `op` in eight lanes (lane `i` takes values `i`, `i + 8`, ...), the lanes then
/// pairwise: a fixed order, which the compiler turns into vector operations without changing a
/// bit (a running fold over 32 scores is a chain of 32 dependent operations; measured in
/// docs/EFFICIENCY.md).
fn lanes(row: &[f32], init: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let (whole, tail) = row.as_chunks::<8>();
    for c in whole {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = op(*a, *v);
        }
    }
    for (a, v) in acc.iter_mut().zip(tail) {
        *a = op(*a, *v);
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    op(op(op(a0, a4), op(a2, a6)), op(op(a1, a5), op(a3, a7)))
}
