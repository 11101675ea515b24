//! The commands of `k3-cli` that the developer tasks run too: `convert` (`cargo xtask convert`
//! calls this same code, so the installed binary and the repository's task cannot drift apart),
//! `text_file`, the bound on texts read whole that it shares with the binary's commands, and
//! `progress`, how every long command shows its progress, and `store`, models by name.

pub mod convert;
pub mod progress;
pub mod store;
pub mod text_file;
