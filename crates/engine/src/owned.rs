//! An engine that owns its model: the engine's tensors are views into the model's mapped trunk,
//! so the two live together in one value that a long-lived caller (a server) can hold and share
//! across threads.

use std::path::Path;
use std::sync::Arc;

use k3_format::{Model, OpenOptions};

use crate::{Engine, EngineError, EngineOptions};

self_cell::self_cell!(
    struct Cell {
        owner: Arc<Model>,
        #[covariant]
        dependent: Engine,
    }
    impl {Debug}
);

/// An [`Engine`] together with the model it runs.
#[derive(Debug)]
pub struct OwnedEngine(Cell);

impl OwnedEngine {
    /// Opens the WASTE model at `dir` and loads an engine over it.
    pub fn open(dir: &Path, open: &OpenOptions, opts: EngineOptions) -> Result<OwnedEngine, EngineError> {
        Self::load(Arc::new(Model::open_with(dir, open)?), opts)
    }

    pub fn load(model: Arc<Model>, opts: EngineOptions) -> Result<OwnedEngine, EngineError> {
        Cell::try_new(model, |m| Engine::load_with(m, opts)).map(OwnedEngine)
    }

    pub fn engine(&self) -> &Engine<'_> {
        self.0.borrow_dependent()
    }

    pub fn model(&self) -> &Arc<Model> {
        self.0.borrow_owner()
    }
}

#[cfg(test)]
mod tests {
    fn shared<T: Send + Sync>() {}

    #[test]
    fn an_owned_engine_can_be_shared_across_threads() {
        shared::<super::OwnedEngine>();
    }
}
