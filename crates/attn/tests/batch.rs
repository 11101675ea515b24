//! Several sequences in one chunk, and tentative (speculative) rows: every row gives the same bits
//! as its sequence run alone, and committing the first `j` tentative rows leaves exactly the state
//! that running those `j` rows would have.

mod common;

use common::{D, KdaParts, MlaParts, bits, rand};
use k3_attn::{KdaRun, KdaSeq, KdaState, KdaTape, MlaCache, MlaSeq};

/// Runs `f` on a pool of two threads, so the parallel paths run too.
fn on_two<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap().install(f)
}

#[test]
fn kda_sequences_in_one_chunk_each_get_their_own_bits() {
    let parts = KdaParts::new(10);
    let kda = parts.layer();
    // Three sequences with different histories (one empty), then a chunk of 1, 4 and 2 rows.
    let histories = [5usize, 0, 9];
    let rows = [1usize, 4, 2];
    let mut states: Vec<KdaState> = histories
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut s = kda.state();
            let xs = rand(n * D, 100 + i as u64, 1.0);
            let mut out = vec![0f32; n * D];
            kda.prefill(&mut s, &xs, &mut out);
            s
        })
        .collect();
    let xs = rand(rows.iter().sum::<usize>() * D, 7, 1.0);
    let mut alone = Vec::new();
    let mut want_states = states.clone();
    let mut at = 0;
    for (s, &n) in want_states.iter_mut().zip(&rows) {
        let mut out = vec![0f32; n * D];
        kda.prefill(s, &xs[at * D..(at + n) * D], &mut out);
        alone.extend(out);
        at += n;
    }
    let mut batched = vec![0f32; xs.len()];
    on_two(|| {
        let mut seqs: Vec<KdaSeq<'_>> =
            states.iter_mut().zip(&rows).map(|(s, &rows)| KdaSeq { rows, run: KdaRun::Advance(s) }).collect();
        kda.forward(&mut seqs, &xs, &mut batched);
    });
    assert!(bits(&batched) == bits(&alone), "batched outputs differ from each sequence alone");
    assert!(states == want_states, "batched states differ from each sequence alone");
}

#[test]
fn kda_tentative_rows_commit_to_exactly_the_accepted_prefix() {
    let parts = KdaParts::new(30);
    let kda = parts.layer();
    let mut base = kda.state();
    let prompt = rand(6 * D, 1, 1.0);
    kda.prefill(&mut base, &prompt, &mut vec![0f32; 6 * D]);
    let k = 5;
    let drafts = rand(k * D, 2, 1.0);
    // What running the rows directly gives, row by row.
    let mut direct = vec![base.clone()];
    let mut direct_out = vec![0f32; k * D];
    for t in 0..k {
        let mut s = direct[t].clone();
        kda.prefill(&mut s, &drafts[t * D..(t + 1) * D], &mut direct_out[t * D..(t + 1) * D]);
        direct.push(s);
    }
    // Tentative, beside an advancing sequence in the same chunk.
    let mut other = kda.state();
    let mut other_alone = other.clone();
    let other_x = rand(3 * D, 3, 1.0);
    let mut other_out = vec![0f32; 3 * D];
    kda.prefill(&mut other_alone, &other_x, &mut other_out);
    let mut tape = KdaTape::default();
    let mut out = vec![0f32; (k + 3) * D];
    let xs: Vec<f32> = drafts.iter().chain(&other_x).copied().collect();
    on_two(|| {
        let mut seqs = [
            KdaSeq { rows: k, run: KdaRun::Tentative(&base, &mut tape) },
            KdaSeq { rows: 3, run: KdaRun::Advance(&mut other) },
        ];
        kda.forward(&mut seqs, &xs, &mut out);
    });
    assert!(bits(&out[..k * D]) == bits(&direct_out), "tentative outputs differ from running the rows");
    assert!(bits(&out[k * D..]) == bits(&other_out), "the advancing neighbour's outputs differ");
    assert!(other == other_alone, "the advancing neighbour's state differs");
    assert_eq!(tape.len(), k);
    assert!(tape.bytes() > 0);
    for (accepted, want) in direct.iter().enumerate() {
        let mut s = base.clone();
        on_two(|| kda.commit(&mut s, &tape, accepted));
        assert!(s == *want, "commit of {accepted} of {k} rows differs from running them");
    }
}

#[test]
fn mla_sequences_in_one_chunk_and_truncated_drafts() {
    let parts = MlaParts::new(40);
    let mla = parts.layer();
    // The last sequence's chunk is long enough to run expanded, the others absorbed.
    let histories = [40usize, 0, 7, 5];
    let rows = [1usize, 3, 2, 300];
    let mut caches: Vec<MlaCache> = histories
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut c = mla.cache();
            let xs = rand(n * D, 200 + i as u64, 1.0);
            mla.prefill(&mut c, &xs, &mut vec![0f32; n * D]);
            c
        })
        .collect();
    assert!(
        k3_attn::MlaForm::Auto.expands(mla.config(), 300, 305) && !k3_attn::MlaForm::Auto.expands(mla.config(), 3, 3)
    );
    let before = caches.clone();
    let xs = rand(rows.iter().sum::<usize>() * D, 9, 1.0);
    let mut alone = Vec::new();
    let mut want = caches.clone();
    let mut at = 0;
    for (c, &n) in want.iter_mut().zip(&rows) {
        let mut out = vec![0f32; n * D];
        mla.prefill(c, &xs[at * D..(at + n) * D], &mut out);
        alone.extend(out);
        at += n;
    }
    let mut batched = vec![0f32; xs.len()];
    on_two(|| {
        let mut seqs: Vec<MlaSeq<'_>> =
            caches.iter_mut().zip(&rows).map(|(cache, &rows)| MlaSeq { cache, rows }).collect();
        mla.forward(&mut seqs, &xs, &mut batched);
    });
    assert!(bits(&batched) == bits(&alone), "batched outputs differ from each sequence alone");
    assert!(caches == want, "batched caches differ");
    // Drafts not accepted: back to the first position of the chunk, as if only it had run.
    let mut first_only = before[1].clone();
    mla.prefill(&mut first_only, &xs[D..2 * D], &mut vec![0f32; D]);
    caches[1].truncate(histories[1] + 1);
    assert!(caches[1] == first_only, "a truncated cache differs from running the accepted rows");
}
