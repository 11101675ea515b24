//! K3's vision tower on an 896 x 896 image (64 x 64 patches, 1,024 prompt positions) at the
//! release's shape (27 blocks, 1,024 wide, 12 heads of 128, MLP 4,096, projector into 7,168):
//! random BF16 weights, since only the arithmetic is timed. `--blocks N` runs the first N blocks
//! and scales: every block costs the same (same shapes, same patches), which the report checks
//! by timing 1 and N blocks. Threads 1..=--threads in one run, medians of --reps, and the
//! projection to 8 cores from the best measured per-core rate.

use std::time::Instant;

use half::bf16;
use k3_quant::rng::XorShift;
use k3_quant::{Activations, Matrix};
use k3_vision::tower::{BlockWeights, TowerWeights};
use k3_vision::{Layout, Patches, ProcessorConfig, Tower, VisionConfig};
use serde_json::{Value, json};

fn weights(n: usize, scale: f32, rng: &mut XorShift) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.gaussian() * scale)).collect()
}

struct Owned {
    blocks: Vec<[Vec<bf16>; 4]>,
    patch: Vec<bf16>,
    proj: [Vec<bf16>; 2],
}

fn tower<'a>(cfg: &VisionConfig, w: &'a Owned, act: Activations) -> anyhow::Result<Tower<'a>> {
    let (d, q, m) = (cfg.vt_hidden_size, cfg.qkv_hidden_size, cfg.vt_intermediate_size);
    let mat = |v: &'a [bf16], r: usize, c: usize| Matrix::bf16(v, r, c).map(|m| m.with_activations(act));
    let blocks = w
        .blocks
        .iter()
        .map(|[qkv, o, f0, f1]| {
            Ok(BlockWeights {
                norm0: vec![1.0; d],
                norm1: vec![1.0; d],
                wqkv: mat(qkv, 3 * q, d)?,
                wo: mat(o, d, q)?,
                fc0: mat(f0, m, d)?,
                fc1: mat(f1, d, m)?,
            })
        })
        .collect::<Result<Vec<_>, k3_quant::ShapeError>>()?;
    let mw = cfg.merged_width();
    let tw = TowerWeights {
        patch_embed: mat(&w.patch, d, 3 * cfg.patch_size * cfg.patch_size)?,
        pos_emb: vec![0.01; cfg.init_pos_emb_height * cfg.init_pos_emb_width * d],
        blocks,
        final_norm: vec![1.0; d],
        proj0: mat(&w.proj[0], mw, mw)?,
        proj2: mat(&w.proj[1], cfg.text_hidden_size, mw)?,
        post_norm: vec![1.0; cfg.text_hidden_size],
    };
    Ok(Tower::new(cfg.clone(), tw)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(blocks: usize, threads: usize, reps: usize, json_out: bool) -> anyhow::Result<Value> {
    let full = VisionConfig { text_hidden_size: 7168, ..VisionConfig::default() };
    let blocks = blocks.clamp(1, full.vt_num_hidden_layers);
    let mut rng = XorShift::new(7);
    let (d, q, m) = (full.vt_hidden_size, full.qkv_hidden_size, full.vt_intermediate_size);
    let owned = Owned {
        blocks: (0..blocks)
            .map(|_| {
                [
                    weights(3 * q * d, 1.0 / (d as f32).sqrt(), &mut rng),
                    weights(d * q, 1.0 / (q as f32).sqrt(), &mut rng),
                    weights(m * d, 1.0 / (d as f32).sqrt(), &mut rng),
                    weights(d * m, 1.0 / (m as f32).sqrt(), &mut rng),
                ]
            })
            .collect(),
        patch: weights(d * 588, 0.04, &mut rng),
        proj: [
            weights(full.merged_width().pow(2), 0.016, &mut rng),
            weights(7168 * full.merged_width(), 0.016, &mut rng),
        ],
    };
    let p = ProcessorConfig::default_for(&full)?;
    let layout = Layout::of(896, 896, &p)?;
    let patches = Patches { layout, patch: 14, values: (0..layout.patches() * 588).map(|_| rng.gaussian()).collect() };
    let mut rows = Vec::new();
    // Exact (f32) and bf16 activations (what the CLI and server run), side by side per count.
    for (t, act) in (1..=threads).flat_map(|t| [(t, Activations::Exact), (t, Activations::Bf16)]) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build()?;
        // 1 block and `blocks` blocks: the difference is the per-block cost, the rest the fixed
        // part (patch embedding, final norm, merge, projector).
        let time = |nb: usize| -> anyhow::Result<f64> {
            let cfg = VisionConfig { vt_num_hidden_layers: nb, ..full.clone() };
            let sub =
                Owned { blocks: owned.blocks[..nb].to_vec(), patch: owned.patch.clone(), proj: owned.proj.clone() };
            let tw = tower(&cfg, &sub, act)?;
            let mut s = Vec::new();
            for _ in 0..reps {
                let t0 = Instant::now();
                pool.install(|| tw.embed(&patches))?;
                s.push(t0.elapsed().as_secs_f64());
            }
            Ok(median(s))
        };
        let one = time(1)?;
        let many = if blocks > 1 { time(blocks)? } else { one };
        let per_block = if blocks > 1 { (many - one) / (blocks - 1) as f64 } else { one };
        let fixed = (one - per_block).max(0.0);
        let whole = fixed + per_block * full.vt_num_hidden_layers as f64;
        rows.push(json!({"threads": t, "activations": format!("{act:?}"), "one_block_s": one, "blocks_s": many, "per_block_s": per_block,
            "fixed_s": fixed, "tower_27_s": whole}));
    }
    // One block's parts on one thread: the four products, and attention over the image.
    let split = block_split(&owned, &full, layout, reps, &mut rng)?;
    let one_thread = rows[0]["tower_27_s"].as_f64().unwrap_or(0.0);
    let core_s = |a: &str| {
        rows.iter()
            .filter(|r| r["activations"] == a)
            .filter_map(|r| Some(r["tower_27_s"].as_f64()? * r["threads"].as_f64()?))
            .fold(f64::MAX, f64::min)
    };
    let (best_core, best_bf16) = (core_s("Exact"), core_s("Bf16"));
    // Patches n = 4096: per block 2 n (3qd + dq + 2md) + attention 4 n^2 q FLOPs.
    let n = layout.patches() as f64;
    let (df, qf, mf) = (d as f64, q as f64, m as f64);
    let flops = full.vt_num_hidden_layers as f64 * (2.0 * n * (4.0 * qf * df + 2.0 * mf * df) + 4.0 * n * n * qf);
    let report = json!({
        "image": "896 x 896", "patches": layout.patches(), "positions": layout.positions,
        "blocks_timed": blocks, "reps": reps, "rows": rows, "one_block_one_thread": split,
        "tower_flops": flops, "gflops_per_core": flops / best_core / 1e9,
        "gflops_per_core_bf16": flops / best_bf16 / 1e9, "attention_flops_per_block": 4.0 * n * n * qf,
        "projected_8_cores_s": best_core / 8.0, "projected_8_cores_bf16_s": best_bf16 / 8.0,
        "one_thread_s": one_thread,
    });
    if !json_out {
        print(&report, blocks, reps);
    }
    Ok(report)
}

/// One block's four products and its attention, timed apart on one thread.
fn block_split(
    owned: &Owned,
    full: &VisionConfig,
    layout: Layout,
    reps: usize,
    rng: &mut XorShift,
) -> anyhow::Result<Value> {
    let (d, q, m) = (full.vt_hidden_size, full.qkv_hidden_size, full.vt_intermediate_size);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let n = layout.patches();
    let x: Vec<f32> = (0..n * d).map(|_| rng.gaussian()).collect();
    let [qkv, o, f0, f1] = &owned.blocks[0];
    let mats = [(qkv, 3 * q, d), (o, d, q), (f0, m, d), (f1, d, m)];
    let mut products = Vec::new();
    let mut attention = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        for (w, r, c) in mats {
            let mm = Matrix::bf16(w, r, c)?;
            let xs = if c == d { x.clone() } else { vec![0.1f32; n * c] };
            let mut ys = vec![0f32; n * r];
            pool.install(|| k3_quant::par::matmul(&mm, &xs, &mut ys));
        }
        products.push(t0.elapsed().as_secs_f64());
        let qkv_act: Vec<f32> = (0..n * 3 * q).map(|_| rng.gaussian() * 0.1).collect();
        let t1 = Instant::now();
        pool.install(|| k3_vision::tower::attention::attend(&qkv_act, n, full.vt_num_attention_heads, full.head_dim()));
        attention.push(t1.elapsed().as_secs_f64());
    }
    Ok(json!({"products_s": median(products), "attention_s": median(attention)}))
}

fn print(report: &Value, blocks: usize, reps: usize) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!(
        "K3 vision tower, 896 x 896 ({} patches -> {} positions), {blocks} of 27 blocks timed, median of {reps}",
        report["patches"], report["positions"]
    );
    for r in report["rows"].as_array().into_iter().flatten() {
        println!(
            "  {} thread(s), {:<5}: 1 block {:.2} s, {blocks} blocks {:.2} s -> per block {:.2} s, fixed {:.2} s, whole tower {:.1} s",
            r["threads"],
            r["activations"].as_str().unwrap_or(""),
            f(&r["one_block_s"]),
            f(&r["blocks_s"]),
            f(&r["per_block_s"]),
            f(&r["fixed_s"]),
            f(&r["tower_27_s"])
        );
    }
    let split = &report["one_block_one_thread"];
    let per_block = f(&report["tower_flops"]) / 27.0;
    let attention = f(&report["attention_flops_per_block"]);
    println!(
        "  one block on one thread: products {:.2} s ({:.0} GFLOP/s), attention {:.2} s ({:.0} GFLOP/s)",
        f(&split["products_s"]),
        (per_block - attention) / f(&split["products_s"]).max(1e-9) / 1e9,
        f(&split["attention_s"]),
        attention / f(&split["attention_s"]).max(1e-9) / 1e9
    );
    println!(
        "  {:.2} TFLOP a tower: {:.1} GFLOP/s per core at best (bf16 {:.1}); 8 cores at those rates: {:.1} s (bf16 {:.1} s)",
        f(&report["tower_flops"]) / 1e12,
        f(&report["gflops_per_core"]),
        f(&report["gflops_per_core_bf16"]),
        f(&report["projected_8_cores_s"]),
        f(&report["projected_8_cores_bf16_s"])
    );
}
