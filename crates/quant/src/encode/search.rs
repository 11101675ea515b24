//! Encoding vectors with trained codebooks: the stage-by-stage beam search, the [`Joint`]
//! search for the fast-scan codec, and the parallel pass over a matrix's vectors.

use rayon::prelude::*;

use super::distance::{Data, MAX_DIM, MAX_STAGES, stage_dists};
use super::joint::Joint;
use super::train::Codebooks;

/// A partial encoding in the beam search.
#[derive(Debug, Clone, Copy)]
struct Beam {
    err: f32,
    res: [f32; MAX_DIM],
    codes: [u16; MAX_STAGES],
}

/// The widest beam searched (wider requests are narrowed to it).
pub const MAX_BEAM: usize = 64;

/// Reusable memory of the beam search, for one set of codebooks.
#[derive(Debug)]
pub struct Search {
    /// The best candidates of a stage so far, best first: (error, beam, entry).
    cand: [(f32, u32, u32); MAX_BEAM],
    beams: [Beam; MAX_BEAM],
    next: [Beam; MAX_BEAM],
    /// The codebooks transposed ([`Codebooks::transposed`]).
    soa: Vec<f32>,
    dists: Vec<f32>,
}

impl Search {
    /// Memory for searching `cb` (which must not change while this is used).
    pub fn for_codebooks(cb: &Codebooks) -> Self {
        let empty = Beam { err: 0.0, res: [0.0; MAX_DIM], codes: [0; MAX_STAGES] };
        Search {
            cand: [(0.0, 0, 0); MAX_BEAM],
            beams: [empty; MAX_BEAM],
            next: [empty; MAX_BEAM],
            soa: cb.transposed(),
            dists: vec![0f32; cb.entries],
        }
    }
}

/// Beam search over the stages in order for one vector `v` (weights `w`), keeping the `beam` best
/// partial reconstructions; writes the best codes to `out` (`stages` entries).
pub fn encode_vec(v: &[f32], w: Option<&[f32]>, cb: &Codebooks, beam: usize, search: &mut Search, out: &mut [u16]) {
    let (s_n, d) = (cb.stages, cb.dim);
    assert!(d <= MAX_DIM && s_n <= MAX_STAGES, "encoder handles up to {MAX_DIM} dims and {MAX_STAGES} stages");
    let beam = beam.clamp(1, MAX_BEAM);
    let Search { cand, beams, next, soa, dists } = search;
    debug_assert_eq!(soa.len(), s_n * d * cb.entries, "a Search is for its codebooks");
    beams[0] = Beam { err: 0.0, res: [0.0; MAX_DIM], codes: [0; MAX_STAGES] };
    beams[0].res[..d].copy_from_slice(v);
    let mut live = 1;
    for s in 0..s_n - 1 {
        let stage = &soa[s * d * cb.entries..(s + 1) * d * cb.entries];
        // The `beam` best candidates as they come, best first; equal errors keep their order.
        let mut n = 0;
        for (b, bm) in beams[..live].iter().enumerate() {
            stage_dists(&bm.res[..d], w, stage, dists);
            for (e, &err) in dists.iter().enumerate() {
                if n == beam {
                    if err >= cand[beam - 1].0 {
                        continue;
                    }
                    n -= 1;
                }
                let mut i = n;
                while i > 0 && cand[i - 1].0 > err {
                    cand[i] = cand[i - 1];
                    i -= 1;
                }
                cand[i] = (err, b as u32, e as u32);
                n += 1;
            }
        }
        for (slot, &(err, b, e)) in next.iter_mut().zip(&cand[..n]) {
            *slot = beams[b as usize];
            for (r, c) in slot.res[..d].iter_mut().zip(cb.entry(s, e as usize)) {
                *r -= c;
            }
            slot.codes[s] = e as u16;
            slot.err = err;
        }
        live = n;
        std::mem::swap(beams, next);
    }
    // The last stage needs only the best candidate over every beam (the first of equals).
    let s = s_n - 1;
    let stage = &soa[s * d * cb.entries..(s + 1) * d * cb.entries];
    let (mut best, mut at) = (f32::INFINITY, (0, 0));
    for (b, bm) in beams[..live].iter().enumerate() {
        stage_dists(&bm.res[..d], w, stage, dists);
        for (e, &err) in dists.iter().enumerate() {
            if err < best {
                (best, at) = (err, (b, e));
            }
        }
    }
    out.copy_from_slice(&beams[at.0].codes[..s_n]);
    out[s] = at.1 as u16;
}

/// The search one set of codebooks gets: [`Joint`] for 3 x 16-entry codebooks (fast-scan),
/// the stage-by-stage beam ([`encode_vec`]) otherwise.
#[derive(Debug)]
pub enum Searcher {
    Joint(Box<Joint>),
    Beam(Box<Search>),
}

impl Searcher {
    pub fn for_codebooks(cb: &Codebooks) -> Self {
        Joint::new(cb)
            .map_or_else(|| Searcher::Beam(Box::new(Search::for_codebooks(cb))), |j| Searcher::Joint(Box::new(j)))
    }

    /// The codes of `v` (weights `w`) into `out`; `width` is the joint search's first-stage
    /// picks or the beam's width.
    pub fn encode(&mut self, v: &[f32], w: Option<&[f32]>, cb: &Codebooks, width: usize, out: &mut [u16]) {
        match self {
            Searcher::Joint(joint) => joint.encode(v, w, width, out),
            Searcher::Beam(search) => encode_vec(v, w, cb, width, search, out),
        }
    }

    /// [`encode`](Self::encode) for each `dim`-vector of `vs`, all with the weights `w` (a
    /// chunk of many rows): the joint search takes them in one call.
    pub fn encode_many(&mut self, vs: &[f32], w: Option<&[f32]>, cb: &Codebooks, width: usize, out: &mut [u16]) {
        match self {
            Searcher::Joint(joint) => joint.encode_many(vs, w, width, out),
            Searcher::Beam(search) => {
                for (v, out) in vs.chunks_exact(cb.dim).zip(out.chunks_exact_mut(cb.stages)) {
                    encode_vec(v, w, cb, width, search, out);
                }
            }
        }
    }
}

/// Encodes every vector of `data`, in parallel. `codes` gets `stages` entries per vector.
pub fn encode(data: Data<'_>, cb: &Codebooks, beam: usize, codes: &mut Vec<u16>) {
    // Tasks of 1,024 vectors: per-vector tasks cost rayon's bookkeeping on every vector.
    const TASK: usize = 1024;
    codes.resize(data.len() * cb.stages, 0);
    codes.par_chunks_mut(TASK * cb.stages).enumerate().for_each_init(
        || Searcher::for_codebooks(cb),
        |searcher, (t, outs)| match searcher {
            // Unweighted, the joint search takes the task's vectors in one call.
            Searcher::Joint(joint) if data.weights.is_none() => {
                let n = outs.len() / cb.stages;
                joint.encode_all(&data.vecs[t * TASK * cb.dim..][..n * cb.dim], beam, outs);
            }
            _ => {
                for (k, out) in outs.chunks_exact_mut(cb.stages).enumerate() {
                    let i = t * TASK + k;
                    searcher.encode(data.vec(i), data.weight(i), cb, beam, out);
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::super::distance::dist;
    use super::*;

    fn codebooks(seed: u64) -> Codebooks {
        let values = crate::rng::noise(2 * 16 * 4, seed, 1.0);
        Codebooks { stages: 2, entries: 16, dim: 4, values }
    }

    /// The transposed distances are `dist`'s bits, and a beam as wide as the entries finds the
    /// best of all 256 two-stage codes (an exhaustive reference).
    #[test]
    fn the_search_matches_exhaustive_search() {
        let cb = codebooks(3);
        let mut search = Search::for_codebooks(&cb);
        let vs = crate::rng::noise(200 * 4, 4, 1.5);
        let ws = crate::rng::noise(200 * 4, 5, 1.0).iter().map(|v| v.abs() + 0.1).collect::<Vec<f32>>();
        let mut dists = vec![0f32; 16];
        let mut out = [0u16; 2];
        for (i, v) in vs.chunks_exact(4).enumerate() {
            let w = &ws[i * 4..(i + 1) * 4];
            stage_dists(v, Some(w), &search.soa[..64], &mut dists);
            for (e, got) in dists.iter().enumerate() {
                assert_eq!(got.to_bits(), dist(v, cb.entry(0, e), Some(w)).to_bits());
            }
            encode_vec(v, Some(w), &cb, 16, &mut search, &mut out);
            let err = |a: usize, b: usize| {
                let r: Vec<f32> = (0..4).map(|j| v[j] - cb.entry(0, a)[j] - cb.entry(1, b)[j]).collect();
                dist(&r, &[0.0; 4], Some(w))
            };
            let best = (0..256).map(|c| err(c / 16, c % 16)).fold(f32::INFINITY, f32::min);
            assert!(err(out[0] as usize, out[1] as usize) <= best * (1.0 + 1e-5) + 1e-7, "vector {i}");
        }
    }
}
