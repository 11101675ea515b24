//! The responses `/v1/responses` stores (`store: true`, the default): each response and the
//! conversation it ended, the items a `previous_response_id` continues from, kept per API key
//! in memory only (they do not outlive the server), bounded in count and in bytes: the oldest
//! go first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

use crate::boundary::Caller;

/// How many responses, and how many bytes of them, the store keeps at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    pub count: usize,
    pub bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { count: 1000, bytes: 256 << 20 }
    }
}

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The key whose request made it: no other reads or deletes it.
    pub owner: Caller,
    /// The response as it was answered.
    pub response: Value,
    /// The whole conversation as Responses items: every earlier input and output, this
    /// request's input, then its output.
    pub conversation: Vec<Value>,
    /// How many of `conversation`'s items are inputs (the output follows them).
    pub inputs: usize,
    bytes: usize,
}

impl Stored {
    pub fn new(owner: Caller, response: Value, conversation: Vec<Value>, inputs: usize) -> Stored {
        let bytes = response.to_string().len() + conversation.iter().map(|v| v.to_string().len()).sum::<usize>();
        Stored { owner, response, conversation, inputs, bytes }
    }
}

#[derive(Debug, Default)]
struct Kept {
    by_id: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The responses kept, within their limits.
#[derive(Debug)]
pub struct Store {
    limits: StoreLimits,
    kept: Mutex<Kept>,
}

/// Why a response was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the response is {bytes} bytes with its conversation, more than the store's {limit}")]
pub struct TooLarge {
    pub bytes: usize,
    pub limit: usize,
}

impl Store {
    pub fn new(limits: StoreLimits) -> Store {
        Store { limits, kept: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `s` under `id`, dropping the oldest until it fits.
    pub fn put(&self, id: &str, s: Stored) -> Result<(), TooLarge> {
        if s.bytes > self.limits.bytes || self.limits.count == 0 {
            return Err(TooLarge { bytes: s.bytes, limit: self.limits.bytes });
        }
        let mut k = self.lock();
        while k.order.len() >= self.limits.count || k.bytes + s.bytes > self.limits.bytes {
            let Some(old) = k.order.pop_front() else { break };
            if let Some(gone) = k.by_id.remove(&old) {
                k.bytes -= gone.bytes;
            }
        }
        k.bytes += s.bytes;
        k.order.push_back(id.to_string());
        k.by_id.insert(id.to_string(), s);
        Ok(())
    }

    /// The response `id` if `who` stored it.
    pub fn get(&self, id: &str, who: Caller) -> Option<Stored> {
        self.lock().by_id.get(id).filter(|s| s.owner == who).cloned()
    }

    /// Removes the response `id` if `who` stored it; whether it did.
    pub fn delete(&self, id: &str, who: Caller) -> bool {
        let mut k = self.lock();
        if k.by_id.get(id).is_none_or(|s| s.owner != who) {
            return false;
        }
        if let Some(gone) = k.by_id.remove(id) {
            k.bytes -= gone.bytes;
        }
        k.order.retain(|i| i != id);
        true
    }

    /// Responses kept and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        let k = self.lock();
        (k.order.len(), k.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(owner: Option<usize>, text: &str) -> Stored {
        Stored::new(Caller(owner), json!({"t": text}), vec![json!(text)], 1)
    }

    #[test]
    fn the_oldest_go_first_within_count_and_bytes() {
        let one = stored(None, "x").bytes;
        let store = Store::new(StoreLimits { count: 3, bytes: one * 10 });
        for i in 0..4 {
            store.put(&format!("r{i}"), stored(None, "x")).unwrap();
        }
        assert!(store.get("r0", Caller(None)).is_none(), "the fourth pushed the first out");
        assert_eq!(store.usage(), (3, one * 3));
        let big = stored(None, &"y".repeat(one * 4));
        let too = store.put("big", stored(None, &"y".repeat(one * 20))).unwrap_err();
        assert_eq!(too.limit, one * 10);
        store.put("r4", big).unwrap();
        assert!(store.get("r4", Caller(None)).is_some());
        assert!(store.get("r1", Caller(None)).is_none() && store.get("r2", Caller(None)).is_none());
        assert!(store.usage().1 <= one * 10, "{:?}", store.usage());
    }

    #[test]
    fn another_key_neither_reads_nor_deletes() {
        let store = Store::new(StoreLimits::default());
        store.put("r", stored(Some(0), "x")).unwrap();
        assert!(store.get("r", Caller(Some(1))).is_none());
        assert!(!store.delete("r", Caller(Some(1))));
        assert!(store.get("r", Caller(Some(0))).is_some());
        assert!(store.delete("r", Caller(Some(0))));
        assert!(store.get("r", Caller(Some(0))).is_none());
    }
}
