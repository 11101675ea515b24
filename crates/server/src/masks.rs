//! Constrained answers' masks (`json_object`, `json_schema`, strict calls' arguments), computed
//! on threads of their own: a sequence's next mask starts as soon as its token is sent and runs
//! while the batch steps, so a costly schema slows only its own request. The scheduler thread
//! never computes one, and the forward pass's workers are not borrowed for them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use k3_text::mask::{Mask, MaskJob};

/// Threads computing masks: enough that two costly schemas do not queue behind each other,
/// few enough not to crowd the forward pass.
const THREADS: usize = 2;

type Work = (MaskJob, Arc<AtomicBool>, mpsc::Sender<Option<Mask>>);

/// The mask threads; they end when the pool is dropped.
pub(crate) struct MaskPool {
    work: Option<mpsc::Sender<Work>>,
    /// A mask landed (one message per mask): what the scheduler waits on when every sequence
    /// waits for its mask.
    landed: mpsc::Receiver<()>,
}

impl MaskPool {
    pub fn new() -> std::io::Result<MaskPool> {
        let (work, jobs) = mpsc::channel::<Work>();
        let (tell, landed) = mpsc::channel();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..THREADS {
            let (jobs, tell) = (jobs.clone(), tell.clone());
            std::thread::Builder::new().name(format!("k3-mask-{i}")).spawn(move || {
                loop {
                    let next = jobs.lock().map(|j| j.recv());
                    let Ok(Ok((job, abandon, out))) = next else { return };
                    // A panic is the sequence's failure (`None`), not the thread's end.
                    let mask = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&abandon)));
                    let _ = out.send(mask.ok().flatten());
                    let _ = tell.send(());
                }
            })?;
        }
        Ok(MaskPool { work: Some(work), landed })
    }

    /// Starts computing `job`.
    pub fn submit(&self, job: MaskJob) -> PendingMask {
        let (out, rx) = mpsc::channel();
        let abandon = Arc::new(AtomicBool::new(false));
        if let Some(w) = &self.work {
            let _ = w.send((job, abandon.clone(), out));
        }
        PendingMask { rx, abandon, got: None }
    }

    /// Waits until a mask lands or `most` passes (the scheduler then looks at its queue and
    /// its clients again).
    pub fn wait(&self, most: Duration) {
        let _ = self.landed.recv_timeout(most);
    }

    /// Forgets the masks that landed so far (before looking at which are ready, so a mask that
    /// lands after the look still wakes [`wait`](Self::wait)).
    pub fn forget_landed(&self) {
        while self.landed.try_recv().is_ok() {}
    }
}

impl Drop for MaskPool {
    fn drop(&mut self) {
        // The threads end at their next look for work.
        self.work.take();
    }
}

/// A mask being computed for one sequence; dropping it (the sequence ended) abandons it.
#[derive(Debug)]
pub(crate) struct PendingMask {
    rx: mpsc::Receiver<Option<Mask>>,
    abandon: Arc<AtomicBool>,
    got: Option<Result<Mask, ()>>,
}

/// Where a pending mask is.
pub(crate) enum Landed<'a> {
    Ready(&'a Mask),
    Waiting,
    /// Its computation failed (a panic in the matcher).
    Failed,
}

impl PendingMask {
    pub fn poll(&mut self) -> Landed<'_> {
        if self.got.is_none() {
            self.got = match self.rx.try_recv() {
                Ok(Some(m)) => Some(Ok(m)),
                Ok(None) | Err(mpsc::TryRecvError::Disconnected) => Some(Err(())),
                Err(mpsc::TryRecvError::Empty) => None,
            };
        }
        match &self.got {
            Some(Ok(m)) => Landed::Ready(m),
            Some(Err(())) => Landed::Failed,
            None => Landed::Waiting,
        }
    }
}

impl Drop for PendingMask {
    fn drop(&mut self) {
        self.abandon.store(true, Ordering::Relaxed);
    }
}
