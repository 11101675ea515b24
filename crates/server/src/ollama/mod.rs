//! Ollama's API over the same scheduler as the OpenAI one: `/api/chat` and `/api/generate`
//! (NDJSON streaming by default), `/api/tags`, `/api/show`, `/api/ps` and `/api/version`, for
//! the tools that speak only Ollama. Requests are translated into the OpenAI bodies
//! ([`request`]) and checked by the same rules; errors come in Ollama's shape
//! (`{"error": "..."}`), which its clients read.

mod reply;
pub mod request;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::about::About;
use crate::answer::{self, Kind};
use crate::api::{ChatRequest, CompletionRequest};
use crate::error::ApiError;
use crate::job::ModelInfo;
use crate::request::{body, parse, prepared, prepared_bytes};
use crate::state::AppState;
use k3_engine::config::Family;
use k3_generate::cache::Scope;
use reply::Endpoint;
use request::Generate;

/// The Ollama release whose API these routes follow (clients gate features on it).
pub const API_VERSION: &str = "0.12.0";

/// The answer, or the error as Ollama's clients read it: `{"error": "field: message"}`.
fn either(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| e.shaped(crate::error::Shape::Ollama))
}

/// `POST /api/chat`.
pub async fn chat(State(s): State<AppState>, Extension(scope): Extension<Scope>, req: Request) -> Response {
    let (stop_bytes, beginnings) = (s.stop_bytes, s.beginnings.clone());
    let over = Arc::new(AtomicU64::new(0));
    let asked = over.clone();
    either(
        async {
            let p = prepared(&s, req, move |v: Value, info, tok| {
                let tok = tok.ok_or_else(|| ApiError::bad("messages", "this model embeds no tokenizer"))?;
                asked.store(request::num_ctx_over(&v, info.context).unwrap_or(0), Ordering::Relaxed);
                let r: ChatRequest = openai_body(request::chat(&v)?)?;
                r.prepare(tok, info, stop_bytes, &beginnings).map_err(request::renamed)
            })
            .await?;
            let stream = p.stream;
            let r = reply::answer(answer::submit(&s, p, Kind::Chat, scope)?, Endpoint::Chat, stream).await?;
            Ok(clamped(&s, r, over.load(Ordering::Relaxed)))
        }
        .await,
    )
}

/// An answer whose `num_ctx` (`asked`, 0 if it was within the context) was clamped to the
/// server's context, as Ollama clamps it: a warning in the log and the context used in the
/// `x-k3-num-ctx` header.
fn clamped(s: &AppState, mut r: Response, asked: u64) -> Response {
    if let (true, Ok((info, _))) = (asked > 0, s.ready()) {
        crate::reqlog::warning(
            s.log_format,
            &format!("options.num_ctx {asked} is more than this server's context: clamped to {}", info.context),
        );
        r.headers_mut().insert("x-k3-num-ctx", axum::http::HeaderValue::from(info.context));
    }
    r
}

/// `POST /api/generate`: a user turn in the chat format, or a `raw` prompt as it is; no prompt
/// at all is Ollama's "load the model", answered at once.
pub async fn generate(State(s): State<AppState>, Extension(scope): Extension<Scope>, req: Request) -> Response {
    let (stop_bytes, beginnings) = (s.stop_bytes, s.beginnings.clone());
    either(
        async {
            let bytes = body(&s, req).await?;
            let (info, _) = s.ready()?;
            let v: Value = parse(&bytes)?;
            if let Generate::Load = request::generate(&v)? {
                let model = v.get("model").and_then(Value::as_str).unwrap_or(&info.id);
                check_model(model, info)?;
                return Ok(Json(json!({"model": model, "created_at": now_rfc3339(), "response": "", "done": true,
                                      "done_reason": "load"}))
                .into_response());
            }
            let raw = matches!(request::generate(&v)?, Generate::Raw(_));
            let over = request::num_ctx_over(&v, info.context).unwrap_or(0);
            let p = prepared_bytes(&s, bytes, move |v: Value, info, tok| match request::generate(&v)? {
                Generate::Raw(body) => {
                    let r: CompletionRequest = openai_body(body)?;
                    r.prepare(tok, info, stop_bytes).map_err(request::renamed)
                }
                Generate::Chat(body) => {
                    let tok = tok.ok_or_else(|| ApiError::bad("prompt", "this model embeds no tokenizer"))?;
                    let r: ChatRequest = openai_body(body)?;
                    r.prepare(tok, info, stop_bytes, &beginnings).map_err(request::renamed)
                }
                Generate::Load => Err(ApiError::bad("prompt", "no prompt")),
            })
            .await?;
            let stream = p.stream;
            let kind = if raw { Kind::Completion } else { Kind::Chat };
            let r = reply::answer(answer::submit(&s, p, kind, scope)?, Endpoint::Generate, stream).await?;
            Ok(clamped(&s, r, over))
        }
        .await,
    )
}

/// A translated body into the OpenAI request it stands for.
fn openai_body<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::bad("body", format!("the request is not a valid request: {e}")))
}

fn check_model(asked: &str, info: &ModelInfo) -> Result<(), ApiError> {
    if request::same_model(asked, &info.id) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, format!("model '{asked}' not found; this server runs '{}'", info.id)))
    }
}

/// The model's name as Ollama lists it (`NAME:latest`).
fn name(id: &str) -> String {
    if id.contains(':') { id.to_string() } else { format!("{id}:latest") }
}

/// `details` of `/api/tags` and `/api/show`.
fn details(family: Family, about: &About) -> Value {
    json!({
        "parent_model": "", "format": "waste", "family": family.name(), "families": [family.name()],
        "parameter_size": about.parameter_size(), "quantization_level": about.quantization,
    })
}

/// A model as `/api/tags` and `/api/ps` list it (loaded or not).
pub(crate) fn listing_of(id: &str, family: Family, about: &About) -> Value {
    use std::hash::{Hash, Hasher};
    // An identifier of this model's files (not Ollama's sha256 of a blob).
    let mut h = std::hash::DefaultHasher::new();
    (id, about.bytes, about.modified, about.parameters).hash(&mut h);
    json!({
        "name": name(id), "model": name(id), "modified_at": rfc3339(about.modified, 0),
        "size": about.bytes, "digest": format!("{:016x}", h.finish()), "details": details(family, about),
    })
}

/// The listing of the served model (`/api/tags` and `/api/ps`).
fn listing(info: &ModelInfo) -> Value {
    listing_of(&info.id, info.family, &info.about)
}

/// `GET /api/tags`: the one model served.
pub async fn tags(State(s): State<AppState>) -> Response {
    either(s.ready().map(|(info, _)| Json(json!({"models": [listing(info)]})).into_response()))
}

/// A loaded model as `/api/ps` lists it: in memory, none of it on a GPU.
pub(crate) fn ps_entry(info: &ModelInfo) -> Value {
    let mut m = listing(info);
    m["size_vram"] = json!(0);
    m
}

/// `GET /api/ps`: the model is loaded for as long as the server runs.
pub async fn ps(State(s): State<AppState>) -> Response {
    either(s.ready().map(|(info, _)| Json(json!({"models": [ps_entry(info)]})).into_response()))
}

/// `GET /api/version`.
pub async fn version() -> Response {
    Json(json!({"version": API_VERSION, "k3": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `POST /api/show {"model"}`: details, the sampling defaults as Ollama's `parameters`, the chat
/// template, the shape as `model_info`, and what the model can do.
pub async fn show(State(s): State<AppState>, req: Request) -> Response {
    either(
        async {
            let bytes = body(&s, req).await?;
            let (info, _) = s.ready()?;
            let v: Value = parse(&bytes)?;
            request::show(&v)?;
            let asked = v.get("model").or(v.get("name")).and_then(Value::as_str).unwrap_or_default();
            check_model(asked, info)?;
            Ok(Json(show_body(info)).into_response())
        }
        .await,
    )
}

/// `/api/show`'s answer for a model: details, the sampling defaults as Ollama's `parameters`, the
/// chat template, the shape as `model_info`, and what the model can do.
pub(crate) fn show_body(info: &ModelInfo) -> Value {
    let d = &info.sampling;
    let mut parameters = format!("temperature {}\ntop_p {}", d.temperature, d.top_p);
    if d.top_k > 0 {
        parameters.push_str(&format!("\ntop_k {}", d.top_k));
    }
    if d.min_p > 0.0 {
        parameters.push_str(&format!("\nmin_p {}", d.min_p));
    }
    let family = info.family.name();
    let mut capabilities = vec!["completion"];
    if info.about.tools {
        capabilities.push("tools");
    }
    if info.about.thinking {
        capabilities.push("thinking");
    }
    // Ollama's word for a model that takes images (Open WebUI offers uploads then).
    if info.sees {
        capabilities.push("vision");
    }
    json!({
        "license": "", "modelfile": "", "parameters": parameters,
        "template": info.about.template.clone().unwrap_or_default(),
        "details": details(info.family, &info.about),
        "model_info": {
            "general.architecture": family, "general.parameter_count": info.about.parameters,
            format!("{family}.context_length"): info.context, format!("{family}.embedding_length"): info.hidden,
            format!("{family}.block_count"): info.layers, format!("{family}.vocab_size"): info.vocab,
        },
        "capabilities": capabilities,
        "modified_at": rfc3339(info.about.modified, 0),
    })
}

/// Now, as Ollama writes times: RFC 3339 in UTC with nanoseconds.
pub(crate) fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` (Howard Hinnant's days-to-civil).
fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_rfc3339() {
        assert_eq!(super::rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(super::rfc3339(1_709_210_096, 5), "2024-02-29T12:34:56.000000005Z");
    }
}
