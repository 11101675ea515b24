//! Image files are untrusted: any bytes, and any cut or flip of a real picture, give a picture
//! or an error from `probe` and `decode`, never a panic (the structure walk in `intact` indexes
//! into the file by the lengths it declares).

use k3_vision::{DecodeLimits, decode, probe};
use proptest::prelude::*;

/// A small real picture in `format`, encoded by the `image` crate.
fn picture(format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(13, 9, |x, y| image::Rgb([(x * 19) as u8, (y * 23) as u8, ((x + y) * 7) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn survives(bytes: &[u8]) {
    let limits = DecodeLimits::default();
    let _ = probe(bytes, &limits);
    let _ = decode(bytes, &limits);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        survives(&bytes);
    }

    #[test]
    fn flipped_pictures_never_panic(which in 0usize..2, at in any::<usize>(), flip in any::<u8>(), cut in any::<usize>()) {
        let mut bytes = picture([image::ImageFormat::Png, image::ImageFormat::Jpeg][which]);
        let at = at % bytes.len();
        bytes[at] ^= flip;
        bytes.truncate(1 + cut % bytes.len());
        survives(&bytes);
    }
}

/// Every cut of a real PNG and JPEG: each is refused (the whole file alone decodes).
#[test]
fn every_cut_of_a_picture_is_refused_without_a_panic() {
    for format in [image::ImageFormat::Png, image::ImageFormat::Jpeg] {
        let bytes = picture(format);
        assert!(decode(&bytes, &DecodeLimits::default()).is_ok(), "{format:?} whole");
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], &DecodeLimits::default()).is_err(), "{format:?} cut at {cut}");
        }
    }
}
