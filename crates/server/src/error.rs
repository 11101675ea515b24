//! Errors in the shape each API's clients read: OpenAI's `{"error": {"message", "type", "param",
//! "code"}}`, Ollama's `{"error": "..."}` and Anthropic's `{"type": "error", "error": {"type",
//! "message"}}`, with the HTTP status clients expect.

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
    /// The prompt cannot fit: its tokens (at least) and the context. Each API words this the way
    /// its clients recognise (they compact the conversation on it).
    pub overflow: Option<(u64, u64)>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None, overflow: None }
    }

    /// A prompt of `tokens` (at least) that leaves no room in a context of `context`: a 400 on
    /// `param` with OpenAI's `context_length_exceeded` code, Anthropic's `prompt is too long`
    /// and Ollama's `exceeds the available context size` wording on their routes.
    pub fn context_exceeded(param: &str, tokens: u64, context: u64, message: impl Into<String>) -> Self {
        ApiError {
            overflow: Some((tokens, context)),
            ..ApiError::bad(param, message).with_code("context_length_exceeded")
        }
    }

    /// The same error under OpenAI's `code` for it.
    pub fn with_code(self, code: &'static str) -> Self {
        ApiError { code: Some(code), ..self }
    }

    /// A 400 naming the field at fault.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
            code: None,
            overflow: None,
        }
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

/// Whose error shape a route answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Ollama,
    Anthropic,
}

impl Shape {
    /// The shape of the API `path` belongs to: Ollama's `/api/...`, Anthropic's
    /// `/v1/messages...`, else OpenAI's.
    pub fn of_path(path: &str) -> Shape {
        if path.starts_with("/api/") {
            Shape::Ollama
        } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Shape::Anthropic
        } else {
            Shape::OpenAi
        }
    }
}

impl ApiError {
    /// Anthropic's `error.type` for this status.
    pub fn anthropic_kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The message with the field at fault before it (`field: message`), for the shapes that
    /// have no `param`.
    pub fn with_param(&self) -> String {
        match &self.param {
            Some(p) => format!("{p}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// Anthropic's error body (also an SSE `error` event's data). A prompt that cannot fit is
    /// worded as Anthropic words it (`prompt is too long: N tokens > M maximum`), which Claude
    /// Code reads to compact the conversation.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let message = match self.overflow {
            Some((tokens, context)) => format!("prompt is too long: {tokens} tokens > {context} maximum"),
            None => self.with_param(),
        };
        json!({"type": "error", "error": {"type": self.anthropic_kind(), "message": message}})
    }

    /// Ollama's error text: a prompt that cannot fit is worded as Ollama words it (with
    /// `truncate: false`), naming the server's `--context`, which is what can be raised.
    pub fn ollama_message(&self) -> String {
        match self.overflow {
            Some((tokens, context)) => format!(
                "request ({tokens} tokens) exceeds the available context size ({context} tokens), try increasing it \
                 (k3-cli serve --context)"
            ),
            None => self.with_param(),
        }
    }

    /// The response in `shape`.
    pub fn shaped(self, shape: Shape) -> Response {
        match shape {
            Shape::OpenAi => self.into_response(),
            Shape::Ollama => (self.status, Json(json!({"error": self.ollama_message()}))).into_response(),
            Shape::Anthropic => (self.status, Json(self.anthropic_body())).into_response(),
        }
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

/// A value as an error quotes it: whole when short, else its JSON type.
pub fn short(v: &serde_json::Value) -> String {
    use serde_json::Value;
    let text = v.to_string();
    if text.len() <= 40 {
        return text;
    }
    match v {
        Value::String(_) => "a long string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
        _ => "this value".into(),
    }
}
