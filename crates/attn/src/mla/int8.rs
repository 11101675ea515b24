//! The absorbed attention over an int8 cache in integer arithmetic (`k3_quant::gemm8`): each
//! head's query rounded to int8 once a row, the latents' scores as exact integer dots, the block's
//! weights rounded to 7 bits a head and block for an exact integer weighted sum. The shared keys'
//! part of the scores (`k_ext`) the same way, with its own query and row steps.
//! Every level computes the same integers, so the same bits; positions are cut into the same
//! blocks and groups as the f32 path, so within the absorbed form chunks, steps and pools agree
//! bit for bit. The expanded form widens the rows to f32 instead: under `MlaForm::Auto` a
//! prompt's long chunks and its decode differ by the query's and weights' rounding (~1e-5 nats).

use k3_quant::gemm8;

use super::softmax::{BLOCK, Partial};

/// An int8 cache's rows as attention reads them.
#[derive(Clone, Copy)]
pub(super) struct Int8Keys<'a> {
    /// Latents `[len, l]` and shared keys `[len, r]`, and their steps (one a position each).
    pub c: (&'a [i8], &'a [f32]),
    pub kext: (&'a [i8], &'a [f32]),
}

/// Heads' queries rounded for [`gemm8::scores`]: absorbed `[H, 4 ceil(l / 4)]` and shared-key
/// parts `[H, 4 ceil(r / 4)]`, each with one step a head.
pub(super) struct Queries8 {
    pub abs: (Vec<i8>, Vec<f32>),
    pub ext: (Vec<i8>, Vec<f32>),
}

impl Queries8 {
    pub fn new(qabs: &[f32], qext: &[f32], l: usize, r: usize) -> Self {
        let round = |q: &[f32], k: usize| {
            let (mut a, mut steps) = (Vec::new(), Vec::new());
            if k > 0 {
                gemm8::quantize_queries(q, k, &mut a, &mut steps);
            }
            (a, steps)
        };
        Queries8 { abs: round(qabs, l), ext: round(qext, r) }
    }

    /// Heads `heads`' rows.
    pub fn heads(&self, heads: std::ops::Range<usize>, l: usize, r: usize) -> Heads8<'_> {
        Heads8 { abs: rows_of(&self.abs, &heads, l), ext: rows_of(&self.ext, &heads, r) }
    }
}

fn rows_of<'a>((a, s): &'a (Vec<i8>, Vec<f32>), heads: &std::ops::Range<usize>, k: usize) -> (&'a [i8], &'a [f32]) {
    let k4 = k.div_ceil(4) * 4;
    if k == 0 { (&a[..0], &s[..0]) } else { (&a[heads.start * k4..heads.end * k4], &s[heads.clone()]) }
}

/// Some heads' rows of a [`Queries8`].
pub(super) struct Heads8<'a> {
    abs: (&'a [i8], &'a [f32]),
    ext: (&'a [i8], &'a [f32]),
}

/// A task's buffers, reused block to block.
#[derive(Default)]
struct Scratch {
    keys: gemm8::PackedKeys,
    values: Vec<i8>,
    dots: Vec<i32>,
    sums: Vec<i32>,
    weights: Vec<u8>,
    wsteps: Vec<f32>,
    scores: Vec<f32>,
}

impl Scratch {
    /// Adds to `scores` `[heads, nb]` the heads' integer dots with `nb` int8 rows of `k` (one
    /// part of the key: the latents or the shared keys), scaled by each head's query step and
    /// each row's step.
    fn add_scores(&mut self, (q, qsteps): (&[i8], &[f32]), rows: &[i8], steps: &[f32], k: usize, nb: usize) {
        gemm8::pack_keys(rows, k, &mut self.keys);
        self.dots.resize(qsteps.len() * nb, 0);
        gemm8::scores(q, &self.keys, k, nb, &mut self.dots);
        for ((sr, dr), qs) in self.scores.chunks_exact_mut(nb).zip(self.dots.chunks_exact(nb)).zip(qsteps) {
            sr.iter_mut().zip(dr).zip(steps).for_each(|((o, d), rs)| *o += *d as f32 * (qs * rs));
        }
    }
}

impl Partial {
    /// [`Partial::attend`] over an int8 cache, for the heads of `q`.
    pub(super) fn attend_int8(
        &mut self,
        q: Heads8<'_>,
        keys: Int8Keys<'_>,
        span: std::ops::Range<usize>,
        (l, r): (usize, usize),
        scale: f32,
    ) {
        let h = q.abs.1.len();
        let mut s = Scratch::default();
        for start in span.clone().step_by(BLOCK) {
            let nb = BLOCK.min(span.end - start);
            let rows = &keys.c.0[start * l..(start + nb) * l];
            let csteps = &keys.c.1[start..start + nb];
            s.scores.clear();
            s.scores.resize(h * nb, 0.0);
            s.add_scores(q.abs, rows, csteps, l, nb);
            if r > 0 {
                let kext = &keys.kext.0[start * r..(start + nb) * r];
                s.add_scores(q.ext, kext, &keys.kext.1[start..start + nb], r, nb);
            }
            self.fold(&mut s.scores, nb, l, scale);
            // A weight stands for its position's value times its latent's step.
            for row in s.scores.chunks_exact_mut(nb) {
                row.iter_mut().zip(csteps).for_each(|(w, cs)| *w *= cs);
            }
            gemm8::quantize_weights(&s.scores, nb, &mut s.weights, &mut s.wsteps);
            gemm8::pack_values(rows, l, &mut s.values);
            s.sums.resize(h * l, 0);
            gemm8::weighted(&s.weights, &s.values, l, &mut s.sums);
            for ((lat, sums), ws) in self.lat.chunks_exact_mut(l).zip(s.sums.chunks_exact(l)).zip(&s.wsteps) {
                lat.iter_mut().zip(sums).for_each(|(o, v)| *o += *v as f32 * ws);
            }
        }
    }
}
