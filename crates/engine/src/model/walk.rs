//! The model one layer at a time over many windows, each read from an empty state (as
//! `k3-cli perplexity` scores): between layers only each row's state at the layer boundary is
//! held — its residual stream and, for K3, its AttnRes block snapshots — so a pass that samples
//! every MoE layer's expert inputs (calibration, through `EngineOptions::calibrate`) holds one
//! layer's samples at a time, not the whole model's. A layer's rows go through it in groups of
//! windows; each row gives the bits it would give in an ordinary forward pass of its window.

use std::time::Instant;

use k3_attn::MlaCache;
use k3_router::synthetic::RowContext;

use super::Engine;
use super::forward::{Chunk, Logits, Seq};
use super::layers::Attn;
use super::session::{LayerState, Session};
use super::stats::RunStats;
use crate::EngineError;

/// Rows a layer's step takes at a time (whole windows; at least one): bounds the step's own
/// activations, which a walk over tens of thousands of rows would otherwise hold for every row.
pub const GROUP_ROWS: usize = 4096;

/// A walk's windows and every row's state at the boundary before its next layer.
#[derive(Debug)]
pub struct LayerWalk {
    windows: Vec<Vec<u32>>,
    done: usize,
    /// `[rows, hidden]`: the residual stream (K3: the running partial sum).
    h: Vec<f32>,
    /// Per row, K3's AttnRes block snapshots so far.
    blocks: Vec<Vec<Vec<f32>>>,
    /// Per row, for a model routed by a synthetic process: the tokens its routing depends on.
    contexts: Vec<RowContext>,
}

impl LayerWalk {
    /// Layers run so far.
    pub fn layers_done(&self) -> usize {
        self.done
    }

    /// Rows (tokens of every window).
    pub fn rows(&self) -> usize {
        self.blocks.len()
    }

    /// `[rows, hidden]`: every row's residual stream after the layers run so far (K3: the
    /// running partial sum), windows in order.
    pub fn hidden(&self) -> &[f32] {
        &self.h
    }

    /// Bytes the walk holds between layers: the residual stream and the block snapshots.
    pub fn held_bytes(&self) -> u64 {
        let snapshots: usize = self.blocks.iter().map(|b| b.iter().map(Vec::len).sum::<usize>()).sum();
        4 * (self.h.len() + snapshots) as u64
    }
}

impl<'m> Engine<'m> {
    /// The most a walk over `rows` rows holds between layers: each row's residual stream and
    /// (K3) one snapshot per AttnRes block, `rows x hidden x 4 x (1 + blocks)` bytes. A layer's
    /// step adds the engine's own activations for [`GROUP_ROWS`] rows (its plan, when loaded
    /// with that chunk).
    pub fn walk_bytes(&self, rows: u64) -> u64 {
        let blocks = if self.layers.iter().any(|l| l.att_res.is_some()) {
            self.layers.len().div_ceil(self.res_block)
        } else {
            0
        };
        rows * self.hidden as u64 * 4 * (1 + blocks as u64)
    }

    /// A walk over `windows` (each from an empty state), before the first layer.
    pub fn walk(&self, windows: Vec<Vec<u32>>) -> Result<LayerWalk, EngineError> {
        if let Some(bad) = windows.iter().flatten().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::Input(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        if self.opts.approx.defer > 0 {
            return Err(EngineError::Input("a layer-at-a-time walk cannot defer experts to the next layer".into()));
        }
        let windows: Vec<Vec<u32>> = windows.into_iter().filter(|w| !w.is_empty()).collect();
        let ids: Vec<u32> = windows.concat();
        let contexts = if self.synthetic_routing() {
            windows.iter().flat_map(|w| (0..w.len()).map(move |j| RowContext::at(j, |p| w[p]))).collect()
        } else {
            Vec::new()
        };
        Ok(LayerWalk { h: self.embed(&ids), blocks: vec![Vec::new(); ids.len()], windows, done: 0, contexts })
    }

    /// Runs the walk's next layer over every window, [`GROUP_ROWS`] rows at a time. Returns the
    /// layer's index.
    pub fn walk_layer(&self, w: &mut LayerWalk) -> Result<usize, EngineError> {
        let li = w.done;
        let layer =
            self.layers.get(li).ok_or_else(|| EngineError::Input(format!("the walk has run all {li} layers")))?;
        let (d, started) = (self.hidden, Instant::now());
        let mut step = RunStats::default();
        let (mut first, mut row0) = (0, 0);
        while first < w.windows.len() {
            let mut end = first + 1;
            let mut n = w.windows[first].len();
            while end < w.windows.len() && n + w.windows[end].len() <= GROUP_ROWS {
                n += w.windows[end].len();
                end += 1;
            }
            let mut sessions: Vec<Session> = (first..end).map(|_| self.layer_session(li)).collect();
            let windows = &w.windows[first..end];
            let mut seqs: Vec<Seq<'_>> =
                sessions.iter_mut().zip(windows).map(|(s, ids)| Seq::new(s, ids, Logits::Last)).collect();
            let blocks = w.blocks[row0..row0 + n].iter_mut().map(std::mem::take).collect();
            let contexts = w.contexts.get(row0..row0 + n).map(<[RowContext]>::to_vec).unwrap_or_default();
            let rows = windows.iter().map(Vec::len).collect();
            let mut c = Chunk::at(rows, w.h[row0 * d..(row0 + n) * d].to_vec(), blocks, contexts);
            self.attention(&mut seqs, li, layer, &mut c, started)?;
            self.feed_forward(&mut seqs, li, layer, &mut c, started, &mut step)?;
            w.h[row0 * d..(row0 + n) * d].copy_from_slice(&c.h);
            w.blocks[row0..row0 + n].iter_mut().zip(c.blocks).for_each(|(b, c)| *b = c);
            (first, row0) = (end, row0 + n);
        }
        w.done += 1;
        Ok(li)
    }

    /// A session with a fresh state for layer `li` only (the others' are empty placeholders it
    /// never reads): a walk's window holds one layer's state at a time, not a whole model's.
    fn layer_session(&self, li: usize) -> Session {
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(j, l)| match &l.attn {
                Attn::Kda(k) if j == li => LayerState::Kda(k.state()),
                Attn::Mla(m) if j == li => LayerState::Mla(m.cache()),
                _ => LayerState::Mla(MlaCache::default()),
            })
            .collect();
        Session::new(layers)
    }
}
