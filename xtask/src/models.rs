//! The tasks that write model files: `convert` (`k3-cli convert`'s own code), `export` and
//! `synth`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k3_cli::convert::Experts;
use k3_convert::{ConvertOptions, convert as run_convert};

use k3_cli::progress::{Progress, Unit};

pub fn export(model: &Path, out: &Path) -> Result<()> {
    let src = k3_convert::Source::open(model)?;
    let mut pb = None;
    let r = k3_convert::export(&src, out, &mut |done, total| {
        pb.get_or_insert_with(|| Progress::new("export", total, Unit::Bytes)).set_position(done);
    })
    .with_context(|| format!("exporting {} to {}", model.display(), out.display()))?;
    if let Some(pb) = pb {
        pb.finish();
    }
    println!(
        "wrote {} tensors ({:.1} MB) to {}: {}",
        r.tensors,
        r.bytes as f64 / 1e6,
        out.display(),
        r.files.join(", ")
    );
    Ok(())
}

pub fn synth(
    preset: &str,
    out: &PathBuf,
    experts: Option<Experts>,
    k3_routing: bool,
    layers: Option<u32>,
) -> Result<()> {
    if preset == TOOL_CALLER {
        return tool_caller(out);
    }
    let mut p = k3_convert::synth::preset(preset).with_context(|| {
        let names: Vec<&str> = k3_convert::synth::PRESETS.iter().map(|p| p.name).chain([TOOL_CALLER]).collect();
        format!("unknown preset `{preset}` (one of {})", names.join(", "))
    })?;
    p.k3_routing |= k3_routing;
    if let Some(n) = layers {
        if n < 2 || n > p.layers {
            bail!(
                "--layers {n}: the preset {preset} has {} layers; give 2 to {} (the first is dense)",
                p.layers,
                p.layers
            );
        }
        p.layers = n;
    }
    let e = match experts {
        None | Some(Experts::Keep) => p.experts_default,
        Some(Experts::Vq3) => k3_convert::synth::SynthExperts::Vq3,
        Some(Experts::Mxfp4) => k3_convert::synth::SynthExperts::Mxfp4,
        Some(Experts::Int4) => k3_convert::synth::SynthExperts::Int4,
        Some(Experts::Fp8) => k3_convert::synth::SynthExperts::Fp8,
        Some(Experts::Int2) => k3_convert::synth::SynthExperts::Int2,
        Some(Experts::Bf16 | Experts::F32 | Experts::Rtn3) => {
            bail!("synthetic models have MXFP4, INT4, FP8, int2 or vq3 experts")
        }
    };
    let mut bar = k3_cli::convert::PhaseBar::default();
    k3_convert::synth::synth(&p, e, out, &mut |p| bar.show(p))?;
    bar.finish();
    let m = k3_format::Model::open(out)?;
    let shard: u64 = m.manifest().shards.iter().map(|s| s.bytes).sum();
    println!(
        "wrote {} to {}: trunk {:.1} MB, expert shards {:.2} GB",
        p.name,
        out.display(),
        m.manifest().trunk.bytes as f64 / 1e6,
        shard as f64 / 1e9
    );
    Ok(())
}

const TOOL_CALLER: &str = "tool-caller";

/// The scripted Kimi-Linear model that answers every turn with a `get_weather` call
/// (`k3_convert::synth::scripted`), made from the golden tiny Kimi-Linear's shapes and converted.
fn tool_caller(out: &Path) -> Result<()> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden/tiny-kimi-linear");
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let hf = tempfile::tempdir_in(parent).with_context(|| format!("a scratch directory in {}", parent.display()))?;
    k3_convert::synth::scripted::tool_caller(&base, hf.path())?;
    // Copied: the scratch checkpoint goes away when this returns.
    run_convert(&ConvertOptions { copy_experts: true, ..ConvertOptions::new(hf.path(), out) }, &mut |_| {})?;
    println!("wrote {TOOL_CALLER} to {}", out.display());
    Ok(())
}
