//! The commands of `k3-cli` that the developer tasks run too: `convert` (`cargo xtask convert`
//! calls this same code, so the installed binary and the repository's task cannot drift apart).

pub mod convert;
