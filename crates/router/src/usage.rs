//! Expert usage history: how often each (layer, expert) was routed to, kept in a small text file
//! between runs so the hottest experts can be pinned in the cache.
//!
//! Format: a first line `# k3 expert usage v1`, then one `layer expert count` line per expert
//! with a non-zero count. Blank lines and lines starting with `#` are ignored.

use std::collections::HashMap;
use std::path::Path;

/// A routed expert: (layer, expert).
pub type Key = (u32, u32);

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] k3_format::FormatError),
    #[error("{path}: line {line}: {reason} (expected `layer expert count`)")]
    Parse { path: std::path::PathBuf, line: usize, reason: &'static str },
}

const HEADER: &str = "# k3 expert usage v1";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageHistory {
    counts: HashMap<Key, u64>,
}

impl UsageHistory {
    pub fn record(&mut self, k: Key) {
        *self.counts.entry(k).or_default() += 1;
    }

    pub fn count(&self, k: Key) -> u64 {
        self.counts.get(&k).copied().unwrap_or(0)
    }

    /// The `n` most used experts, most used first (ties: lower layer, then lower expert).
    pub fn hottest(&self, n: usize) -> Vec<Key> {
        let mut v: Vec<(Key, u64)> = self.counts.iter().map(|(k, c)| (*k, *c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter().take(n).map(|(k, _)| k).collect()
    }

    /// Adds another history's counts (e.g. this run's to the saved one).
    pub fn merge(&mut self, other: &UsageHistory) {
        for (k, c) in &other.counts {
            *self.counts.entry(*k).or_default() += c;
        }
    }

    pub fn load(path: &Path) -> Result<UsageHistory, UsageError> {
        let text = std::fs::read_to_string(path).map_err(|e| UsageError::Io { path: path.to_path_buf(), source: e })?;
        let bad = |line: usize, reason: &'static str| UsageError::Parse { path: path.to_path_buf(), line, reason };
        if text.lines().next() != Some(HEADER) {
            return Err(bad(1, "not a k3 expert usage file"));
        }
        let mut h = UsageHistory::default();
        for (i, line) in text.lines().enumerate().skip(1) {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let [l, e, c] = f[..] else { return Err(bad(i + 1, "three numbers needed")) };
            let (l, e, c) = (l.parse::<u32>(), e.parse::<u32>(), c.parse::<u64>());
            let (Ok(l), Ok(e), Ok(c)) = (l, e, c) else { return Err(bad(i + 1, "not numbers")) };
            *h.counts.entry((l, e)).or_default() += c;
        }
        Ok(h)
    }

    /// Writes the history to `path` atomically (a unique temporary renamed into place).
    pub fn save(&self, path: &Path) -> Result<(), UsageError> {
        let mut v: Vec<(Key, u64)> = self.counts.iter().filter(|(_, c)| **c > 0).map(|(k, c)| (*k, *c)).collect();
        v.sort();
        let mut text = format!("{HEADER}\n");
        for ((l, e), c) in v {
            text.push_str(&format!("{l} {e} {c}\n"));
        }
        Ok(k3_format::write_atomic(path, text.as_bytes())?)
    }
}
