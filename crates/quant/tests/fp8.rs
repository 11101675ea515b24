//! FP8 e4m3 widening: the reference gives the OCP standard's values, and every kernel level gives
//! the reference's bits for every byte, at every length and offset.

use k3_quant::cpu::levels;
use k3_quant::fp8::{e4m3, widen_at};
use proptest::prelude::*;

#[test]
fn e4m3_values_are_the_standards() {
    // OCP FP8 e4m3fn: max 448, min normal 2^-6, min subnormal 2^-9, NaN at 0x7F / 0xFF.
    assert_eq!(e4m3(0x7E), 448.0);
    assert_eq!(e4m3(0xFE), -448.0);
    assert_eq!(e4m3(0x08), 2f32.powi(-6));
    assert_eq!(e4m3(0x07), 7.0 * 2f32.powi(-9));
    assert_eq!(e4m3(0x01), 2f32.powi(-9));
    assert_eq!(e4m3(0x38), 1.0);
    assert_eq!(e4m3(0x00), 0.0);
    assert!(e4m3(0x80) == 0.0 && e4m3(0x80).is_sign_negative());
    assert!(e4m3(0x7F).is_nan() && e4m3(0xFF).is_nan());
}

fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn every_byte_widens_to_the_references_bits_at_every_level() {
    let all: Vec<u8> = (0..=255u8).collect();
    for level in levels() {
        let mut out = vec![0f32; 256];
        widen_at(level, &all, &mut out);
        for (b, v) in all.iter().zip(&out) {
            assert!(same(*v, e4m3(*b)), "{level:?}: byte {b:#04x} gave {v}, not {}", e4m3(*b));
        }
    }
}

proptest! {
    #[test]
    fn any_slice_widens_as_the_reference(bytes in proptest::collection::vec(any::<u8>(), 0..100), skip in 0usize..8) {
        let bytes = &bytes[skip.min(bytes.len())..];
        for level in levels() {
            let mut out = vec![0f32; bytes.len()];
            widen_at(level, bytes, &mut out);
            for (b, v) in bytes.iter().zip(&out) {
                prop_assert!(same(*v, e4m3(*b)), "{:?}: byte {:#04x}", level, b);
            }
        }
    }
}
