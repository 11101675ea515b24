//! # k3-engine
//!
//! The Kimi model forward pass, streaming experts through k3-io.
//!
//! Not built yet: this crate is implemented by issue #7. See `docs/ARCHITECTURE.md` for
//! what it will own and what it may depend on.
