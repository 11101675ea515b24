//! `cargo xtask bench serve`: the server over real HTTP on localhost. Aggregate completion
//! tokens/s with 1..N concurrent clients (each its own prompt, greedy), and the time to the first
//! token, with the prompt cache and without, of a follow-up turn in a ~1,000-token conversation,
//! of the same request again (Regenerate), and of a new question under a ~2,000-token system
//! prompt another request used; and the time to the first token of one conversation through
//! each chat API (`/v1/chat/completions`, Anthropic's `/v1/messages`, OpenAI's `/v1/responses`):
//! the new routes' serving overhead. Repetitions interleaved, medians.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use k3_server::ServerOptions;
use serde_json::{Value, json};

use super::median;

pub struct Options {
    pub model: PathBuf,
    pub clients: Vec<usize>,
    pub tokens: usize,
    pub reps: usize,
    /// Memory budget for the engine (e.g. for a model larger than memory).
    pub mem: Option<u64>,
}

/// A server on its own runtime, listening on a free port, once `/health` says ok.
struct Server {
    addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

fn start(opts: ServerOptions) -> Result<Server> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let limits = opts.limits;
    let (router, state) = k3_server::app(opts);
    rt.spawn(async move { k3_server::serve(listener, router, state, limits).await });
    for _ in 0..3000 {
        if http(addr, "GET", "/health", None).is_ok_and(|(s, _)| s == 200) {
            return Ok(Server { addr, _rt: rt });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    bail!("the server did not become ready")
}

/// One HTTP/1.1 request (`Connection: close`): (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// A streamed request: seconds to the first piece of text, and its usage (when asked for).
fn first_token(addr: SocketAddr, body: &Value) -> Result<(f64, Value)> {
    first_token_on(addr, Route::Chat, body)
}

/// The three chat APIs, for the time each takes to its first token on the same conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Messages,
    Responses,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
        }
    }

    /// Whether a streamed event's data carries answer text.
    fn is_text(self, v: &Value) -> bool {
        let nonempty = |t: &Value| t.as_str().is_some_and(|t| !t.is_empty());
        match self {
            Route::Chat => nonempty(&v["choices"][0]["delta"]["content"]),
            Route::Messages => v["type"] == "content_block_delta" && nonempty(&v["delta"]["text"]),
            Route::Responses => v["type"] == "response.output_text.delta" && nonempty(&v["delta"]),
        }
    }

    /// A conversation (OpenAI chat messages, the system turn first) as this route's body.
    fn body(self, model: &str, messages: &[Value], max_tokens: u64) -> Value {
        let (system, rest) = (&messages[0]["content"], &messages[1..]);
        match self {
            Route::Chat => streamed(json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0})),
            Route::Messages => json!({"model": model, "system": system, "messages": rest, "max_tokens": max_tokens,
                                      "temperature": 0, "stream": true}),
            Route::Responses => json!({"model": model, "instructions": system, "input": rest,
                                       "max_output_tokens": max_tokens, "temperature": 0, "stream": true,
                                       "store": false}),
        }
    }
}

/// [`first_token`] through `route`'s API.
fn first_token_on(addr: SocketAddr, route: Route, body: &Value) -> Result<(f64, Value)> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    let body = body.to_string();
    write!(
        s,
        "POST {} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        route.path(),
        body.len()
    )?;
    let (mut first, mut usage) = (None, Value::Null);
    for line in BufReader::new(s).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)?;
        if first.is_none() && route.is_text(&v) {
            first = Some(t0.elapsed().as_secs_f64());
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    Ok((first.context("no text came back")?, usage))
}

/// Time to the first token of the same ~1,000-token conversation through each API, on the
/// server without a prompt cache (every request prefills it whole), the routes interleaved and
/// their order rotated each repetition: each route's median against `/v1/chat/completions`'.
fn routes(o: &Options, cold: &Server, json_out: bool) -> Result<Value> {
    let (_, models) = http(cold.addr, "GET", "/v1/models", None)?;
    let model = serde_json::from_str::<Value>(&models)?["data"][0]["id"].as_str().unwrap_or("default").to_string();
    let all = [Route::Chat, Route::Messages, Route::Responses];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
    for rep in 0..o.reps.max(3) * 3 {
        let messages = conversation(rep);
        for k in 0..all.len() {
            let i = (k + rep) % all.len();
            times[i].push(first_token_on(cold.addr, all[i], &all[i].body(&model, &messages, 4))?.0);
        }
    }
    let chat = median(times[0].clone());
    let mut out = serde_json::Map::new();
    for (r, t) in all.iter().zip(&times) {
        let m = median(t.clone());
        out.insert(r.path().to_string(), json!({"ttft_s": m, "vs_chat_completions": m / chat.max(1e-12)}));
        if !json_out {
            println!("{:<22} first token in {:.1} ms ({:.3}x /v1/chat/completions)", r.path(), m * 1e3, m / chat);
        }
    }
    Ok(Value::Object(out))
}

/// `clients` concurrent greedy completions of `tokens`: completion tokens per second in all.
/// Prompts are text, or (a model without a tokenizer) 4 random ids below `vocab`.
fn aggregate(addr: SocketAddr, clients: usize, tokens: usize, rep: usize, ids: Option<u32>) -> Result<f64> {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let prompt = match ids {
                Some(vocab) => {
                    let mut rng = k3_quant::rng::XorShift::new((rep * 1000 + i) as u64 + 1);
                    json!((0..4).map(|_| (rng.next_u64() % u64::from(vocab)) as u32).collect::<Vec<_>>())
                }
                None => json!(format!("And it came to pass on day {} of month {rep}, that", i + 1)),
            };
            let body = json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0});
            std::thread::spawn(move || http(addr, "POST", "/v1/completions", Some(&body)))
        })
        .collect();
    let mut done = 0;
    for h in handles {
        let (status, body) = h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        if status != 200 {
            bail!("HTTP {status}: {body}");
        }
        let v: Value = serde_json::from_str(&body)?;
        done += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    }
    Ok(done as f64 / t0.elapsed().as_secs_f64())
}

/// A conversation of about 1,000 tokens ending with a user turn (`rep` makes each one new).
fn conversation(rep: usize) -> Vec<Value> {
    let verse = "And God saw the light, that it was good: and God divided the light from the darkness. ";
    let mut m = vec![json!({"role": "system", "content": format!("Conversation {rep}.")})];
    for i in 0..8 {
        m.push(json!({"role": "user", "content": format!("Tell me verse {i} again: {}", verse.repeat(2))}));
        m.push(json!({"role": "assistant", "content": verse.repeat(3)}));
    }
    m.push(json!({"role": "user", "content": "And what came after?"}));
    m
}

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    let model = k3_engine::Model::open(&o.model)?;
    let ids = match k3_generate::model_tokenizer(&model) {
        Some(_) => None,
        None => Some(model.manifest().architecture.vocab as u32),
    };
    drop(model);
    let mut opts = ServerOptions::new(o.model.clone());
    opts.engine.mem_budget = o.mem;
    let batched = start(opts.clone())?;
    let mut report = json!({
        "model": o.model.display().to_string(), "tokens_per_client": o.tokens, "reps": o.reps,
        "clients": throughput(o, &batched, ids, json_out)?,
    });
    if ids.is_some() {
        // No chat without a tokenizer: the prompt cache's cases are not measured.
        return Ok(report);
    }
    let cold = start(ServerOptions { prompt_cache_ram: 0, ..opts })?;
    let (w, wo, prompt_tokens, cached) = follow_up(o, &batched, &cold)?;
    report["follow_up_ttft_s"] = json!({"prompt_cache": w, "no_cache": wo, "ratio": w / wo.max(1e-12),
                                        "first_turn_prompt_tokens": prompt_tokens, "tokens_saved_total": cached});
    if !json_out {
        println!(
            "follow-up turn after a {prompt_tokens}-token first turn: first token in {:.1} ms with the prompt cache, {:.1} ms without ({:.3}x)",
            w * 1e3,
            wo * 1e3,
            w / wo.max(1e-12)
        );
    }
    report["routes_ttft_s"] = routes(o, &cold, json_out)?;
    let cases: [(&str, Case); 2] = [("regenerate", regenerate), ("shared_system", shared_system)];
    for (name, case) in cases {
        report[format!("{name}_ttft_s")] = measure_case(o, name, case, &batched, &cold, json_out)?;
    }
    Ok(report)
}

/// Tokens a second in all for each number of concurrent clients (medians over `o.reps`, the
/// order of the client counts rotated each repetition), and each against one client.
fn throughput(o: &Options, server: &Server, ids: Option<u32>, json_out: bool) -> Result<Value> {
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); o.clients.len()];
    for rep in 0..o.reps {
        for k in 0..o.clients.len() {
            let i = (k + rep) % o.clients.len();
            eprintln!("  rep {rep}: {} clients", o.clients[i]);
            rates[i].push(aggregate(server.addr, o.clients[i], o.tokens, rep, ids)?);
        }
    }
    let one = median(rates[o.clients.iter().position(|&c| c == 1).unwrap_or(0)].clone());
    let mut by_clients = serde_json::Map::new();
    for (c, r) in o.clients.iter().zip(&rates) {
        let m = median(r.clone());
        by_clients.insert(c.to_string(), json!({"tok_per_s": m, "vs_one": m / one.max(1e-12)}));
    }
    if !json_out {
        println!("concurrent clients, {} tokens each, greedy ({} reps, medians):", o.tokens, o.reps);
        for (c, v) in &by_clients {
            println!(
                "  {c:>3} clients: {:>9.3} tok/s in all ({:.2}x one client)",
                v["tok_per_s"].as_f64().unwrap_or(0.0),
                v["vs_one"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(Value::Object(by_clients))
}

/// Time to first token of a follow-up turn: the first turn answered, then the next one
/// streamed, on a server with the prompt cache and one without. Gives the two medians, the
/// first turn's prompt tokens and the tokens the cache saved in all.
fn follow_up(o: &Options, batched: &Server, cold: &Server) -> Result<(f64, f64, u64, u64)> {
    let (mut with, mut without, mut prompt_tokens, mut cached) = (Vec::new(), Vec::new(), 0, 0);
    for rep in 0..o.reps {
        for (server, out) in [(batched, &mut with), (cold, &mut without)] {
            let mut messages = conversation(rep);
            let first = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
            let (status, body) = http(server.addr, "POST", "/v1/chat/completions", Some(&first))?;
            if status != 200 {
                bail!("HTTP {status}: {body}");
            }
            let v: Value = serde_json::from_str(&body)?;
            messages.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
            messages.push(json!({"role": "user", "content": "Say it once more."}));
            out.push(
                first_token(server.addr, &streamed(json!({"messages": messages, "max_tokens": 4, "temperature": 0})))?
                    .0,
            );
            prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        }
        let (_, m) = http(batched.addr, "GET", "/metrics", None)?;
        cached = m
            .lines()
            .find_map(|l| l.strip_prefix("k3_prompt_cache_tokens_saved_total "))
            .unwrap_or("0")
            .to_string()
            .parse::<f64>()
            .unwrap_or(0.0) as u64;
    }
    Ok((median(with), median(without), prompt_tokens, cached))
}

/// One case's time to first token (a first request, then the measured one) on both servers.
fn measure_case(o: &Options, name: &str, case: Case, batched: &Server, cold: &Server, json_out: bool) -> Result<Value> {
    let (mut with, mut without, mut tokens) = (Vec::new(), Vec::new(), (0, 0));
    for rep in 0..o.reps {
        for (server, out) in [(batched, &mut with), (cold, &mut without)] {
            let (first, next) = case(rep);
            let (status, body) = http(server.addr, "POST", "/v1/chat/completions", Some(&first))?;
            if status != 200 {
                bail!("HTTP {status}: {body}");
            }
            let (ttft, usage) = first_token(server.addr, &next)?;
            out.push(ttft);
            if std::ptr::eq(server, batched) {
                tokens = (usage["prompt_tokens"].as_u64().unwrap_or(0), cached_tokens(&usage));
            }
        }
    }
    let (w, wo) = (median(with), median(without));
    if !json_out {
        println!(
            "{name}: a {}-token prompt ({} cached): first token in {:.1} ms with the prompt cache, {:.1} ms without ({:.3}x)",
            tokens.0,
            tokens.1,
            w * 1e3,
            wo * 1e3,
            w / wo.max(1e-12)
        );
    }
    Ok(json!({"prompt_cache": w, "no_cache": wo, "ratio": w / wo.max(1e-12),
              "prompt_tokens": tokens.0, "cached_tokens": tokens.1}))
}

/// A first request and the streamed one measured after it, for repetition `rep`.
type Case = fn(usize) -> (Value, Value);

fn cached_tokens(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

/// A ~1,000-token conversation asked, then asked again as it was.
fn regenerate(rep: usize) -> (Value, Value) {
    let body = json!({"messages": conversation(rep), "max_tokens": 4, "temperature": 0});
    (body.clone(), streamed(body))
}

/// A ~2,000-token system prompt with one question, then the same system prompt with another.
fn shared_system(rep: usize) -> (Value, Value) {
    let verse = "And God saw the light, that it was good: and God divided the light from the darkness. ";
    let system = format!("Rules of house {rep}. {}", verse.repeat(100));
    let ask = |q: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                               "max_tokens": 4, "temperature": 0})
    };
    (ask("What was good?"), streamed(ask("What was divided?")))
}
