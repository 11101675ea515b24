//! How many prompt rows each prefilling sequence feeds in a step beside the decoding ones.

/// Prompt tokens a prefilling sequence feeds per step while others decode: long prompts advance
/// a chunk at a time, so the sequences already decoding keep getting tokens.
pub const PREFILL_CHUNK: usize = 64;

/// Prompt rows each prefilling sequence feeds in the next step (`remaining[i]`: tokens of its
/// prompt left), beside `decoding` sequences feeding one token each, in a step of at most
/// `budget` rows (the engine's planned chunk: what the memory plan holds activations for).
///
/// The rule: while any sequence decodes, a prefilling one feeds at most `PREFILL_CHUNK` rows,
/// so a decoding sequence waits at most that much prefill per prefilling sequence for its next
/// token; with none decoding, the prefilling ones share the whole budget, so a long prompt on a
/// model whose experts stream from disk is read in as few chunks as memory holds (each chunk
/// reads its experts once). Every prefilling sequence feeds at least one row: each step makes
/// progress.
pub fn prefill_rows(budget: usize, decoding: usize, remaining: &[usize]) -> Vec<usize> {
    let share = (budget.saturating_sub(decoding) / remaining.len().max(1)).max(1);
    let cap = if decoding > 0 { share.min(PREFILL_CHUNK) } else { share };
    remaining.iter().map(|&r| r.min(cap)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prompt_alone_takes_the_whole_chunk_and_beside_decoders_at_most_a_shared_one() {
        use super::{PREFILL_CHUNK, prefill_rows};
        // Alone, a long prompt on a streaming model is fed as the plan's whole chunk.
        assert_eq!(prefill_rows(2048, 0, &[5000]), [2048]);
        assert_eq!(prefill_rows(2048, 0, &[300]), [300]);
        // Two prompts alone share it.
        assert_eq!(prefill_rows(2048, 0, &[5000, 5000]), [1024, 1024]);
        // Beside sequences that decode, each prompt feeds at most PREFILL_CHUNK rows a step, so
        // every decoding sequence gets its next token after that much prefill at most.
        for decoding in 1..8 {
            for prompts in 1..8 {
                let rows = prefill_rows(2048, decoding, &vec![10_000; prompts]);
                assert!(rows.iter().all(|&r| (1..=PREFILL_CHUNK).contains(&r)), "{rows:?}");
            }
        }
        // A step never carries more rows than the plan holds, and every prompt moves.
        for budget in [1, 7, 64, 512] {
            for decoding in 0..10 {
                let rows = prefill_rows(budget, decoding, &[10_000; 9]);
                assert!(rows.iter().all(|&r| r >= 1));
                if budget >= decoding + 9 {
                    assert!(decoding + rows.iter().sum::<usize>() <= budget, "{budget} {decoding} {rows:?}");
                }
            }
        }
    }
}
