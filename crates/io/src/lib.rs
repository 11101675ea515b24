//! # k3-io
//!
//! The O_DIRECT io_uring expert reader and the expert cache.
//!
//! Not built yet: this crate is implemented by issue #5. See `docs/ARCHITECTURE.md` for
//! what it will own and what it may depend on.
