//! Which form KDA runs a run of positions in: the recurrence (the state read and updated once a
//! position, in one fused pass) or chunked (the reference kernels' WY / UT form: the state read
//! and updated once every [`CHUNK`](super::wy::CHUNK) positions by matrix products, with ~1.3x
//! the multiply-adds plus per-chunk exponentials and a triangular inverse). The recurrence is
//! the default because it measures faster on every CPU tried (`cargo xtask bench attn` prints
//! both each run; docs/EFFICIENCY.md); the forms differ in the last bits.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KdaForm {
    /// Position by position: any cut of the positions gives the bits of stepping them.
    #[default]
    Recurrent,
    /// In chunks counted from a run's first position.
    Chunked,
}
