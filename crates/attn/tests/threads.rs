//! KDA and MLA give the same bits on any number of threads: heads (or, in a prefill, MLA's
//! tokens) are split over the pool, never one reduction. The layers are large enough that every
//! parallel path runs (a K3-sized head dimension; MLA over more than a hundred positions).

mod common;

use common::{D, KdaParts, MlaParts, bits, rand};
use k3_attn::{KdaForm, MlaForm};

/// Prefill `prompt` tokens, then `steps` single tokens, on a pool of `threads`: every output.
fn run<S>(
    threads: usize,
    state: S,
    mut step: impl FnMut(&mut S, &[f32], &mut [f32]) + Send,
    prompt: usize,
    steps: usize,
) -> Vec<u32>
where
    S: Send,
{
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let xs = rand((prompt + steps) * D, 77, 1.0);
    let mut out = vec![0f32; (prompt + steps) * D];
    let mut state = state;
    pool.install(|| {
        step(&mut state, &xs[..prompt * D], &mut out[..prompt * D]);
        for t in prompt..prompt + steps {
            step(&mut state, &xs[t * D..(t + 1) * D], &mut out[t * D..(t + 1) * D]);
        }
    });
    bits(&out)
}

#[test]
fn kda_gives_the_same_bits_on_any_pool() {
    let parts = KdaParts::new(10);
    // A prompt of 70 positions: one chunk and a short one when chunked.
    for form in [KdaForm::Recurrent, KdaForm::Chunked] {
        let mut layer = parts.layer();
        layer.set_form(form);
        let go = |threads| run(threads, layer.state(), |s, x, o| layer.prefill(s, x, o), 70, 3);
        let one = go(1);
        for threads in [2, 3, 7] {
            assert!(go(threads) == one, "KDA {form:?} on {threads} threads");
        }
    }
}

#[test]
fn mla_gives_the_same_bits_on_any_pool() {
    let parts = MlaParts::new(40);
    // 128 positions of prompt, then single tokens over them (heads split); the prompt's chunk in
    // each form (Auto expands it).
    for form in [MlaForm::Auto, MlaForm::Absorbed, MlaForm::Expanded] {
        let mut layer = parts.layer();
        layer.set_form(form);
        let go = |threads| run(threads, layer.cache(), |c, x, o| layer.prefill(c, x, o), 128, 3);
        let one = go(1);
        for threads in [2, 3, 7] {
            assert!(go(threads) == one, "MLA {form:?} on {threads} threads");
        }
    }
}

#[test]
fn mla_past_a_group_of_positions_gives_the_same_bits_on_any_pool() {
    let parts = MlaParts::new(41);
    let layer = parts.layer();
    // A prompt longer than one group (2,048 positions), then single tokens split by groups.
    let go = |threads| run(threads, layer.cache(), |c, x, o| layer.prefill(c, x, o), 2100, 3);
    let one = go(1);
    for threads in [2, 3] {
        assert!(go(threads) == one, "MLA on {threads} threads");
    }
}
