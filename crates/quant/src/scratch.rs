//! Per-thread buffers kept between products: taken out while in use, so a product that starts
//! another on the same thread (as rayon's work stealing can) gets its own, and put back after.

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` on this thread's `T` from `key` (a fresh one if it is in use or new).
pub(crate) fn with_taken<T: Default, R>(key: &'static LocalKey<Cell<Option<T>>>, f: impl FnOnce(&mut T) -> R) -> R {
    let mut buffers = key.take().unwrap_or_default();
    let r = f(&mut buffers);
    key.set(Some(buffers));
    r
}
