//! Truncated and corrupt files made by a real encoder are refused with the reason, never
//! decoded as a partial picture (the JPEG decoder alone fills a cut scan with grey).

use k3_vision::{DecodeLimits, decode};

/// A `w x h` gradient encoded as `format` by the `image` crate.
fn encoded(w: u32, h: u32, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn refused(bytes: &[u8]) -> String {
    decode(bytes, &DecodeLimits::default()).unwrap_err().to_string()
}

#[test]
fn a_truncated_jpeg_is_refused_at_every_cut() {
    let whole = encoded(96, 64, image::ImageFormat::Jpeg);
    assert_eq!(decode(&whole, &DecodeLimits::default()).unwrap().width, 96);
    // Cut in the scan, just before the end-of-image marker, and inside the headers.
    for cut in [whole.len() / 2, whole.len() - 2, whole.len() - 1, 30] {
        let e = refused(&whole[..cut]);
        assert!(e.contains("JPEG truncated"), "cut at {cut}: {e}");
    }
    // Bytes after the end marker are ignored, as viewers ignore them.
    let mut trailing = whole.clone();
    trailing.extend(b"trailing bytes");
    assert!(decode(&trailing, &DecodeLimits::default()).is_ok());
}

#[test]
fn a_truncated_or_damaged_png_is_refused() {
    let whole = encoded(64, 48, image::ImageFormat::Png);
    for cut in [whole.len() / 2, whole.len() - 4] {
        let e = refused(&whole[..cut]);
        assert!(e.contains("PNG truncated"), "cut at {cut}: {e}");
    }
    // One bit of the IDAT's data flipped, then one of its CRC.
    let idat = whole.windows(4).position(|w| w == b"IDAT").unwrap();
    let len = u32::from_be_bytes(whole[idat - 4..idat].try_into().unwrap()) as usize;
    for at in [idat + 10, idat + 4 + len + 1] {
        let mut damaged = whole.clone();
        damaged[at] ^= 0x10;
        let e = refused(&damaged);
        assert!(e.contains("PNG data"), "flipped at {at}: {e}");
    }
}
