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
    pub sequences: u64,
    pub chunk: u64,
    pub reserved_bytes: u64,
    pub trunk_bytes: u64,
    pub slot_bytes: u64,
    /// Every expert of the model (more slots than this are never useful).
    pub all_experts: u64,
    /// Experts one token routes to.
    pub top_k: u64,
}

pub(crate) const OVERHEAD_BYTES: u64 = 64 << 20;

pub(crate) fn plan(fp: Footprint, d: Demand) -> Result<MemoryPlan, EngineError> {
    if d.context == 0 {
        return Err(EngineError::Input("a context of 0 tokens cannot hold a prompt (--context)".into()));
    }
    if d.chunk == 0 {
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
        fp.activation_per_token.checked_mul(d.chunk).ok_or_else(|| too_big("a prefill chunk (--chunk)", d.chunk))?;
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
        d.chunk,
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
        sequences: d.sequences,
        activation_bytes,
        chunk: d.chunk,
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
            sequences: 1,
            chunk: 32,
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
        let e = plan(FP, Demand { chunk: u64::MAX, ..demand() }).unwrap_err().to_string();
        assert!(e.contains("--chunk"), "{e}");
        let e = plan(FP, Demand { context: 0, ..demand() }).unwrap_err().to_string();
        assert!(e.contains("--context"), "{e}");
        let e = plan(FP, Demand { budget: Some(u64::MAX / 2), ..demand() }).unwrap_err().to_string();
        assert!(e.contains("more than this machine has"), "{e}");
        let e = plan(FP, Demand { budget: Some(12 << 20), ..demand() }).unwrap_err().to_string();
        assert!(e.contains("too small") && e.contains("needs at least"), "{e}");
    }
}
