//! Image bytes to RGB pixels, with every limit checked before the pixels are decoded: the format
//! is recognized from the bytes (PNG, JPEG, WebP; GIF only to say that it is refused), the
//! declared size is checked against [`DecodeLimits`] (a pixel bomb is refused by its header),
//! animation is refused (an animated PNG or WebP is not one picture), and a truncated or corrupt
//! file is an error, never a partial picture ([`crate::intact`] checks its structure first).

use std::io::Cursor;

use image::{ImageFormat, ImageReader};

use crate::VisionError;

/// What an image may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Encoded bytes.
    pub max_bytes: usize,
    /// Pixels along either side.
    pub max_side: u32,
    /// Pixels in all (`width * height`).
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    /// 64 MiB of file, 16,384 pixels a side, 64 megapixels: more than any camera or screenshot,
    /// and at most 192 MiB of decoded RGB (a bomb claiming 65,535 x 65,535 would want 12 GiB).
    fn default() -> Self {
        DecodeLimits { max_bytes: 64 << 20, max_side: 16_384, max_pixels: 64_000_000 }
    }
}

impl std::fmt::Display for DecodeLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at most {} MiB, {} pixels a side, {} megapixels",
            self.max_bytes >> 20,
            self.max_side,
            self.max_pixels / 1_000_000
        )
    }
}

/// A decoded picture: 8-bit RGB, row-major, `height` rows of `width * 3` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
    /// The file had an alpha channel (dropped here, as the reference drops it when its processor
    /// names no background to composite over).
    pub had_alpha: bool,
}

fn bad(reason: impl Into<String>) -> VisionError {
    VisionError::Image(reason.into())
}

/// What an image's header says, checked against the limits: enough to count its pixels (and so
/// the memory its decoding takes) before any is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
}

impl Header {
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    fn name(&self) -> &'static str {
        match self.format {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            _ => "WebP",
        }
    }
}

/// Reads `bytes`' header and structure without decoding a pixel: the format, the declared size
/// within `limits`, no animation, and the file whole (see [`crate::intact`]). What [`decode`]
/// checks first; a server sums the pixels of a request's images with it before decoding any.
pub fn probe(bytes: &[u8], limits: &DecodeLimits) -> Result<Header, VisionError> {
    if bytes.is_empty() {
        return Err(bad("the file is empty"));
    }
    if bytes.len() > limits.max_bytes {
        return Err(bad(format!("{} bytes is larger than the limit ({limits})", bytes.len())));
    }
    let format = image::guess_format(bytes)
        .map_err(|_| bad("not a PNG, JPEG or WebP image (the first bytes match no image format)"))?;
    match format {
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP => {}
        ImageFormat::Gif => return Err(bad("GIF is not supported: give a PNG, JPEG or WebP image")),
        other => return Err(bad(format!("{other:?} is not supported: give a PNG, JPEG or WebP image"))),
    }
    let name = Header { format, width: 0, height: 0 }.name();
    crate::intact::check(bytes, format).map_err(bad)?;
    // The declared size, from the header alone, before the decoder allocates anything.
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(|e| bad(format!("{name} header: {e}")))?;
    check_size(width, height, limits)?;
    if animated(bytes, format)? {
        return Err(bad("the image is animated; give one still frame (PNG, JPEG or WebP)"));
    }
    Ok(Header { format, width, height })
}

/// Decodes `bytes` into RGB, within `limits`. Grey and palette images become RGB; an alpha
/// channel is dropped (the processor composites nothing for an opaque-background config).
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Picture, VisionError> {
    let header = probe(bytes, limits)?;
    let name = header.name();
    let mut reader = ImageReader::with_format(Cursor::new(bytes), header.format);
    let mut l = image::Limits::default();
    l.max_image_width = Some(limits.max_side);
    l.max_image_height = Some(limits.max_side);
    // The decoder's own buffer plus our RGB copy.
    l.max_alloc = Some(limits.max_pixels.saturating_mul(8));
    reader.limits(l);
    let decoder = reader.into_decoder().map_err(|e| bad(format!("{name} header: {e}")))?;
    let img = image::DynamicImage::from_decoder(decoder).map_err(|e| bad(format!("{name} data: {e}")))?;
    if (img.width(), img.height()) != (header.width, header.height) {
        return Err(bad(format!(
            "{name} data: the header says {} x {} pixels, the data holds {} x {}",
            header.width,
            header.height,
            img.width(),
            img.height()
        )));
    }
    let had_alpha = img.color().has_alpha();
    Ok(Picture { width: header.width, height: header.height, rgb: img.into_rgb8().into_raw(), had_alpha })
}

fn check_size(width: u32, height: u32, limits: &DecodeLimits) -> Result<(), VisionError> {
    if width == 0 || height == 0 {
        return Err(bad(format!("{width} x {height} pixels: the image is empty")));
    }
    if width > limits.max_side || height > limits.max_side || u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(bad(format!("{width} x {height} pixels is larger than the limit ({limits})")));
    }
    Ok(())
}

/// Whether a PNG (APNG) or WebP holds more than one frame.
fn animated(bytes: &[u8], format: ImageFormat) -> Result<bool, VisionError> {
    Ok(match format {
        ImageFormat::Png => {
            let d =
                image::codecs::png::PngDecoder::new(Cursor::new(bytes)).map_err(|e| bad(format!("PNG header: {e}")))?;
            d.is_apng().map_err(|e| bad(format!("PNG header: {e}")))?
        }
        ImageFormat::WebP => {
            let d = image::codecs::webp::WebPDecoder::new(Cursor::new(bytes))
                .map_err(|e| bad(format!("WebP header: {e}")))?;
            d.has_animation()
        }
        _ => false,
    })
}
