//! What clients are told about the served model beyond its shape (Ollama's `/api/tags` and
//! `/api/show`): size on disk, parameter count, encodings, when it was written, its chat
//! template and what it can do.

use k3_engine::Model;
use k3_engine::config::Family;
use k3_text::tokenizer::Tokenizer;

/// Facts read once at load.
#[derive(Debug, Clone, Default)]
pub struct About {
    /// Header, trunk and shards.
    pub bytes: u64,
    /// Weights: trunk tensors and every expert's matrices.
    pub parameters: u64,
    /// The manifest's encodings, e.g. `experts mxfp4, trunk int8`.
    pub quantization: String,
    /// When the header was written (Unix seconds; 0 if unknown).
    pub modified: u64,
    /// The model's own Jinja chat template, if it embeds one.
    pub template: Option<String>,
    /// The tokenizer has tool-call markers.
    pub tools: bool,
    /// The model writes a thinking section (K3, or `<think>` tags).
    pub thinking: bool,
}

impl About {
    pub fn of(model: &Model, tok: Option<&Tokenizer>, family: Family) -> About {
        let m = model.manifest();
        let elements = |shape: &[u64]| shape.iter().product::<u64>();
        let trunk: u64 = m.trunk.tensors.iter().map(|t| elements(&t.tensor.shape)).sum();
        let per_layout: Vec<u64> =
            m.expert_layouts.iter().map(|l| l.matrices.iter().map(|t| elements(&t.shape)).sum()).collect();
        let experts: u64 =
            model.header().index.iter().map(|e| per_layout.get(usize::from(e.layout)).copied().unwrap_or(0)).sum();
        let header = std::fs::metadata(model.header_path()).ok();
        let modified = header
            .as_ref()
            .and_then(|h| h.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let header_bytes = header.map_or(0, |h| h.len());
        About {
            bytes: header_bytes + m.trunk.bytes + m.shards.iter().map(|s| s.bytes).sum::<u64>(),
            parameters: trunk + experts,
            quantization: m.encodings.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
            modified,
            template: tok.and_then(|t| t.chat_template().map(str::to_string)),
            tools: tok
                .is_some_and(|t| k3_text::toolcall::ToolCallReader::new(t, k3_generate::dialect(family)).is_some()),
            thinking: family == Family::KimiK3 || tok.is_some_and(|t| t.think_tags().is_some()),
        }
    }

    /// The parameter count as Ollama writes it: `48.0B`, `1.2T`, `15.2M`.
    pub fn parameter_size(&self) -> String {
        let p = self.parameters as f64;
        match p {
            p if p >= 1e12 => format!("{:.1}T", p / 1e12),
            p if p >= 1e9 => format!("{:.1}B", p / 1e9),
            p if p >= 1e6 => format!("{:.1}M", p / 1e6),
            p => format!("{:.0}", p),
        }
    }
}
