//! What every handler shares: the scheduler's handle, the model's shape and tokenizer once
//! loaded, the counters, the boundary's settings and the request limits.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use axum::http::StatusCode;
use k3_text::tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::job::{Handle, ModelInfo};
use crate::metrics::Metrics;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub handle: Handle,
    /// Set by the loader once the model is ready.
    pub info: Arc<OnceLock<ModelInfo>>,
    pub tok: Arc<OnceLock<Tokenizer>>,
    /// Set by the loader when the model reads images: how an image is sized into positions
    /// (`/v1/messages/count_tokens` counts them).
    pub image_processor: Arc<OnceLock<k3_vision::ProcessorConfig>>,
    pub metrics: Arc<Metrics>,
    /// Conversations' beginnings rendered for chat requests' resume points, for the next ones.
    pub beginnings: Arc<crate::resume_points::Beginnings>,
    pub boundary: Arc<crate::boundary::Boundary>,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// A request's body must arrive within this.
    pub body_timeout: std::time::Duration,
    /// Total bytes of a request's stop strings at most.
    pub stop_bytes: usize,
    /// How request lines are written on standard error.
    pub log_format: crate::reqlog::LogFormat,
    /// Image pixels a request may bring, and the server's pixels in flight
    /// ([`crate::image_budget`]).
    pub image_limits: crate::image_budget::ImageLimits,
    pub images_in_flight: Arc<crate::image_budget::InFlight>,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<crate::response_store::Store>,
    /// Unix seconds at start (the models' `created`).
    pub created: u64,
}

impl AppState {
    /// The model's shape and its tokenizer (`None`: the model is served token ids).
    pub(crate) fn ready(&self) -> Result<(&ModelInfo, Option<&Tokenizer>), ApiError> {
        match self.info.get() {
            Some(i) if self.handle.status.ready.load(Ordering::SeqCst) && self.handle.status.failure().is_none() => {
                Ok((i, self.tok.get()))
            }
            _ => Err(self.unavailable()),
        }
    }

    pub(crate) fn unavailable(&self) -> ApiError {
        let failed = self.handle.status.failure();
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, failed.unwrap_or_else(|| "Loading model".into()))
    }
}
