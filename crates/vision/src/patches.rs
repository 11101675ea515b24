//! How big an image becomes and how it is cut: the NaViT rule of the reference processor
//! (scale down, never up, so the image has at most `in_patch_limit` patches and at most
//! `patch_limit_on_one_side` a side; pad right and bottom to whole 2 x 2 groups of patches) and
//! the normalized patches in the tower's order (patch rows, then columns; inside a patch
//! channel, then y, then x: a flattened `Conv2d` weight's order).

use crate::config::ProcessorConfig;
use crate::resize::bicubic_resize;
use crate::{Picture, VisionError};

/// An image's size through the processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// As given.
    pub width: u32,
    pub height: u32,
    /// Resized.
    pub new_width: u32,
    pub new_height: u32,
    /// Patches down and across, after padding.
    pub grid_h: usize,
    pub grid_w: usize,
    /// Prompt positions the image takes (`grid_h * grid_w / 4`).
    pub positions: usize,
}

impl Layout {
    /// The processor's rule (`navit_resize_config`) for a `width x height` image.
    pub fn of(width: u32, height: u32, p: &ProcessorConfig) -> Result<Self, VisionError> {
        let (w, h, ps) = (f64::from(width), f64::from(height), p.patch_size as f64);
        let per_side = p.patch_limit_on_one_side as f64;
        let patches = (w / ps).floor().max(1.0) * (h / ps).floor().max(1.0);
        let scale = 1f64.min((p.in_patch_limit as f64 / patches).sqrt()).min(per_side * ps / w).min(per_side * ps / h);
        let side_max = per_side * ps;
        let new_w = ((w * scale) as i64).max(1).min(side_max as i64) as usize;
        let new_h = ((h * scale) as i64).max(1).min(side_max as i64) as usize;
        let factor = p.merge_kernel_size * p.patch_size;
        let (pw, ph) = (new_w.next_multiple_of(factor), new_h.next_multiple_of(factor));
        let (grid_h, grid_w) = (ph / p.patch_size, pw / p.patch_size);
        if grid_h > 512 || grid_w > 512 {
            return Err(VisionError::Image(format!(
                "{width} x {height} pixels makes {grid_w} x {grid_h} patches; the tower's rotary table has 512 a side"
            )));
        }
        let m = p.merge_kernel_size;
        Ok(Layout {
            width,
            height,
            new_width: new_w as u32,
            new_height: new_h as u32,
            grid_h,
            grid_w,
            positions: (grid_h / m) * (grid_w / m),
        })
    }

    pub fn patches(&self) -> usize {
        self.grid_h * self.grid_w
    }
}

/// An image's normalized patches, `[grid_h * grid_w, 3 * p * p]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Patches {
    pub layout: Layout,
    pub patch: usize,
    pub values: Vec<f32>,
}

/// Resizes `pic` as the processor does and cuts it into normalized patches; the padding is
/// black before normalization (`-mean / std` after), as the reference pads.
pub fn patches(pic: &Picture, p: &ProcessorConfig) -> Result<Patches, VisionError> {
    if pic.had_alpha && p.transparent_bg_config.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(VisionError::Image(
            "the image is transparent, and this model's processor composites transparent images over a background \
             (transparent_bg_config) that k3 does not reproduce: flatten the image (e.g. save it as JPEG) first"
                .into(),
        ));
    }
    let layout = Layout::of(pic.width, pic.height, p)?;
    let resized = bicubic_resize(pic, layout.new_width, layout.new_height);
    Ok(cut(&resized, layout, p))
}

/// Cuts an already resized picture.
pub fn cut(resized: &Picture, layout: Layout, p: &ProcessorConfig) -> Patches {
    let ps = p.patch_size;
    let (w, h) = (resized.width as usize, resized.height as usize);
    let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * p.image_std[c]));
    let bias: [f32; 3] = std::array::from_fn(|c| -p.image_mean[c] / p.image_std[c]);
    let dim = 3 * ps * ps;
    let mut values = vec![0f32; layout.patches() * dim];
    for (n, patch) in values.chunks_exact_mut(dim).enumerate() {
        let (gy, gx) = (n / layout.grid_w, n % layout.grid_w);
        for (i, v) in patch.iter_mut().enumerate() {
            let (c, y, x) = (i / (ps * ps), (i / ps) % ps, i % ps);
            let (iy, ix) = (gy * ps + y, gx * ps + x);
            let raw = if iy < h && ix < w { f32::from(resized.rgb[(iy * w + ix) * 3 + c]) } else { 0.0 };
            // torch.addcmul(bias, image, scale): one rounding of the product, then the sum.
            *v = raw.mul_add(scale[c], bias[c]);
        }
    }
    Patches { layout, patch: ps, values }
}
