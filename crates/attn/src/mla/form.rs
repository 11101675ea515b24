//! Which form of MLA attention a chunk runs: absorbed (queries projected into the latent space,
//! every position pair costs `H (2 L + R)` multiply-adds) or expanded (the span's latents
//! decompressed once per chunk into per-head keys and values, `S H (nope + v) L`, after which a
//! pair costs `H (nope + R + v)`). Decode and short chunks are cheaper absorbed; a chunk of a few
//! hundred tokens or more is cheaper expanded. Either form gives a row the same bits however the
//! rows are batched and on any number of threads; the two forms differ in the last bits.

use std::str::FromStr;

use super::MlaConfig;

/// Fewer rows than this stay absorbed whatever the count says: decode, a session's first
/// token, speculative drafts (a short span decompressed costs about what a query's absorption
/// does, and these should run decode's form).
const MIN_EXPANDED_ROWS: usize = 32;

/// The form of MLA attention a chunk runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlaForm {
    /// Whichever costs fewer multiply-adds for the chunk and its span ([`MlaForm::expands`]).
    #[default]
    Auto,
    /// Always absorbed (decode's form): a chunk gives the bits of stepping its tokens one by one.
    Absorbed,
    /// Always expanded (the reference models' form for prefill).
    Expanded,
}

impl MlaForm {
    pub const NAMES: [&'static str; 3] = ["auto", "absorbed", "expanded"];

    pub fn name(self) -> &'static str {
        match self {
            MlaForm::Auto => "auto",
            MlaForm::Absorbed => "absorbed",
            MlaForm::Expanded => "expanded",
        }
    }

    /// Whether a chunk of `rows` queries of one sequence, whose cache holds `len` positions with
    /// them, runs expanded.
    pub fn expands(self, cfg: &MlaConfig, rows: usize, len: usize) -> bool {
        match self {
            MlaForm::Absorbed => false,
            MlaForm::Expanded => true,
            MlaForm::Auto => {
                let (absorbed, expanded) = costs(cfg, rows, len);
                rows >= MIN_EXPANDED_ROWS && expanded < absorbed
            }
        }
    }
}

impl FromStr for MlaForm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(MlaForm::Auto),
            "absorbed" => Ok(MlaForm::Absorbed),
            "expanded" => Ok(MlaForm::Expanded),
            _ => Err(format!("`{s}` is not an MLA form (auto, absorbed or expanded)")),
        }
    }
}

/// Multiply-adds of the chunk's attention `(absorbed, expanded)` for `rows` queries ending at
/// `len` cached positions (row `i` sees `len - rows + i + 1` of them).
pub fn costs(cfg: &MlaConfig, rows: usize, len: usize) -> (u128, u128) {
    let (h, l, r) = (cfg.heads as u128, cfg.kv_lora as u128, cfg.rope as u128);
    let (nope, v) = (cfg.nope as u128, cfg.v_dim as u128);
    let (n, s) = (rows as u128, len.max(rows) as u128);
    let pairs = n * (s - n) + n * (n + 1) / 2;
    let absorbed = n * h * (nope + v) * l + h * pairs * (2 * l + r);
    let expanded = s * h * (nope + v) * l + h * pairs * (nope + r + v);
    (absorbed, expanded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mla::PositionEmbedding;

    fn k3() -> MlaConfig {
        MlaConfig {
            hidden: 7168,
            heads: 96,
            kv_lora: 512,
            nope: 128,
            rope: 64,
            v_dim: 128,
            lowrank_eps: 1e-6,
            positions: PositionEmbedding::None,
        }
    }

    #[test]
    fn decode_stays_absorbed_and_long_chunks_expand() {
        let cfg = k3();
        for len in [1, 4096, 65_536, 1 << 20] {
            assert!(!MlaForm::Auto.expands(&cfg, 1, len), "decode at {len}");
            assert!(!MlaForm::Auto.expands(&cfg, 16, len), "a short chunk at {len}");
        }
        assert!(MlaForm::Auto.expands(&cfg, 512, 512), "a first chunk of 512");
        assert!(MlaForm::Auto.expands(&cfg, 2048, 65_536), "a chunk of 2048 at 64k");
        // The arithmetic: per position and query, 96 x (576 + 512) absorbed against
        // 96 x (192 + 128) expanded, plus 12.6 M per position decompressed once.
        let (a, e) = costs(&cfg, 2048, 65_536);
        let ratio = a as f64 / e as f64;
        assert!((2.5..3.2).contains(&ratio), "{ratio}");
        assert!(!MlaForm::Absorbed.expands(&cfg, 4096, 4096) && MlaForm::Expanded.expands(&cfg, 1, 1));
    }

    #[test]
    fn names_parse_back() {
        for name in MlaForm::NAMES {
            assert_eq!(name.parse::<MlaForm>().unwrap().name(), name);
        }
        assert!("fast".parse::<MlaForm>().unwrap_err().contains("auto, absorbed or expanded"));
    }
}
