//! Checking a model before it is used: every trunk tensor's checksum, on every core, when the
//! engine loads (expert records are checked as they arrive, by `k3-io`). A damaged model must
//! fail loudly, never generate garbage.

use rayon::prelude::*;

use crate::EngineError;
use k3_format::Model;

/// What the check covered.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrunkCheck {
    pub bytes: u64,
    pub seconds: f64,
}

/// Checks every trunk tensor (largest first, spread over the rayon pool); the first damaged one in
/// the model's order is the error.
pub fn verify_trunk(model: &Model) -> Result<TrunkCheck, EngineError> {
    let t0 = std::time::Instant::now();
    let tensors = &model.manifest().trunk.tensors;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tensors[i].len));
    let bad =
        order.par_iter().filter_map(|&i| model.check_tensor(&tensors[i]).err().map(|e| (i, e))).min_by_key(|(i, _)| *i);
    if let Some((_, source)) = bad {
        return Err(EngineError::Damaged { source });
    }
    Ok(TrunkCheck { bytes: model.manifest().trunk.bytes, seconds: t0.elapsed().as_secs_f64() })
}
