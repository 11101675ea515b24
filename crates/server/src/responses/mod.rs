//! OpenAI's Responses API over the same scheduler as the chat route: `POST /v1/responses`
//! (whole or streamed), `GET` and `DELETE /v1/responses/{id}` and `GET
//! /v1/responses/{id}/input_items` for stored responses. A body is translated once into the
//! `/v1/chat/completions` body it stands for ([`request`]) and prepared by the chat route's
//! rules, so tools, thinking, images, `json_schema` and the prompt cache behave as there; the
//! answer is built from the same reply ([`reply`]); stored responses are kept in memory per API
//! key ([`crate::response_store`]). Errors come in OpenAI's shape, naming the field as the client wrote it.

mod fields;
mod items;
mod reply;
pub mod request;
mod tools;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::answer::{self, Kind};
use crate::api::ChatRequest;
use crate::boundary::Caller;
use crate::error::ApiError;
use crate::request::{body, parse, prepared_bytes};
use crate::response_store::Store;
use crate::state::AppState;
use k3_generate::cache::Scope;
use reply::{Keep, Meta};

/// A fresh response id: `resp_` and 32 hex digits no client can guess.
fn new_id() -> String {
    static SEED: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let s = SEED.get_or_init(RandomState::new);
    format!("resp_{:016x}{:016x}", s.hash_one(n), s.hash_one(!n))
}

fn not_found(id: &str, field: Option<&str>) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no response `{id}` is stored for this API key (stored responses are kept in memory, the oldest dropped \
             beyond the server's bounds, and not across restarts)"
        ),
    );
    e.param = field.map(str::to_string);
    e
}

/// `POST /v1/responses`.
pub async fn create(
    State(s): State<AppState>,
    Extension(scope): Extension<Scope>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Response {
    created(s, scope, caller, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn created(s: AppState, scope: Scope, caller: Caller, req: Request) -> Result<Response, ApiError> {
    let bytes = body(&s, req).await?;
    // Parsed, translated, checked and tokenized in one hop to a blocking thread (CPU work kept
    // off the async workers); what the answer needs of the translation comes back beside it.
    let (stop_bytes, beginnings, store) = (s.stop_bytes, s.beginnings.clone(), s.responses.clone());
    let side = Arc::new(Mutex::new(None));
    let kept = side.clone();
    let p = prepared_bytes(&s, bytes, move |raw: Box<RawValue>, info, tok| {
        let (mut t, earlier) = translated(raw.get().as_bytes(), &store, caller)?;
        let r: ChatRequest = parse(std::mem::take(&mut t.chat).as_bytes())?;
        let tok = tok.ok_or_else(|| ApiError::bad("input", "this model embeds no tokenizer"))?;
        let p = r.prepare(tok, info, stop_bytes, &beginnings).map_err(|e| request::renamed(e, &t.origins))?;
        *kept.lock().unwrap_or_else(PoisonError::into_inner) = Some((t, earlier));
        Ok(p)
    })
    .await?;
    let taken = side.lock().unwrap_or_else(PoisonError::into_inner).take();
    let (t, earlier) =
        taken.ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "checking the request failed"))?;
    let sub = answer::submit(&s, p, Kind::Chat, scope)?;
    let meta = Meta { id: new_id(), created_at: reply::unix_now(), echo: t.echo, namespaced: t.namespaced };
    let keep = t.store.then(|| {
        let mut conversation = earlier;
        conversation.extend(t.input);
        Keep { store: s.responses.clone(), owner: caller, conversation }
    });
    reply::answer(sub, meta, keep, t.stream).await
}

/// A Responses body translated into the chat body, with the stored conversation it continues.
fn translated(bytes: &[u8], store: &Store, caller: Caller) -> Result<(request::Translated, Vec<Value>), ApiError> {
    let v: Value = parse(bytes)?;
    let earlier = match v.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(id)) => {
            store.get(id, caller).ok_or_else(|| not_found(id, Some("previous_response_id")))?.conversation
        }
        Some(other) => return Err(ApiError::bad("previous_response_id", format!("{other} is not a response id"))),
    };
    Ok((request::translate(bytes, &v, &earlier)?, earlier))
}

/// `GET /v1/responses/{id}`: a stored response as it was answered.
pub async fn get(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    s.responses.get(&id, caller).map(|r| Json(r.response)).ok_or_else(|| not_found(&id, None))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !s.responses.delete(&id, caller) {
        return Err(not_found(&id, None));
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}

/// `GET /v1/responses/{id}/input_items`: the conversation's input items (every earlier turn's
/// too), newest first unless `order=asc`; `limit` (1 to 100, 20) after the item `after`.
pub async fn input_items(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if let Some(k) = q.keys().find(|k| !matches!(k.as_str(), "order" | "limit" | "after")) {
        return Err(ApiError::bad(k, "not a parameter of input_items (order, limit, after)"));
    }
    let stored = s.responses.get(&id, caller).ok_or_else(|| not_found(&id, None))?;
    let mut items: Vec<Value> = stored.conversation[..stored.inputs]
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let mut item = item.clone();
            if item.get("id").is_none_or(Value::is_null) {
                item["id"] = json!(format!("item_{}_{i}", id.trim_start_matches("resp_")));
            }
            item
        })
        .collect();
    match q.get("order").map(String::as_str) {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(o) => return Err(ApiError::bad("order", format!("`{o}`: give asc or desc"))),
    }
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => return Err(ApiError::bad("limit", "a number from 1 to 100")),
    };
    if let Some(after) = q.get("after") {
        let at = items.iter().position(|i| i["id"] == json!(after));
        let at = at.ok_or_else(|| ApiError::bad("after", format!("no item `{after}` in this response's input")))?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    Ok(Json(json!({
        "object": "list", "first_id": items.first().map(|i| i["id"].clone()),
        "last_id": items.last().map(|i| i["id"].clone()), "has_more": has_more, "data": items,
    })))
}
