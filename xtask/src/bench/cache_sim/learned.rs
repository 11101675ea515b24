//! A learned replacement policy in FlashMoE's manner: a record's score from its recency and its
//! use counts at three time scales, fitted to what the offline optimum (Belady's MIN) looks at:
//! the log of the tokens until the record's next use. The examples are the records an LRU cache
//! weighed when it had to give one up, on another text (as Hawkeye and Glider learn from MIN's
//! decisions); the record expected back last is given up.

/// Half-lives, in tokens, of the decayed use counts.
const HALF_LIVES: [f64; 3] = [4.0, 16.0, 64.0];
/// Inputs of the model: bias, log age, the three decayed counts (log1p).
pub const INPUTS: usize = 5;

/// A record's use history, as decayed counts at its last use.
#[derive(Debug, Clone, Copy)]
pub struct Features {
    counts: [f64; 3],
}

impl Features {
    pub fn new() -> Features {
        Features { counts: [1.0; 3] }
    }

    /// A use `dt` tokens after the last.
    pub fn used(&mut self, dt: usize) {
        for (c, h) in self.counts.iter_mut().zip(HALF_LIVES) {
            *c = *c * 0.5f64.powf(dt as f64 / h) + 1.0;
        }
    }

    /// The model's inputs `age` tokens after the last use.
    pub fn at(&self, age: usize) -> [f64; INPUTS] {
        let d = |i: usize| (self.counts[i] * 0.5f64.powf(age as f64 / HALF_LIVES[i])).ln_1p();
        [1.0, (1.0 + age as f64).ln(), d(0), d(1), d(2)]
    }
}

/// The fitted model.
#[derive(Debug, Clone)]
pub struct Learned {
    pub w: [f64; INPUTS],
}

impl Learned {
    /// Higher keeps the record: minus its predicted log distance to the next use.
    pub fn score(&self, x: &[f64; INPUTS]) -> f64 {
        -self.w.iter().zip(x).map(|(a, b)| a * b).sum::<f64>()
    }

    /// Least squares of `ln(1 + tokens to the next use)` on the inputs.
    pub fn fit(samples: &[([f64; INPUTS], f64)]) -> Learned {
        let mut h = [[0.0; INPUTS]; INPUTS];
        let mut g = [0.0; INPUTS];
        for (x, y) in samples {
            for i in 0..INPUTS {
                g[i] += x[i] * y;
                for j in 0..INPUTS {
                    h[i][j] += x[i] * x[j];
                }
            }
        }
        for (i, row) in h.iter_mut().enumerate() {
            row[i] += 1e-9 * samples.len().max(1) as f64;
        }
        Learned { w: solve(h, g) }
    }
}

/// `h x = g` by Gaussian elimination with partial pivoting (h is positive definite).
fn solve(mut h: [[f64; INPUTS]; INPUTS], mut g: [f64; INPUTS]) -> [f64; INPUTS] {
    for c in 0..INPUTS {
        let p = (c..INPUTS).max_by(|&a, &b| h[a][c].abs().total_cmp(&h[b][c].abs())).unwrap_or(c);
        h.swap(c, p);
        g.swap(c, p);
        if h[c][c].abs() < 1e-300 {
            continue;
        }
        for r in c + 1..INPUTS {
            let f = h[r][c] / h[c][c];
            let pivot = h[c];
            h[r].iter_mut().zip(pivot).skip(c).for_each(|(a, b)| *a -= f * b);
            g[r] -= f * g[c];
        }
    }
    let mut x = [0.0; INPUTS];
    for c in (0..INPUTS).rev() {
        let s: f64 = (c + 1..INPUTS).map(|k| h[c][k] * x[k]).sum();
        x[c] = if h[c][c].abs() < 1e-300 { 0.0 } else { (g[c] - s) / h[c][c] };
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fit recovers a known linear model from noiseless targets.
    #[test]
    fn least_squares_recovers_a_known_model() {
        let truth = [-1.0, 0.5, -0.25, 0.8, 0.1];
        let samples: Vec<([f64; INPUTS], f64)> = (0..2000u64)
            .map(|i| {
                let f = |s: u64| ((i * 2654435761 + s * 40503) % 1000) as f64 / 500.0 - 1.0;
                let x = [1.0, f(1), f(2), f(3), f(4)];
                (x, truth.iter().zip(&x).map(|(a, b)| a * b).sum())
            })
            .collect();
        let m = Learned::fit(&samples);
        for (a, b) in m.w.iter().zip(truth) {
            assert!((a - b).abs() < 1e-6, "{:?} vs {truth:?}", m.w);
        }
    }
}
