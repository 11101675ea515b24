//! Images in requests: OpenAI's `image_url` parts and Ollama's `images`, as data (a `data:` URL
//! or bare base64). A remote URL is never fetched (the server reads nothing on a client's
//! behalf): it is refused with a 400 saying so. Each image is decoded here, before the request
//! is queued, so a bad one is a 400 naming its field; the tower runs on the engine's thread.

use base64::Engine as _;
use k3_engine::media::DecodeLimits;
use k3_vision::{Picture, decode};
use serde::Deserialize;

use crate::error::ApiError;

/// OpenAI's `image_url` object.
#[derive(Debug, Deserialize)]
pub struct ImageUrl {
    pub url: String,
    /// `auto` or `high` (the processor's rule sizes every image at the model's full resolution);
    /// `low` asks for fewer positions, which k3 cannot give: refused.
    pub detail: Option<String>,
}

impl ImageUrl {
    /// The image's bytes; `field` names the `image_url` object in errors.
    pub fn bytes(&self, field: &str) -> Result<Vec<u8>, ApiError> {
        match self.detail.as_deref() {
            None | Some("auto" | "high") => {}
            Some(other) => {
                return Err(ApiError::bad(
                    &format!("{field}.detail"),
                    format!(
                        "detail `{other}` is not supported: every image is read at the model's resolution (auto, high)"
                    ),
                ));
            }
        }
        data_url(&self.url, &format!("{field}.url"))
    }
}

/// A decoded image of a request, and its file's hash (a prompt resumes a kept state through an
/// image only when the hash agrees).
#[derive(Debug, Clone)]
pub struct RequestImage {
    pub picture: Picture,
    pub digest: u64,
}

/// The bytes of a `data:` URL's image; `field` names the request part in errors.
pub fn data_url(url: &str, field: &str) -> Result<Vec<u8>, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let reason = if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("file:") {
            "remote image URLs are never fetched: send the image itself as a data URL (data:image/png;base64,...)"
        } else {
            "an image_url must be a data URL (data:image/png;base64,...)"
        };
        return Err(ApiError::bad(field, reason));
    };
    let Some((kind, data)) = rest.split_once(";base64,") else {
        return Err(ApiError::bad(field, "the data URL is not base64 (data:image/png;base64,...)"));
    };
    if !kind.is_empty() && !kind.starts_with("image/") {
        return Err(ApiError::bad(field, format!("the data URL holds `{kind}`, not an image")));
    }
    base64_image(data, field)
}

/// Bare base64 image bytes (Ollama's `images`), at most the decoder's limit.
pub fn base64_image(data: &str, field: &str) -> Result<Vec<u8>, ApiError> {
    let limits = DecodeLimits::default();
    if data.len() / 4 * 3 > limits.max_bytes + 3 {
        return Err(ApiError::bad(field, format!("the image is larger than the limit ({limits})")));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| ApiError::bad(field, format!("the image is not valid base64: {e}")))
}

/// Decodes an image's bytes within the limits.
pub fn picture(bytes: &[u8], field: &str) -> Result<RequestImage, ApiError> {
    let picture = decode(bytes, &DecodeLimits::default()).map_err(|e| ApiError::bad(field, e.to_string()))?;
    Ok(RequestImage { picture, digest: xxhash_rust::xxh3::xxh3_64(bytes) })
}
