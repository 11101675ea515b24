//! Nibble-packed weights (MXFP4, int4) as the few-vector kernels of both levels read them
//! against the split layout ([`super::split`]): a stored nibble is an unsigned level (`w +
//! offset`), through a 16-entry table for MXFP4, as is for int4 (its nibble is `w + 8`).

use half::f16;

use super::BLOCK;
use super::scales::{E8m0, GroupF16};
use crate::mxfp4::E2M1_DOUBLED;

/// `[rows, cols / 2]` packed bytes (low nibble = even column) and their block scales.
pub(super) struct Nibbles<'a, S> {
    pub q: &'a [u8],
    pub cols: usize,
    /// Nibble to `w + offset`, where a table is needed ([`lookup`](Self::lookup)).
    pub levels: [u8; 16],
    pub lookup: bool,
    /// What a stored level adds to its weight.
    pub offset: i32,
    pub scale: S,
}

/// MXFP4's doubled E2M1 levels (-12..=12) offset by 12, the half folded into the E8M0 scales.
pub(super) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Nibbles<'a, E8m0<'a>> {
    Nibbles {
        q: packed,
        cols,
        levels: E2M1_DOUBLED.map(|l| (l + 12) as u8),
        lookup: true,
        offset: 12,
        scale: E8m0 { scale, blocks: cols / BLOCK },
    }
}

/// int4 (levels nibble - 8, f16 scales per `group` columns).
pub(super) fn int4<'a>(q: &'a [u8], scale: &'a [f16], group: usize, cols: usize) -> Nibbles<'a, GroupF16<'a>> {
    Nibbles {
        q,
        cols,
        levels: std::array::from_fn(|n| n as u8),
        lookup: false,
        offset: 8,
        scale: GroupF16 { scale, group, groups: cols / group },
    }
}
