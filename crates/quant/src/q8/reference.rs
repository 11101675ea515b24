//! Scalar references: each block's integer dot exactly, then accumulated block by block in
//! order with one fused multiply-add, `acc = fma(dot, step * weight scale, acc)`. This order is
//! the definition: the VNNI kernels follow it exactly, so they give these bits.

use half::f16;

use super::{BLOCK, Q8Batch};
use crate::mxfp4::{E2M1_DOUBLED, SCALE_HALF};

/// One block quantized: `u = round(x / d) + 128` (halves away from zero), `d = max|x| / 127`;
/// a NaN or an infinity makes every value 128 and the step NaN. Returns the step.
pub fn quantize_block(xb: &[f32], ub: &mut [u8]) -> f32 {
    if xb.iter().any(|v| !v.is_finite()) {
        ub.fill(128);
        return f32::NAN;
    }
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (u, x) in ub.iter_mut().zip(xb) {
        *u = ((x * inv).round().clamp(-127.0, 127.0) as i32 + 128) as u8;
    }
    d
}

/// `sum_b dot(v, r, b) * (step(v, b) * scale(r, b))` for every (vector, row), in block order.
fn product(
    x: &Q8Batch,
    rows: usize,
    ys: &mut [f32],
    dot: impl Fn(usize, usize, &[u8]) -> i32,
    scale: impl Fn(usize, usize) -> f32,
) {
    let (cols, blocks) = (x.cols(), x.cols() / BLOCK);
    for (v, y) in ys.chunks_exact_mut(rows).enumerate() {
        for (r, out) in y.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..blocks {
                let u = &x.values()[v * cols + b * BLOCK..][..BLOCK];
                acc = (dot(r, b, u) as f32).mul_add(x.steps()[v * blocks + b] * scale(r, b), acc);
            }
            *out = acc;
        }
    }
}

/// The integer dot of one nibble-packed block (16 bytes; low nibble = even column) with offset
/// activations.
fn nibble_dot(bytes: &[u8], u: &[u8], table: impl Fn(u8) -> i32) -> i32 {
    (0..16)
        .map(|i| {
            table(bytes[i] & 15) * (i32::from(u[2 * i]) - 128) + table(bytes[i] >> 4) * (i32::from(u[2 * i + 1]) - 128)
        })
        .sum()
}

pub fn matmul_mxfp4(packed: &[u8], scale: &[u8], x: &Q8Batch, ys: &mut [f32]) {
    let blocks = x.cols() / BLOCK;
    let rows = scale.len() / blocks;
    product(
        x,
        rows,
        ys,
        |r, b, u| nibble_dot(&packed[(r * blocks + b) * 16..][..16], u, |n| i32::from(E2M1_DOUBLED[usize::from(n)])),
        |r, b| SCALE_HALF[usize::from(scale[r * blocks + b])],
    )
}

pub fn matmul_int4(q: &[u8], scale: &[f16], group: usize, x: &Q8Batch, ys: &mut [f32]) {
    let (blocks, groups) = (x.cols() / BLOCK, x.cols() / group);
    let rows = scale.len() / groups;
    product(
        x,
        rows,
        ys,
        |r, b, u| nibble_dot(&q[(r * blocks + b) * 16..][..16], u, |n| i32::from(n) - 8),
        |r, b| scale[r * groups + b * BLOCK / group].to_f32(),
    )
}

pub fn matmul_int8(q: &[i8], scale: &[f32], x: &Q8Batch, ys: &mut [f32]) {
    let cols = x.cols();
    let rows = scale.len();
    product(
        x,
        rows,
        ys,
        |r, b, u| {
            q[r * cols + b * BLOCK..][..BLOCK].iter().zip(u).map(|(w, u)| i32::from(*w) * (i32::from(*u) - 128)).sum()
        },
        |_, _| 1.0,
    );
    for y in ys.chunks_exact_mut(rows) {
        for (o, s) in y.iter_mut().zip(scale) {
            *o *= s;
        }
    }
}
