//! # k3-router
//!
//! MoE routing and the lookahead predictor.
//!
//! Not built yet: this crate is implemented by issue #6. See `docs/ARCHITECTURE.md` for
//! what it will own and what it may depend on.
