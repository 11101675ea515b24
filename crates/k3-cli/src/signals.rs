//! Signals, as a Unix tool should treat them: a closed standard output ends the program quietly
//! (`k3-cli inspect --json | head -1`), and Ctrl-C asks the running command to stop at the next
//! token, keeping what it has (statistics are still written); a second Ctrl-C exits at once.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe; a second Ctrl-C means "now".
        unsafe { libc::_exit(130) };
    }
}

/// Restores the default action of SIGPIPE (Rust ignores it, so writing to a closed pipe would be
/// an error — or a panic in `println!` — instead of the quiet end every Unix tool has).
pub fn quiet_broken_pipe() {
    // SAFETY: setting a signal's disposition to its default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// From now on Ctrl-C sets [`interrupted`] instead of killing the process.
pub fn catch_ctrl_c() {
    // SAFETY: the handler only touches an atomic and calls `_exit`, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// Whether Ctrl-C was pressed since the last [`reset`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn reset() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}
