//! The reader: an I/O thread that owns the in-flight reads, and the caller's handle to it.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use xxhash_rust::xxh3::xxh3_64;

use crate::IoError;
use crate::arena::{ALIGN, Arena, Lease};
use crate::backend::{Backend, Done, Op, Pread, Uring};

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring, or the pread pool where io_uring cannot be set up.
    Auto,
    IoUring,
    Pread,
}

/// A fault to inject into a finished read (tests of the error paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The read fails with this errno.
    Errno(i32),
    /// The read returns only this many bytes (the reader must read the rest).
    Short(usize),
}

/// Decides, for a finished read `(tag, offset, len)`, whether to inject a fault.
pub type FaultHook = Arc<dyn Fn(u64, u64, usize) -> Option<Fault> + Send + Sync>;

#[derive(Clone)]
pub struct ReaderOptions {
    /// Reads in flight at once.
    pub queue_depth: usize,
    pub backend: BackendChoice,
    /// Check each record's xxh3 on arrival (when the request carries one).
    pub verify: bool,
    /// Bytes per slot (the largest record).
    pub slot_bytes: usize,
    /// Slots in the arena: reads in flight plus records kept (the expert cache).
    pub slots: usize,
    pub pread_threads: usize,
    #[doc(hidden)]
    pub fault: Option<FaultHook>,
    /// Behave as if io_uring could not be set up (tests of the fallback).
    #[doc(hidden)]
    pub simulate_no_io_uring: bool,
}

impl std::fmt::Debug for ReaderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderOptions")
            .field("queue_depth", &self.queue_depth)
            .field("backend", &self.backend)
            .field("verify", &self.verify)
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots)
            .field("pread_threads", &self.pread_threads)
            .finish_non_exhaustive()
    }
}

impl ReaderOptions {
    pub fn new(slot_bytes: usize, slots: usize) -> Self {
        ReaderOptions {
            queue_depth: 32,
            backend: BackendChoice::Auto,
            verify: true,
            slot_bytes,
            slots,
            pread_threads: 8,
            fault: None,
            simulate_no_io_uring: false,
        }
    }
}

/// A file opened by [`Reader::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Needed now (the current layer's routed experts): issued before any prefetch.
    Demand,
    /// A guess for `layer`: dropped, never issued, once the reader is told that layer has passed.
    Prefetch { layer: u32 },
}

#[derive(Debug, Clone, Copy)]
pub struct ReadRequest {
    pub file: FileId,
    pub offset: u64,
    pub len: usize,
    /// The arena slot to read into; it belongs to the reader until the completion arrives.
    pub slot: usize,
    /// Expected xxh3-64 of the `len` bytes.
    pub xxh3: Option<u64>,
    pub priority: Priority,
    /// The caller's name for this read (e.g. layer and expert), returned with the completion.
    pub tag: u64,
}

/// A finished (or dropped, or failed) read. After it is delivered the slot is the caller's again.
#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub slot: usize,
    pub len: usize,
    pub result: Result<(), IoError>,
}

struct Job {
    req: ReadRequest,
    fd: RawFd,
    path: Arc<PathBuf>,
    done: usize,
    /// Past this offset a read gives zeros ([`Reader::open_past_end`]; the file's length when
    /// opened): the aligned read of an expert read in place at the end of a checkpoint's file.
    file_len: u64,
}

enum Cmd {
    Read(Job),
    Layer(u32),
}

/// Reads records into arena slots on a dedicated thread.
pub struct Reader {
    arena: Arc<Arena>,
    cmd: Option<Sender<Cmd>>,
    done: Receiver<Completion>,
    thread: Option<JoinHandle<()>>,
    backend: String,
    /// Path, descriptor, opened with O_DIRECT, where reading past the end gives zeros (its length
    /// when opened; `u64::MAX` where it is an error).
    files: Vec<(Arc<PathBuf>, OwnedFd, bool, u64)>,
    in_flight: Vec<bool>,
    outstanding: usize,
    stash: VecDeque<Completion>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("backend", &self.backend)
            .field("outstanding", &self.outstanding)
            .finish_non_exhaustive()
    }
}

impl Reader {
    pub fn new(opts: ReaderOptions) -> Result<Reader, IoError> {
        let arena = Arc::new(Arena::new(opts.slot_bytes, opts.slots)?);
        let depth = opts.queue_depth.max(1);
        let uring = || {
            if opts.simulate_no_io_uring {
                Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
            } else {
                Uring::new(depth, &arena)
            }
        };
        let backend: Box<dyn Backend> = match opts.backend {
            BackendChoice::Pread => Box::new(Pread::new(opts.pread_threads)),
            BackendChoice::IoUring => {
                Box::new(uring().map_err(|e| IoError::Setup(format!("io_uring is not available here: {e}")))?)
            }
            BackendChoice::Auto => match uring() {
                Ok(u) => Box::new(u),
                Err(_) => Box::new(Pread::new(opts.pread_threads)),
            },
        };
        let name = backend.name();
        let (cmd_tx, cmd_rx) = channel();
        let (done_tx, done_rx) = channel();
        let io = IoThread {
            arena: arena.clone(),
            backend,
            depth,
            verify: opts.verify,
            fault: opts.fault.clone(),
            cmds: cmd_rx,
            out: done_tx,
            layer: 0,
            demand: VecDeque::new(),
            prefetch: VecDeque::new(),
            flying: HashMap::new(),
            next_id: 0,
        };
        let thread = std::thread::Builder::new()
            .name("k3-io".into())
            .spawn(move || io.run())
            .map_err(|e| IoError::Setup(format!("cannot start the I/O thread: {e}")))?;
        let slots = arena.slots();
        Ok(Reader {
            arena,
            cmd: Some(cmd_tx),
            done: done_rx,
            thread: Some(thread),
            backend: name,
            files: Vec::new(),
            in_flight: vec![false; slots],
            outstanding: 0,
            stash: VecDeque::new(),
        })
    }

    /// The backend in use, for people (`io_uring (registered buffers)`, `io_uring`, `pread x 8 threads`).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Opens a file for reading with O_DIRECT; where the filesystem refuses O_DIRECT (tmpfs), opens
    /// it buffered ([`is_direct`](Self::is_direct) tells). A read past its end is an error (a
    /// truncated file).
    pub fn open(&mut self, path: &Path) -> Result<FileId, IoError> {
        self.open_with(path, None)
    }

    /// [`open`](Self::open), where a read may run past the file's end and what lies past it
    /// reads as zeros: a checkpoint's file whose last expert's aligned read ends beyond it. The
    /// file must be `len` bytes (as the model says), or it is refused.
    pub fn open_past_end(&mut self, path: &Path, len: u64) -> Result<FileId, IoError> {
        self.open_with(path, Some(len))
    }

    fn open_with(&mut self, path: &Path, past_end: Option<u64>) -> Result<FileId, IoError> {
        let open = |flags| std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path);
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open(0).map_err(|e| IoError::Open { path: path.to_path_buf(), source: e })?, false)
            }
            Err(e) => return Err(IoError::Open { path: path.to_path_buf(), source: e }),
        };
        let len = file.metadata().map_err(|e| IoError::Open { path: path.to_path_buf(), source: e })?.len();
        if past_end.is_some_and(|want| want != len) {
            let why = format!("is {len} bytes, not the {} the model was converted from", past_end.unwrap_or(0));
            return Err(IoError::Open { path: path.to_path_buf(), source: std::io::Error::other(why) });
        }
        let end = if past_end.is_some() { len } else { u64::MAX };
        self.files.push((Arc::new(path.to_path_buf()), OwnedFd::from(file), direct, end));
        Ok(FileId(self.files.len() as u32 - 1))
    }

    pub fn is_direct(&self, file: FileId) -> bool {
        self.files[file.0 as usize].2
    }

    /// Queues a read. The slot must not be in flight; with O_DIRECT, offset and length must be
    /// multiples of 4096 (records are).
    pub fn submit(&mut self, req: ReadRequest) -> Result<(), IoError> {
        let (path, fd, direct, file_len) =
            self.files.get(req.file.0 as usize).ok_or_else(|| IoError::Request("unknown file".into()))?;
        if req.slot >= self.in_flight.len() || self.in_flight[req.slot] {
            return Err(IoError::Request(format!("slot {} is out of range or already being read", req.slot)));
        }
        if self.arena.is_leased(req.slot) {
            return Err(IoError::Request(format!("slot {} is leased: its record is still being used", req.slot)));
        }
        if req.len == 0 || req.len > self.arena.slot_bytes() || req.len > u32::MAX as usize {
            return Err(IoError::Request(format!(
                "{} bytes do not fit a {}-byte slot",
                req.len,
                self.arena.slot_bytes()
            )));
        }
        if *direct && (!req.offset.is_multiple_of(ALIGN as u64) || !req.len.is_multiple_of(ALIGN)) {
            return Err(IoError::Request(format!(
                "{}: O_DIRECT read at offset {} of {} bytes is not 4096-aligned",
                path.display(),
                req.offset,
                req.len
            )));
        }
        let job = Job { req, fd: fd.as_raw_fd(), path: path.clone(), done: 0, file_len: *file_len };
        self.cmd.as_ref().ok_or(IoError::Closed)?.send(Cmd::Read(job)).map_err(|_| IoError::Closed)?;
        self.in_flight[req.slot] = true;
        self.outstanding += 1;
        Ok(())
    }

    /// Tells the reader that decode has reached `layer`: queued prefetches for earlier layers are
    /// dropped (they complete with [`IoError::Stale`]) and never issued.
    pub fn set_layer(&self, layer: u32) {
        if let Some(c) = &self.cmd {
            let _ = c.send(Cmd::Layer(layer));
        }
    }

    /// Reads submitted and not yet delivered.
    pub fn outstanding(&self) -> usize {
        self.outstanding + self.stash.len()
    }

    fn receive(&mut self) -> Option<Completion> {
        if self.outstanding == 0 {
            return None;
        }
        let c = self.done.recv().ok()?;
        self.in_flight[c.slot] = false;
        self.outstanding -= 1;
        Some(c)
    }

    /// The next completion in arrival order (blocking); `None` when nothing is outstanding.
    pub fn next_completion(&mut self) -> Option<Completion> {
        self.stash.pop_front().or_else(|| self.receive())
    }

    /// The first completion, in arrival order, whose tag satisfies `wanted` (others are kept for
    /// later); `None` when no outstanding read could satisfy it.
    pub fn wait_any(&mut self, wanted: impl Fn(u64) -> bool) -> Option<Completion> {
        if let Some(i) = self.stash.iter().position(|c| wanted(c.tag)) {
            return self.stash.remove(i);
        }
        while let Some(c) = self.receive() {
            if wanted(c.tag) {
                return Some(c);
            }
            self.stash.push_back(c);
        }
        None
    }

    /// A lease on the first `len` bytes of `slot` (for another thread), unless a read into it is
    /// in flight.
    pub fn lease(&self, slot: usize, len: usize) -> Option<Lease> {
        if slot >= self.in_flight.len() || self.in_flight[slot] || len > self.arena.slot_bytes() {
            return None;
        }
        Some(Lease::new(self.arena.clone(), slot, len))
    }

    /// Whether a lease on `slot` is alive.
    pub fn is_leased(&self, slot: usize) -> bool {
        slot < self.in_flight.len() && self.arena.is_leased(slot)
    }

    /// The first `len` bytes of `slot`, unless a read into it is in flight.
    pub fn data(&self, slot: usize, len: usize) -> Option<&[u8]> {
        if slot >= self.in_flight.len() || self.in_flight[slot] || len > self.arena.slot_bytes() {
            return None;
        }
        // SAFETY: no read is in flight into this slot (the reader marks a slot in flight from
        // submit until its completion is received), so nothing writes it while borrowed; and no
        // new read can be submitted into it while `&self` is borrowed (submit takes `&mut self`).
        Some(unsafe { self.arena.slot(slot, len) })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Closing the command channel makes the I/O thread finish what is in flight and stop;
        // only then may the files close and the arena go.
        self.cmd = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct IoThread {
    arena: Arc<Arena>,
    backend: Box<dyn Backend>,
    depth: usize,
    verify: bool,
    fault: Option<FaultHook>,
    cmds: Receiver<Cmd>,
    out: Sender<Completion>,
    layer: u32,
    demand: VecDeque<Job>,
    prefetch: VecDeque<Job>,
    flying: HashMap<u64, Job>,
    next_id: u64,
}

impl IoThread {
    fn run(mut self) {
        let mut closed = false;
        let mut done = Vec::new();
        loop {
            let idle = self.flying.is_empty() && self.demand.is_empty() && self.prefetch.is_empty();
            if idle {
                if closed {
                    return;
                }
                match self.cmds.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => closed = true,
                }
            }
            loop {
                match self.cmds.try_recv() {
                    Ok(c) => self.command(c),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            if closed {
                // Nobody will take new completions' slots; finish only what the kernel holds.
                self.demand.clear();
                self.prefetch.clear();
            }
            // Demand reads may fill the queue; prefetches only three quarters of it, so a demand
            // read arriving later never waits behind a full queue of guesses.
            let prefetch_depth = (self.depth * 3 / 4).max(1);
            while self.flying.len() < self.depth {
                let job = match self.demand.pop_front() {
                    Some(j) => j,
                    None if self.flying.len() < prefetch_depth => match self.prefetch.pop_front() {
                        Some(j) => j,
                        None => break,
                    },
                    None => break,
                };
                self.issue(job);
            }
            if !self.flying.is_empty() {
                done.clear();
                if let Err(e) = self.backend.wait(1, &mut done) {
                    // The backend itself broke: fail everything in flight rather than hang.
                    let ids: Vec<u64> = self.flying.keys().copied().collect();
                    for id in ids {
                        let job = self.flying.remove(&id).expect("present");
                        let err = IoError::Read {
                            path: (*job.path).clone(),
                            offset: job.req.offset,
                            len: job.req.len,
                            source: std::io::Error::new(e.kind(), e.to_string()),
                        };
                        self.finish(job, Err(err));
                    }
                    continue;
                }
                for d in done.drain(..) {
                    self.completed(d);
                }
            }
        }
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Read(job) => match job.req.priority {
                Priority::Demand => self.demand.push_back(job),
                Priority::Prefetch { layer } if layer < self.layer => self.finish(job, Err(IoError::Stale)),
                Priority::Prefetch { .. } => self.prefetch.push_back(job),
            },
            Cmd::Layer(l) => {
                self.layer = l;
                let (keep, stale): (VecDeque<Job>, VecDeque<Job>) = self
                    .prefetch
                    .drain(..)
                    .partition(|j| matches!(j.req.priority, Priority::Prefetch { layer } if layer >= l));
                self.prefetch = keep;
                for j in stale {
                    self.finish(j, Err(IoError::Stale));
                }
            }
        }
    }

    fn issue(&mut self, job: Job) {
        let id = self.next_id;
        self.next_id += 1;
        let op = Op {
            id,
            fd: job.fd,
            // SAFETY (of the arithmetic): job.done < len <= slot_bytes keeps the pointer in the slot.
            ptr: self.arena.slot_ptr(job.req.slot).wrapping_add(job.done),
            len: (job.req.len - job.done) as u32,
            offset: job.req.offset + job.done as u64,
            slot: job.req.slot as u16,
        };
        match self.backend.submit(op) {
            Ok(()) => {
                self.flying.insert(id, job);
            }
            Err(e) => {
                let err = IoError::Read { path: (*job.path).clone(), offset: op.offset, len: job.req.len, source: e };
                self.finish(job, Err(err));
            }
        }
    }

    fn completed(&mut self, d: Done) {
        let Some(mut job) = self.flying.remove(&d.id) else { return };
        let mut res = d.res;
        if let Some(hook) = &self.fault {
            match hook(job.req.tag, job.req.offset + job.done as u64, job.req.len - job.done) {
                Some(Fault::Errno(e)) => res = -e,
                Some(Fault::Short(n)) if res > 0 => res = res.min(n as i32),
                _ => {}
            }
        }
        if res < 0 {
            let errno = -res;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return self.issue(job);
            }
            let err = IoError::Read {
                path: (*job.path).clone(),
                offset: job.req.offset + job.done as u64,
                len: job.req.len,
                source: std::io::Error::from_raw_os_error(errno),
            };
            return self.finish(job, Err(err));
        }
        let at_end = |job: &Job| job.req.offset + job.done as u64 >= job.file_len;
        if res == 0 && !at_end(&job) {
            let err =
                IoError::Eof { path: (*job.path).clone(), offset: job.req.offset, got: job.done, len: job.req.len };
            return self.finish(job, Err(err));
        }
        job.done += res as usize;
        if job.done < job.req.len && at_end(&job) {
            // SAFETY: the slot holds `len` bytes (checked at submit) and belongs to this thread
            // until its completion is delivered; `done < len`.
            unsafe {
                std::ptr::write_bytes(self.arena.slot_ptr(job.req.slot).add(job.done), 0, job.req.len - job.done);
            }
            job.done = job.req.len;
        }
        if job.done < job.req.len {
            // A short read: ask for the rest (the same slot, further on).
            return self.issue(job);
        }
        let result = match (self.verify, job.req.xxh3) {
            (true, Some(stored)) => {
                // SAFETY: the read into this slot has completed and its completion is not yet
                // delivered: this thread is the slot's only user.
                let computed = xxh3_64(unsafe { self.arena.slot(job.req.slot, job.req.len) });
                if computed == stored {
                    Ok(())
                } else {
                    Err(IoError::Checksum {
                        path: (*job.path).clone(),
                        offset: job.req.offset,
                        len: job.req.len,
                        stored,
                        computed,
                    })
                }
            }
            _ => Ok(()),
        };
        self.finish(job, result);
    }

    fn finish(&mut self, job: Job, result: Result<(), IoError>) {
        let _ = self.out.send(Completion { tag: job.req.tag, slot: job.req.slot, len: job.req.len, result });
    }
}
