//! Images in requests: OpenAI's `image_url` parts and Ollama's `images`, as data (a `data:` URL
//! or bare base64). A remote URL is never fetched (the server reads nothing on a client's
//! behalf): it is refused with a 400 saying so. Each image's header and structure are read while
//! the request is checked ([`probed`]: a bad one is a 400 naming its field); then [`admit`]
//! counts the request's pixels against its budget, takes them from the server's in-flight
//! budget and decodes, all before the request is queued. The resize runs off the engine's thread
//! and the tower on it (the preparing module).

use axum::http::StatusCode;
use base64::Engine as _;
use k3_generate::media::DecodeLimits;
use k3_vision::{Header, Picture, decode, probe};
use serde::Deserialize;

use crate::error::ApiError;
use crate::image_budget::{ImageLimits, InFlight, Lease, megapixels};

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

/// An image of a request: checked by its header, then decoded ([`admit`]), with its file's hash
/// (a prompt resumes a kept state through an image only when the hash agrees).
#[derive(Debug)]
pub struct RequestImage {
    /// The request part it came in (errors name it).
    pub field: String,
    pub header: Header,
    pub digest: u64,
    /// The file until it is decoded.
    bytes: Vec<u8>,
    picture: Option<Picture>,
    /// Its pixels of the server's in-flight budget, held until its patches are made.
    lease: Option<Lease>,
}

impl RequestImage {
    /// The decoded picture and its share of the in-flight budget, taken to be resized (once).
    pub fn take_picture(&mut self) -> Option<(Picture, Option<Lease>)> {
        Some((self.picture.take()?, self.lease.take()))
    }
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

/// An image's bytes with their header and structure checked (nothing decoded yet).
pub fn probed(bytes: Vec<u8>, field: &str) -> Result<RequestImage, ApiError> {
    let header = probe(&bytes, &DecodeLimits::default()).map_err(|e| ApiError::bad(field, e.to_string()))?;
    let digest = xxhash_rust::xxh3::xxh3_64(&bytes);
    Ok(RequestImage { field: field.to_string(), header, digest, bytes, picture: None, lease: None })
}

/// A request's images within its budget and the server's: their pixels counted from their
/// headers (a 400 naming the image that goes over `limits.per_request`), taken from `in_flight`
/// (a 503 after `limits.wait` when other requests' images hold them), then decoded, each image
/// keeping its share of the budget until its patches are made. Blocks: run it on a blocking
/// thread.
pub fn admit(
    images: &mut [RequestImage],
    limits: &ImageLimits,
    in_flight: &std::sync::Arc<InFlight>,
) -> Result<(), ApiError> {
    let n = images.len();
    let mut total = 0u64;
    for (k, img) in images.iter().enumerate() {
        total = total.saturating_add(img.header.pixels());
        if total > limits.per_request {
            return Err(ApiError::bad(
                &img.field,
                format!(
                    "image {} of {n} ({} x {} pixels by its header) brings this request's images to {total} pixels, \
                     over the per-request budget of {} pixels ({} megapixels, --max-image-megapixels): send fewer or \
                     smaller images",
                    k + 1,
                    img.header.width,
                    img.header.height,
                    limits.per_request,
                    megapixels(limits.per_request),
                ),
            ));
        }
    }
    if total == 0 {
        return Ok(());
    }
    let mut lease = in_flight.acquire(total, limits.wait).map_err(|used| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server is busy with other requests' images: this request's {} megapixels did not fit in the \
                 in-flight budget of {} megapixels ({} in use, --image-megapixels-in-flight) within {} s; try again",
                megapixels(total),
                megapixels(in_flight.cap()),
                megapixels(used),
                limits.wait.as_secs_f64(),
            ),
        )
    })?;
    for img in images.iter_mut() {
        let share = lease.split(img.header.pixels());
        let picture =
            decode(&img.bytes, &DecodeLimits::default()).map_err(|e| ApiError::bad(&img.field, e.to_string()))?;
        img.bytes = Vec::new();
        img.picture = Some(picture);
        img.lease = Some(share);
    }
    Ok(())
}
