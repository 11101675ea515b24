//! `k3-cli inspect` and `verify`: what a model is, how it is laid out on disk, and whether its
//! bytes are intact.

use k3_cli::progress::{Progress, Unit};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k3_engine::Model;
use serde_json::{Value, json};

fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} KB", bytes as f64 / 1e3)
    }
}

/// The facts `inspect` shows, as one JSON object.
pub fn summary(model: &Model) -> Value {
    let m = model.manifest();
    let a = &m.architecture;
    let mut by_encoding: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for t in &m.trunk.tensors {
        let e = by_encoding.entry(t.tensor.encoding.label()).or_default();
        e.0 += 1;
        e.1 += t.len;
    }
    let index = &model.header().index;
    let layouts: Vec<Value> = m
        .expert_layouts
        .iter()
        .map(|l| {
            json!({
                "record_bytes": l.record_bytes,
                "payload_bytes": l.payload_bytes,
                "matrices": l.matrices.iter().map(|t| json!({
                    "name": t.name, "encoding": t.encoding.label(), "shape": t.shape,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let shards: Vec<Value> = m
        .shards
        .iter()
        .zip(model.shard_paths())
        .enumerate()
        .map(|(i, (s, path))| {
            json!({
                "file": s.file, "path": path.display().to_string(), "bytes": s.bytes,
                "records": index.iter().filter(|e| usize::from(e.shard) == i).count(),
            })
        })
        .collect();
    let record_bytes = m.expert_layouts.first().map_or(0, |l| l.record_bytes);
    let per_token = u64::from(a.experts_per_token) * a.moe_layers.len() as u64 * record_bytes;
    let expert_bytes: u64 = m.shards.iter().map(|s| s.bytes).sum();
    json!({
        "path": model.dir().display().to_string(),
        "format_version": format!("{}.{}", model.header().version.0, model.header().version.1),
        "architecture": a,
        "encodings": m.encodings,
        "activations": activations(model),
        "context": context(model),
        "alignment": m.alignment,
        "expert_records": index.len(),
        "expert_layouts": layouts,
        "routed_bytes_per_token_cold": per_token,
        "trunk": {
            "file": m.trunk.file, "bytes": m.trunk.bytes, "tensors": m.trunk.tensors.len(),
            "tensor_list": m.trunk.tensors.iter().map(|t| json!({
                "name": t.tensor.name, "encoding": t.tensor.encoding.label(), "shape": t.tensor.shape, "bytes": t.len,
            })).collect::<Vec<_>>(),
            "by_encoding": by_encoding.iter().map(|(k, (n, b))| (k.clone(), json!({"tensors": n, "bytes": b})))
                .collect::<serde_json::Map<_, _>>(),
        },
        "shards": shards,
        "total_bytes": m.trunk.bytes + expert_bytes,
        "sampling": sampling(model),
        "vision": vision(model),
        "embedded_files": m.blobs.iter().map(|b| json!({"name": b.name, "bytes": b.len})).collect::<Vec<_>>(),
        "provenance": m.provenance,
    })
}

/// The model's longest context and what its attention state costs: per token of context for
/// each `--kv-cache` type, and fixed per sequence (what chat and serve fit to memory).
fn context(model: &Model) -> Value {
    use k3_engine::KvCacheType;
    let config = model.blob("config.json").ok_or("the model embeds no config.json".to_string()).and_then(|raw| {
        k3_engine::config::ModelConfig::parse(Path::new("config.json"), raw).map_err(|e| e.to_string())
    });
    match config {
        Ok(c) => {
            let per = |kv: KvCacheType| c.attention_state(kv).0;
            json!({
                "max_positions": c.max_positions,
                "state_bytes_per_token": {"f32": per(KvCacheType::F32), "bf16": per(KvCacheType::Bf16),
                                          "int8": per(KvCacheType::Int8)},
                "state_bytes_per_sequence": c.attention_state(KvCacheType::F32).1,
            })
        }
        Err(e) => json!({"error": e}),
    }
}

/// The sampling defaults of generate, chat and serve for `model`, and where they come from.
fn sampling(model: &Model) -> Value {
    use k3_generate::generation_config::{Recommended, defaults, describe};
    let settings = |conversation| match defaults(model, conversation) {
        Ok(c) => json!({
            "temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k, "min_p": c.min_p,
            "repeat_penalty": c.repeat_penalty, "text": describe(&c),
        }),
        Err(e) => json!({"error": e.to_string()}),
    };
    let from = match Recommended::of_model(model) {
        Ok(Some(r)) if !r.is_empty() => "the model's generation_config.json",
        Ok(Some(_)) => "k3's fallback: generation_config.json states no sampling setting",
        Ok(None) => "k3's fallback: no generation_config.json",
        Err(_) => "an unusable generation_config.json",
    };
    json!({"from": from, "generate": settings(false), "chat_and_serve": settings(true)})
}

/// K3's vision tower: its shape, whether the model holds it, and the processor's settings.
fn vision(model: &Model) -> Value {
    let Some(cfg) = model.blob("config.json") else { return Value::Null };
    let Ok(cfg) = k3_engine::config::ModelConfig::parse(Path::new("config.json"), cfg) else { return Value::Null };
    let Some(v) = cfg.vision else { return Value::Null };
    let t = &v.tower;
    let (mut tensors, mut bytes) = (0, 0);
    for e in model
        .manifest()
        .trunk
        .tensors
        .iter()
        .filter(|e| e.tensor.name.starts_with("vision_tower.") || e.tensor.name.starts_with("mm_projector."))
    {
        tensors += 1;
        bytes += e.len;
    }
    let processor = match model.blob("preprocessor_config.json") {
        Some(b) => k3_vision::ProcessorConfig::parse(b, t).map(|p| (p, "preprocessor_config.json")),
        None => k3_vision::ProcessorConfig::default_for(t).map(|p| (p, "the reference's defaults")),
    };
    json!({
        "tower": "MoonViT3d", "blocks": t.vt_num_hidden_layers, "hidden": t.vt_hidden_size,
        "heads": t.vt_num_attention_heads, "head_dim": t.head_dim(), "mlp": t.vt_intermediate_size,
        "patch": t.patch_size, "merge": t.merge_kernel_size, "projects_to": t.text_hidden_size,
        "placeholder_token": v.placeholder, "tensors_kept": tensors, "bytes": bytes,
        "processor": match processor {
            Ok((p, from)) => json!({"in_patch_limit": p.in_patch_limit, "patch_limit_on_one_side": p.patch_limit_on_one_side,
                "image_mean": p.image_mean, "image_std": p.image_std, "from": from}),
            Err(e) => json!({"error": e.to_string()}),
        },
    })
}

/// Every trunk tensor with its stored encoding, shape and size, for a person.
pub fn tensor_table(model: &Model) -> String {
    let mut o = String::new();
    let tensors = &model.manifest().trunk.tensors;
    let width = tensors.iter().map(|t| t.tensor.name.len()).max().unwrap_or(0);
    let enc_width = tensors.iter().map(|t| t.tensor.encoding.label().len()).max().unwrap_or(0).max(10);
    for t in tensors {
        let e = &t.tensor;
        let shape = format!("{:?}", e.shape);
        let label = e.encoding.label();
        let _ = writeln!(o, "{:<width$}  {label:<enc_width$} {shape:<16} {}", e.name, human_bytes(t.len));
    }
    o
}

/// The same facts for a person.
pub fn table(model: &Model) -> String {
    let m = model.manifest();
    let a = &m.architecture;
    let s = summary(model);
    let mut o = String::new();
    let (major, minor) = model.header().version;
    let _ = writeln!(o, "model       {}  (WASTE {major}.{minor})", model.dir().display());
    let _ = writeln!(o, "arch        {}: {} layers, hidden {}, vocab {}", a.name, a.layers, a.hidden, a.vocab);
    let layers = match (a.moe_layers.first(), a.moe_layers.last()) {
        (Some(f), Some(l)) => format!("{} MoE layers ({f}..={l})", a.moe_layers.len()),
        _ => "no MoE layers".into(),
    };
    let _ = writeln!(
        o,
        "experts     {} per layer, {} active per token, {layers}: {} records",
        a.experts,
        a.experts_per_token,
        model.header().index.len()
    );
    for (i, l) in m.expert_layouts.iter().enumerate() {
        let mats: Vec<String> =
            l.matrices.iter().map(|t| format!("{} {} {:?}", t.name, t.encoding.label(), t.shape)).collect();
        let _ = writeln!(
            o,
            "record {i:<4} {} per expert ({} payload, aligned to {}): {}",
            human_bytes(l.record_bytes),
            human_bytes(l.payload_bytes),
            m.alignment,
            mats.join(", ")
        );
    }
    let per_token = s["routed_bytes_per_token_cold"].as_u64().unwrap_or(0);
    let _ = writeln!(o, "per token   {} of routed experts read when nothing is cached", human_bytes(per_token));
    let enc: Vec<String> = m.encodings.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(o, "encodings   {}", enc.join(", "));
    context_line(&mut o, &s["context"]);
    let auto = k3_engine::ActivationPrecision::Auto.for_model(model);
    let _ = writeln!(o, "{} (auto: generate, chat and serve)", crate::run::activations_line(auto, auto.kv_cache()));
    let _ =
        writeln!(o, "trunk       {}  {}, {} tensors", m.trunk.file, human_bytes(m.trunk.bytes), m.trunk.tensors.len());
    if let Some(by) = s["trunk"]["by_encoding"].as_object() {
        let w = by.keys().map(String::len).max().unwrap_or(0).max(10);
        for (k, v) in by {
            let _ = writeln!(
                o,
                "              {k:<w$} {:>5} tensors  {}",
                v["tensors"],
                human_bytes(v["bytes"].as_u64().unwrap_or(0))
            );
        }
    }
    for sh in s["shards"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "shard       {}  {}, {} records  ({})",
            sh["file"].as_str().unwrap_or_default(),
            human_bytes(sh["bytes"].as_u64().unwrap_or(0)),
            sh["records"],
            sh["path"].as_str().unwrap_or_default()
        );
    }
    let _ = writeln!(o, "total       {}", human_bytes(s["total_bytes"].as_u64().unwrap_or(0)));
    vision_lines(&mut o, &s["vision"]);
    let blobs: Vec<String> = m.blobs.iter().map(|b| format!("{} ({})", b.name, human_bytes(b.len))).collect();
    let _ = writeln!(o, "embedded    {}", if blobs.is_empty() { "nothing".into() } else { blobs.join(", ") });
    let samp = &s["sampling"];
    let text = |k: &str| samp[k]["text"].as_str().or(samp[k]["error"].as_str()).unwrap_or_default().to_string();
    let _ = writeln!(
        o,
        "sampling    chat and serve: {}; generate: {}  (from {})",
        text("chat_and_serve"),
        text("generate"),
        samp["from"].as_str().unwrap_or_default()
    );
    let _ = writeln!(o, "provenance  {}", m.provenance);
    o
}

/// The `context` line of [`table`], from [`summary`]'s `context`.
fn context_line(o: &mut String, c: &Value) {
    if let Some(per) = c["state_bytes_per_token"].as_object() {
        let most = c["max_positions"].as_u64().map_or("not stated".into(), |n| format!("{n} tokens"));
        let b = |k: &str| format!("{} B", per.get(k).and_then(Value::as_u64).unwrap_or(0));
        let _ = writeln!(
            o,
            "context     {most} (max_position_embeddings); attention state {} a token (--kv-cache bf16 {}, int8 {}) and {} a sequence",
            b("f32"),
            b("bf16"),
            b("int8"),
            human_bytes(c["state_bytes_per_sequence"].as_u64().unwrap_or(0))
        );
    }
}

/// The `vision` and `images` lines of [`table`], from [`summary`]'s `vision` (none without a tower).
fn vision_lines(o: &mut String, v: &Value) {
    if !v.is_null() {
        let kept = match v["tensors_kept"].as_u64() {
            Some(0) | None => "not in this model (converted without it: convert again to read images)".to_string(),
            Some(n) => format!("{n} tensors, {}", human_bytes(v["bytes"].as_u64().unwrap_or(0))),
        };
        let p = &v["processor"];
        let _ = writeln!(
            o,
            "vision      MoonViT3d: {} blocks, {} wide, {} heads of {}, MLP {}; {}x{} patches merged 2x2 into {}; {kept}",
            v["blocks"], v["hidden"], v["heads"], v["head_dim"], v["mlp"], v["patch"], v["patch"], v["projects_to"]
        );
        let _ = writeln!(
            o,
            "images      at most {} patches ({} a side), an image takes (h/{})(w/{})/4 positions  (from {})",
            p["in_patch_limit"],
            p["patch_limit_on_one_side"],
            v["patch"],
            v["patch"],
            p["from"].as_str().unwrap_or("?")
        );
    }
}

pub fn run(model: &Path, shard_dirs: &[PathBuf], json: bool, tensors: bool) -> anyhow::Result<ExitCode> {
    let m = crate::run::open_model(model, shard_dirs)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary(&m))?);
    } else if tensors {
        print!("{}", tensor_table(&m));
    } else {
        print!("{}", table(&m));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn verify(model: &Model) -> anyhow::Result<ExitCode> {
    let total = model.verify_bytes();
    let pb = Progress::new("verify", total, Unit::Bytes);
    let problems = model.verify(&mut |done| pb.set_position(done));
    pb.finish();
    let m = model.manifest();
    if problems.is_empty() {
        println!(
            "ok: {} embedded files, {} trunk tensors and {} expert records verified ({:.1} MB)",
            m.blobs.len(),
            m.trunk.tensors.len(),
            model.header().index.len(),
            total as f64 / 1e6
        );
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        eprintln!("BAD {}: {}", p.place, p.error);
    }
    eprintln!("{} problem(s) found in {}", problems.len(), model.dir().display());
    Ok(ExitCode::FAILURE)
}

/// What `--activations auto` picks for this model, and what each class of products would run at
/// on this CPU.
fn activations(model: &Model) -> Value {
    let auto = k3_engine::ActivationPrecision::Auto.for_model(model);
    let mut v = serde_json::to_value(auto.ran()).unwrap_or_default();
    v["auto"] = auto.name().into();
    v["kv_cache_auto"] = auto.kv_cache().name().into();
    v
}
