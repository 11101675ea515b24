//! One decode through a routing trace against an expert cache of a given size, counted in
//! records: which requests hit, how many bytes are read. The replacement scores and the choice of
//! a victim are k3-io's own (`k3_io::cache::score`, `victim_among`), so LRU, LFU and LFRU here
//! are the engine's; the learned policy and Belady's MIN (the offline optimum: give up the record
//! used again farthest in the future) exist only here, to say what a better policy could gain.

use std::collections::HashMap;

use k3_io::Policy;
use k3_io::cache::{score, victim_among};
use k3_router::trace_stats::Trace;

use super::learned::{Features, INPUTS, Learned};

/// How the cache chooses what to give up.
#[derive(Debug, Clone)]
pub enum Choice {
    Engine(Policy),
    Learned(Learned),
    Belady,
}

/// What a miss or a resident record may be served by instead of the stored record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Route each token to its `k` heaviest experts only (top-k reduction), if set.
    pub top_k: Option<usize>,
    /// HOBBIT: a miss on an expert outside the token's heaviest `hobbit_keep` is served by a
    /// low-bit copy of `low_ratio` the record's bytes.
    pub hobbit_keep: Option<usize>,
    /// DynaExq: a record given up is kept demoted at `low_ratio` of a slot; a hit on it is
    /// served at the low precision.
    pub dynaexq: bool,
    pub low_ratio: f64,
    /// Guesses of the next layer read ahead per token (the lookahead), best first.
    pub lookahead: usize,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    pub requests: u64,
    pub hits: u64,
    /// Requests served at a lower precision (HOBBIT copies, DynaExq demoted hits).
    pub low: u64,
    /// Bytes read, in records.
    pub records_read: f64,
    pub tokens: u64,
}

impl Outcome {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.requests.max(1) as f64
    }
    /// Records read per token.
    pub fn per_token(&self) -> f64 {
        self.records_read / self.tokens.max(1) as f64
    }
}

#[derive(Debug, Clone, Copy)]
struct Resident {
    last_use: u64,
    uses: f64,
    /// Token index of the last use.
    last_token: usize,
    /// Decayed counts for the learned policy's features.
    feats: Features,
}

/// The simulated cache: `slots` records over all layers.
pub struct Sim<'a> {
    trace: &'a Trace,
    /// Slots for records at the stored precision (DynaExq gives part of the cache's bytes to
    /// demoted ones).
    slots: usize,
    /// DynaExq: how many demoted records fit beside them.
    demoted_room: usize,
    choice: Choice,
    variant: Variant,
    layer_shares: bool,
    resident: HashMap<(u32, u32), Resident>,
    /// DynaExq's demoted records, in order of demotion (oldest first), and its room in records.
    demoted: Vec<(u32, u32)>,
    clock: u64,
    /// For each layer and expert, the token indices it is used at (ascending): Belady's
    /// future, and the learned policy's targets.
    uses_at: Vec<HashMap<u32, Vec<usize>>>,
    /// Collected when learning: each `SAMPLE_EVERY`-th eviction's candidates, their inputs and
    /// `ln(1 + tokens to the next use)`.
    samples: Option<Vec<([f64; INPUTS], f64)>>,
    evictions: u64,
}

/// Evictions between two whose candidates become training examples.
const SAMPLE_EVERY: u64 = 8;

/// The learned policy for a cache of `slots` records, fitted on `train` (another text) from the
/// records an LRU cache weighed when it gave one up.
///
/// Then `rounds` more times: the records the learned policy itself weighed are added and the
/// model refitted (as DAgger does), so it learns from the states its own choices lead to.
pub fn learn(train: &Trace, slots: usize, warm: usize, rounds: usize) -> Learned {
    let uses = index_uses(train);
    let mut samples = Vec::new();
    let mut choice = Choice::Engine(Policy::Lru);
    let mut model = Learned { w: [0.0; INPUTS] };
    for _ in 0..=rounds {
        let mut sim = Sim::new(train, slots, choice, Variant::default());
        sim.uses_at = uses.clone();
        sim.samples = Some(Vec::new());
        sim.run(warm, train[0].len(), &|_, _| Vec::new());
        samples.extend(sim.samples.unwrap_or_default());
        model = Learned::fit(&samples);
        choice = Choice::Learned(model.clone());
    }
    model
}

impl<'a> Sim<'a> {
    pub fn new(trace: &'a Trace, slots: usize, choice: Choice, variant: Variant) -> Sim<'a> {
        let uses_at = if matches!(choice, Choice::Belady) { index_uses(trace) } else { Vec::new() };
        let (slots, demoted_room) = if variant.dynaexq {
            let full = (slots as f64 * (1.0 - DEMOTED_SHARE)).round() as usize;
            (full, ((slots - full) as f64 / variant.low_ratio.max(1e-6)) as usize)
        } else {
            (slots, 0)
        };
        Sim {
            trace,
            slots,
            demoted_room,
            choice,
            variant,
            layer_shares: true,
            resident: HashMap::new(),
            demoted: Vec::new(),
            clock: 0,
            uses_at,
            samples: None,
            evictions: 0,
        }
    }

    pub fn with_layer_shares(mut self, on: bool) -> Self {
        self.layer_shares = on;
        self
    }

    /// Decodes tokens `..to` of the trace (layers in turn for each token), counting from
    /// `count_from` on (the ones before warm the cache).
    pub fn run(&mut self, count_from: usize, to: usize, predict: &dyn Fn(u32, usize) -> Vec<u32>) -> Outcome {
        let mut out = Outcome::default();
        let layers = self.trace.len() as u32;
        for t in 0..to {
            let counting = t >= count_from;
            let mut o = Outcome::default();
            for l in 0..layers {
                self.step(l, t, &mut o);
                if self.variant.lookahead > 0 && l + 1 < layers {
                    self.read_ahead(l + 1, t, &predict(l + 1, t), &mut o);
                }
            }
            if counting {
                out.requests += o.requests;
                out.hits += o.hits;
                out.low += o.low;
                out.records_read += o.records_read;
                out.tokens += 1;
            }
        }
        out
    }

    /// Layer `l` of token `t`: its experts requested, misses read.
    fn step(&mut self, l: u32, t: usize, o: &mut Outcome) {
        let r = &self.trace[l as usize][t];
        let mut order: Vec<usize> = (0..r.experts.len()).collect();
        order.sort_by(|&a, &b| r.weights[b].total_cmp(&r.weights[a]));
        let keep = self.variant.top_k.unwrap_or(order.len()).min(order.len());
        let protect: Vec<(u32, u32)> = order[..keep].iter().map(|&i| (l, r.experts[i])).collect();
        for (rank, &i) in order[..keep].iter().enumerate() {
            let e = r.experts[i];
            self.clock += 1;
            o.requests += 1;
            if self.touch((l, e), t) {
                o.hits += 1;
                continue;
            }
            if self.variant.dynaexq && self.undemote((l, e)) {
                o.hits += 1;
                o.low += 1;
                continue;
            }
            if self.variant.hobbit_keep.is_some_and(|k| rank >= k) {
                o.low += 1;
                o.records_read += self.variant.low_ratio;
                continue;
            }
            o.records_read += 1.0;
            self.insert((l, e), t, &protect);
        }
    }

    /// The lookahead's first `n` guesses for layer `l` that are not resident, read ahead.
    fn read_ahead(&mut self, l: u32, t: usize, guesses: &[u32], o: &mut Outcome) {
        let missing: Vec<u32> = guesses
            .iter()
            .copied()
            .filter(|&e| !self.resident.contains_key(&(l, e)))
            .take(self.variant.lookahead)
            .collect();
        for e in missing {
            self.clock += 1;
            o.records_read += 1.0;
            self.insert((l, e), t.saturating_sub(1), &[]);
        }
    }

    /// A use of a resident record; false if it is not resident.
    fn touch(&mut self, k: (u32, u32), t: usize) -> bool {
        let (clock, slots, policy) = (self.clock, self.slots, self.engine_policy());
        let Some(r) = self.resident.get_mut(&k) else { return false };
        r.uses = k3_io::cache::decayed(r.uses, clock - r.last_use, slots, policy) + 1.0;
        r.feats.used(t - r.last_token);
        r.last_use = clock;
        r.last_token = t;
        true
    }

    fn engine_policy(&self) -> Policy {
        if let Choice::Engine(p) = self.choice { p } else { Policy::Lru }
    }

    fn insert(&mut self, k: (u32, u32), t: usize, protect: &[(u32, u32)]) {
        if self.slots == 0 {
            return;
        }
        if self.resident.len() >= self.slots {
            let Some(v) = self.victim(t, protect) else { return };
            self.resident.remove(&v);
            if self.variant.dynaexq {
                self.demote(v);
            }
        }
        let r = Resident { last_use: self.clock, uses: 1.0, last_token: t, feats: Features::new() };
        self.resident.insert(k, r);
    }

    fn victim(&mut self, t: usize, protect: &[(u32, u32)]) -> Option<(u32, u32)> {
        let keys: Vec<(u32, u32)> = self.resident.keys().copied().filter(|k| !protect.contains(k)).collect();
        self.evictions += 1;
        if self.samples.is_some() && self.evictions.is_multiple_of(SAMPLE_EVERY) {
            let examples: Vec<([f64; INPUTS], f64)> = keys
                .iter()
                .map(|&k| {
                    let r = &self.resident[&k];
                    (r.feats.at(t - r.last_token), ((self.next_use(k, t) - t) as f64).ln_1p())
                })
                .collect();
            self.samples.get_or_insert_default().extend(examples);
        }
        let candidates: Vec<(f64, usize, u32)> = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let r = &self.resident[&k];
                let s = match &self.choice {
                    Choice::Engine(p) => score(*p, r.uses, r.last_use, self.clock, self.slots),
                    Choice::Learned(m) => m.score(&r.feats.at(t - r.last_token)),
                    Choice::Belady => -(self.next_use(k, t) as f64),
                };
                (s, i, k.0)
            })
            .collect();
        let mut held: HashMap<u32, usize> = HashMap::new();
        for k in self.resident.keys() {
            *held.entry(k.0).or_default() += 1;
        }
        let shares = self.layer_shares && !matches!(self.choice, Choice::Belady);
        victim_among(&candidates, shares.then_some(&held)).map(|i| keys[i])
    }

    /// The next token after `t` that uses `k` (the trace's length if none).
    fn next_use(&self, k: (u32, u32), t: usize) -> usize {
        let never = self.trace[0].len() + 1;
        let Some(v) = self.uses_at[k.0 as usize].get(&k.1) else { return never };
        let i = v.partition_point(|&u| u <= t);
        v.get(i).copied().unwrap_or(never)
    }

    /// DynaExq: a record given up stays demoted while there is room (the oldest demoted one goes).
    fn demote(&mut self, k: (u32, u32)) {
        self.demoted.push(k);
        if self.demoted.len() > self.demoted_room {
            self.demoted.remove(0);
        }
    }

    fn undemote(&mut self, k: (u32, u32)) -> bool {
        match self.demoted.iter().position(|&d| d == k) {
            Some(i) => {
                // Served from the demoted copy; it stays there (it is promoted only by a read).
                let d = self.demoted.remove(i);
                self.demoted.push(d);
                true
            }
            None => false,
        }
    }
}

/// DynaExq's share of the cache's bytes given to demoted records (the full records keep the rest).
pub const DEMOTED_SHARE: f64 = 0.25;

fn index_uses(trace: &Trace) -> Vec<HashMap<u32, Vec<usize>>> {
    trace
        .iter()
        .map(|layer| {
            let mut m: HashMap<u32, Vec<usize>> = HashMap::new();
            for (t, r) in layer.iter().enumerate() {
                for &e in &r.experts {
                    m.entry(e).or_default().push(t);
                }
            }
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_router::RouterConfig;
    use k3_router::synthetic::{K3Like, random_ids, trace};

    fn k3_trace(seed: u64) -> Trace {
        let cfg = RouterConfig::new(896, 16);
        trace(&K3Like::new(&cfg, 7), &cfg, &random_ids(160, 160_000, seed), 3)
    }

    /// Belady's MIN is the optimum: no policy hits more often; every exact miss is one record read.
    #[test]
    fn no_policy_beats_belady_and_misses_are_reads() {
        let (test, train) = (k3_trace(1), k3_trace(2));
        for slots in [20, 60, 120] {
            let run = |c: Choice| Sim::new(&test, slots, c, Variant::default()).run(32, 160, &|_, _| Vec::new());
            let best = run(Choice::Belady);
            let learned = learn(&train, slots, 32, 1);
            for c in [
                Choice::Engine(Policy::Lru),
                Choice::Engine(Policy::Lfu),
                Choice::Engine(Policy::Lfru),
                Choice::Learned(learned),
            ] {
                let o = run(c.clone());
                assert!(o.hits <= best.hits, "{c:?} at {slots} slots: {} hits, MIN {}", o.hits, best.hits);
                assert_eq!(o.records_read, (o.requests - o.hits) as f64);
            }
        }
    }

    /// A cache holding every expert misses only on first uses; none misses on everything.
    #[test]
    fn a_whole_cache_misses_only_first_uses() {
        let test = k3_trace(3);
        let o =
            Sim::new(&test, 3 * 896, Choice::Engine(Policy::Lru), Variant::default()).run(0, 160, &|_, _| Vec::new());
        let distinct: usize = test
            .iter()
            .map(|l| l.iter().flat_map(|r| &r.experts).collect::<std::collections::HashSet<_>>().len())
            .sum();
        assert_eq!(o.requests - o.hits, distinct as u64);
        let none = Sim::new(&test, 0, Choice::Engine(Policy::Lru), Variant::default()).run(0, 160, &|_, _| Vec::new());
        assert_eq!(none.hits, 0);
    }
}
