//! `cargo xtask bench decode --svg`: one decode step's timeline, a lane per layer.

use std::path::Path;

use anyhow::Result;
use k3_engine::Engine;
use k3_format::Model;
use k3_generate::sample::{Sampler, SamplerConfig};

use super::decode::options;

/// One decode step of `variant` with its timeline, drawn as an SVG: a lane per layer, time across.
pub fn timeline_svg(model: &Model, variant: &str, mem: Option<u64>, out: &Path) -> Result<()> {
    use k3_engine::SpanKind;
    // An 8-token prompt and three steps.
    let engine = Engine::load_with(model, options(variant, mem, 11, 0)?)?;
    let mut s = engine.session();
    let v = engine.vocab();
    let mut logits = engine.forward(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8], None)?;
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    for step in 0..3 {
        if step == 2 {
            s.timeline = Some(Vec::new());
        }
        let next = sampler.sample(&logits[logits.len() - v..]);
        logits = engine.forward(&mut s, &[next], None)?;
    }
    let spans = s.timeline.take().unwrap_or_default();
    let total = spans.iter().map(|x| x.end).fold(0.0, f64::max).max(1e-9);
    let layers = engine.layers();
    let (w, lane, left, top) = (1000.0, 22.0, 70.0, 40.0);
    let x = |t: f64| left + t / total * w;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        left + w + 60.0,
        top + lane * layers as f64 + 60.0
    );
    svg += &format!(
        "<text x=\"{left}\" y=\"16\" font-size=\"13\">One decode step ({variant}): {:.1} ms. Waiting for expert reads in red.</text>\n",
        total * 1e3
    );
    for l in 0..layers {
        let y = top + lane * l as f64;
        svg += &format!("<text x=\"4\" y=\"{}\">layer {l}</text>\n", y + 14.0);
        svg += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#ddd\"/>\n",
            left + w,
            y + lane,
            y + lane
        );
    }
    for sp in &spans {
        let (color, h, dy) = match sp.kind {
            SpanKind::Attention => ("#4a90d9", 16.0, 2.0),
            SpanKind::MoeOther => ("#9b59b6", 16.0, 2.0),
            SpanKind::Wait => ("#e74c3c", 16.0, 2.0),
            SpanKind::Expert(_) => ("#27ae60", 10.0, 5.0),
        };
        let y = top + lane * f64::from(sp.layer) + dy;
        let title = match sp.kind {
            SpanKind::Expert(e) => format!("expert {e}"),
            k => format!("{k:?}"),
        };
        svg += &format!(
            "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{h}\" fill=\"{color}\"><title>{title}: {:.2} ms</title></rect>\n",
            x(sp.start),
            (x(sp.end) - x(sp.start)).max(0.5),
            (sp.end - sp.start) * 1e3
        );
    }
    let ly = top + lane * layers as f64 + 20.0;
    for (i, (c, name)) in [
        ("#4a90d9", "attention"),
        ("#9b59b6", "routing, latent, shared expert, sums"),
        ("#27ae60", "expert compute"),
        ("#e74c3c", "waiting for reads"),
    ]
    .iter()
    .enumerate()
    {
        let lx = left + 230.0 * i as f64;
        svg += &format!(
            "<rect x=\"{lx}\" y=\"{ly}\" width=\"12\" height=\"12\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            lx + 16.0,
            ly + 10.0
        );
    }
    for k in 0..=4 {
        let t = total * f64::from(k) / 4.0;
        svg +=
            &format!("<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.1} ms</text>\n", x(t), ly + 32.0, t * 1e3);
    }
    svg += "</svg>\n";
    k3_format::write_atomic(out, svg.as_bytes())?;
    Ok(())
}
