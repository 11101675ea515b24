//! Page-aligned slot memory shared with the kernel.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::IoError;

/// Alignment of every slot: the O_DIRECT unit on every drive k3 targets.
pub const ALIGN: usize = 4096;

/// `slots` equal slots of `slot_bytes` (rounded up to 4 KiB) in one allocation.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    slot_bytes: usize,
    slots: usize,
    layout: Layout,
    /// Per slot: how many [`Lease`]s are alive (a leased slot is never read into).
    leases: Vec<AtomicU32>,
}

// SAFETY: the arena is plain memory. Who may touch which slot when is decided by the reader's
// slot-ownership protocol (a slot in flight is only written by the kernel; a completed slot is only
// read by its owner), not by the type, so sharing the owner across threads is sound.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    pub fn new(slot_bytes: usize, slots: usize) -> Result<Arena, IoError> {
        let slot_bytes = slot_bytes.max(1).next_multiple_of(ALIGN);
        let total =
            slot_bytes.checked_mul(slots.max(1)).ok_or_else(|| IoError::Setup("arena size overflows".into()))?;
        let layout = Layout::from_size_align(total, ALIGN).map_err(|e| IoError::Setup(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| IoError::Setup(format!("cannot allocate {total} bytes of read buffers")))?;
        let leases = (0..slots.max(1)).map(|_| AtomicU32::new(0)).collect();
        Ok(Arena { ptr, slot_bytes, slots: slots.max(1), layout, leases })
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn bytes(&self) -> usize {
        self.layout.size()
    }

    /// The start of slot `i` (for the kernel).
    pub(crate) fn slot_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.slots, "slot {i} of {}", self.slots);
        // SAFETY: i < slots, so the offset stays inside the allocation.
        unsafe { self.ptr.as_ptr().add(i * self.slot_bytes) }
    }

    /// The first `len` bytes of slot `i`.
    ///
    /// # Safety
    /// Nothing may write slot `i` (no read in flight into it) while the borrow lives.
    pub(crate) unsafe fn slot(&self, i: usize, len: usize) -> &[u8] {
        assert!(len <= self.slot_bytes, "{len} bytes from a {}-byte slot", self.slot_bytes);
        // SAFETY: in bounds (checked), initialized (zeroed at allocation), not written concurrently
        // (the caller's promise).
        unsafe { std::slice::from_raw_parts(self.slot_ptr(i), len) }
    }
}

impl Arena {
    /// Whether any lease on slot `i` is alive.
    pub(crate) fn is_leased(&self, i: usize) -> bool {
        self.leases[i].load(Ordering::Acquire) > 0
    }
}

/// A resident record's bytes, shareable with other threads (a compute pool working on an expert
/// while the I/O thread reads others). While any lease on a slot lives, nothing reads into that
/// slot — the reader refuses, the cache never evicts it — and the arena's memory outlives the
/// reader for it.
pub struct Lease {
    arena: Arc<Arena>,
    slot: usize,
    len: usize,
}

impl Lease {
    /// Slot `slot`'s first `len` bytes, which nothing is writing: the caller (the reader) checks.
    pub(crate) fn new(arena: Arc<Arena>, slot: usize, len: usize) -> Lease {
        arena.leases[slot].fetch_add(1, Ordering::AcqRel);
        Lease { arena, slot, len }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: no read was in flight into the slot when the lease was made (`Reader::lease`),
        // and none can start while it lives (`Reader::submit` refuses a leased slot), so nothing
        // writes these bytes while they are borrowed; the arena is kept alive by the `Arc`.
        unsafe { self.arena.slot(self.slot, self.len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.arena.leases[self.slot].fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("slot", &self.slot).field("len", &self.len).finish()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the reader joins its I/O thread (so no read
        // is in flight) before its arena can be dropped.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
