//! A small deterministic generator (xorshift64) for tests, benchmarks and encoder sampling, so
//! every run with the same seed sees the same numbers.

#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn gaussian(&mut self) -> f32 {
        ((-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()) as f32
    }
}

/// `n` standard normal values.
pub fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut r = XorShift::new(seed);
    (0..n).map(|_| r.gaussian()).collect()
}

/// `n` values uniform in `[-scale/2, scale/2)`.
pub fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut r = XorShift::new(seed);
    (0..n).map(|_| ((r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale).collect()
}
