//! The expert reader and cache of an engine, and the record locations it reads.

use k3_format::Model;
use k3_io::{ExpertCache, FileId, Key, Location, Reader, ReaderOptions};

use super::options::EngineOptions;
use crate::EngineError;

/// The reader and the shard files it has open.
#[derive(Debug)]
pub(crate) struct ExpertIo {
    pub cache: ExpertCache,
    pub files: Vec<FileId>,
}

impl ExpertIo {
    /// A reader with `slots` cache slots of `slot_bytes`, every shard of `model` opened.
    pub fn open(model: &Model, opts: &EngineOptions, slot_bytes: usize, slots: usize) -> Result<ExpertIo, EngineError> {
        let ropts = ReaderOptions {
            queue_depth: opts.queue_depth.max(1),
            fault: opts.fault.clone(),
            ..ReaderOptions::new(slot_bytes, slots)
        };
        let mut reader = Reader::new(ropts)?;
        let files = model.shard_paths().iter().map(|p| reader.open(p)).collect::<Result<Vec<_>, _>>()?;
        let cache = ExpertCache::new(reader, opts.policy).with_layer_shares(opts.cache_layer_shares);
        Ok(ExpertIo { cache, files })
    }

    /// Where the record of `(layer, expert)` is, for a read checked against its checksum.
    pub fn location(&self, model: &Model, (layer, expert): Key) -> Result<Location, EngineError> {
        let loc = model.expert(layer, expert)?;
        Ok(Location {
            file: self.files[usize::from(loc.entry.shard)],
            offset: loc.entry.offset,
            len: loc.entry.length as usize,
            xxh3: Some(loc.entry.xxh3),
        })
    }
}

/// A failed expert read, named by (layer, expert) as `k3-cli verify` names it.
pub(crate) fn expert_error((layer, expert): Key, source: k3_io::IoError) -> EngineError {
    EngineError::Expert { layer, expert, source }
}
