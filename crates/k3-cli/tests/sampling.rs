//! `generate`'s sampling switches as a user gives them (llama.cpp's names): each changes the
//! answer as it says, bad values are refused by name, and a sampled run without `--seed` draws
//! a fresh seed that `--stats` prints and `--seed` repeats. (The sampler's arithmetic is checked
//! against its definitions in the engine's tests.)

mod common;

use common::{fixture, k3};

fn ids(out: &str) -> Vec<u32> {
    out.split_whitespace().map(|t| t.parse().unwrap()).collect()
}

#[test]
fn logit_bias_bans_a_token_and_repeat_penalty_changes_repeats() {
    let m = fixture("tiny-k3.waste");
    let m = m.to_str().unwrap();
    let base = ["generate", "--model", m, "--ids", "37 246 205", "--max-tokens", "8"];
    let (ok, plain, err) = k3(&base);
    assert!(ok, "{err}");
    let plain = ids(&plain);
    let ban = format!("{}=-inf", plain[0]);
    let (ok, banned, err) = k3(&[&base[..], &["--logit-bias", &ban]].concat());
    assert!(ok, "{err}");
    let banned = ids(&banned);
    assert!(!banned.contains(&plain[0]), "{banned:?} holds the banned {}", plain[0]);
    // +100 on a token makes it every choice.
    let (_, forced, _) = k3(&[&base[..], &["--logit-bias", "42=100"]].concat());
    assert!(ids(&forced).iter().all(|&t| t == 42), "{forced}");

    // The default model repeats itself greedily; a strong penalty over the whole text changes that.
    let text = ["generate", "And the LORD", "--max-tokens", "40"];
    let (_, plain, _) = k3(&text);
    let (ok, penalized, err) = k3(&[&text[..], &["--repeat-penalty", "1000", "--repeat-last-n", "-1"]].concat());
    assert!(ok, "{err}");
    assert_ne!(plain, penalized);
    let (_, windowless, _) = k3(&[&text[..], &["--repeat-penalty", "1000", "--repeat-last-n", "0"]].concat());
    assert_eq!(plain, windowless, "a window of 0 tokens penalizes nothing");
}

#[test]
fn bad_sampling_values_are_refused_by_name() {
    let m = fixture("tiny-k3.waste");
    let m = m.to_str().unwrap();
    for (flag, value, says) in [
        ("--logit-bias", "99999=1", "outside the vocabulary"),
        ("--logit-bias", "5", "ID=BIAS"),
        ("--logit-bias", "5=nan", "not usable"),
        ("--min-p", "2", "min-p"),
        ("--repeat-penalty", "0", "repetition penalty"),
        ("--frequency-penalty", "3", "frequency_penalty"),
        ("--presence-penalty", "-9", "presence_penalty"),
        ("--repeat-last-n", "-2", "repeat-last-n"),
    ] {
        let (ok, _, err) = k3(&["generate", "--model", m, "--ids", "1", "--max-tokens", "1", flag, value]);
        assert!(!ok && err.contains(says), "{flag} {value}: {err}");
    }
}

#[test]
fn a_sampled_run_draws_a_fresh_seed_that_repeats_it() {
    let args = ["generate", "And God said", "--max-tokens", "16", "--temperature", "1.2", "--stats"];
    let seed = |err: &str| err.split("--seed ").nth(1).and_then(|r| r.split(' ').next()).unwrap().to_string();
    let (ok, a, err_a) = k3(&args);
    assert!(ok, "{err_a}");
    let (_, _, err_b) = k3(&args);
    assert_ne!(seed(&err_a), seed(&err_b), "each run its own seed");
    let (_, again, _) = k3(&[&args[..], &["--seed", &seed(&err_a)]].concat());
    assert_eq!(a, again);
}

#[test]
fn logprobs_are_the_log_softmax_of_the_logits_command() {
    let m = fixture("tiny-k3.waste");
    let m = m.to_str().unwrap();
    let d = tempfile::tempdir().unwrap();
    let stats = d.path().join("s.json");
    let (ok, out, err) = k3(&[
        "generate",
        "--model",
        m,
        "--ids",
        "37 246 205",
        "--max-tokens",
        "4",
        "--logprobs",
        "2",
        "--stats-json",
        stats.to_str().unwrap(),
        // As the `logits` command computes them (exact); generate's default rounds the experts'
        // inputs to int8 where the CPU has VNNI.
        "--activations",
        "exact",
    ]);
    assert!(ok, "{err}");
    let made = ids(&out);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), made.len(), "{v}");
    // The reference: `k3-cli logits` over the prompt and the answer, log-softmax by hand.
    let mut seq = vec![37u32, 246, 205];
    seq.extend(&made[..made.len() - 1]);
    let f = d.path().join("l.f32");
    let text: Vec<String> = seq.iter().map(u32::to_string).collect();
    let (ok, _, err) = k3(&["logits", "--model", m, "--ids", &text.join(" "), "--out", f.to_str().unwrap()]);
    assert!(ok, "{err}");
    let raw = std::fs::read(&f).unwrap();
    let all: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let vocab = all.len() / seq.len();
    for (k, e) in lps.iter().enumerate() {
        let row = &all[(2 + k) * vocab..(3 + k) * vocab];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = row.iter().map(|&x| f64::from(x - m).exp()).sum();
        let want = f64::from(row[made[k] as usize] - m) - z.ln();
        assert_eq!(e["token"].as_u64(), Some(u64::from(made[k])));
        assert!((e["logprob"].as_f64().unwrap() - want).abs() < 1e-4, "token {k}: {e} vs {want}");
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    let (ok, _, err) = k3(&["generate", "--model", m, "--ids", "1", "--logprobs", "2"]);
    assert!(!ok && err.contains("--stats-json"), "{err}");
}
