//! Random-weight WASTE models with K3's or K2's architecture and routing shape, written directly
//! (no Hugging Face step), for tests and benchmarks (`presets`): `k3-tiny` / `k2-tiny` (seconds to
//! make), `k3-proxy` / `k2-proxy` (expert shards far larger than the memory a benchmark gives the
//! engine), `k3-medium` (every expert cached). `scripted` writes checkpoints that say a script.
//!
//! Weights are scaled like a trained model's (about `1/sqrt(fan_in)`), so activations stay in
//! range through the layers; routing is whatever random gates give. `k3-proxy-routed` is the same
//! model with routing a lookahead can predict, as a trained model's can: every MoE layer shares one
//! router, and the attention and MoE branches write 0.1x-scaled updates to the residual stream, so
//! consecutive layers' routers see nearly the same input.

mod presets;
pub mod scripted;

use presets::is_mla;
pub use presets::{PRESETS, Preset, SynthArch, config_json, preset};

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use k3_format::{Architecture, CodebookSource, Encoding, ExpertLayout, ModelWriter, Opened, WriterSpec};
use k3_quant::fp8;
use k3_quant::rng::XorShift;
use k3_quant::vq::{Codec, Rotation};

use k3_engine::EngineError;
use k3_engine::names::{self, KdaNames, LayerNames, MlaNames, MlpNames, MoeNames};

struct Gen(XorShift);

impl Gen {
    fn bf16(&mut self, n: usize, scale: f32) -> Vec<u8> {
        (0..n).flat_map(|_| bf16::from_f32(self.0.gaussian() * scale).to_le_bytes()).collect()
    }

    fn f32s(&mut self, n: usize, f: impl Fn(&mut XorShift) -> f32) -> Vec<u8> {
        (0..n).flat_map(|_| f(&mut self.0).to_le_bytes()).collect()
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend(self.0.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Which expert encoding the synthetic model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthExperts {
    Mxfp4,
    /// k3's int4 in groups of 32 (f16 scales): K2-Thinking's experts.
    Int4,
    /// Random codes and codebooks in the default VQ layout (3 bits per weight).
    Vq3,
    /// FP8 e4m3 in 128 x 128 blocks with f32 scales: K2-Instruct's and DeepSeek-V3's experts.
    Fp8,
    /// int2 in groups of 32 (f16 scales): HOBBIT's low-bit copies (`--low-bit-copies`).
    Int2,
}

/// The expert matrices: (name, rows, columns).
fn expert_mats(p: &Preset) -> [(&'static str, usize, usize); 3] {
    [("w1", p.expert_width, p.latent), ("w2", p.latent, p.expert_width), ("w3", p.expert_width, p.latent)]
}

/// What the writer is told: the architecture, the expert record layout, provenance.
fn writer_spec(p: &Preset, experts: SynthExperts) -> Result<WriterSpec, EngineError> {
    let enc = |cols: usize| match experts {
        SynthExperts::Mxfp4 => Encoding::Mxfp4,
        SynthExperts::Int4 => Encoding::Int4Group { group: 32 },
        SynthExperts::Int2 => Encoding::Int2Group { group: 32 },
        SynthExperts::Fp8 => Encoding::Fp8Block { block_rows: 128, block_cols: 128 },
        SynthExperts::Vq3 => Encoding::Vq {
            stages: 3,
            entries: 16,
            dim: 4,
            rotation_block: Rotation::block_for(cols, 128) as u32,
            rotation_seed: 1,
            codebook: CodebookSource::Inline,
            interleave: 32,
        },
    };
    let layout_mats: Vec<(&str, Encoding, Vec<u64>)> =
        expert_mats(p).iter().map(|(n, r, c)| (*n, enc(*c), vec![*r as u64, *c as u64])).collect();
    let layout = ExpertLayout::build(4096, &layout_mats).map_err(EngineError::Shape)?;
    Ok(WriterSpec {
        architecture: Architecture {
            name: match p.arch {
                SynthArch::K3 => "kimi_k3".into(),
                SynthArch::K2 => "deepseek_v3".into(),
            },
            layers: p.layers,
            hidden: p.hidden as u64,
            vocab: p.vocab as u64,
            experts: p.experts,
            experts_per_token: p.top_k,
            moe_layers: (1..p.layers).collect(),
        },
        alignment: 4096,
        shards: 1,
        shard_dirs: Vec::new(),
        encodings: BTreeMap::from([
            ("experts".to_string(), layout.matrices[0].encoding.label()),
            ("trunk".to_string(), "bf16".to_string()),
        ]),
        expert_layouts: vec![layout],
        checkpoint_files: Vec::new(),
        provenance: serde_json::json!({"synthetic": p.name, "experts": format!("{experts:?}")}),
    })
}

/// Writes preset `p` to `out` (resumable like any conversion).
pub fn synth(
    p: &Preset,
    experts: SynthExperts,
    out: &Path,
    progress: &mut dyn FnMut(crate::Progress),
) -> Result<(), EngineError> {
    let config = serde_json::to_vec_pretty(&config_json(p)).expect("config serializes");
    let spec = writer_spec(p, experts)?;
    let layout = spec.expert_layouts[0].clone();
    let mut w = match ModelWriter::open(out, spec)? {
        Opened::Complete => return Ok(()),
        Opened::Writer(w) => w,
    };
    let mut g = Gen(XorShift::new(0x5EED));
    let branch = if p.predictable_routing { 0.1 } else { 1.0 };
    Trunk { w: &mut w, g: &mut g, p, branch, progress: &mut *progress }.write()?;
    write_experts(&mut w, &mut g, p, experts, &layout, progress)?;
    w.finish(&[("config.json", &config)])?;
    Ok(())
}

/// Writes the trunk's tensors (those not yet written), weights scaled about `1/sqrt(fan_in)`.
struct Trunk<'a> {
    w: &'a mut ModelWriter,
    g: &'a mut Gen,
    p: &'a Preset,
    /// Scale of the matrices writing into the residual stream (small: predictable routing).
    branch: f32,
    /// Hears each layer written (`trunk`, layers done of the model's).
    progress: &'a mut dyn FnMut(crate::Progress),
}

fn fan_in_scale(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}

impl Trunk<'_> {
    fn put(&mut self, name: &str, e: Encoding, shape: &[u64], data: Vec<u8>) -> Result<(), EngineError> {
        if !self.w.has_tensor(name) {
            self.w.write_tensor(name, e, shape, &[&data])?;
        }
        Ok(())
    }

    fn ones(&mut self, name: &str, n: usize) -> Result<(), EngineError> {
        self.put(name, Encoding::Bf16, &[n as u64], (0..n).flat_map(|_| bf16::ONE.to_le_bytes()).collect())
    }

    fn mat(&mut self, name: &str, r: usize, c: usize) -> Result<(), EngineError> {
        let data = self.g.bf16(r * c, fan_in_scale(c));
        self.put(name, Encoding::Bf16, &[r as u64, c as u64], data)
    }

    /// A matrix writing into the residual stream.
    fn out_mat(&mut self, name: &str, r: usize, c: usize) -> Result<(), EngineError> {
        let data = self.g.bf16(r * c, self.branch * fan_in_scale(c));
        self.put(name, Encoding::Bf16, &[r as u64, c as u64], data)
    }

    fn f32s(&mut self, name: &str, shape: &[u64], f: impl Fn(&mut XorShift) -> f32) -> Result<(), EngineError> {
        let data = self.g.f32s(shape.iter().product::<u64>() as usize, f);
        self.put(name, Encoding::F32, shape, data)
    }

    fn write(mut self) -> Result<(), EngineError> {
        let p = self.p;
        let (d, vocab) = (p.hidden, p.vocab);
        let embed = self.g.bf16(vocab * d, 1.0);
        self.put(names::EMBED, Encoding::Bf16, &[vocab as u64, d as u64], embed)?;
        self.mat(names::LM_HEAD, vocab, d)?;
        self.ones(names::NORM, d)?;
        let k3 = p.arch == SynthArch::K3;
        if k3 {
            self.ones(names::OUT_RES_NORM, d)?;
            self.mat(names::OUT_RES_PROJ, 1, d)?;
        }
        // Predictable routing: one router for all MoE layers, residual updates scaled down.
        let shared_router = p.predictable_routing.then(|| self.g.bf16(p.experts as usize * d, fan_in_scale(d)));
        for i in 0..p.layers {
            (self.progress)(crate::Progress {
                phase: "trunk",
                done: u64::from(i),
                total: u64::from(p.layers),
                resumed: 0,
                unit: crate::Unit::Layers,
            });
            let ln = LayerNames::of(i);
            for n in [&ln.input_norm, &ln.post_norm] {
                self.ones(n, d)?;
            }
            if k3 {
                for n in [&ln.att_res_norm, &ln.mlp_res_norm] {
                    self.ones(n, d)?;
                }
                for n in [&ln.att_res_proj, &ln.mlp_res_proj] {
                    self.mat(n, 1, d)?;
                }
            }
            if is_mla(p, i) {
                self.mla(i)?
            } else {
                self.kda(i)?
            }
            if i == 0 {
                let n = MlpNames::dense(i);
                self.mat(&n.gate, p.dense_width, d)?;
                self.mat(&n.up, p.dense_width, d)?;
                self.out_mat(&n.down, d, p.dense_width)?;
            } else {
                self.moe(i, shared_router.as_ref())?;
            }
        }
        Ok(())
    }

    fn mla(&mut self, i: u32) -> Result<(), EngineError> {
        let (d, q, kv, heads) = (self.p.hidden, self.p.q_lora, self.p.kv_lora, self.p.mla_heads);
        let n = MlaNames::of(i);
        self.mat(&n.q_a, q, d)?;
        self.mat(&n.q_b, heads * 192, q)?;
        self.mat(&n.kv_a, kv + 64, d)?;
        self.mat(&n.kv_b, heads * 256, kv)?;
        if self.p.arch == SynthArch::K3 {
            self.mat(&n.g_proj, heads * 128, d)?;
        }
        self.out_mat(&n.o_proj, d, heads * 128)?;
        self.ones(&n.q_a_norm, q)?;
        self.ones(&n.kv_a_norm, kv)
    }

    fn kda(&mut self, i: u32) -> Result<(), EngineError> {
        let (d, h, hd) = (self.p.hidden, self.p.kda_heads, self.p.head_dim);
        let c = h * hd;
        let n = KdaNames::of(i);
        for m in [&n.q_proj, &n.k_proj, &n.v_proj, &n.g_proj] {
            self.mat(m, c, d)?;
        }
        self.out_mat(&n.o_proj, d, c)?;
        self.mat(&n.f_a, hd, d)?;
        self.mat(&n.f_b, c, hd)?;
        self.mat(&n.b_proj, h, d)?;
        for conv in [&n.q_conv, &n.k_conv, &n.v_conv] {
            self.f32s(conv, &[c as u64, 1, 4], |r| r.gaussian() * 0.5)?;
        }
        self.f32s(&n.a_log, &[h as u64], |r| (1.0 + 15.0 * r.uniform() as f32).ln())?;
        self.f32s(&n.dt_bias, &[c as u64], |r| r.gaussian() * 0.1)?;
        self.f32s(&n.o_norm, &[hd as u64], |_| 1.0)
    }

    fn moe(&mut self, i: u32, shared_router: Option<&Vec<u8>>) -> Result<(), EngineError> {
        let p = self.p;
        let (d, e) = (p.hidden, p.experts as usize);
        let n = MoeNames::of(i);
        match shared_router {
            Some(r) => self.put(&n.gate, Encoding::Bf16, &[e as u64, d as u64], r.clone())?,
            None => self.mat(&n.gate, e, d)?,
        }
        self.put(&n.bias, Encoding::F32, &[e as u64], vec![0; e * 4])?;
        // K3's experts work in a latent width with two shared experts; K2's on the hidden state
        // with one.
        let shared = match p.arch {
            SynthArch::K3 => {
                self.mat(&n.latent_down, p.latent, d)?;
                self.ones(&n.latent_norm, p.latent)?;
                self.out_mat(&n.latent_up, d, p.latent)?;
                2 * p.expert_width
            }
            SynthArch::K2 => p.expert_width,
        };
        self.mat(&n.shared.gate, shared, d)?;
        self.mat(&n.shared.up, shared, d)?;
        self.out_mat(&n.shared.down, d, shared)
    }
}

/// Writes every routed expert record not yet written.
fn write_experts(
    w: &mut ModelWriter,
    g: &mut Gen,
    p: &Preset,
    experts: SynthExperts,
    layout: &ExpertLayout,
    progress: &mut dyn FnMut(crate::Progress),
) -> Result<(), EngineError> {
    let moe_layers: Vec<u32> = (1..p.layers).collect();
    let total = u64::from(p.experts) * moe_layers.len() as u64 * layout.record_bytes;
    let written =
        moe_layers.iter().flat_map(|&l| (0..p.experts).map(move |e| (l, e))).filter(|&(l, e)| w.has_expert(l, e));
    let resumed = written.count() as u64 * layout.record_bytes;
    let mut done = 0u64;
    for &layer in &moe_layers {
        for e in 0..p.experts {
            if !w.has_expert(layer, e) {
                let mut parts = Vec::new();
                for (m, (_, r, c)) in layout.matrices.iter().zip(expert_mats(p)) {
                    match experts {
                        SynthExperts::Mxfp4 => {
                            parts.push(g.bytes(r * c / 2));
                            // Scales near 2^-7 keep E2M1 values (up to 6) about 1/sqrt(fan_in).
                            let e8 = (127.0 - (3.0 * (c as f64).sqrt()).log2()).round() as u8;
                            parts.push(g.bytes(r * c / 32).iter().map(|b| e8 - 1 + b % 3).collect());
                        }
                        SynthExperts::Int4 => {
                            parts.push(g.bytes(r * c / 2));
                            // Levels -8..7 (RMS about 4.6) times scales about 1/(4.6 sqrt(fan_in)).
                            let s = half::f16::from_f32(1.0 / (4.6 * (c as f32).sqrt()));
                            parts.push((0..r * c / 32).flat_map(|_| s.to_le_bytes()).collect());
                        }
                        SynthExperts::Int2 => {
                            parts.push(g.bytes(r * c / 4));
                            // Levels -2..1 (RMS about 1.2) times scales about 1/(1.2 sqrt(fan_in)).
                            let s = half::f16::from_f32(1.0 / (1.2 * (c as f32).sqrt()));
                            parts.push((0..r * c / 32).flat_map(|_| s.to_le_bytes()).collect());
                        }
                        SynthExperts::Fp8 => {
                            // Any byte but the two NaNs; block scales bring the RMS to 1/sqrt(fan_in).
                            parts.push(g.bytes(r * c).into_iter().map(fp8::finite).collect());
                            let rms =
                                ((0..=255u8).filter(|b| !fp8::is_nan(*b)).map(|b| fp8::e4m3(b).powi(2)).sum::<f32>()
                                    / 254.0)
                                    .sqrt();
                            let s = 1.0 / (rms * (c as f32).sqrt());
                            parts.push((0..r.div_ceil(128) * c.div_ceil(128)).flat_map(|_| s.to_le_bytes()).collect());
                        }
                        SynthExperts::Vq3 => {
                            debug_assert!(matches!(m.encoding, Encoding::Vq { .. }));
                            let codec = Codec::FastScan;
                            let items = c / codec.dim() * codec.stages();
                            parts.push(g.bytes(r * items / 2));
                            parts.push((0..r).flat_map(|_| half::f16::from_f32(1.0).to_le_bytes()).collect());
                            parts.push(g.f32s(3 * 16 * 4, |x| x.gaussian() * 0.5 / (c as f32).sqrt() * 2.0));
                        }
                    }
                }
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                w.write_expert(layer, e, 0, &refs)?;
            }
            done += layout.record_bytes;
            progress(crate::Progress { phase: "experts", done, total, resumed, unit: crate::Unit::Bytes });
        }
    }
    Ok(())
}
