//! Signals, as a Unix tool should treat them: a closed standard output ends the program quietly
//! (`k3-cli inspect --json | head -1`), and Ctrl-C sets the running command's cancellation flag
//! while the model runs ([`arm`]), so it stops at the next token and keeps what it has
//! (statistics are still written); a second Ctrl-C exits at once. `generate` treats SIGTERM and
//! SIGHUP the same way. Outside a run (waiting for input) a signal ends the process at once: only
//! the model's loop looks at the flag, so a flag set while waiting would be a signal ignored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static CANCEL: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// A run that checks the flag is under way.
static ARMED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only atomics here: async-signal-safe.
    if ARMED.load(Ordering::SeqCst)
        && let Some(flag) = CANCEL.get()
        && !flag.swap(true, Ordering::SeqCst)
    {
        return;
    }
    // SAFETY: `_exit` is async-signal-safe; a second signal, or one while nothing checks the
    // flag, means "now".
    unsafe { libc::_exit(130) };
}

/// While the guard lives, a first signal sets the flag (the model's loop stops at the next
/// token) instead of ending the process.
#[must_use = "the flag is set only while the guard lives"]
pub struct Armed(());

pub fn arm() -> Armed {
    ARMED.store(true, Ordering::SeqCst);
    Armed(())
}

impl Drop for Armed {
    fn drop(&mut self) {
        ARMED.store(false, Ordering::SeqCst);
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

/// The flag Ctrl-C sets from now on, while [`arm`]ed (instead of killing the process).
pub fn ctrl_c_flag() -> Arc<AtomicBool> {
    stop_flag(&[libc::SIGINT])
}

/// The flag Ctrl-C, SIGTERM (what systemd and docker send) and SIGHUP (the terminal closed)
/// set from now on, while [`arm`]ed: a run that ends on any of them still writes what it has.
pub fn end_flag() -> Arc<AtomicBool> {
    stop_flag(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
}

fn stop_flag(signals: &[libc::c_int]) -> Arc<AtomicBool> {
    let flag = CANCEL.get_or_init(|| Arc::new(AtomicBool::new(false))).clone();
    for &sig in signals {
        // SAFETY: the handler only touches atomics (the flag is initialised before it is
        // installed) and calls `_exit`, both async-signal-safe.
        unsafe {
            libc::signal(sig, on_sigint as *const () as libc::sighandler_t);
        }
    }
    flag
}
