//! The commands of `k3-cli` that the developer tasks run too: `convert` (`cargo xtask convert`
//! calls this same code, so the installed binary and the repository's task cannot drift apart),
//! and `text_file`, the bound on texts read whole that it shares with the binary's commands.

pub mod convert;
pub mod text_file;
