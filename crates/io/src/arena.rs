//! Page-aligned slot memory shared with the kernel.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

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
        Ok(Arena { ptr, slot_bytes, slots: slots.max(1), layout })
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

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the reader joins its I/O thread (so no read
        // is in flight) before its arena can be dropped.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
