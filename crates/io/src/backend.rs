//! The two ways of issuing reads: io_uring (registered buffers when the memlock limit allows) and
//! a pread thread pool (where io_uring is unavailable, or when asked for).

use std::io;
use std::os::fd::RawFd;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use io_uring::{IoUring, opcode, types};

use crate::arena::Arena;

/// One read into a slot. `ptr` points into the arena, inside slot `slot`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op {
    pub id: u64,
    pub fd: RawFd,
    pub ptr: *mut u8,
    pub len: u32,
    pub offset: u64,
    pub slot: u16,
}

// SAFETY: `ptr` points into the arena, which outlives every op (the reader drains all reads
// before the arena is dropped); the slot protocol gives the op exclusive use of those bytes.
unsafe impl Send for Op {}

/// A finished read: bytes read, or a negative errno.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub id: u64,
    pub res: i32,
}

pub(crate) trait Backend: Send {
    fn name(&self) -> String;
    fn submit(&mut self, op: Op) -> io::Result<()>;
    /// Waits until at least `min` reads have finished (if that many are in flight) and appends
    /// every finished read to `out`.
    fn wait(&mut self, min: usize, out: &mut Vec<Done>) -> io::Result<()>;
}

pub(crate) struct Uring {
    ring: IoUring,
    registered: bool,
    in_flight: usize,
}

impl Uring {
    pub fn new(depth: usize, arena: &Arena) -> io::Result<Uring> {
        let ring = IoUring::new((depth.max(1) as u32).next_power_of_two())?;
        let iovecs: Vec<libc::iovec> = (0..arena.slots())
            .map(|i| libc::iovec { iov_base: arena.slot_ptr(i).cast(), iov_len: arena.slot_bytes() })
            .collect();
        // Registered buffers count against RLIMIT_MEMLOCK; where it is too small, plain reads into
        // the same buffers work as well (slightly more kernel work per read).
        let registered = arena.slots() <= usize::from(u16::MAX)
            // SAFETY: the iovecs describe the arena, which outlives the ring (the reader drops the
            // backend, and so the ring, before the arena).
            && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Uring { ring, registered, in_flight: 0 })
    }
}

impl Backend for Uring {
    fn name(&self) -> String {
        if self.registered { "io_uring (registered buffers)".into() } else { "io_uring".into() }
    }

    fn submit(&mut self, op: Op) -> io::Result<()> {
        let fd = types::Fd(op.fd);
        let entry = if self.registered {
            opcode::ReadFixed::new(fd, op.ptr, op.len, op.slot).offset(op.offset).build()
        } else {
            opcode::Read::new(fd, op.ptr, op.len).offset(op.offset).build()
        }
        .user_data(op.id);
        // SAFETY: the buffer stays valid and untouched by anyone else until the completion for
        // `op.id` is reaped (slot protocol).
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.ring.submit()?;
        }
        self.ring.submit()?;
        self.in_flight += 1;
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Done>) -> io::Result<()> {
        let want = min.min(self.in_flight);
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        for cqe in self.ring.completion() {
            out.push(Done { id: cqe.user_data(), res: cqe.result() });
            self.in_flight -= 1;
        }
        Ok(())
    }
}

/// A pool of threads doing `pread`, for kernels or sandboxes without io_uring.
pub(crate) struct Pread {
    ops: Option<Sender<Op>>,
    done: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
    in_flight: usize,
}

impl Pread {
    pub fn new(threads: usize) -> Pread {
        let (op_tx, op_rx) = channel::<Op>();
        let (done_tx, done_rx) = channel();
        let op_rx = Arc::new(Mutex::new(op_rx));
        let threads = (0..threads.max(1))
            .map(|_| {
                let (rx, tx) = (op_rx.clone(), done_tx.clone());
                std::thread::spawn(move || {
                    loop {
                        let op = match rx.lock().map(|r| r.recv()) {
                            Ok(Ok(op)) => op,
                            _ => return,
                        };
                        // SAFETY: the op's buffer is exclusively this read's until its Done is
                        // delivered (slot protocol) and lies inside the live arena.
                        let n = unsafe { libc::pread(op.fd, op.ptr.cast(), op.len as usize, op.offset as libc::off_t) };
                        let res = if n < 0 {
                            -io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                        } else {
                            n as i32
                        };
                        if tx.send(Done { id: op.id, res }).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Pread { ops: Some(op_tx), done: done_rx, threads, in_flight: 0 }
    }
}

impl Backend for Pread {
    fn name(&self) -> String {
        format!("pread x {} threads", self.threads.len())
    }

    fn submit(&mut self, op: Op) -> io::Result<()> {
        self.ops
            .as_ref()
            .and_then(|s| s.send(op).ok())
            .ok_or_else(|| io::Error::other("pread workers have stopped"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Done>) -> io::Result<()> {
        let want = min.min(self.in_flight);
        for _ in 0..want {
            let d = self.done.recv().map_err(|_| io::Error::other("pread workers have stopped"))?;
            out.push(d);
            self.in_flight -= 1;
        }
        while let Ok(d) = self.done.try_recv() {
            out.push(d);
            self.in_flight -= 1;
        }
        Ok(())
    }
}

impl Drop for Pread {
    fn drop(&mut self) {
        self.ops = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
