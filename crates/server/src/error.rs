//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! clients expect.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error a client sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code` for a failure clients act on (`context_length_exceeded`);
    /// otherwise the status.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None }
    }

    /// The same error under OpenAI's `code` for it.
    pub fn with_code(self, code: &'static str) -> Self {
        ApiError { code: Some(code), ..self }
    }

    /// A 400 naming the field at fault.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()), code: None }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl ApiError {
    /// The response in OpenAI's shape, or in Ollama's for its routes (`{"error": "..."}`).
    pub fn shaped(self, ollama: bool) -> Response {
        if !ollama {
            return self.into_response();
        }
        let message = match &self.param {
            Some(p) => format!("{p}: {}", self.message),
            None => self.message.clone(),
        };
        (self.status, Json(json!({"error": message}))).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind(), "param": self.param,
            "code": self.code.map_or_else(|| json!(self.status.as_u16()), |c| json!(c)),
        }});
        (self.status, Json(body)).into_response()
    }
}

/// Whether `path` is one of Ollama's routes (its errors take Ollama's shape).
pub fn is_ollama(path: &str) -> bool {
    path.starts_with("/api/")
}
