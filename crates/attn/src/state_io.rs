//! A small self-describing byte format for saved attention state: magic, kind, dimensions, then
//! little-endian f32 arrays. Restoring checks every dimension against the layer's config.

use crate::AttnError;

const MAGIC: &[u8; 8] = b"K3ATTNS1";

pub(crate) fn write(kind: &[u8; 4], dims: &[u64], arrays: &[&[f32]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + dims.len() * 8 + arrays.iter().map(|a| 8 + a.len() * 4).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(kind);
    out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_le_bytes());
    }
    for a in arrays {
        out.extend_from_slice(&(a.len() as u64).to_le_bytes());
        for v in *a {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AttnError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len()).ok_or_else(|| AttnError::State {
            what: self.what,
            reason: format!("truncated at byte {} (needs {n} more)", self.at),
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u64(&mut self) -> Result<u64, AttnError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// Reads what [`write`] wrote; checks the kind and that the dimensions equal `dims`.
pub(crate) fn read(what: &'static str, bytes: &[u8], kind: &[u8; 4], dims: &[u64]) -> Result<Vec<Vec<f32>>, AttnError> {
    let err = |reason: String| AttnError::State { what, reason };
    let mut c = Cursor { bytes, at: 0, what };
    if c.take(8)? != MAGIC {
        return Err(err("not a k3 attention state (bad magic)".into()));
    }
    let k = c.take(4)?;
    if k != kind {
        return Err(err(format!(
            "holds a `{}` state, not `{}`",
            String::from_utf8_lossy(k),
            String::from_utf8_lossy(kind)
        )));
    }
    let n = u32::from_le_bytes(c.take(4)?.try_into().expect("4 bytes")) as usize;
    if n != dims.len() {
        return Err(err(format!("{n} dimensions, expected {}", dims.len())));
    }
    for (i, want) in dims.iter().enumerate() {
        let got = c.u64()?;
        if got != *want {
            return Err(err(format!("dimension {i} is {got}, this layer has {want}")));
        }
    }
    let mut arrays = Vec::new();
    while c.at < bytes.len() {
        let len = c.u64()?;
        let bytes_len =
            usize::try_from(len).ok().and_then(|l| l.checked_mul(4)).ok_or_else(|| err("array too long".into()))?;
        let raw = c.take(bytes_len)?;
        arrays.push(raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect());
    }
    Ok(arrays)
}
