//! Bad images are refused before any work, each with what is wrong and the limits stated.

use k3_vision::{DecodeLimits, decode};

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend(kind);
    out.extend(data);
    let mut body = kind.to_vec();
    body.extend(data);
    out.extend(crc32(&body).to_be_bytes());
    out
}

/// A PNG claiming `w x h` (8-bit RGB) with `extra` chunks after its header and one tiny IDAT.
fn png(w: u32, h: u32, extra: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    out.extend(chunk(b"IHDR", &ihdr));
    for c in extra {
        out.extend(c);
    }
    // zlib of one row: filter 0 and three zero bytes (stored block).
    out.extend(chunk(b"IDAT", &[0x78, 0x01, 0x01, 0x04, 0x00, 0xfb, 0xff, 0, 0, 0, 0, 0x00, 0x04, 0x00, 0x01]));
    out.extend(chunk(b"IEND", &[]));
    out
}

fn refused(bytes: &[u8]) -> String {
    decode(bytes, &DecodeLimits::default()).unwrap_err().to_string()
}

#[test]
fn a_one_pixel_png_decodes() {
    let p = decode(&png(1, 1, &[]), &DecodeLimits::default()).unwrap();
    assert_eq!((p.width, p.height, p.rgb.as_slice()), (1, 1, &[0u8, 0, 0][..]));
}

#[test]
fn a_pixel_bomb_is_refused_by_its_header() {
    let e = refused(&png(60_000, 60_000, &[]));
    assert!(e.contains("60000 x 60000") && e.contains("larger than the limit") && e.contains("megapixels"), "{e}");
}

#[test]
fn an_animated_png_is_refused() {
    let actl = chunk(b"acTL", &[0, 0, 0, 2, 0, 0, 0, 0]);
    let e = refused(&png(1, 1, &[actl]));
    assert!(e.contains("animated"), "{e}");
}

#[test]
fn truncated_empty_unknown_and_gif_are_refused() {
    let whole = png(4, 4, &[]);
    let e = refused(&whole[..whole.len() - 20]);
    assert!(e.starts_with("image: PNG"), "{e}");
    assert!(refused(&[]).contains("empty"));
    assert!(refused(b"%PDF-1.7 not a picture").contains("not a PNG, JPEG or WebP"));
    assert!(refused(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;").contains("GIF is not supported"));
    let big = DecodeLimits { max_bytes: 10, ..DecodeLimits::default() };
    assert!(decode(&whole, &big).unwrap_err().to_string().contains("bytes is larger than the limit"));
}

fn riff_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = kind.to_vec();
    out.extend((data.len() as u32).to_le_bytes());
    out.extend(data);
    if data.len() % 2 == 1 {
        out.push(0);
    }
    out
}

#[test]
fn an_animated_webp_is_refused() {
    // VP8X with the animation flag, ANIM, and one ANMF frame holding a 1 x 1 lossless image.
    let mut vp8x = vec![0x02, 0, 0, 0];
    vp8x.extend([0, 0, 0, 0, 0, 0]);
    let vp8l = riff_chunk(b"VP8L", &[0x2f, 0, 0, 0, 0x10, 0x07, 0x10, 0x11, 0x11, 0x88, 0x88, 0xfe, 0x07, 0x00]);
    let mut anmf = vec![0u8; 16];
    anmf[12..15].copy_from_slice(&[100, 0, 0]);
    anmf.extend(&vp8l);
    let mut body = b"WEBP".to_vec();
    body.extend(riff_chunk(b"VP8X", &vp8x));
    body.extend(riff_chunk(b"ANIM", &[0, 0, 0, 0, 0, 0]));
    body.extend(riff_chunk(b"ANMF", &anmf));
    let mut file = b"RIFF".to_vec();
    file.extend((body.len() as u32).to_le_bytes());
    file.extend(body);
    let e = refused(&file);
    assert!(e.contains("animated"), "{e}");
}
