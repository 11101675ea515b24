//! The scheduler's state as the HTTP side sees it: whether the model is ready (or why it failed),
//! whether the server is stopping, and the queue's and batch's sizes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// The scheduler's state as the HTTP side sees it.
#[derive(Debug, Default)]
pub struct Status {
    /// Set once the model is loaded.
    pub ready: AtomicBool,
    /// The server is stopping: new requests are refused.
    pub draining: AtomicBool,
    /// The drain is over: answers still running end at the next step.
    pub cut: AtomicBool,
    /// The scheduler thread has ended (its prompt cache written out, if it had one).
    pub ended: AtomicBool,
    /// Why loading failed, if it did.
    pub failed: Mutex<Option<String>>,
    /// Jobs sent but not yet running.
    pub queued: AtomicUsize,
    /// Sequences in the running batch.
    pub active: AtomicUsize,
    /// The engine's expert-cache counters after the latest step.
    pub cache: Mutex<Option<k3_engine::CacheStats>>,
}

impl Status {
    /// Why the model cannot serve, once it cannot: its load failed, or the scheduler stopped
    /// (`/health` then answers 503 with this, whatever `ready` says).
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
