//! The CLI on the converted golden fixtures, as a user runs it.

mod common;

use std::path::Path;

use common::{copy_model, fixture, k3, k3_stdin};

/// `k3-cli logits --model MODEL --ids IDS --out OUT` and `extra` switches.
fn logits(model: &Path, ids: &str, out: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec!["logits", "--model", model.to_str().unwrap(), "--ids", ids, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    k3(&args)
}

#[test]
fn inspect_describes_the_k3_fixture() {
    let (ok, out, err) = k3(&["inspect", fixture("tiny-k3.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("kimi_k3: 6 layers, hidden 256, vocab 512"), "{out}");
    assert!(out.contains("32 per layer, 4 active per token, 5 MoE layers (1..=5): 160 records"), "{out}");
    assert!(out.contains("w1 mxfp4 [64, 128], w2 mxfp4 [128, 64], w3 mxfp4 [64, 128]"), "{out}");
}

#[test]
fn inspect_json_is_one_object_a_program_can_read() {
    let (ok, out, err) = k3(&["inspect", "--json", fixture("tiny-kimi-linear.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["architecture"]["name"], "kimi_linear");
    assert_eq!(v["architecture"]["moe_layers"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(v["expert_records"], 64);
    // BF16 experts: w1 [64, 256] + w2 [256, 64] + w3 [64, 256] = 3 x 32 KiB, plus header, padded to 4 KiB.
    assert_eq!(v["expert_layouts"][0]["record_bytes"], 102400);
    assert_eq!(v["routed_bytes_per_token_cold"], 4 * 4 * 102400);
    // Its config: model_max_length 1048576; one MLA layer of latent 64 + 16 shared key dims
    // (f32 320 B a token, bf16 160, int8 64 + 4 + 16 + 4 = 88); four KDA layers of 4 heads x 32,
    // kernel 4: 4 x 4 x (128 x 32 + 3 x 128 x 4) bytes.
    assert_eq!(v["context"]["max_positions"], 1048576);
    assert_eq!(v["context"]["state_bytes_per_token"], serde_json::json!({"f32": 320, "bf16": 160, "int8": 88}));
    assert_eq!(v["context"]["state_bytes_per_sequence"], 4 * 4 * (128 * 32 + 3 * 128 * 4));
}

#[test]
fn verify_passes_a_good_model() {
    let (ok, out, err) = k3(&["verify", fixture("tiny-k3.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("160 expert records verified"), "{out}");
}

#[test]
fn verify_names_a_flipped_byte_in_a_record_and_in_a_tensor() {
    let d = copy_model("tiny-k3.waste");
    let m = k3_format::Model::open(d.path()).unwrap();
    let rec = m.expert(3, 17).unwrap().entry;
    let t = m.manifest().trunk_tensor("model.layers.2.self_attn.q_proj.weight").unwrap().clone();
    drop(m);
    let shard = d.path().join("experts-00000.waste");
    let mut b = std::fs::read(&shard).unwrap();
    b[(rec.offset + rec.length / 2) as usize] ^= 4;
    std::fs::write(&shard, b).unwrap();
    let trunk = d.path().join("trunk.waste");
    let mut b = std::fs::read(&trunk).unwrap();
    b[(t.offset + 1) as usize] ^= 1;
    std::fs::write(&trunk, b).unwrap();

    let (ok, _, err) = k3(&["verify", d.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("BAD expert record (layer 3, expert 17)"), "{err}");
    assert!(err.contains("BAD tensor `model.layers.2.self_attn.q_proj.weight`"), "{err}");
    assert!(err.contains("2 problem(s)"), "{err}");
}

#[test]
fn a_directory_that_is_not_a_model_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let (ok, _, err) = k3(&["inspect", d.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a WASTE model directory"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn logits_and_trace_match_the_golden_references() {
    let d = tempfile::tempdir().unwrap();
    let g = fixture("golden/tiny-k3/golden");
    let ids = std::fs::read_to_string(g.join("ids.txt")).unwrap();
    let model = fixture("tiny-k3.waste");
    for (cmd, golden) in [("logits", "logits.f32"), ("trace", "trace.f32")] {
        let out = d.path().join(format!("{cmd}.f32"));
        let (ok, stdout, err) = k3(&[
            "--",
            cmd,
            "--model",
            model.to_str().unwrap(),
            "--ids",
            ids.trim(),
            "--out",
            out.to_str().unwrap(),
            "--chunk",
            "3",
        ][1..]);
        assert!(ok, "{err}");
        assert!(stdout.contains("argmax per position: [5, 73, 237, 390, 292, 41, 381, 251]"), "{stdout}");
        let (got, want) = (f32s(&out), f32s(&g.join(golden)));
        assert_eq!(got.len(), want.len());
        let num: f64 = got.iter().zip(&want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
        let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
        assert!((num / den).sqrt() < 1e-4, "{cmd}");
    }
}

#[test]
fn bad_token_ids_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("x.f32");
    let model = fixture("tiny-k3.waste");
    let (ok, _, err) = logits(&model, "1 2 x", &out, &[]);
    assert!(!ok && err.contains("`x` is not a token id"), "{err}");
    let (ok, _, err) = logits(&model, "1 999", &out, &[]);
    assert!(!ok && err.contains("token id 999 is outside the vocabulary of 512"), "{err}");
    assert!(!out.exists(), "nothing written on error");
}

#[test]
fn measurement_switches_change_timing_not_results() {
    let d = tempfile::tempdir().unwrap();
    let model = fixture("tiny-k3.waste");
    let ids = std::fs::read_to_string(fixture("golden/tiny-k3/golden/ids.txt")).unwrap();
    let base = d.path().join("base.f32");
    let (ok, _, err) = logits(&model, ids.trim(), &base, &[]);
    assert!(ok, "{err}");
    let other = d.path().join("other.f32");
    let stats = d.path().join("stats.json");
    let (ok, _, err) = logits(
        &model,
        ids.trim(),
        &other,
        &[
            "--no-overlap",
            "--no-lookahead",
            "--cache-policy",
            "lru",
            "--mem",
            "80M",
            "--stats",
            "--verbose",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert!(err.contains("memory plan") && err.contains("overlap efficiency"), "{err}");
    assert_eq!(std::fs::read(&base).unwrap(), std::fs::read(&other).unwrap());
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(s["tokens"], 8);
    assert_eq!(s["prefetches"]["issued"], 0, "--no-lookahead");
    assert!(s["bytes_read"].as_u64().unwrap() > 0 && s["peak_rss_bytes"].as_u64().unwrap() > 0);
    let (ok, _, err) = logits(&model, "1", &other, &["--mem", "1M"]);
    assert!(!ok && err.contains("too small") && err.contains("needs at least"), "{err}");
    assert!(!err.contains("stack backtrace"), "{err}");
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let ranks = fixture("tokenizer/o200k_base.tiktoken");
    let text = "Hello 世界 😀\r\nit's 42 — done";
    let (ok, ids, err) = k3_stdin(&["tokenize", "--tokenizer", ranks.to_str().unwrap()], text);
    assert!(ok, "{err}");
    let parsed: Vec<u32> = serde_json::from_str(ids.trim()).unwrap();
    assert!(!parsed.is_empty());
    let (ok, back, err) = k3_stdin(&["detokenize", "--tokenizer", ranks.to_str().unwrap()], &ids);
    assert!(ok, "{err}");
    assert_eq!(back, text);
    let (ok, _, err) = k3_stdin(&["tokenize", "--tokenizer", fixture("tiny-k3.waste").to_str().unwrap()], "x");
    assert!(!ok && err.contains("embeds no tiktoken.model or tokenizer.json"), "{err}");
    let hf = fixture("tokenizer/minilm-tokenizer.json");
    let (ok, ids, err) = k3_stdin(&["tokenize", "--tokenizer", hf.to_str().unwrap()], "Hello world");
    assert!(ok, "{err}");
    assert_eq!(ids.trim(), "[7592,2088]");
}

#[test]
fn generate_is_reproducible_and_starts_from_the_reference_prediction() {
    let model = fixture("tiny-k3.waste");
    let m = model.to_str().unwrap();
    // The golden argmax after "37 246 205" is 237 (fixtures/golden/tiny-k3/golden/meta.json),
    // with exact activations: compared with a reference (this random model's top token moves
    // under int8 expert activations, generate's default).
    let exact = ["generate", "--model", m, "--ids", "37 246 205", "--max-tokens", "6", "--activations", "exact"];
    let (ok, out, err) = k3(&exact);
    assert!(ok, "{err}");
    assert!(out.starts_with("237 "), "{out}");
    let (_, again, _) = k3(&exact);
    assert_eq!(out, again, "greedy decoding is reproducible");
    let sampled = [
        "generate",
        "--model",
        m,
        "--ids",
        "37 246 205",
        "--max-tokens",
        "12",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "3",
    ];
    let (ok, a, err) = k3(&sampled);
    assert!(ok, "{err}");
    assert_eq!(a, k3(&sampled).1, "the same seed samples the same tokens");
    let (ok, _, err) = k3(&["generate", "--model", m, "hello"]);
    assert!(!ok && err.contains("embeds no tokenizer"), "{err}");
    let d = tempfile::tempdir().unwrap();
    let stats = d.path().join("s.json");
    let (ok, _, err) = k3(&[
        "generate",
        "--model",
        m,
        "--ids",
        "37 246 205",
        "--max-tokens",
        "4",
        "--stats-json",
        stats.to_str().unwrap(),
        "--context",
        "64",
        "--activations",
        "exact",
    ]);
    assert!(ok, "{err}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(s["prefill"]["tokens"], 3);
    assert_eq!(s["decode"]["tokens"], 4);
    assert_eq!(s["per_token"].as_array().unwrap().len(), 4, "one entry per decode step but the last");
    assert_eq!(s["per_token"][0]["token"], 237);
}

#[test]
fn text_generation_and_chat_run_end_to_end() {
    // The golden tiny K3 with a byte-level tokenizer (fixtures/README.md), so text goes in and out.
    let model = fixture("default.waste");
    let m = model.to_str().unwrap();
    let (ok, out, err) = k3(&["generate", "--model", m, "Once upon a time", "--max-tokens", "8"]);
    assert!(ok, "{err}");
    assert!(!out.trim().is_empty(), "random weights, but some text comes out");
    let (ok, out, err) = k3_stdin(
        &["chat", "--model", m, "--system", "Be brief.", "--max-tokens", "6", "--temperature", "0"],
        "Hi\nAnd again?\n",
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "one answer per turn: {out:?}");
    assert_eq!(err.matches("> ").count(), 3, "a prompt per turn and one at the end: {err:?}");
}

#[test]
fn usage_history_is_recorded_and_used_for_pinning() {
    let d = tempfile::tempdir().unwrap();
    let model = fixture("tiny-k3.waste");
    let hist = d.path().join("usage.txt");
    let out = d.path().join("l.f32");
    for _ in 0..2 {
        let (ok, _, err) =
            logits(&model, "37 246 205 394", &out, &["--usage-history", hist.to_str().unwrap(), "--verbose"]);
        assert!(ok, "{err}");
    }
    let text = std::fs::read_to_string(&hist).unwrap();
    assert!(text.starts_with("# k3 expert usage v1\n"));
    // 4 tokens x 4 experts x 5 MoE layers, twice.
    let total: u64 = text.lines().skip(1).map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(total, 2 * 4 * 4 * 5);
    let (_, _, err) = logits(&model, "1", &out, &["--usage-history", hist.to_str().unwrap(), "--verbose"]);
    // Half the cache's slots are pinnable: the hottest experts of the history, as many as fit.
    let slots: usize = err.split(" slots of").next().unwrap().rsplit('(').next().unwrap().trim().parse().unwrap();
    let distinct = text.lines().skip(1).count();
    assert!(err.contains(&format!("pinned the {} most used experts", distinct.min(slots / 2))), "{err}");
}

#[test]
fn without_model_the_embedded_default_runs() {
    let (ok, out, err) = k3(&["generate", "Once upon a time", "--max-tokens", "40"]);
    assert!(ok, "{err}");
    // The default model is trained (fixtures/default-model): what it writes is words, nearly all
    // of them words of the held-out chapters it never saw (random weights give BPE fragments).
    let heldout = std::fs::read_to_string(fixture("default-model/heldout.txt")).unwrap();
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_alphabetic()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
    };
    let known: std::collections::HashSet<String> = words(&heldout).into_iter().collect();
    let said = words(&out);
    assert!(said.len() >= 15, "{out:?}");
    let hits = said.iter().filter(|w| known.contains(*w)).count();
    assert!(hits * 10 >= said.len() * 9, "{hits} of {} words are English words: {out:?}", said.len());
    let (ok, out, err) = k3_stdin(&["chat", "--max-tokens", "4", "--temperature", "0"], "Hello\n");
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
}

#[test]
fn perplexity_scores_text_and_refuses_too_little() {
    // Genesis 1:3-4, part of the default model's training text: a trained model finds it easy.
    let verse = "And God said, Let there be light: and there was light. And God saw the light, that it was good.";
    let (ok, out, err) = k3_stdin(&["perplexity", "--json", "--window", "64"], verse);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let (tokens, scored) = (v["tokens"].as_u64().unwrap(), v["scored_tokens"].as_u64().unwrap());
    assert!(tokens > 10 && tokens <= 64, "one window: {v}");
    assert_eq!(scored, tokens - 1);
    let ppl = v["perplexity"].as_f64().unwrap();
    assert!(ppl > 1.0 && ppl < 50.0, "a uniform guess over 4,096 tokens would be 4096: {v}");
    // Against itself: every top token agrees and the divergence is nothing.
    let m = fixture("default.waste");
    let (ok, out, err) = k3_stdin(&["perplexity", "--json", "--window", "64", "--against", m.to_str().unwrap()], verse);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["against"]["top1_agreement"].as_f64(), Some(1.0), "{v}");
    assert!(v["against"]["mean_kl"].as_f64().unwrap().abs() < 1e-9, "{v}");
    assert_eq!(v["against"]["positions"].as_u64(), Some(scored), "{v}");
    let (ok, _, err) = k3_stdin(&["perplexity"], "a");
    assert!(!ok);
    assert!(err.contains("too short"), "{err}");
}

/// A Kimi K2 model (the golden tiny DeepSeek-V3 checkpoint with a byte-level tokenizer carrying
/// K2's special tokens and K2-Instruct's own chat template) converted, then `generate` and a
/// two-turn `chat` run on it: the template supplies the default system message.
#[test]
fn a_k2_model_generates_and_chats_with_its_own_template() {
    use k3_convert::synth::scripted::{SPECIALS, byte_tokenizer};
    use k3_convert::{ConvertOptions, convert};
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("golden/deepseek-v3/bf16").join(f), hf.join(f)).unwrap();
    }
    let template = std::fs::read_to_string(fixture("chat/templates/Kimi-K2-Instruct.jinja")).unwrap();
    byte_tokenizer(&hf, &[], &SPECIALS, Some(&template)).unwrap();
    let out = d.path().join("k2");
    convert(&ConvertOptions::new(hf, &out), &mut |_| {}).unwrap();
    let m = out.to_str().unwrap();
    let (ok, out_text, err) = k3(&["generate", "--model", m, "Once upon a time", "--max-tokens", "8"]);
    assert!(ok, "{err}");
    assert!(!out_text.is_empty(), "{err}");
    let (ok, out_text, err) =
        k3_stdin(&["chat", "--model", m, "--max-tokens", "6", "--temperature", "0"], "Hi\nAnd again?\n");
    assert!(ok, "{err}");
    assert_eq!(out_text.lines().count(), 2, "one answer per turn: {out_text:?}");
}

/// llama.cpp's short switches mean what its long ones do: the same text, bit for bit.
#[test]
fn short_flags_are_llama_cpps() {
    let model = fixture("default.waste");
    let model = model.to_str().unwrap();
    let run = |prompt: &[&str], rest: &[&str]| {
        let args: Vec<&str> = ["generate"].iter().chain(prompt).chain(rest).copied().collect();
        k3(&args)
    };
    let long_rest = ["--max-tokens", "8", "--seed", "3", "--temperature", "0.7", "--threads", "1", "--context", "512"];
    let short_rest = ["-n", "8", "-s", "3", "--temp", "0.7", "-t", "1", "-c", "512"];
    let long = run(&["--model", model, "--prompt", "In the beginning"], &long_rest);
    let short = run(&["-m", model, "-p", "In the beginning"], &short_rest);
    assert!(long.0 && short.0, "{} / {}", long.2, short.2);
    assert!(!long.1.is_empty());
    assert_eq!(long.1, short.1);
    // The prompt as the argument is the same prompt; both at once is refused.
    assert_eq!(run(&["In the beginning"], &short_rest).1, short.1);
    let both = run(&["In the beginning", "-p", "In the beginning"], &[]);
    assert!(!both.0 && both.2.contains("cannot be used with"), "{}", both.2);
    // -f reads the prompt from a file.
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("p.txt");
    std::fs::write(&file, "In the beginning").unwrap();
    assert_eq!(run(&["-f", file.to_str().unwrap()], &short_rest).1, short.1);
}

/// inspect and verify take the model as every other command does (`--model`, `-m`), or as the
/// argument, or none: the default model.
#[test]
fn every_command_takes_model() {
    let tiny = fixture("tiny-k3.waste");
    let arg = k3(&["inspect", tiny.to_str().unwrap()]);
    let flag = k3(&["inspect", "--model", tiny.to_str().unwrap()]);
    let short = k3(&["inspect", "-m", tiny.to_str().unwrap()]);
    assert!(arg.0 && arg.1 == flag.1 && flag.1 == short.1, "{}", flag.2);
    let default = k3(&["inspect", "--json"]);
    assert!(default.0, "{}", default.2);
    let v: serde_json::Value = serde_json::from_str(&default.1).unwrap();
    assert_eq!(v["architecture"]["name"], "kimi_linear");
    let verify = k3(&["verify", "-m", tiny.to_str().unwrap()]);
    assert!(verify.0 && verify.1.contains("160 expert records verified"), "{}", verify.1);
    let both = k3(&["verify", tiny.to_str().unwrap(), "--model", tiny.to_str().unwrap()]);
    assert!(!both.0 && both.2.contains("cannot be used with"), "{}", both.2);
}

/// tokenize runs on the default model without `--tokenizer`; `--pieces` shows each token's text,
/// the pieces spelling the input; detokenize turns the ids back into it.
#[test]
fn tokenize_on_the_default_model_with_pieces() {
    let text = "In the beginning God created";
    let (ok, ids, err) = k3_stdin(&["tokenize"], text);
    assert!(ok, "{err}");
    let ids: Vec<u32> = serde_json::from_str(&ids).unwrap();
    let (ok, pieces, err) = k3_stdin(&["tokenize", "--pieces", "-m", fixture("default.waste").to_str().unwrap()], text);
    assert!(ok, "{err}");
    let pieces: Vec<serde_json::Value> = serde_json::from_str(&pieces).unwrap();
    let got: Vec<u32> = pieces.iter().map(|p| p["id"].as_u64().unwrap() as u32).collect();
    assert_eq!(got, ids);
    let spelled: String = pieces.iter().map(|p| p["piece"].as_str().unwrap()).collect();
    assert_eq!(spelled, text);
    assert!(ids.len() > 1);
    let (ok, back, err) = k3_stdin(&["detokenize"], &serde_json::to_string(&ids).unwrap());
    assert!(ok, "{err}");
    assert_eq!(back, text);
}

/// `completions SHELL` prints a script that completes the subcommands; an unknown shell is named.
#[test]
fn completions_for_the_usual_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, err) = k3(&["completions", shell]);
        assert!(ok, "{shell}: {err}");
        assert!(out.contains("generate") && out.contains("serve") && out.contains("--max-tokens"), "{shell}");
    }
    let (ok, _, err) = k3(&["completions", "tcsh"]);
    assert!(!ok && err.contains("tcsh"), "{err}");
}

/// `serve --alias` refuses a model id a client could not send back, before loading anything.
#[test]
fn serve_refuses_an_unusable_alias() {
    let (ok, _, err) = k3(&["serve", "--alias", "my model"]);
    assert!(!ok && err.contains("not a usable model id"), "{err}");
}

/// `generate` says why it stopped: at --max-tokens only with --stats (the README says so), a
/// full context always.
#[test]
fn generate_says_why_it_stopped() {
    let (ok, _, err) = k3(&["generate", "And God said", "-n", "3", "--stats"]);
    assert!(ok && err.contains("[stopped: --max-tokens 3 reached]"), "{err}");
    let (ok, _, err) = k3(&["generate", "And God said", "-n", "3"]);
    assert!(ok && !err.contains("[stopped"), "{err}");
    let (ok, _, err) = k3(&["generate", "And God said", "-n", "64", "--context", "8"]);
    assert!(ok && err.contains("[stopped: the context of 8 tokens is full"), "{err}");
}
