//! The store's writer thread: states are serialized by the caller and written here, so the
//! caller's step does not wait on the drive.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};
use std::thread::JoinHandle;

use super::files::write_private;

/// A state to write: its file, bytes, and what the index will say of it.
pub struct Work {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub owner: u64,
    pub ids: Vec<u32>,
    pub logits: bool,
}

/// A write the writer thread has finished.
pub struct Written {
    pub path: PathBuf,
    pub owner: u64,
    pub ids: Vec<u32>,
    pub logits: bool,
    pub result: Result<u64, String>,
}

/// States being written and waiting at most: past that, `save` skips. The channel holds as many,
/// so a state sent while fewer are outstanding always finds room (the writer may not have taken
/// the one before off the channel yet).
pub const QUEUE: usize = 2;

/// Starts the writer: work in, finished writes out.
pub fn spawn() -> std::io::Result<(SyncSender<Work>, JoinHandle<()>, Receiver<Written>)> {
    let (work_tx, work_rx) = sync_channel::<Work>(QUEUE);
    let (done_tx, done_rx) = channel();
    let thread = std::thread::Builder::new().name("k3-state-writer".into()).spawn(move || {
        for Work { path, bytes, owner, ids, logits } in work_rx {
            let result = write_private(&path, &bytes, true).map(|()| bytes.len() as u64).map_err(|e| e.to_string());
            if done_tx.send(Written { path, owner, ids, logits, result }).is_err() {
                break;
            }
        }
    })?;
    Ok((work_tx, thread, done_rx))
}
