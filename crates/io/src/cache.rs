//! The expert cache: arena slots hold expert records; a record read into a slot is used in place.
//!
//! Invariants (tested under random request sequences): the cache never holds more records than the
//! arena has slots (the byte budget); a slot whose read is in flight is never evicted; a pinned
//! record is never evicted; a record borrowed through [`ExpertCache::get`] cannot be evicted while
//! borrowed (eviction needs `&mut self`).

use std::collections::HashMap;

use crate::IoError;
use crate::arena::Lease;
use crate::reader::{FileId, Priority, ReadRequest, Reader};

/// A routed expert: (layer, expert).
pub type Key = (u32, u32);

fn tag(k: Key) -> u64 {
    u64::from(k.0) << 32 | u64::from(k.1)
}

fn key(tag: u64) -> Key {
    ((tag >> 32) as u32, tag as u32)
}

/// Where a record is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub file: FileId,
    pub offset: u64,
    pub len: usize,
    pub xxh3: Option<u64>,
}

/// Which resident record to give up when a slot is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Least recently used.
    Lru,
    /// Least frequently used (ties: least recently).
    Lfu,
    /// Frequency with recency: uses decay by half every `slots` requests since the last use.
    Lfru,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            "lfru" => Ok(Policy::Lfru),
            _ => Err(format!("unknown cache policy `{s}` (lru, lfu, lfru)")),
        }
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub evictions: u64,
    pub prefetches_issued: u64,
    /// Prefetched records later requested on demand.
    pub prefetches_used: u64,
    /// Prefetched records evicted unused, or dropped as stale before being read.
    pub prefetches_wasted: u64,
    pub failed_reads: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Free,
    InFlight { key: Key, prefetch: bool },
    Ready { key: Key, len: usize, last_use: u64, uses: f64, prefetched_unused: bool },
}

/// What [`ExpertCache::request`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Resident: usable now.
    Hit,
    /// A read for it is already in flight.
    Pending,
    /// Missing: a read was issued.
    Issued,
    /// Missing, and every slot is in flight or pinned: request again after a completion.
    NoRoom,
}

#[derive(Debug)]
pub struct ExpertCache {
    reader: Reader,
    slots: Vec<Slot>,
    map: HashMap<Key, usize>,
    pinned: std::collections::HashSet<Key>,
    /// Needed by the step in progress: not evicted until released.
    protected: std::collections::HashSet<Key>,
    policy: Policy,
    /// Give up a record of the layer that holds the most slots (each layer keeps its share).
    layer_shares: bool,
    clock: u64,
    stats: CacheStats,
}

impl ExpertCache {
    /// A cache over the reader's arena: one record per slot.
    pub fn new(reader: Reader, policy: Policy) -> Self {
        let n = reader.arena().slots();
        ExpertCache {
            reader,
            slots: vec![Slot::Free; n],
            map: HashMap::new(),
            pinned: Default::default(),
            protected: Default::default(),
            policy,
            layer_shares: true,
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    /// Whether a record to give up is taken from the layer holding the most slots (on, the
    /// default) or from the whole cache by the policy alone. Decode visits the layers in turn:
    /// taken from the whole cache, a cache smaller than a step's experts loses every layer's
    /// records to the other layers' before its next token comes back.
    pub fn with_layer_shares(mut self, on: bool) -> Self {
        self.layer_shares = on;
        self
    }

    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    pub fn reader_mut(&mut self) -> &mut Reader {
        &mut self.reader
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Records resident or in flight.
    pub fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| !matches!(s, Slot::Free)).count()
    }

    /// Keeps these experts resident once loaded (the hottest ones from a usage history). At most
    /// half the slots can be pinned; the rest of `keys` is ignored. Returns how many were pinned.
    pub fn pin(&mut self, keys: &[Key]) -> usize {
        let room = self.slots.len() / 2;
        for k in keys.iter().take(room.saturating_sub(self.pinned.len())) {
            self.pinned.insert(*k);
        }
        self.pinned.len()
    }

    /// Keeps `keys` resident (once loaded) until [`release`](Self::release)d: the experts the step
    /// in progress still has to use.
    pub fn protect(&mut self, keys: &[Key]) {
        self.protected.extend(keys.iter().copied());
    }

    pub fn release(&mut self, k: Key) {
        self.protected.remove(&k);
    }

    /// Waits for the next read of any kind to finish and files it; `None` when nothing is in flight.
    pub fn wait_next(&mut self) -> Option<(Key, Result<(), IoError>)> {
        let c = self.reader.next_completion()?;
        Some(self.complete(c))
    }

    /// Slots neither in flight nor holding a protected or pinned record.
    pub fn available(&self) -> usize {
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, s)| match s {
                Slot::Free => true,
                Slot::InFlight { .. } => false,
                Slot::Ready { key, .. } => {
                    !self.pinned.contains(key) && !self.protected.contains(key) && !self.reader.is_leased(*i)
                }
            })
            .count()
    }

    pub fn set_layer(&self, layer: u32) {
        self.reader.set_layer(layer)
    }

    /// Asks for an expert: a hit is usable now, a miss starts a read (demand reads before
    /// prefetches). Never evicts a slot in flight or pinned.
    pub fn request(&mut self, k: Key, loc: Location, priority: Priority) -> Result<Status, IoError> {
        self.clock += 1;
        let demand = priority == Priority::Demand;
        let n = self.slots.len();
        if let Some(&i) = self.map.get(&k) {
            match &mut self.slots[i] {
                Slot::Ready { last_use, uses, prefetched_unused, .. } => {
                    if demand {
                        self.stats.hits += 1;
                        if *prefetched_unused {
                            *prefetched_unused = false;
                            self.stats.prefetches_used += 1;
                        }
                        *uses = decayed(*uses, self.clock - *last_use, n, self.policy) + 1.0;
                        *last_use = self.clock;
                    }
                    return Ok(Status::Hit);
                }
                Slot::InFlight { prefetch, .. } => {
                    if demand && *prefetch {
                        // The guess was right: it now counts as demand.
                        *prefetch = false;
                        self.stats.prefetches_used += 1;
                        self.stats.misses += 1;
                    }
                    return Ok(Status::Pending);
                }
                Slot::Free => unreachable!("mapped keys are never free"),
            }
        }
        let Some(i) = self.victim() else { return Ok(Status::NoRoom) };
        if let Slot::Ready { key, prefetched_unused, .. } = self.slots[i] {
            self.map.remove(&key);
            self.stats.evictions += 1;
            if prefetched_unused {
                self.stats.prefetches_wasted += 1;
            }
        }
        self.reader.submit(ReadRequest {
            file: loc.file,
            offset: loc.offset,
            len: loc.len,
            slot: i,
            xxh3: loc.xxh3,
            priority,
            tag: tag(k),
        })?;
        self.slots[i] = Slot::InFlight { key: k, prefetch: !demand };
        self.map.insert(k, i);
        if demand {
            self.stats.misses += 1;
        } else {
            self.stats.prefetches_issued += 1;
        }
        Ok(Status::Issued)
    }

    /// A free slot, else the resident record the policy gives up (never in flight, never pinned).
    fn victim(&self) -> Option<usize> {
        if let Some(i) = self.slots.iter().position(|s| matches!(s, Slot::Free)) {
            return Some(i);
        }
        let n = self.slots.len();
        let candidates: Vec<(f64, usize, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match *s {
                Slot::Ready { key, last_use, uses, .. }
                    if !self.pinned.contains(&key) && !self.protected.contains(&key) && !self.reader.is_leased(i) =>
                {
                    Some((score(self.policy, uses, last_use, self.clock, n), i, key.0))
                }
                _ => None,
            })
            .collect();
        let mut held: HashMap<u32, usize> = HashMap::new();
        if self.layer_shares {
            for s in &self.slots {
                if let Slot::Ready { key, .. } | Slot::InFlight { key, .. } = s {
                    *held.entry(key.0).or_default() += 1;
                }
            }
        }
        victim_among(&candidates, self.layer_shares.then_some(&held))
    }

    fn complete(&mut self, c: crate::reader::Completion) -> (Key, Result<(), IoError>) {
        let k = key(c.tag);
        let Slot::InFlight { prefetch, .. } = self.slots[c.slot] else {
            unreachable!("a completion always belongs to a slot in flight")
        };
        match c.result {
            Ok(()) => {
                self.stats.bytes_read += c.len as u64;
                self.slots[c.slot] =
                    Slot::Ready { key: k, len: c.len, last_use: self.clock, uses: 1.0, prefetched_unused: prefetch };
                (k, Ok(()))
            }
            Err(e) => {
                if matches!(e, IoError::Stale) {
                    self.stats.prefetches_wasted += 1;
                } else {
                    self.stats.failed_reads += 1;
                }
                self.slots[c.slot] = Slot::Free;
                self.map.remove(&k);
                (k, Err(e))
            }
        }
    }

    /// Waits for the next of `keys` to arrive (in arrival order) and returns it with its result;
    /// other completions meanwhile (prefetches) are filed. `None` when none of `keys` is in flight.
    pub fn wait_any(&mut self, keys: &[Key]) -> Option<(Key, Result<(), IoError>)> {
        loop {
            let in_flight =
                keys.iter().any(|k| self.map.get(k).is_some_and(|&i| matches!(self.slots[i], Slot::InFlight { .. })));
            if !in_flight {
                return None;
            }
            let c = self.reader.next_completion()?;
            let (k, r) = self.complete(c);
            if keys.contains(&k) {
                return Some((k, r));
            }
        }
    }

    /// Waits for every read in flight and files it.
    pub fn drain(&mut self) {
        while let Some(c) = self.reader.next_completion() {
            let _ = self.complete(c); // failures are counted in the stats
        }
    }

    /// A resident record's bytes, in place.
    pub fn get(&self, k: Key) -> Option<&[u8]> {
        let &i = self.map.get(&k)?;
        match self.slots[i] {
            Slot::Ready { len, .. } => self.reader.data(i, len),
            _ => None,
        }
    }

    /// A resident record's bytes for another thread: its slot is neither read into nor evicted
    /// until the lease is dropped.
    pub fn lease(&self, k: Key) -> Option<Lease> {
        let &i = self.map.get(&k)?;
        match self.slots[i] {
            Slot::Ready { len, .. } => self.reader.lease(i, len),
            _ => None,
        }
    }

    /// Whether `k` is resident or on its way.
    pub fn contains(&self, k: Key) -> bool {
        self.map.contains_key(&k)
    }
}

/// Of `candidates` (score, slot, layer), the slot to give up: the lowest score, within the layer
/// holding the most slots by `held` when layers keep their shares (the lower layer on a tie).
pub fn victim_among(candidates: &[(f64, usize, u32)], held: Option<&HashMap<u32, usize>>) -> Option<usize> {
    let layer = held.and_then(|held| {
        candidates.iter().map(|c| c.2).max_by_key(|l| (held.get(l).copied().unwrap_or(0), std::cmp::Reverse(*l)))
    });
    candidates.iter().filter(|c| layer.is_none_or(|l| c.2 == l)).min_by(|a, b| a.0.total_cmp(&b.0)).map(|c| c.1)
}

/// What the policy keeps a record for: the lowest score is given up first. `uses` counts the
/// record's uses (for LFRU as last decayed at `last_use`), `clock` counts requests, `slots` is the
/// cache's size (LFRU halves a count every `slots` requests).
pub fn score(policy: Policy, uses: f64, last_use: u64, clock: u64, slots: usize) -> f64 {
    match policy {
        Policy::Lru => last_use as f64,
        Policy::Lfu => uses * 1e12 + last_use as f64,
        Policy::Lfru => decayed(uses, clock - last_use, slots, policy) * 1e12 + last_use as f64,
    }
}

/// A use count as the policy sees it `age` requests after it was last updated.
pub fn decayed(uses: f64, age: u64, slots: usize, policy: Policy) -> f64 {
    match policy {
        Policy::Lfru => uses * 0.5f64.powf(age as f64 / slots.max(1) as f64),
        _ => uses,
    }
}
