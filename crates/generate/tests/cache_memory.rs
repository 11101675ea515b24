//! The prompt cache's budget is what the process really holds: over a thousand distinct prompts
//! kept and evicted, the resident memory grows by at most the budget and a stated margin. (Its
//! own process: no other test's allocations move the figure.)

use std::path::Path;

use k3_engine::{Engine, Model};
use k3_generate::cache::Scope;
use k3_generate::cache::{Kept, PromptCache};

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 4096
}

#[test]
fn a_thousand_prompts_stay_within_the_budget() {
    let model = Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")).unwrap();
    let engine = Engine::load(&model).unwrap();
    let budget = 8 << 20;
    let mut cache = PromptCache::new(budget);
    let prompt = |i: u32| [1 + i % 4000, 7, 1 + (i * 7) % 4000, 9];
    let run = |i: u32, cache: &mut PromptCache| {
        let mut s = engine.session();
        engine.forward_last(&mut s, &prompt(i)).unwrap();
        cache.insert(&engine, Scope(u64::from(i % 3)), &s, Kept::AnswerEnd);
    };
    // Warm up what every step allocates (activations, the expert cache), with the cache off.
    let mut off = PromptCache::new(0);
    for i in 0..20 {
        run(i, &mut off);
    }
    let before = rss();
    for i in 0..1000 {
        run(i, &mut cache);
    }
    let grown = rss().saturating_sub(before);
    assert!(cache.used() <= budget && cache.used() > budget / 2, "{} of {budget} used", cache.used());
    // The margin: malloc's headers and rounding on each entry's dozen allocations, and pages
    // an evicted entry's memory leaves partly used (a quarter of the budget), plus 2 MiB of
    // the allocator's own bookkeeping.
    let margin = budget / 4 + (2 << 20);
    assert!(grown <= budget + margin, "resident memory grew {grown} bytes for a budget of {budget} (+{margin})");
    eprintln!("kept {} bytes by the cache's count; resident memory grew {grown}", cache.used());
}
