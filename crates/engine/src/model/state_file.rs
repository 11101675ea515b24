//! A session's state as one self-describing file, for keeping states on disk (the prompt cache's
//! disk tier): magic and format version, the model's fingerprint, the token ids the state stands
//! for, the logits after the last of them (when kept), every layer's attention state in
//! `k3_attn`'s own format, and an xxh3-64 of all that. Reading checks each part against the
//! engine that reads: a file from another model or format version, a truncated or damaged one,
//! or one whose layers do not fit is an error that says which, never a state.

use k3_attn::AttnError;
use xxhash_rust::xxh3::xxh3_64;

use super::{Engine, LayerState, Session};

const MAGIC: &[u8; 8] = b"K3STATE\0";

/// The layout [`Engine::state_file`] writes.
pub(crate) const STATE_FILE_VERSION: u32 = 1;

/// Why a state file was not read.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("not a k3 state file (no magic)")]
    Magic,
    #[error("state file format version {found}; this build reads version {STATE_FILE_VERSION}")]
    Version { found: u32 },
    #[error(
        "the state is another model's, or was saved with other routing options (fingerprint {found:016x}; this model's is {want:016x})"
    )]
    Model { found: u64, want: u64 },
    #[error("truncated at byte {at} (needs {need} more)")]
    Truncated { at: usize, need: usize },
    #[error("damaged: its checksum does not match its contents")]
    Checksum,
    #[error("{0}")]
    Invalid(String),
    #[error("layer {layer}: {source}")]
    Layer { layer: usize, source: AttnError },
}

/// A state read back: the session and the logits kept with it.
#[derive(Debug)]
pub struct SavedState {
    pub session: Session,
    pub logits: Option<Vec<f32>>,
}

impl Engine<'_> {
    /// What identifies the model a state belongs to: an xxh3-64 of its manifest, which holds
    /// the architecture and every tensor's checksum (another model, or the same one re-encoded,
    /// has another).
    pub fn fingerprint(&self) -> u64 {
        // A manifest is plain data: serializing it cannot fail. Routing knobs change every
        // state after the first MoE layer, so a state saved under them belongs to them.
        *self.fingerprint.get_or_init(|| {
            let mut bytes = serde_json::to_vec(self.model.manifest()).unwrap_or_default();
            if let Some(n) = self.opts.experts_per_token {
                bytes.extend_from_slice(format!("experts_per_token={n}").as_bytes());
            }
            if let Some(p) = self.opts.expert_top_p {
                bytes.extend_from_slice(format!("expert_top_p={p}").as_bytes());
            }
            bytes.extend_from_slice(self.opts.approx.describe().as_bytes());
            if let Some(n) = self.opts.cache_aware {
                bytes.extend_from_slice(format!("cache_aware={n}").as_bytes());
            }
            // Rounded activations and a compact MLA cache compute other states too.
            if self.opts.activations != crate::ActivationPrecision::Exact {
                bytes.extend_from_slice(format!("activations={:?}", self.opts.activations).as_bytes());
            }
            if self.kv_cache() != k3_attn::KvCacheType::F32 {
                bytes.extend_from_slice(format!("kv_cache={}", self.kv_cache().name()).as_bytes());
            }
            // An int8 cache is read in integers by the absorbed form only: the forms' states
            // differ by more than float noise.
            if self.kv_cache() == k3_attn::KvCacheType::Int8 {
                bytes.extend_from_slice(format!("mla_form={}", self.opts.mla_form.name()).as_bytes());
            }
            if let Some(c) = &self.opts.low_bit_copies {
                // The copies' own manifest: other copies compute other states.
                bytes.extend_from_slice(format!("low_bit_copies={}", c.experts).as_bytes());
                bytes.extend_from_slice(&serde_json::to_vec(c.model.manifest()).unwrap_or_default());
            }
            xxh3_64(&bytes)
        })
    }

    /// `session`'s state (and `logits` after its last token, if given) as a state file's bytes.
    pub fn state_file(&self, session: &Session, logits: Option<&[f32]>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + session.state_bytes() + 4 * session.ids.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&STATE_FILE_VERSION.to_le_bytes());
        out.extend_from_slice(&self.fingerprint().to_le_bytes());
        out.extend_from_slice(&(session.ids.len() as u64).to_le_bytes());
        session.ids.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
        let logits = logits.unwrap_or_default();
        out.extend_from_slice(&(logits.len() as u64).to_le_bytes());
        logits.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out.extend_from_slice(&(session.layers.len() as u64).to_le_bytes());
        for layer in &session.layers {
            let blob = match layer {
                LayerState::Kda(s) => s.to_bytes(),
                LayerState::Mla(c) => c.to_bytes(),
            };
            out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
            out.extend_from_slice(&blob);
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// The state a [`state_file`](Self::state_file) holds, checked against this engine: the
    /// format version, then the checksum (nothing of a damaged file is believed), the model, the
    /// token ids and logits, each layer's kind and dimensions, and that the attention caches hold
    /// as many positions as there are tokens.
    pub fn read_state_file(&self, bytes: &[u8]) -> Result<SavedState, StateFileError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(StateFileError::Magic);
        }
        let body_len = bytes.len().checked_sub(8).ok_or(StateFileError::Truncated { at: bytes.len(), need: 8 })?;
        let (body, sum) = bytes.split_at(body_len);
        if body_len < MAGIC.len() + 4 {
            return Err(StateFileError::Truncated { at: bytes.len(), need: MAGIC.len() + 12 - bytes.len() });
        }
        let mut c = Cursor { bytes: body, at: MAGIC.len() };
        let found = u32::from_le_bytes(c.array()?);
        if found != STATE_FILE_VERSION {
            return Err(StateFileError::Version { found });
        }
        if u64::from_le_bytes(sum.try_into().map_err(|_| StateFileError::Checksum)?) != xxh3_64(body) {
            return Err(StateFileError::Checksum);
        }
        let (found, want) = (u64::from_le_bytes(c.array()?), self.fingerprint());
        if found != want {
            return Err(StateFileError::Model { found, want });
        }
        let ids = c.values(4, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()))?;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(StateFileError::Invalid(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        let logits = c.values(4, |b| f32::from_le_bytes(b.try_into().unwrap_or_default()))?;
        if !logits.is_empty() && logits.len() != self.vocab {
            return Err(StateFileError::Invalid(format!("{} logits for a vocabulary of {}", logits.len(), self.vocab)));
        }
        let mut session = self.session();
        let layers = c.u64()?;
        if layers != session.layers.len() as u64 {
            return Err(StateFileError::Invalid(format!("{layers} layers; this model has {}", session.layers.len())));
        }
        for (i, layer) in session.layers.iter_mut().enumerate() {
            let len = usize::try_from(c.u64()?).map_err(|_| StateFileError::Invalid(format!("layer {i}: too long")))?;
            let blob = c.take(len)?;
            let restored = match layer {
                LayerState::Kda(s) => s.restore(blob),
                LayerState::Mla(m) => m.restore(blob),
            };
            restored.map_err(|source| StateFileError::Layer { layer: i, source })?;
        }
        if c.at != body.len() {
            return Err(StateFileError::Invalid(format!("{} bytes after the last layer", body.len() - c.at)));
        }
        if let Some(LayerState::Mla(m)) = session.layers.iter().find(|l| matches!(l, LayerState::Mla(_)))
            && m.len() != ids.len()
        {
            return Err(StateFileError::Invalid(format!(
                "its attention caches hold {} positions for {} tokens",
                m.len(),
                ids.len()
            )));
        }
        session.ids = ids;
        Ok(SavedState { session, logits: (!logits.is_empty()).then_some(logits) })
    }
}

/// What a state file's head says of it, read without the rest (a store's index at startup):
/// the format version, the model's fingerprint, the token ids, and whether logits follow. Nothing
/// of it is believed until [`Engine::read_state_file`] has checked the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateHeader {
    pub version: u32,
    pub fingerprint: u64,
    pub ids: Vec<u32>,
    pub logits: bool,
}

/// The bytes of a state file's head before its token ids: magic, version, fingerprint and the
/// count of token ids ([`parse_state_head`]).
pub const STATE_HEAD_BYTES: usize = MAGIC.len() + 4 + 8 + 8;

/// The first [`STATE_HEAD_BYTES`] of a state file: its format version, model fingerprint and
/// token count. Checks the magic and the version only.
pub fn parse_state_head(head: &[u8]) -> Result<(u32, u64, u64), StateFileError> {
    if head.len() < MAGIC.len() || &head[..MAGIC.len()] != MAGIC {
        return Err(StateFileError::Magic);
    }
    let mut c = Cursor { bytes: head, at: MAGIC.len() };
    let version = u32::from_le_bytes(c.array()?);
    if version != STATE_FILE_VERSION {
        return Err(StateFileError::Version { found: version });
    }
    Ok((version, c.u64()?, c.u64()?))
}

/// Bytes of a state file's head after [`STATE_HEAD_BYTES`] for `tokens` token ids: the ids and
/// the logits' count (`None` past 2 GiB: no state has so many tokens).
pub fn state_ids_bytes(tokens: u64) -> Option<usize> {
    let need = usize::try_from(tokens).ok()?.checked_mul(4)?.checked_add(8)?;
    (need <= 1 << 31).then_some(need)
}

/// The head of a state file: `read(n)` gives its next `n` bytes (fewer at its end). The ids are
/// read only once `fits(fingerprint, tokens)` accepts the head (a caller that knows the file's
/// length refuses a count that length cannot hold, or another model's file, before reading).
pub fn read_state_header(
    mut read: impl FnMut(usize) -> std::io::Result<Vec<u8>>,
    fits: impl FnOnce(u64, u64) -> Result<(), StateFileError>,
) -> Result<StateHeader, StateFileError> {
    let head = read(STATE_HEAD_BYTES).map_err(|e| StateFileError::Invalid(e.to_string()))?;
    let (version, fingerprint, n) = parse_state_head(&head)?;
    let need = state_ids_bytes(n).ok_or_else(|| StateFileError::Invalid(format!("a count of {n} tokens")))?;
    fits(fingerprint, n)?;
    let rest = read(need).map_err(|e| StateFileError::Invalid(e.to_string()))?;
    let mut c = Cursor { bytes: &rest, at: 0 };
    let ids = c.take(need - 8)?.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let logits = c.u64()? > 0;
    Ok(StateHeader { version, fingerprint, ids, logits })
}

/// How long an engine's state files are: `base + tokens * per_token`, and `logits` more when
/// the logits after the last token are kept. Every file [`Engine::state_file`] writes has
/// exactly this length (the recurrent layers' states are of a fixed size, the attention caches
/// grow by a fixed size per token), so a file of any other length is refused before a byte of
/// its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateFileLayout {
    pub base: u64,
    pub per_token: u64,
    pub logits: u64,
}

impl StateFileLayout {
    /// The length of a file of `tokens` tokens (`None` when it overflows).
    pub fn len(&self, tokens: u64, logits: bool) -> Option<u64> {
        let body = tokens.checked_mul(self.per_token)?.checked_add(self.base)?;
        body.checked_add(if logits { self.logits } else { 0 })
    }
}

impl Engine<'_> {
    /// The length of this engine's state files ([`StateFileLayout`]): measured once on an empty
    /// session (its fixed-size parts as they are written), the per-token part from the
    /// attention caches' width.
    pub fn state_file_layout(&self) -> StateFileLayout {
        let empty = self.session();
        let base = self.state_file(&empty, None).len() as u64;
        let per_position: usize = empty
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Mla(m) => m.bytes_per_position(),
                LayerState::Kda(_) => 0,
            })
            .sum();
        StateFileLayout { base, per_token: 4 + per_position as u64, logits: 4 * self.vocab as u64 }
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StateFileError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or(StateFileError::Truncated { at: self.at, need: n })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StateFileError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u64(&mut self) -> Result<u64, StateFileError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count, then that many `size`-byte values.
    fn values<T>(&mut self, size: usize, f: impl Fn(&[u8]) -> T) -> Result<Vec<T>, StateFileError> {
        let n = self.u64()?;
        let bytes = usize::try_from(n).ok().and_then(|n| n.checked_mul(size));
        let bytes = bytes.ok_or_else(|| StateFileError::Invalid(format!("a count of {n} values")))?;
        Ok(self.take(bytes)?.chunks_exact(size).map(f).collect())
    }
}
