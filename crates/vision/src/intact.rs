//! Whether an image file is whole, from its structure alone (no pixel is decoded): decoders
//! forgive too much (`image`'s JPEG decoder fills a truncated scan with grey and says nothing),
//! so a file that ends before its format's end marker is refused here, with where it ends.
//! PNG: every chunk complete up to `IEND` (the decoder checks each chunk's CRC); JPEG: every
//! segment and scan complete up to the end-of-image marker; WebP: the RIFF size the header
//! declares is all there. Bytes after the end marker are ignored, as every viewer ignores them.

use image::ImageFormat;

/// `Err(reason)` when the file ends before its format's end (or its structure is broken).
pub fn check(bytes: &[u8], format: ImageFormat) -> Result<(), String> {
    match format {
        ImageFormat::Png => png(bytes),
        ImageFormat::Jpeg => jpeg(bytes),
        ImageFormat::WebP => webp(bytes),
        _ => Ok(()),
    }
}

fn be32(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}

fn png(b: &[u8]) -> Result<(), String> {
    let mut at = 8;
    loop {
        let (Some(len), Some(kind)) = (be32(b, at), b.get(at + 4..at + 8)) else {
            return Err(format!("PNG truncated: it ends at byte {} before its IEND chunk", b.len()));
        };
        // Length, type, data, CRC.
        let end = at.saturating_add(12).saturating_add(len);
        if end > b.len() {
            let name = String::from_utf8_lossy(kind);
            return Err(format!(
                "PNG truncated: its {name} chunk at byte {at} needs {len} bytes of data, the file ends at byte {}",
                b.len()
            ));
        }
        if kind == b"IEND" {
            return Ok(());
        }
        at = end;
    }
}

fn jpeg(b: &[u8]) -> Result<(), String> {
    let truncated = |what: &str| format!("JPEG truncated: it ends at byte {} {what}", b.len());
    let mut at = 2;
    loop {
        match b.get(at) {
            None => return Err(truncated("before its end-of-image marker")),
            Some(0xFF) => {}
            Some(other) => return Err(format!("JPEG corrupt: byte {at} is {other:#04x} where a marker belongs")),
        }
        // Fill bytes may precede a marker.
        while b.get(at) == Some(&0xFF) {
            at += 1;
        }
        let Some(&marker) = b.get(at) else { return Err(truncated("inside a marker")) };
        at += 1;
        match marker {
            0xD9 => return Ok(()),
            // Restart markers and TEM carry no length.
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        let len = b.get(at..at + 2).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])));
        match len {
            Some(len) if len >= 2 && at + len <= b.len() => at += len,
            Some(len) if len < 2 => return Err(format!("JPEG corrupt: segment {marker:#04x} at byte {at}")),
            _ => return Err(truncated(&format!("inside its segment {marker:#04x} at byte {}", at - 2))),
        }
        if marker == 0xDA {
            at = scan_end(b, at).ok_or_else(|| truncated("inside a scan, before its end-of-image marker"))?;
        }
    }
}

/// Where a scan's entropy-coded data ends: the first marker that is neither a stuffed `FF 00`
/// nor a restart; `None` when the file ends first.
fn scan_end(b: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let i = at + b.get(at..)?.iter().position(|&x| x == 0xFF)?;
        match *b.get(i + 1)? {
            0x00 | 0xD0..=0xD7 => at = i + 2,
            _ => return Some(i),
        }
    }
}

fn webp(b: &[u8]) -> Result<(), String> {
    let declared = b.get(4..8).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize);
    match declared {
        Some(size) if size.saturating_add(8) <= b.len() => Ok(()),
        Some(size) => Err(format!(
            "WebP truncated: its header declares {} bytes, the file has {}",
            size.saturating_add(8),
            b.len()
        )),
        None => Err("WebP truncated: its header is incomplete".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_ends_at_its_first_real_marker() {
        // SOI, SOS (length 2), data with a stuffed FF and a restart, EOI.
        let j = [0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02, 1, 0xFF, 0x00, 2, 0xFF, 0xD3, 3, 0xFF, 0xD9];
        assert_eq!(jpeg(&j), Ok(()));
        for cut in 2..j.len() {
            let e = jpeg(&j[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
    }

    #[test]
    fn a_webp_holds_what_its_riff_header_declares() {
        let mut w = b"RIFF".to_vec();
        w.extend(8u32.to_le_bytes());
        w.extend(b"WEBPVP8L");
        assert_eq!(webp(&w), Ok(()));
        assert!(webp(&w[..w.len() - 1]).unwrap_err().contains("declares 16 bytes, the file has 15"));
    }

    #[test]
    fn a_png_ends_with_iend() {
        let mut p = b"\x89PNG\r\n\x1a\n".to_vec();
        p.extend([0, 0, 0, 0]);
        p.extend(b"IEND");
        p.extend([0xAE, 0x42, 0x60, 0x82]);
        assert_eq!(png(&p), Ok(()));
        assert!(png(&p[..p.len() - 1]).unwrap_err().contains("IEND chunk at byte 8"));
    }
}
