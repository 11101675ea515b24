//! A failure stays with its request: two requests stepped in one batch, one of them routed to an
//! expert whose record on disk is damaged. That one fails, naming the record and no server path;
//! the other gets exactly what it gets alone, and the scheduler goes on serving.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use k3_engine::{Engine, Model};
use k3_generate::GenerateParams;
use k3_generate::cache::PromptCache;
use k3_generate::cache::Scope;
use k3_server::job::{Event, Job, Status};
use k3_server::metrics::Metrics;
use k3_server::scheduler;
use tokio::sync::mpsc as tmpsc;

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

/// The experts token `id` alone routes to at MoE layer `layer`.
fn routed(engine: &Engine<'_>, id: u32, layer: u32) -> Vec<u32> {
    let mut s = engine.session();
    s.routing_trace = Some(Vec::new());
    engine.forward_last(&mut s, &[id]).unwrap();
    s.routing_trace.unwrap().into_iter().find(|r| r.layer == layer).unwrap().experts
}

fn job(prompt: u32) -> (Job, tmpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = tmpsc::unbounded_channel();
    let params = GenerateParams { max_tokens: 1, logprobs: Some(0), ..GenerateParams::default() };
    (
        Job {
            prompt: vec![prompt],
            params,
            events: tx,
            scope: Scope::default(),
            resume_points: Vec::new(),
            images: Vec::new(),
            tally: Default::default(),
            log: Default::default(),
            progress: false,
        },
        rx,
    )
}

fn events(mut rx: tmpsc::UnboundedReceiver<Event>) -> Vec<Event> {
    let mut v = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        v.push(e);
    }
    v
}

#[test]
fn a_damaged_expert_fails_only_the_request_that_reads_it() {
    let model = Model::open(default_model()).unwrap();
    let engine = Engine::load(&model).unwrap();
    let layer = engine.config().moe_layers()[0];
    // A token that routes to some expert E at the first MoE layer, and one that does not.
    let a = 300u32;
    let e = routed(&engine, a, layer)[0];
    let b = (301..600).find(|&t| !routed(&engine, t, layer).contains(&e)).expect("a token avoiding E");
    // What b gets alone: its logits' log-probability of the greedy token.
    let alone = {
        let l = engine.forward_last(&mut engine.session(), &[b]).unwrap();
        (0..l.len()).fold(0, |m, i| if l[i] > l[m] { i } else { m }) as u32
    };
    drop(engine);

    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(default_model()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
    }
    let copy = Model::open(dir.path()).unwrap();
    let loc = copy.expert(layer, e).unwrap();
    let mut bytes = std::fs::read(loc.path).unwrap();
    bytes[(loc.entry.offset + loc.entry.length / 2) as usize] ^= 0x40;
    std::fs::write(loc.path, bytes).unwrap();
    let model = Model::open(dir.path()).unwrap();
    let engine = Engine::load_with(&model, k3_engine::EngineOptions { sequences: 2, ..Default::default() }).unwrap();

    // Both jobs are queued before the scheduler starts: its first step holds both.
    let (jobs, rx) = mpsc::sync_channel(4);
    let (ja, ra) = job(a);
    let (jb, rb) = job(b);
    let (jc, rc) = job(b);
    jobs.send(ja).unwrap();
    jobs.send(jb).unwrap();
    let status = Status::default();
    status.queued.store(2, std::sync::atomic::Ordering::SeqCst);
    let metrics = Metrics::default();
    std::thread::scope(|s| {
        let (engine, status, metrics) = (&engine, &status, &metrics);
        s.spawn(move || {
            let rx = rx;
            let mut cache = PromptCache::new(0);
            scheduler::run(engine, None, &rx, 2, &mut cache, status, metrics);
        });
        let ea = events(ra);
        let eb = events(rb);
        let seen = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::SeqCst);
        // Together: one step of both, then b's sampled token fed alone (apart: three steps).
        assert_eq!((seen(&metrics.steps), seen(&metrics.step_sequences)), (2, 3), "both in one step");
        match ea.last() {
            Some(Event::Failed(m)) => {
                assert!(m.contains("expert") && m.contains(&format!("layer {layer}")), "{m}");
                assert!(!m.contains(dir.path().to_str().unwrap()), "a server path reaches the client: {m}");
            }
            other => panic!("the request reading the damaged expert did not fail: {other:?}"),
        }
        assert!(matches!(eb.last(), Some(Event::Done { .. })), "the other request failed too: {eb:?}");
        let got = eb.iter().find_map(|e| match e {
            Event::Delta { logprob: Some(l), .. } => Some(l.id),
            _ => None,
        });
        assert_eq!(got, Some(alone), "the other request's answer is what it gets alone");
        // The scheduler goes on.
        status.queued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        jobs.send(jc).unwrap();
        assert!(matches!(events(rc).last(), Some(Event::Done { .. })));
        drop(jobs);
    });
    assert_eq!(metrics.failed_steps.load(std::sync::atomic::Ordering::SeqCst), 1);
}
