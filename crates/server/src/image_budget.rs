//! Image pixels, the measure of what images cost: decoding takes memory in proportion to them
//! (about 3 bytes a pixel of RGB plus the decoder's own buffers) and resizing takes time. A
//! request may bring so many pixels ([`ImageLimits::per_request`], counted from the headers
//! before anything is decoded), and so many may be in flight across the server
//! ([`ImageLimits::in_flight`]: decoded and not yet resized into the tower's patches). A request
//! takes its pixels from the in-flight budget before decoding ([`InFlight::acquire`]), waits
//! at most [`ImageLimits::wait`] for them, and gives each image's back when its patches are made,
//! when it fails, or when the client goes away ([`Lease`] returns them when dropped).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How many image pixels a request may bring and how many may be in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Pixels of all a request's images, by their headers.
    pub per_request: u64,
    /// Pixels decoded and waiting for (or in) their resize across the server; at least
    /// `per_request` (raised to it), so any request that passes its own check can fit.
    pub in_flight: u64,
    /// How long a request waits for in-flight pixels before it is answered 503.
    pub wait: Duration,
}

/// The largest image the decoder takes (64 megapixels, [`k3_vision::DecodeLimits`]).
const LARGEST: u64 = 64_000_000;

impl Default for ImageLimits {
    /// Two of the largest images a request, four in flight (about 0.8 GB of decoded RGB plus
    /// the decoders' buffers), ten seconds of waiting.
    fn default() -> Self {
        ImageLimits { per_request: 2 * LARGEST, in_flight: 4 * LARGEST, wait: Duration::from_secs(10) }
    }
}

/// Megapixels as people write them: `128` or `0.5`.
pub fn megapixels(pixels: u64) -> String {
    let mp = pixels as f64 / 1e6;
    if mp.fract() == 0.0 { format!("{mp:.0}") } else { format!("{mp}") }
}

/// The server's in-flight pixels: a counting semaphore whose permits are pixels.
#[derive(Debug)]
pub struct InFlight {
    cap: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl InFlight {
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(InFlight { cap, used: Mutex::new(0), freed: Condvar::new() })
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn used(&self) -> MutexGuard<'_, u64> {
        // A panic elsewhere cannot leave the count half-written: it is one integer.
        self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `pixels` of the budget, waiting at most `wait` for others to give theirs back (a
    /// blocking call: for a blocking thread, never an async worker). `Err` with the pixels in
    /// flight when they did not come free in time; more than the whole budget never can.
    pub fn acquire(self: &Arc<Self>, pixels: u64, wait: Duration) -> Result<Lease, u64> {
        let deadline = Instant::now() + wait;
        let mut used = self.used();
        loop {
            if pixels <= self.cap.saturating_sub(*used) {
                *used += pixels;
                return Ok(Lease { budget: self.clone(), pixels });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || pixels > self.cap {
                return Err(*used);
            }
            used = self.freed.wait_timeout(used, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }

    /// Pixels in flight now.
    pub fn in_use(&self) -> u64 {
        *self.used()
    }
}

/// Pixels taken from the in-flight budget, given back when dropped.
#[derive(Debug)]
pub struct Lease {
    budget: Arc<InFlight>,
    pixels: u64,
}

impl Lease {
    /// `pixels` of this lease as a lease of their own (an image's share of its request's).
    pub fn split(&mut self, pixels: u64) -> Lease {
        let pixels = pixels.min(self.pixels);
        self.pixels -= pixels;
        Lease { budget: self.budget.clone(), pixels }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.pixels > 0 {
            let mut used = self.budget.used();
            *used = used.saturating_sub(self.pixels);
            drop(used);
            self.budget.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_come_back_when_leases_drop_and_waiters_get_them() {
        let b = InFlight::new(100);
        let mut whole = b.acquire(100, Duration::ZERO).unwrap();
        assert_eq!(b.acquire(1, Duration::ZERO).unwrap_err(), 100);
        let part = whole.split(30);
        drop(whole);
        assert_eq!(b.in_use(), 30);
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || b.acquire(100, Duration::from_secs(60)).map(|l| l.pixels))
        };
        drop(part);
        assert_eq!(waiter.join().unwrap(), Ok(100));
        assert_eq!(b.in_use(), 0);
        assert_eq!(b.acquire(101, Duration::from_secs(60)).unwrap_err(), 0, "more than the budget never waits");
    }
}
