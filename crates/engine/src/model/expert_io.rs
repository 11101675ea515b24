//! The expert reader and cache of an engine, and the record locations it reads.

use std::sync::Arc;

use k3_format::Model;
use k3_io::{ExpertCache, FileId, Key, Location, Reader, ReaderOptions};

use super::approx::LOW_BIT;
use super::options::EngineOptions;
use crate::EngineError;

/// The reader and the shard files it has open.
#[derive(Debug)]
pub(crate) struct ExpertIo {
    pub cache: ExpertCache,
    pub files: Vec<FileId>,
    /// HOBBIT's low-bit copies and their shard files (keys flagged [`LOW_BIT`]).
    low: Option<(Arc<Model>, Vec<FileId>)>,
}

impl ExpertIo {
    /// A reader with `slots` cache slots of `slot_bytes`, every shard of `model` (and of its
    /// low-bit copies, if any) opened.
    pub fn open(model: &Model, opts: &EngineOptions, slot_bytes: usize, slots: usize) -> Result<ExpertIo, EngineError> {
        let ropts = ReaderOptions {
            queue_depth: opts.queue_depth.max(1),
            fault: opts.fault.clone(),
            ..ReaderOptions::new(slot_bytes, slots)
        };
        let mut reader = Reader::new(ropts)?;
        // A checkpoint's file read in place may end inside its last expert's aligned read.
        let mut open = |m: &Model| {
            let shards = m.manifest().shards.iter().zip(m.shard_paths());
            shards
                .map(|(s, p)| if s.in_place() { reader.open_past_end(p, s.bytes) } else { reader.open(p) })
                .collect::<Result<Vec<_>, _>>()
        };
        let files = open(model)?;
        let low = match &opts.low_bit_copies {
            Some(c) => Some((c.model.clone(), open(&c.model)?)),
            None => None,
        };
        let cache = ExpertCache::new(reader, opts.policy).with_layer_shares(opts.cache_layer_shares);
        Ok(ExpertIo { cache, files, low })
    }

    /// Where the record of `(layer, expert)` is (a low-bit copy's when flagged), for a read
    /// checked against its checksum.
    pub fn location(&self, model: &Model, (layer, expert): Key) -> Result<Location, EngineError> {
        let (model, files, expert) = match &self.low {
            Some((m, f)) if expert & LOW_BIT != 0 => (&**m, f, expert & !LOW_BIT),
            _ => (model, &self.files, expert),
        };
        let loc = model.expert(layer, expert)?;
        Ok(Location {
            file: files[usize::from(loc.entry.shard)],
            offset: loc.entry.offset,
            len: loc.entry.length as usize,
            xxh3: Some(loc.entry.xxh3),
        })
    }
}

/// A failed expert read, named by (layer, expert) as `k3-cli verify` names it.
pub(crate) fn expert_error((layer, expert): Key, source: k3_io::IoError) -> EngineError {
    EngineError::Expert { layer, expert: expert & !LOW_BIT, source }
}
