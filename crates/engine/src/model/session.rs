//! The state of one sequence: everything earlier tokens left behind, and what was measured.

use k3_attn::{KdaState, KdaTape, MlaCache};
use k3_router::lookahead::LookaheadStats;

use super::stats::{RunStats, Span};

/// Per-layer recurrent state of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LayerState {
    Kda(KdaState),
    Mla(MlaCache),
}

/// The experts one token chose at one MoE layer, in routing order.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutedToken {
    pub position: usize,
    pub layer: u32,
    pub experts: Vec<u32>,
    /// The experts' routing weights, in the same order.
    pub weights: Vec<f32>,
}

/// The state of one sequence.
#[derive(Debug, Clone)]
pub struct Session {
    pub(crate) layers: Vec<LayerState>,
    /// The tokens the state holds, in order (what prompt lookup drafts from, what a prompt cache
    /// matches).
    pub(crate) ids: Vec<u32>,
    /// How well each lookahead predictor would have guessed every MoE layer's experts.
    pub lookahead: LookaheadStats,
    /// The experts each layer chose for the previous token (the previous-token predictor).
    pub(crate) prev_routing: Vec<Vec<u32>>,
    /// Per layer: the after-attention guesses a prefetch would read (best first, capped), and how
    /// many of them the layer then chose.
    pub(crate) prefetch_guesses: Vec<(u64, u64)>,
    pub stats: RunStats,
    /// When `Some`, the next `forward` records where its time went (cleared at each call).
    pub timeline: Option<Vec<Span>>,
    /// Every expert this session routed to, counted (for the usage-history file).
    pub usage: k3_router::UsageHistory,
    /// When `Some`, every token's experts at every MoE layer are appended (for comparing encodings).
    pub routing_trace: Option<Vec<RoutedToken>>,
    /// A chunk of drafts (tentative) awaiting `Engine::accept_drafts`.
    pub(crate) pending: Option<Pending>,
}

/// What keeping a prefix of a chunk of drafts needs: per KDA layer the chunk's tape, per MLA
/// layer the cache length before it, and (when tracing) the rows' routing.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub ids: Vec<u32>,
    pub tapes: Vec<KdaTape>,
    pub mla_len: Vec<usize>,
    pub routes: Vec<RoutedToken>,
}

impl PartialEq for Session {
    /// Same recurrent state (statistics aside).
    fn eq(&self, other: &Self) -> bool {
        self.layers == other.layers && self.ids == other.ids
    }
}

impl Session {
    /// How many tokens the state holds (the next token's position).
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// The tokens the state holds, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Bytes of the recurrent state: KDA states and the MLA caches' positions.
    pub fn state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(s) => s.bytes(),
                LayerState::Mla(c) => c.bytes(),
            })
            .sum()
    }

    /// Bytes this session holds in memory: its states as allocated (an MLA cache's reserved room
    /// included), its tokens, and the per-layer bookkeeping; what keeping it costs.
    pub fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        let states: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(s) => s.bytes(),
                LayerState::Mla(c) => c.held_bytes(),
            })
            .sum();
        let per_layer = size_of::<LayerState>() + size_of::<Vec<u32>>() + size_of::<(u64, u64)>() + 3 * 32;
        let routing: usize = self.prev_routing.iter().map(|r| 4 * r.capacity()).sum();
        size_of::<Session>() + states + 4 * self.ids.capacity() + self.layers.len() * per_layer + routing
    }

    pub(crate) fn new(layers: Vec<LayerState>) -> Session {
        let n = layers.len();
        Session {
            layers,
            ids: Vec::new(),
            lookahead: LookaheadStats::new(n),
            prev_routing: vec![Vec::new(); n],
            prefetch_guesses: vec![(0, 0); n],
            stats: RunStats::default(),
            timeline: None,
            usage: k3_router::UsageHistory::default(),
            routing_trace: None,
            pending: None,
        }
    }
}
