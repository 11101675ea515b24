//! # k3-attn
//!
//! Kimi Delta Attention and gated MLA: decode and chunked prefill.
//!
//! Not built yet: this crate is implemented by issue #4. See `docs/ARCHITECTURE.md` for
//! what it will own and what it may depend on.
