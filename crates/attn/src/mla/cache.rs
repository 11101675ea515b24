//! An MLA layer's cache: every position's normalized latent and shared key, in its
//! [`KvCacheType`], growing with use up to the memory plan's context.

use crate::AttnError;
use crate::latents::{KvCacheType, Rows};
use crate::state_io;

/// The per-layer cache: for every position so far, the normalized latent and the shared key, in
/// the cache's [`KvCacheType`]. (`Default`: an empty f32 cache of no shape, the placeholder for a
/// layer a session never runs.)
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MlaCache {
    pub(super) c: Rows,
    pub(super) kext: Rows,
    len: usize,
    dims: [u64; 2],
    /// The most positions the memory plan holds room for (0: no plan): growth stops there.
    most: usize,
}

impl MlaCache {
    /// An empty cache of `latent`- and `key`-value rows stored as `kind` (what
    /// [`Mla::cache_of`](super::Mla::cache_of) makes for a layer).
    pub fn new(kind: KvCacheType, latent: usize, key: usize) -> MlaCache {
        MlaCache::empty(kind, [latent as u64, key as u64])
    }

    /// An empty cache of `dims` (latent, shared key) storing rows as `kind`.
    pub(super) fn empty(kind: KvCacheType, dims: [u64; 2]) -> MlaCache {
        MlaCache { c: Rows::new(kind), kext: Rows::new(kind), dims, ..MlaCache::default() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values of a latent and of a shared key.
    pub fn dims(&self) -> (usize, usize) {
        (self.dims[0] as usize, self.dims[1] as usize)
    }

    pub fn cache_type(&self) -> KvCacheType {
        self.c.kind()
    }

    /// The most positions the memory plan holds room for: the cache grows with use (doubling,
    /// so appending stays amortized), never past `tokens` unless a position beyond is appended.
    pub fn plan(&mut self, tokens: usize) {
        self.most = tokens;
    }

    /// Room for `rows` more positions.
    pub(super) fn grow(&mut self, rows: usize) {
        let [l, r] = self.dims.map(|x| x as usize);
        let need = self.len + rows;
        if need.saturating_mul(l) <= self.c.capacity() {
            return;
        }
        let mut target = need.max(self.len.saturating_mul(2));
        if self.most > 0 {
            target = target.min(self.most.max(need));
        }
        self.c.reserve_rows(target, l);
        self.kext.reserve_rows(target, r);
    }

    /// Appends one position from outside a layer (benchmarks, tools): `latent` and `key` must be
    /// as long as the cache was made for.
    pub fn append(&mut self, latent: &[f32], key: &[f32]) -> Result<(), AttnError> {
        let (l, r) = self.dims();
        for (tensor, v, want) in [("latent", latent, l), ("shared key", key, r)] {
            if v.len() != want {
                return Err(AttnError::Length { layer: "MLA cache".into(), tensor, len: v.len(), want });
            }
        }
        self.grow(1);
        self.push(latent, key);
        Ok(())
    }

    /// Appends one position: its normalized latent and (rotated, with RoPE) shared key.
    pub(super) fn push(&mut self, latent: &[f32], key: &[f32]) {
        self.c.push(latent);
        self.kext.push(key);
        self.len += 1;
    }

    /// Back to the first `len` positions (speculative positions that were not accepted).
    pub fn truncate(&mut self, len: usize) {
        let [l, r] = self.dims.map(|x| x as usize);
        self.len = self.len.min(len);
        self.c.truncate(self.len, l);
        self.kext.truncate(self.len, r);
    }

    pub fn reset(&mut self) {
        self.c.clear();
        self.kext.clear();
        self.len = 0;
    }

    /// Bytes of the positions held.
    pub fn bytes(&self) -> usize {
        self.len * self.bytes_per_position()
    }

    /// Bytes allocated for positions, used or reserved.
    pub fn held_bytes(&self) -> usize {
        self.c.held_bytes() + self.kext.held_bytes()
    }

    /// Bytes held per cached position.
    pub fn bytes_per_position(&self) -> usize {
        let kind = self.cache_type();
        kind.row_bytes(self.dims[0] as usize) + kind.row_bytes(self.dims[1] as usize)
    }

    /// The positions as f32 (what the cache's rows widen to), in a state file's layout; the cache
    /// type is the saving engine's, which its fingerprint records.
    pub fn to_bytes(&self) -> Vec<u8> {
        let [l, r] = self.dims.map(|x| x as usize);
        let (mut c, mut k) = (vec![0f32; self.len * l], vec![0f32; self.len * r]);
        self.c.widen(0, self.len, l, &mut c);
        self.kext.widen(0, self.len, r, &mut k);
        state_io::write(b"MLA1", &self.dims, &[&c, &k])
    }

    /// Restores a cache saved by [`to_bytes`](Self::to_bytes) for a layer of the same shape,
    /// into this cache's type (rounding f32 values it holds exactly again to the same rows).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), AttnError> {
        let a = state_io::read("MLA", bytes, b"MLA1", &self.dims)?;
        let (l, r) = (self.dims[0] as usize, self.dims[1] as usize);
        if a.len() != 2 || a[0].len() % l != 0 || a[0].len() / l != a[1].len() / r.max(1) || a[1].len() % r.max(1) != 0
        {
            return Err(AttnError::State {
                what: "MLA",
                reason: "latent and key arrays disagree on the length".into(),
            });
        }
        let n = a[0].len() / l;
        self.reset();
        self.c.reserve_rows(n, l);
        self.kext.reserve_rows(n, r);
        let keys = |t: usize| if r == 0 { &[][..] } else { &a[1][t * r..(t + 1) * r] };
        for t in 0..n {
            self.push(&a[0][t * l..(t + 1) * l], keys(t));
        }
        Ok(())
    }
}
