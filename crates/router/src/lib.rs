//! # k3-router: which experts a token goes to, and a guess of which the next layer will want
//!
//! - [`route`]: the Kimi/DeepSeek `noaux_tc` router from the gate logits (the engine computes
//!   `gate.weight x`): sigmoid scores in f32; selection on `score + e_score_correction_bias`,
//!   optionally within the best groups; weights from the *unbiased* scores (a flag selects the
//!   biased-weights variant of Moonshot's Kimi-Linear remote code), renormalized, scaled; optional
//!   expert top-p. Ties go to the lower expert index.
//! - [`lookahead`]: predicting layer l+1's experts during layer l, and measuring the predictions.
//! - [`usage`]: per-(layer, expert) counts kept in a small file, for pinning the hottest experts.
//! - [`synthetic`]: K3-like routing for synthetic models, a seeded process whose statistics
//!   match the published K3 figures.
//! - [`trace_stats`]: what a routing trace says about reuse (next-token reuse, union factors,
//!   weight by rank, flatness, overlap of two texts), as the published K3 figures define it.

mod cache_aware;
pub mod lookahead;
mod route;
pub mod synthetic;
pub mod trace_stats;
pub mod usage;

pub use cache_aware::prefer_cached;
pub use route::{RouterConfig, Routing, route, select, trim};
pub use usage::{Key, UsageError, UsageHistory};
