//! The model's eyes: K3's vision tower built from the WASTE trunk (when the model was converted
//! with it), an image turned into prompt rows, and where those rows go in a sequence.

use half::bf16;
use k3_format::{Encoding, Model};
use k3_quant::Matrix;
use k3_vision::tower::{BlockWeights, TowerWeights, tensors};
use k3_vision::{Patches, Picture, ProcessorConfig, Tower};

use super::Engine;
use crate::EngineError;
use crate::config::ModelConfig;
use crate::weights::{matrix, vector_of};

/// The processor's settings inside the model (conversion embeds the checkpoint's file).
const PROCESSOR_FILE: &str = "preprocessor_config.json";

/// An image's rows in a prompt: positions `at..at + n` take `rows` (`[n, hidden]`) in place of
/// their placeholder tokens' table rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Inserted {
    pub at: usize,
    pub rows: Vec<f32>,
}

/// The tower, its processor settings and the placeholder id, when the model sees.
#[derive(Debug)]
pub(super) struct Eyes<'m> {
    pub tower: Tower<'m>,
    pub processor: ProcessorConfig,
    pub placeholder: u32,
}

fn tensor_err(name: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Shape(format!("vision tensor `{name}`: {e}"))
}

/// The patch convolution `[out, 3, p, p]` as a `[out, 3 p p]` matrix.
fn conv_matrix<'m>(model: &'m Model, name: &str) -> Result<Matrix<'m>, EngineError> {
    let t = model.tensor(name)?;
    let rows = *t.shape.first().ok_or_else(|| tensor_err(name, "has no shape"))? as usize;
    let cols = t
        .shape
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &b| a.checked_mul(b))
        .ok_or_else(|| tensor_err(name, "shape overflows"))? as usize;
    match t.encoding {
        Encoding::F32 => Matrix::f32(t.typed::<f32>("data")?, rows, cols).map_err(|e| tensor_err(name, e)),
        Encoding::Bf16 => Matrix::bf16(t.typed::<bf16>("data")?, rows, cols).map_err(|e| tensor_err(name, e)),
        other => Err(tensor_err(
            name,
            format!("is stored as {}; the patch convolution is read as f32 or bf16", other.label()),
        )),
    }
}

/// The tower, if the config has one and the model was converted with it.
/// The tower's products take the trunk's activation precision (`act`): f32 when exact, bf16
/// under `Bf16Trunk` (what the CLI and server run; the reference serves its tower in bf16 too).
pub(super) fn load<'m>(
    model: &'m Model,
    cfg: &ModelConfig,
    act: k3_quant::Activations,
) -> Result<Option<Eyes<'m>>, EngineError> {
    let Some(v) = &cfg.vision else { return Ok(None) };
    let list = tensors(&v.tower);
    if model.tensor(&list[list.len() - 1].0).is_err() {
        return Ok(None);
    }
    let len =
        |name: &str| list.iter().find(|(n, ..)| n == name).map_or(0, |(_, s, _)| s.iter().product::<u64>() as usize);
    let vals = |name: &str| vector_of(model, name, len(name));
    let matrix = |model: &'m Model, name: &str| matrix(model, name).map(|m| m.with_activations(act));
    let c = &v.tower;
    let blocks = (0..c.vt_num_hidden_layers)
        .map(|i| {
            let n = |s: &str| k3_vision::tower::block_name(i, s);
            Ok(BlockWeights {
                norm0: vals(&n("norm0.weight"))?,
                norm1: vals(&n("norm1.weight"))?,
                wqkv: matrix(model, &n("wqkv.weight"))?,
                wo: matrix(model, &n("wo.weight"))?,
                fc0: matrix(model, &n("mlp.fc0.weight"))?,
                fc1: matrix(model, &n("mlp.fc1.weight"))?,
            })
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
    let w = TowerWeights {
        patch_embed: conv_matrix(model, "vision_tower.patch_embed.proj.weight")?.with_activations(act),
        pos_emb: vals("vision_tower.patch_embed.pos_emb.weight")?,
        blocks,
        final_norm: vals("vision_tower.encoder.final_layernorm.weight")?,
        proj0: matrix(model, "mm_projector.proj.0.weight")?,
        proj2: matrix(model, "mm_projector.proj.2.weight")?,
        post_norm: vals("mm_projector.post_norm.weight")?,
    };
    let tower = Tower::new(c.clone(), w).map_err(|e| EngineError::Shape(e.to_string()))?;
    let processor = match model.blob(PROCESSOR_FILE) {
        Some(bytes) => ProcessorConfig::parse(bytes, c),
        None => ProcessorConfig::default_for(c),
    }
    .map_err(|e| EngineError::Config(e.to_string()))?;
    Ok(Some(Eyes { tower, processor, placeholder: v.placeholder }))
}

/// An image ready for a prompt: the tower's and projector's rows for its placeholder's span.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptImage {
    /// As given (the framing states it).
    pub width: u32,
    pub height: u32,
    /// `[positions, hidden]`.
    pub rows: Vec<f32>,
    /// The image file's hash: two prompts share a prefix through an image only if this agrees.
    pub digest: u64,
}

impl Engine<'_> {
    fn eyes(&self) -> Result<&Eyes<'_>, EngineError> {
        self.eyes.as_ref().ok_or_else(|| {
            EngineError::Input(match &self.cfg.vision {
                Some(_) => "this model was converted without its vision tower: convert the checkpoint again with this k3 to read images".into(),
                None => "this model reads no images (its config has no vision_config)".into(),
            })
        })
    }

    /// Whether the model reads images.
    pub fn sees(&self) -> bool {
        self.eyes.is_some()
    }

    /// `Ok` when the model reads images, else the error saying why not (no `vision_config`, or
    /// converted without the tower).
    pub fn check_sees(&self) -> Result<(), EngineError> {
        self.eyes().map(|_| ())
    }

    /// The id an image's prompt positions carry.
    pub fn image_placeholder(&self) -> Option<u32> {
        self.eyes.as_ref().map(|e| e.placeholder)
    }
}

/// The images of a chunk of `len` rows starting at position `from`, each with the positions of
/// it that fall in the chunk.
pub(super) fn in_chunk(
    images: &[Inserted],
    from: usize,
    len: usize,
    hidden: usize,
) -> impl Iterator<Item = (&Inserted, std::ops::Range<usize>)> {
    images.iter().filter_map(move |img| {
        let n = img.rows.len() / hidden.max(1);
        let (s, e) = (img.at.max(from), (img.at.saturating_add(n)).min(from + len));
        (s < e).then_some((img, s..e))
    })
}

impl Engine<'_> {
    /// A sequence's images are whole rows of the hidden width, in order and not overlapping, and
    /// the positions of them in its chunk carry the placeholder id (so the session's ids say
    /// where images were).
    pub(super) fn check_images(&self, s: &super::Seq<'_>) -> Result<(), EngineError> {
        if s.images.is_empty() {
            return Ok(());
        }
        let placeholder = self.eyes()?.placeholder;
        let d = self.hidden;
        let mut end = 0;
        for img in s.images {
            let n = img.rows.len() / d;
            if n == 0 || img.rows.len() != n * d {
                return Err(EngineError::Input(format!("an image's rows are not whole {d}-wide rows")));
            }
            if img.at < end {
                return Err(EngineError::Input(format!("an image at position {} overlaps the one before", img.at)));
            }
            end = img.at.saturating_add(n);
        }
        for (_, range) in in_chunk(s.images, s.images_from, s.ids.len(), d) {
            let ids = &s.ids[range.start - s.images_from..range.end - s.images_from];
            if let Some(p) = ids.iter().position(|&t| t != placeholder) {
                return Err(EngineError::Input(format!(
                    "position {} of an image carries token {} instead of the image placeholder {placeholder}",
                    range.start + p,
                    ids[p]
                )));
            }
        }
        Ok(())
    }
}

/// An image part way through the tower ([`Engine::start_image`]): a server advances it a block
/// at a time between steps, so the sequences it serves are not held up for a whole tower.
#[derive(Debug)]
pub struct ImageWork<'e> {
    run: k3_vision::tower::TowerRun<'e, 'e>,
    width: u32,
    height: u32,
    digest: u64,
}

impl ImageWork<'_> {
    /// Tower blocks still to run.
    pub fn blocks_left(&self) -> usize {
        self.run.blocks_left()
    }
}

impl<'m> Engine<'m> {
    /// Starts the tower on `pic` (its patches embedded; no block run yet).
    pub fn start_image(&self, pic: &Picture, digest: u64) -> Result<ImageWork<'_>, EngineError> {
        let eyes = self.eyes()?;
        let patches = k3_vision::patch_image(pic, &eyes.processor).map_err(|e| EngineError::Input(e.to_string()))?;
        self.start_patches(&patches, digest)
    }

    /// The processor's settings, when the model sees: with them a server resizes and patches an
    /// image off the engine's thread (a 64-megapixel resize is a second of one core) and starts
    /// the tower on the result ([`Self::start_patches`]).
    pub fn image_processor(&self) -> Option<&ProcessorConfig> {
        self.eyes.as_ref().map(|e| &e.processor)
    }

    /// [`Self::start_image`] on patches already made with [`Self::image_processor`]'s settings.
    pub fn start_patches(&self, patches: &Patches, digest: u64) -> Result<ImageWork<'_>, EngineError> {
        let eyes = self.eyes()?;
        let run = self.compute.run(|| eyes.tower.start(patches)).map_err(|e| EngineError::Input(e.to_string()))?;
        Ok(ImageWork { run, width: patches.layout.width, height: patches.layout.height, digest })
    }

    /// Runs one more block of `work`'s tower; false when none is left.
    pub fn advance_image(&self, work: &mut ImageWork<'_>) -> bool {
        self.compute.run(|| work.run.step())
    }

    /// The rest of the tower and the projector: the image ready for a prompt.
    pub fn finish_image(&self, work: ImageWork<'_>) -> PromptImage {
        let (width, height, digest) = (work.width, work.height, work.digest);
        let rows = self.compute.run(|| work.run.finish());
        PromptImage { width, height, rows, digest }
    }
}
