//! The engine's compute pool: `threads` workers for the arithmetic. When experts stream, the
//! thread that calls the engine coordinates (and waits on expert reads), so reads stay in flight
//! while every worker computes; when they all stay cached, a whole step runs on a worker
//! (`Engine::run`) and its products split among the workers without leaving the pool. Work is split by rows, heads, tokens or experts —
//! never one reduction across threads — so results are the same bits on any number of threads.

use k3_quant::{Matrix, par};

use crate::EngineError;

#[derive(Debug)]
pub(crate) struct Compute {
    pool: rayon::ThreadPool,
}

impl Compute {
    /// A pool of `threads` workers (0: one per core).
    pub fn new(threads: usize) -> Result<Compute, EngineError> {
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("k3-compute-{i}"))
            .build()
            .map_err(|e| EngineError::Input(format!("cannot start {threads} compute threads: {e}")))?;
        Ok(Compute { pool })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` on the pool (its rayon work goes to the pool's workers).
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// `Y = W X` for a batch, rows split over the pool when it is worth waking it.
    pub fn matmul(&self, m: &Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
        let n = xs.len() / m.cols().max(1);
        if par::tasks(m, self.threads(), n) > 1 {
            self.run(|| par::matmul(m, xs, ys));
        } else {
            m.matmul(xs, ys);
        }
    }

    /// The pool, for a scope whose coordinator stays on the calling thread.
    pub fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }
}
