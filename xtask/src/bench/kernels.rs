//! `cargo xtask bench kernels`: every k3-quant kernel on Kimi K3's expert shapes, one core,
//! weights hot in cache and cold (cycling through more matrices than the caches hold), run
//! interleaved with medians, next to the memory read bandwidth measured in the same run.

use half::{bf16, f16};
use k3_quant::rng::noise;
use k3_quant::vq::{self, Codec, Scratch, VqMatrix};
use k3_quant::{Activations, Matrix, int8, mxfp4, q8};
use serde_json::{Value, json};

use super::{cpu_mhz, median, mem_read_gbps, time};

/// Expert shapes of K3: gate/up [3072, 3584], down [3584, 3072].
const SHAPES: [(usize, usize); 2] = [(3072, 3584), (3584, 3072)];
/// Cold runs cycle through at least this many bytes of weights (3x the 32 MiB L3 here).
const COLD_BYTES: usize = 96 << 20;

fn bytes_of(seed: u64, n: usize) -> Vec<u8> {
    noise(n, seed, 1.0).iter().map(|v| ((v + 0.5) * 255.0) as u8).collect()
}

/// One kernel over one shape: a set of distinct matrices and a call that multiplies matrix `i`.
struct Case {
    name: String,
    rows: usize,
    cols: usize,
    /// Vectors per call (1, or the batch size).
    vectors: usize,
    weight_bytes: usize,
    instances: usize,
    run: Box<dyn FnMut(usize)>,
}

/// Vectors per batched int8-activation call: a prefill chunk's worth for the register tiles.
const Q8_BATCH: usize = 64;

/// A batch of `Q8_BATCH` quantized activations and room for the outputs.
fn batch_q8(cols: usize, rows: usize) -> (q8::Q8Batch, Vec<f32>) {
    (q8::Q8Batch::quantize(&noise(cols * Q8_BATCH, 8, 1.0), cols), vec![0f32; rows * Q8_BATCH])
}

fn random_vq(codec: Codec, rows: usize, cols: usize, seed: u64) -> VqMatrix {
    let items = cols / codec.dim() * codec.stages();
    let raw: Vec<u16> = bytes_of(seed, rows * items).iter().map(|b| u16::from(*b) % codec.entries() as u16).collect();
    VqMatrix {
        codec,
        rows,
        cols,
        codes: match codec {
            Codec::FastScan => vq::fastscan::pack(&raw, rows, items),
            Codec::Residual => raw.iter().map(|&c| c as u8).collect(),
        },
        scale: vec![f16::ONE; rows],
        codebooks: noise(codec.stages() * codec.entries() * codec.dim(), seed ^ 1, 1.0),
        rotation: Some(vq::Rotation::new(cols, vq::Rotation::block_for(cols, 128), seed)),
    }
}

fn cases(rows: usize, cols: usize, cold: bool) -> Vec<Case> {
    let x = noise(cols, 7, 1.0);
    let mut out = mxfp4_cases(rows, cols, cold, &x);
    out.extend(trunk_cases(rows, cols, cold));
    out.extend(fp8_cases(rows, cols, cold));
    out.extend(vq_cases(rows, cols, cold));
    out
}

/// Instances of a matrix of `bytes` to cycle through: enough to leave the caches when `cold`.
fn instances(bytes: usize, cold: bool) -> usize {
    if cold { COLD_BYTES.div_ceil(bytes) } else { 1 }
}

/// MXFP4 experts: exact, int8-activation and 32-vector batched kernels.
fn mxfp4_cases(rows: usize, cols: usize, cold: bool, x: &[f32]) -> Vec<Case> {
    let n = rows * cols;
    let x = x.to_vec();
    let mut out = Vec::new();
    let tag = format!("{rows}x{cols}");
    let mx_bytes = n / 2 + n / 32;
    let k = instances(mx_bytes, cold);
    let mats: Vec<(Vec<u8>, Vec<u8>)> = (0..k)
        .map(|i| (bytes_of(i as u64, n / 2), bytes_of(i as u64 + 99, n / 32).iter().map(|b| 112 + b % 16).collect()))
        .collect();
    let mats = std::rc::Rc::new(mats);
    {
        let (m, x) = (mats.clone(), x.clone());
        let mut y = vec![0f32; rows];
        out.push(Case {
            name: format!("mxfp4_f32 {tag}"),
            rows,
            cols,
            vectors: 1,
            weight_bytes: mx_bytes,
            instances: k,
            run: Box::new(move |i| mxfp4::matvec(&m[i].0, &m[i].1, &x, &mut y)),
        });
    }
    {
        let (m, x) = (mats.clone(), x.clone());
        let mut y = vec![0f32; rows];
        let mut q = q8::Q8Batch::default();
        out.push(Case {
            name: format!("mxfp4_q8 {tag}"),
            rows,
            cols,
            vectors: 1,
            weight_bytes: mx_bytes,
            instances: k,
            run: Box::new(move |i| {
                q.quantize_into(&x, cols);
                q8::matmul_mxfp4(&m[i].0, &m[i].1, &q, &mut y)
            }),
        });
    }
    {
        let m = mats.clone();
        let (q, mut ys) = batch_q8(cols, rows);
        out.push(Case {
            name: format!("mxfp4_q8_batch{Q8_BATCH} {tag}"),
            rows,
            cols,
            vectors: Q8_BATCH,
            weight_bytes: mx_bytes,
            instances: k,
            run: Box::new(move |i| q8::matmul_mxfp4(&m[i].0, &m[i].1, &q, &mut ys)),
        });
    }
    {
        let m = mats;
        let xs = noise(cols * 32, 8, 1.0);
        let mut ys = vec![0f32; rows * 32];
        out.push(Case {
            name: format!("mxfp4_f32_batch32 {tag}"),
            rows,
            cols,
            vectors: 32,
            weight_bytes: mx_bytes,
            instances: k,
            run: Box::new(move |i| mxfp4::matmul(&m[i].0, &m[i].1, cols, &xs, &mut ys)),
        });
    }
    out
}

/// A matrix's products as cases: one vector (exact) and `Q8_BATCH` vectors at each of `batched`
/// (through `Matrix`, rounding included, as the engine runs them). `view` makes instance `i`'s
/// matrix from its stored parts.
fn matrix_cases<T: 'static>(
    name: &str,
    (rows, cols): (usize, usize),
    weight_bytes: usize,
    parts: Vec<T>,
    view: for<'b> fn(&'b T, usize, usize) -> Matrix<'b>,
    batched: &[Activations],
) -> Vec<Case> {
    let (k, parts) = (parts.len(), std::rc::Rc::new(parts));
    let case = |suffix: String, vectors: usize, act: Activations| {
        let (parts, xs, mut ys) = (parts.clone(), noise(cols * vectors, 7, 1.0), vec![0f32; rows * vectors]);
        Case {
            name: format!("{name}{suffix} {rows}x{cols}"),
            rows,
            cols,
            vectors,
            weight_bytes,
            instances: k,
            run: Box::new(move |i| {
                let m = view(&parts[i], rows, cols).with_activations(act);
                if vectors == 1 { m.matvec(&xs, &mut ys) } else { m.matmul(&xs, &mut ys) }
            }),
        }
    };
    let mut out = vec![case(String::new(), 1, Activations::Exact)];
    for &act in batched {
        let tag = match act {
            Activations::Exact => "",
            Activations::Int8 => "_q8",
            Activations::Bf16 => "_bf16act",
        };
        out.push(case(format!("{tag}_batch{Q8_BATCH}"), Q8_BATCH, act));
    }
    out
}

const ALL_ACTIVATIONS: [Activations; 3] = [Activations::Exact, Activations::Int8, Activations::Bf16];

/// Trunk encodings: bf16, int8 rows, int4 groups.
fn trunk_cases(rows: usize, cols: usize, cold: bool) -> Vec<Case> {
    let n = rows * cols;
    let count = |bytes: usize| instances(bytes, cold);
    let bf: Vec<Vec<bf16>> =
        (0..count(n * 2)).map(|i| noise(n, i as u64, 1.0).iter().map(|v| bf16::from_f32(*v)).collect()).collect();
    let i8s: Vec<(Vec<i8>, Vec<f32>)> =
        (0..count(n + rows * 4)).map(|i| int8::quantize(&noise(n, i as u64 + 5, 1.0), cols)).collect();
    let i4_bytes = n / 2 + n / 32 * 2;
    let i4s: Vec<(Vec<u8>, Vec<f16>)> =
        (0..count(i4_bytes)).map(|i| (bytes_of(i as u64 + 3, n / 2), vec![f16::from_f32(0.01); n / 32])).collect();
    let shape = (rows, cols);
    let mut out = matrix_cases(
        "bf16",
        shape,
        n * 2,
        bf,
        |w, rows, cols| Matrix::Bf16 { w, rows, cols, act: Activations::Exact },
        &[Activations::Exact, Activations::Bf16],
    );
    out.extend(matrix_cases(
        "int8_row",
        shape,
        n + rows * 4,
        i8s,
        |(q, scale), rows, cols| Matrix::Int8Row { q, scale, rows, cols, act: Activations::Exact },
        &ALL_ACTIVATIONS,
    ));
    out.extend(matrix_cases(
        "int4_g32",
        shape,
        i4_bytes,
        i4s,
        |(q, scale), rows, cols| Matrix::Int4Group { q, scale, group: 32, rows, cols, act: Activations::Exact },
        &ALL_ACTIVATIONS,
    ));
    out
}

/// FP8 e4m3 in 128 x 128 blocks (K2-Instruct's and DeepSeek-V3's experts and trunk): one vector
/// and a batch, exact activations.
fn fp8_cases(rows: usize, cols: usize, cold: bool) -> Vec<Case> {
    let n = rows * cols;
    let scales = rows.div_ceil(128) * cols.div_ceil(128);
    let bytes = n + 4 * scales;
    let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..instances(bytes, cold))
        .map(|i| (fp8_bytes(i as u64 + 17, n), noise(scales, i as u64, 1e-3).iter().map(|s| 1e-3 + s).collect()))
        .collect();
    matrix_cases(
        "fp8_b128",
        (rows, cols),
        bytes,
        mats,
        |(q, scale), rows, cols| {
            Matrix::Fp8(k3_quant::fp8::Fp8Ref::new(q, scale, rows, cols, 128, 128).expect("shapes"))
        },
        &[Activations::Exact],
    )
}

/// `n` random e4m3 bytes, none of them NaN.
pub(super) fn fp8_bytes(seed: u64, n: usize) -> Vec<u8> {
    bytes_of(seed, n).into_iter().map(k3_quant::fp8::finite).collect()
}

/// The VQ codecs: one vector, and batches of 2 and 4 (fast-scan scans the codes once per pair).
fn vq_cases(rows: usize, cols: usize, cold: bool) -> Vec<Case> {
    let n = rows * cols;
    let count = |bytes: usize| instances(bytes, cold);
    let tag = format!("{rows}x{cols}");
    let mut out = Vec::new();
    for codec in Codec::ALL {
        let vq_bytes = n * 3 / 8 + rows * 2;
        let k = count(vq_bytes);
        let mats: Vec<VqMatrix> = (0..k).map(|i| random_vq(codec, rows, cols, i as u64 + 11)).collect();
        // One vector, and a batch of 2 and 4 (fast-scan scans the codes once per pair).
        for n in [1, 2, 4] {
            let m = mats.clone();
            let xs = noise(cols * n, 21, 1.0);
            let mut ys = vec![0f32; rows * n];
            let mut scratch = Scratch::default();
            let name =
                if n == 1 { format!("{} {tag}", codec.name()) } else { format!("{}_batch{n} {tag}", codec.name()) };
            out.push(Case {
                name,
                rows,
                cols,
                vectors: n,
                weight_bytes: vq_bytes,
                instances: k,
                run: Box::new(move |i| m[i].as_ref().matmul(&xs, &mut ys, &mut scratch)),
            });
        }
    }
    out
}

/// Runs the benchmark; returns the JSON report and prints a table unless `json`.
pub fn run(reps: usize, extra_rows: &[usize], json_out: bool) -> Value {
    let mem = mem_read_gbps(512 << 20, 5);
    let peaks = super::peak::measure(1, 3);
    let mhz = cpu_mhz();
    let level = k3_quant::cpu::level();
    let mut results = serde_json::Map::new();
    let shapes = SHAPES.into_iter().chain(extra_rows.iter().map(|&r| (r, SHAPES[0].1)));
    for (rows, cols) in shapes {
        for cold in [false, true] {
            let mut cs = cases(rows, cols, cold);
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cs.len()];
            for c in cs.iter_mut() {
                (c.run)(0); // warm up
            }
            for _ in 0..reps {
                for (c, s) in cs.iter_mut().zip(samples.iter_mut()) {
                    // Calls per sample: at least 8, and every instance once (cold: enough
                    // instances that none is still cached when it comes round again).
                    let calls = c.instances.max(8);
                    if !cold {
                        // Hot: the other cases ran since this one's last sample and pushed its
                        // matrix out of the caches; one untimed call brings it back.
                        (c.run)(0);
                    }
                    let t = time(|| (0..calls).for_each(|i| (c.run)(i % c.instances)));
                    s.push(t / calls as f64);
                }
            }
            for (c, s) in cs.iter().zip(samples) {
                let secs = median(s);
                let gw = (c.rows * c.cols * c.vectors) as f64 / secs / 1e9;
                let entry = results.entry(c.name.clone()).or_insert_with(|| {
                    json!({
                        "rows": c.rows, "cols": c.cols, "vectors_per_call": c.vectors,
                        "bytes_per_weight": c.weight_bytes as f64 / (c.rows * c.cols) as f64,
                    })
                });
                let key = if cold { "cold" } else { "hot" };
                entry[format!("{key}_gweights_per_s")] = json!(gw);
                entry[format!("{key}_weight_gbps")] = json!(c.weight_bytes as f64 / secs / 1e9);
                if let Some(mhz) = mhz {
                    entry[format!("{key}_weights_per_cycle")] = json!(gw * 1e3 / mhz);
                }
                // A weight times a vector is one multiply-add.
                if let Some((ceiling, peak)) =
                    super::peak::ceiling_of(&c.name).and_then(|n| peaks.iter().find(|(p, _)| *p == n))
                {
                    entry["ceiling"] = json!(ceiling);
                    entry[format!("{key}_of_ceiling")] = json!(gw / peak);
                }
            }
        }
    }
    let hot = |name: &str| results.get(name).and_then(|v| v["hot_gweights_per_s"].as_f64()).unwrap_or(0.0);
    let mx = hot("mxfp4_q8 3072x3584").max(hot("mxfp4_f32 3072x3584"));
    let default = vq::DEFAULT_CODEC.name();
    let report = json!({
        "simd": format!("{level:?}"),
        "cpu_mhz": mhz,
        "mem_read_gbps": mem,
        "peak_gmacs": super::peak::to_json(&peaks),
        "mxfp4_gweights_per_s": mx,
        "vq3_codec": default,
        "vq3_gweights_per_s": hot(&format!("{default} 3072x3584")),
        "kernels": results,
    });
    if !json_out {
        println!(
            "SIMD {level:?}, one core, {} MHz nominal; memory read {mem:.1} GB/s (one core, 512 MiB)",
            mhz.unwrap_or(0.0)
        );
        let ceilings: Vec<String> = peaks.iter().map(|(n, g)| format!("{n} {g:.1}")).collect();
        println!("arithmetic ceilings, one core, G multiply-adds/s: {}", ceilings.join("; "));
        println!(
            "{:<34} {:>9} {:>9} {:>9} {:>10} {:>8} {:>12}",
            "kernel", "hot Gw/s", "cold Gw/s", "cold GB/s", "bytes/w", "w/cycle", "hot/ceiling"
        );
        for (name, v) in report["kernels"].as_object().into_iter().flatten() {
            let of = v["hot_of_ceiling"].as_f64().map_or("-".to_string(), |f| format!("{f:.2}"));
            println!(
                "{name:<34} {:>9.2} {:>9.2} {:>9.2} {:>10.3} {:>8.2} {of:>12}",
                v["hot_gweights_per_s"].as_f64().unwrap_or(0.0),
                v["cold_gweights_per_s"].as_f64().unwrap_or(0.0),
                v["cold_weight_gbps"].as_f64().unwrap_or(0.0),
                v["bytes_per_weight"].as_f64().unwrap_or(0.0),
                v["hot_weights_per_cycle"].as_f64().unwrap_or(0.0),
            );
        }
        println!(
            "default VQ codec {default}: {:.2} Gw/s hot vs best MXFP4 {:.2} Gw/s: {:.2}x",
            report["vq3_gweights_per_s"].as_f64().unwrap_or(0.0),
            mx,
            report["vq3_gweights_per_s"].as_f64().unwrap_or(0.0) / mx.max(1e-12)
        );
    }
    report
}
