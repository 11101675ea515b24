//! The memory plan: how a budget (`--mem`) is spent on the mapped trunk, the attention state of
//! the planned context, the activations of one prefill chunk, what the caller keeps (collected
//! logits, say), the expert cache's slots and a fixed overhead. Refuses, with the numbers, what
//! cannot fit, and every size is computed with checked arithmetic (absurd inputs are errors, not
//! wrapped-around plans).

use crate::EngineError;
use crate::budget::{available_memory_bytes, total_memory_bytes};

/// How the memory budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub budget: Option<u64>,
    /// The mapped trunk (resident once touched).
    pub trunk_bytes: u64,
    /// KDA states (fixed) and MLA caches (growing with the context: planned for `context` tokens),
    /// for each of `sequences` sessions.
    pub state_bytes: u64,
    pub context: u64,
    /// The context asked for: more than `context` when the plan fitted a wanted context
    /// (`Demand::fit_context`) to what memory leaves.
    pub asked_context: u64,
    pub sequences: u64,
    /// The activations of one forward call of `chunk` tokens.
    pub activation_bytes: u64,
    pub chunk: u64,
    /// What the caller keeps beside the engine (e.g. the logits `k3-cli logits` collects).
    pub reserved_bytes: u64,
    pub slot_bytes: u64,
    pub cache_slots: u64,
    /// Process overhead allowed for (code, stacks, tokenizer, small buffers).
    pub overhead_bytes: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.fixed_bytes() + self.slot_bytes * self.cache_slots
    }

    /// Everything but the expert cache.
    pub fn fixed_bytes(&self) -> u64 {
        self.trunk_bytes + self.state_bytes + self.activation_bytes + self.reserved_bytes + self.overhead_bytes
    }
}

/// What a model needs per token of context and per token of a forward call (bytes).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Footprint {
    /// Attention state that does not grow (KDA states and convolution windows).
    pub state_fixed: u64,
    /// Attention state per token of context (MLA latents and shared keys).
    pub state_per_token: u64,
    /// Activations per token of a forward call.
    pub activation_per_token: u64,
}

/// What the plan is asked to cover.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    pub budget: Option<u64>,
    pub context: u64,
    /// `context` is the most wanted, lowered to what memory leaves ([`fit_context`]).
    pub fit_context: bool,
    pub sequences: u64,
    /// Tokens per forward call; `None`: the plan picks (`auto_chunk`).
    pub chunk: Option<u64>,
    pub reserved_bytes: u64,
    pub trunk_bytes: u64,
    pub slot_bytes: u64,
    /// Every expert of the model (more slots than this are never useful).
    pub all_experts: u64,
    /// Experts one token routes to.
    pub top_k: u64,
}

pub(crate) const OVERHEAD_BYTES: u64 = 64 << 20;

/// The prefill chunk of a model whose experts all fit in the cache: what the kernels like
/// (`bench decode --chunk` on the in-memory `k3-medium`: 256 prefills 1.08x faster than 64 and
/// 1.20x faster than 32; 512 no faster; docs/EFFICIENCY.md).
pub const IN_MEMORY_CHUNK: u64 = 256;
/// Chunks tried, largest first, for a model whose experts stream from disk: a chunk reads each
/// expert its tokens route to once, so the larger the chunk, the fewer times the prompt reads
/// the experts (a 4,096-token chunk of K3 routes to all of them).
const STREAMING_CHUNKS: [u64; 6] = [4096, 2048, 1024, 512, 256, 128];

/// The plan, choosing the chunk when the caller leaves it open (`d.chunk: None`): a model whose
/// experts all fit in the cache gets `IN_MEMORY_CHUNK` per sequence planned; one that streams
/// gets the largest chunk (at most the context of every sequence) whose activations take at most a quarter of the expert cache the small
/// chunk would leave, so the chunk's reads are amortized and the cache stays three quarters.
pub(crate) fn plan(fp: Footprint, d: Demand) -> Result<MemoryPlan, EngineError> {
    let asked = d.context;
    let d = if d.fit_context { Demand { context: fit_context(fp, d), fit_context: false, ..d } } else { d };
    plan_chunk(fp, d).map(|p| MemoryPlan { asked_context: asked, ..p })
}

/// The least context a fitted plan gets (the old fixed default): below it, the plan is refused
/// with its numbers, as an asked-for context would be.
const LEAST_FITTED_CONTEXT: u64 = 4096;

/// The context a run that wants "as much as fits" gets: `d.context` at most, lowered so that
/// every sequence's attention state fits in what the budget (or, without one, half the memory
/// available now) leaves after the trunk, one small chunk's activations, what the caller keeps,
/// the overhead and the expert cache: every expert when they take at most half of it (a model
/// that fits keeps fitting), else at most half of it (the cache keeps the rest). Never below
/// [`LEAST_FITTED_CONTEXT`] (or `d.context` when that is less).
pub(crate) fn fit_context(fp: Footprint, d: Demand) -> u64 {
    let seqs = d.sequences.max(1);
    let budget = d.budget.or_else(|| available_memory_bytes().map(|a| a / 2)).unwrap_or(0);
    let chunk = IN_MEMORY_CHUNK.saturating_mul(seqs).min(d.context.saturating_mul(seqs));
    let fixed = [
        d.trunk_bytes,
        fp.activation_per_token.saturating_mul(chunk),
        d.reserved_bytes,
        OVERHEAD_BYTES,
        fp.state_fixed.saturating_mul(seqs),
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add);
    let room = budget.saturating_sub(fixed);
    let experts = d.slot_bytes.saturating_mul(d.all_experts);
    let for_state = if experts <= room / 2 { room - experts } else { room / 2 };
    let fits = for_state.checked_div(fp.state_per_token.saturating_mul(seqs)).unwrap_or(u64::MAX);
    d.context.min(fits.max(LEAST_FITTED_CONTEXT))
}

fn plan_chunk(fp: Footprint, d: Demand) -> Result<MemoryPlan, EngineError> {
    if d.chunk.is_some() {
        return plan_fixed(fp, d);
    }
    // A step of a batch carries a chunk for each sequence; none is longer than its context.
    let most = d.context.max(1).saturating_mul(d.sequences.max(1));
    let small =
        plan_fixed(fp, Demand { chunk: Some(IN_MEMORY_CHUNK.saturating_mul(d.sequences.max(1)).min(most)), ..d })?;
    if small.cache_slots >= d.all_experts {
        return Ok(small);
    }
    let cache = small.slot_bytes.saturating_mul(small.cache_slots);
    for c in STREAMING_CHUNKS.into_iter().filter(|&c| c > small.chunk) {
        let c = c.min(most);
        if let Ok(p) = plan_fixed(fp, Demand { chunk: Some(c), ..d })
            && p.activation_bytes - small.activation_bytes <= cache / 4
            && p.cache_slots >= small.cache_slots.min(2 * d.top_k)
        {
            return Ok(p);
        }
    }
    Ok(small)
}

fn plan_fixed(fp: Footprint, d: Demand) -> Result<MemoryPlan, EngineError> {
    let chunk = d.chunk.unwrap_or(IN_MEMORY_CHUNK);
    if d.context == 0 {
        return Err(EngineError::Input("a context of 0 tokens cannot hold a prompt (--context)".into()));
    }
    if chunk == 0 {
        return Err(EngineError::Input("a prefill chunk of 0 tokens makes no progress (--chunk)".into()));
    }
    let too_big = |what: &str, n: u64| {
        EngineError::Input(format!("{what} of {n} tokens needs more memory than any machine has; ask for fewer"))
    };
    if d.sequences == 0 {
        return Err(EngineError::Input("a plan for 0 sequences runs nothing".into()));
    }
    let state_bytes = fp
        .state_per_token
        .checked_mul(d.context)
        .and_then(|b| b.checked_add(fp.state_fixed))
        .and_then(|b| b.checked_mul(d.sequences))
        .ok_or_else(|| too_big("a context (--context)", d.context))?;
    let activation_bytes =
        fp.activation_per_token.checked_mul(chunk).ok_or_else(|| too_big("a prefill chunk (--chunk)", chunk))?;
    let fixed = [d.trunk_bytes, state_bytes, activation_bytes, d.reserved_bytes, OVERHEAD_BYTES]
        .into_iter()
        .try_fold(0u64, u64::checked_add)
        .ok_or_else(|| too_big("this run", d.context))?;
    let machine = total_memory_bytes();
    if let (Some(b), Some(m)) = (d.budget, machine)
        && b > m
    {
        return Err(EngineError::Input(format!(
            "a memory budget of {} is more than this machine has ({}); give at most that (--mem)",
            human(b),
            human(m)
        )));
    }
    let seqs = if d.sequences > 1 { format!("{} sequences of ", d.sequences) } else { String::new() };
    let parts = format!(
        "trunk {}, attention state for {seqs}{} tokens {}, activations of {}-token chunks {}, outputs {}, overhead {}",
        human(d.trunk_bytes),
        d.context,
        human(state_bytes),
        chunk,
        human(activation_bytes),
        human(d.reserved_bytes),
        human(OVERHEAD_BYTES)
    );
    if let Some(m) = machine
        && fixed > m
    {
        return Err(EngineError::Input(format!(
            "this run needs {} before any expert cache ({parts}), more than this machine's {}; \
             lower --context or --chunk",
            human(fixed),
            human(m)
        )));
    }
    // At least two slots (one being read while one is used).
    let min_slots = if d.all_experts == 0 { 0 } else { 2 };
    let cache_slots = match d.budget {
        Some(b) => {
            let slots = b.saturating_sub(fixed) / d.slot_bytes.max(1);
            if slots < min_slots {
                return Err(EngineError::Input(format!(
                    "a memory budget of {} is too small for this model: it needs at least {} \
                     ({parts}, {min_slots} expert slots of {})",
                    human(b),
                    human(fixed + min_slots * d.slot_bytes),
                    human(d.slot_bytes),
                )));
            }
            if d.slot_bytes == 0 { 0 } else { slots.min(d.all_experts) }
        }
        // No budget given: half of the memory available now, at most every expert, at least twice
        // top-k (one token's experts read while the last one's are used).
        None => {
            let room = available_memory_bytes().unwrap_or(0) / 2;
            room.saturating_sub(fixed)
                .checked_div(d.slot_bytes)
                .map_or(0, |slots| slots.min(d.all_experts).max((2 * d.top_k).max(8)).min(d.all_experts))
        }
    };
    Ok(MemoryPlan {
        budget: d.budget,
        trunk_bytes: d.trunk_bytes,
        state_bytes,
        context: d.context,
        asked_context: d.context,
        sequences: d.sequences,
        activation_bytes,
        chunk,
        reserved_bytes: d.reserved_bytes,
        slot_bytes: d.slot_bytes,
        cache_slots,
        overhead_bytes: OVERHEAD_BYTES,
    })
}

pub(crate) fn human(b: u64) -> String {
    if b >= 1 << 30 { format!("{:.2} GB", b as f64 / 1e9) } else { format!("{:.1} MB", b as f64 / 1e6) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand() -> Demand {
        Demand {
            budget: Some(256 << 20),
            context: 4096,
            fit_context: false,
            sequences: 1,
            chunk: Some(32),
            reserved_bytes: 0,
            trunk_bytes: 10 << 20,
            slot_bytes: 1 << 20,
            all_experts: 1000,
            top_k: 4,
        }
    }

    const FP: Footprint = Footprint { state_fixed: 1 << 20, state_per_token: 1024, activation_per_token: 8192 };

    #[test]
    fn the_budget_is_spent_on_what_the_run_uses() {
        let p = plan(FP, demand()).unwrap();
        assert_eq!(p.state_bytes, (1 << 20) + 4096 * 1024);
        let eight = plan(FP, Demand { sequences: 8, ..demand() }).unwrap();
        assert_eq!(eight.state_bytes, 8 * p.state_bytes, "a server's batch holds eight states");
        assert_eq!(p.activation_bytes, 32 * 8192);
        assert!(p.total() <= 256 << 20 && p.total() + p.slot_bytes > 256 << 20, "{p:?}");
    }

    #[test]
    fn absurd_sizes_are_errors_not_wrapped_plans() {
        let e = plan(FP, Demand { context: u64::MAX, ..demand() }).unwrap_err().to_string();
        assert!(e.contains("--context"), "{e}");
        let e = plan(FP, Demand { chunk: Some(u64::MAX), ..demand() }).unwrap_err().to_string();
        assert!(e.contains("--chunk"), "{e}");
        let e = plan(FP, Demand { context: 0, ..demand() }).unwrap_err().to_string();
        assert!(e.contains("--context"), "{e}");
        let e = plan(FP, Demand { budget: Some(u64::MAX / 2), ..demand() }).unwrap_err().to_string();
        assert!(e.contains("more than this machine has"), "{e}");
        let e = plan(FP, Demand { budget: Some(12 << 20), ..demand() }).unwrap_err().to_string();
        assert!(e.contains("too small") && e.contains("needs at least"), "{e}");
    }

    /// Activations wide enough that the largest chunks do not fit the test's budget.
    const WIDE: Footprint = Footprint { activation_per_token: 64 << 10, ..FP };

    #[test]
    fn an_open_chunk_is_small_in_memory_and_large_when_experts_stream() {
        // Every expert fits: the in-memory chunk.
        let fits = plan(WIDE, Demand { chunk: None, all_experts: 100, ..demand() }).unwrap();
        assert_eq!(fits.chunk, IN_MEMORY_CHUNK);
        assert_eq!(fits.cache_slots, 100);
        // 1,000 experts of 1 MiB in a 256 MiB budget stream: the largest chunk whose activations
        // (64 KiB a token) take at most a quarter of the cache the small chunk leaves.
        let small = plan(WIDE, Demand { chunk: Some(IN_MEMORY_CHUNK), ..demand() }).unwrap();
        let big = plan(WIDE, Demand { chunk: None, ..demand() }).unwrap();
        assert!(big.chunk > IN_MEMORY_CHUNK && small.cache_slots < 1000, "{big:?}");
        let cache = small.slot_bytes * small.cache_slots;
        assert!(big.activation_bytes - small.activation_bytes <= cache / 4, "{big:?}");
        // The next larger chunk would have taken more.
        let next = *STREAMING_CHUNKS.iter().rev().find(|&&c| c > big.chunk).unwrap();
        let over = plan(WIDE, Demand { chunk: Some(next), ..demand() }).unwrap();
        assert!(over.activation_bytes - small.activation_bytes > cache / 4, "{next} would have fit");
        // Never more than the context.
        let short = plan(WIDE, Demand { chunk: None, context: 300, ..demand() }).unwrap();
        assert_eq!(short.chunk, 300);
        // A batch of eight sequences in memory: a chunk for each.
        let batch = plan(FP, Demand { chunk: None, all_experts: 20, sequences: 8, ..demand() }).unwrap();
        assert_eq!(batch.chunk, 8 * IN_MEMORY_CHUNK);
        // A chunk the caller fixes is kept.
        assert_eq!(plan(WIDE, Demand { chunk: Some(32), ..demand() }).unwrap().chunk, 32);
    }

    #[test]
    fn a_wanted_context_is_fitted_to_what_memory_leaves() {
        let want = Demand { context: 1 << 20, fit_context: true, chunk: None, ..demand() };
        // 1,000 experts of 1 MiB do not fit in 256 MiB: the state takes half of what the trunk
        // (10 MiB), a 256-token chunk's activations (2 MiB), the overhead (64 MiB) and the fixed
        // state (1 MiB) leave, 1 KiB a token: 91,136 tokens.
        let p = plan(FP, want).unwrap();
        let room = (256u64 << 20) - (10 << 20) - 256 * 8192 - OVERHEAD_BYTES - (1 << 20);
        assert_eq!(p.context, room / 2 / 1024, "{p:?}");
        assert_eq!(p.asked_context, 1 << 20);
        assert!(p.total() <= 256 << 20 && p.cache_slots >= 8, "{p:?}");
        // Every expert fits in half of it: they stay, the state takes the rest.
        let fits = plan(FP, Demand { all_experts: 50, ..want }).unwrap();
        assert_eq!(fits.cache_slots, 50, "{fits:?}");
        assert_eq!(fits.context, (room - (50 << 20)) / 1024);
        // Two sequences (a chunk and a fixed state each) share the room; a smaller wanted
        // context is kept; a context asked for exactly is kept, and refused with numbers when it
        // cannot fit.
        let room2 = (256u64 << 20) - (10 << 20) - 512 * 8192 - OVERHEAD_BYTES - (2 << 20);
        assert_eq!(plan(FP, Demand { sequences: 2, ..want }).unwrap().context, room2 / 2 / 2048);
        assert_eq!(plan(FP, Demand { context: 5000, ..want }).unwrap().context, 5000);
        assert_eq!(plan(FP, Demand { context: 5000, fit_context: false, ..want }).unwrap().asked_context, 5000);
        let e = plan(FP, Demand { fit_context: false, ..want }).unwrap_err().to_string();
        assert!(e.contains("attention state for 1048576 tokens"), "{e}");
        // Never below the old default: a budget that cannot hold 4,096 tokens is refused.
        let tight = plan(FP, Demand { budget: Some(80 << 20), ..want });
        assert!(tight.is_err_and(|e| e.to_string().contains("too small")), "a tight budget");
    }
}
