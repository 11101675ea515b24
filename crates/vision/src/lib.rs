//! # k3-vision
//!
//! Kimi K3 sees through MoonViT3d: an image is decoded ([`decode`], with limits stated before any
//! work), resized and cut into 14 x 14 patches as the checkpoint's processor does ([`resize`],
//! [`patches`]), run through the vision tower and merged 2 x 2 into positions of the language
//! model's hidden width ([`tower`]). The engine places those rows where the prompt's image
//! placeholders are; this crate knows nothing of the engine or the file format: it takes the
//! tower's weights as `k3_quant::Matrix` views.

pub mod config;
pub mod decode;
pub mod intact;
pub mod patches;
pub mod resize;
pub mod tower;

pub use config::{ProcessorConfig, VisionConfig};
pub use decode::{DecodeLimits, Header, Picture, decode, probe};
pub use patches::{Layout, Patches, patches as patch_image};
pub use tower::{Tower, TowerWeights};

/// Why an image cannot be seen, or a tower cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The image itself: undecodable, truncated, too large, animated, an unknown format.
    #[error("image: {0}")]
    Image(String),
    /// The model's `vision_config` or `preprocessor_config.json`.
    #[error("{file}: {reason}")]
    Config { file: &'static str, reason: String },
    /// A tower tensor that is missing or misshaped.
    #[error("vision tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
}
