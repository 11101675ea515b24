//! The tower's shape (`config.json`'s `vision_config`) and the processor's settings
//! (`preprocessor_config.json`'s `media_proc_cfg`), typed and checked. Absent fields take the
//! defaults of the reference implementation (SGLang's `KimiK3VisionConfig`); values this tower
//! does not implement are refused by name rather than run differently.

use serde::Deserialize;

use crate::VisionError;

const CONFIG: &str = "config.json vision_config";
const PROCESSOR: &str = "preprocessor_config.json";

/// The vision tower and projector (MoonViT3d, PatchMergerMLPV2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct VisionConfig {
    pub patch_size: usize,
    pub init_pos_emb_height: usize,
    pub init_pos_emb_width: usize,
    pub init_pos_emb_time: usize,
    pub vt_num_attention_heads: usize,
    pub vt_num_hidden_layers: usize,
    pub vt_hidden_size: usize,
    pub vt_intermediate_size: usize,
    pub merge_kernel_size: [usize; 2],
    pub merge_type: String,
    pub projector_ln_eps: f32,
    pub qkv_hidden_size: usize,
    pub norm_type: String,
    pub attn_bias: bool,
    pub patch_embed_proj_bias: bool,
    pub linear_bias: bool,
    pub activation_func: String,
    pub projector_hidden_act: String,
    pub pos_emb_type: String,
    pub pos_emb_interpolation_mode: String,
    pub text_hidden_size: usize,
}

impl Default for VisionConfig {
    fn default() -> Self {
        VisionConfig {
            patch_size: 14,
            init_pos_emb_height: 64,
            init_pos_emb_width: 64,
            init_pos_emb_time: 4,
            vt_num_attention_heads: 12,
            vt_num_hidden_layers: 27,
            vt_hidden_size: 1024,
            vt_intermediate_size: 4096,
            merge_kernel_size: [2, 2],
            merge_type: "sd2_tpool".into(),
            projector_ln_eps: 1e-5,
            qkv_hidden_size: 1536,
            norm_type: "rmsnorm".into(),
            attn_bias: false,
            patch_embed_proj_bias: false,
            linear_bias: false,
            activation_func: "gelu_pytorch_tanh".into(),
            projector_hidden_act: "gelu".into(),
            pos_emb_type: "divided_fixed".into(),
            pos_emb_interpolation_mode: "bilinear".into(),
            text_hidden_size: 7168,
        }
    }
}

fn refuse(file: &'static str, reason: String) -> VisionError {
    VisionError::Config { file, reason }
}

impl VisionConfig {
    /// Reads `vision_config`, taking the language model's hidden width as the projector's output
    /// (the reference overrides `text_hidden_size` with it too).
    pub fn parse(value: &serde_json::Value, text_hidden: usize) -> Result<Self, VisionError> {
        let mut c: VisionConfig = serde_json::from_value(value.clone()).map_err(|e| refuse(CONFIG, e.to_string()))?;
        c.text_hidden_size = text_hidden;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), VisionError> {
        let want = |field: &str, got: &str, ok: &[&str]| {
            if ok.contains(&got) {
                Ok(())
            } else {
                Err(refuse(CONFIG, format!("{field} \"{got}\" is not implemented (k3 runs {ok:?})")))
            }
        };
        want("merge_type", &self.merge_type, &["sd2_tpool"])?;
        want("norm_type", &self.norm_type, &["rmsnorm"])?;
        want("activation_func", &self.activation_func, &["gelu_pytorch_tanh", "gelu"])?;
        want("projector_hidden_act", &self.projector_hidden_act, &["gelu"])?;
        want("pos_emb_type", &self.pos_emb_type, &["divided_fixed"])?;
        want("pos_emb_interpolation_mode", &self.pos_emb_interpolation_mode, &["bilinear"])?;
        if self.attn_bias || self.linear_bias || self.patch_embed_proj_bias {
            return Err(refuse(
                CONFIG,
                "biased projections (attn_bias, linear_bias, patch_embed_proj_bias) are not implemented".into(),
            ));
        }
        let heads = self.vt_num_attention_heads;
        // Bounds far above any tower (K3: 1,024 wide, MLP 4,096, a 64 x 64 position table), so
        // the shapes' products cannot overflow whatever a config says.
        let bounded = [
            ("vt_hidden_size", self.vt_hidden_size, 1 << 16),
            ("qkv_hidden_size", self.qkv_hidden_size, 1 << 16),
            ("vt_intermediate_size", self.vt_intermediate_size, 1 << 18),
            ("init_pos_emb_height", self.init_pos_emb_height, 1 << 12),
            ("init_pos_emb_width", self.init_pos_emb_width, 1 << 12),
            ("text_hidden_size", self.text_hidden_size, 1 << 20),
        ];
        if let Some((field, v, max)) = bounded.iter().find(|(_, v, max)| v > max) {
            return Err(refuse(CONFIG, format!("{field} {v} is larger than k3 takes ({max})")));
        }
        let sizes = [self.patch_size, heads, self.vt_hidden_size, self.vt_intermediate_size, self.qkv_hidden_size];
        if sizes.contains(&0) || self.init_pos_emb_height == 0 || self.init_pos_emb_width == 0 {
            return Err(refuse(CONFIG, "a size is 0".into()));
        }
        if !self.qkv_hidden_size.is_multiple_of(heads) || !(self.qkv_hidden_size / heads).is_multiple_of(4) {
            return Err(refuse(
                CONFIG,
                format!(
                    "qkv_hidden_size {} over {heads} heads must give a head width divisible by 4 (2D rotary)",
                    self.qkv_hidden_size
                ),
            ));
        }
        if self.merge_kernel_size != [2, 2] {
            return Err(refuse(
                CONFIG,
                format!("merge_kernel_size {:?} is not implemented (k3 runs [2, 2])", self.merge_kernel_size),
            ));
        }
        if self.projector_ln_eps.is_nan()
            || self.projector_ln_eps <= 0.0
            || self.patch_size > 64
            || heads > 1024
            || self.vt_num_hidden_layers > 1024
        {
            return Err(refuse(CONFIG, "projector_ln_eps, patch_size, heads or layers out of range".into()));
        }
        Ok(())
    }

    /// Each head's width (`qkv_hidden_size / heads`).
    pub fn head_dim(&self) -> usize {
        self.qkv_hidden_size / self.vt_num_attention_heads
    }

    /// The width of a merged position: `merge_h * merge_w` patches side by side.
    pub fn merged_width(&self) -> usize {
        self.vt_hidden_size * self.merge_kernel_size[0] * self.merge_kernel_size[1]
    }
}

/// How an image is sized and normalized before the tower (`media_proc_cfg`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProcessorConfig {
    /// At most this many 14 x 14 patches per image: larger images are scaled down.
    pub in_patch_limit: usize,
    /// At most this many patches along either side.
    pub patch_limit_on_one_side: usize,
    pub patch_size: usize,
    pub merge_kernel_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// The background a transparent image is composited over (`pattern`: white, black, gray,
    /// chessboard), if the processor names one: k3 refuses transparent images then rather than
    /// composite differently.
    pub transparent_bg_config: Option<serde_json::Value>,
    /// A fixed number of positions per image, if the processor names one (not implemented:
    /// refused when set).
    pub fixed_output_tokens: Option<serde_json::Value>,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        ProcessorConfig {
            in_patch_limit: 65_536,
            patch_limit_on_one_side: 512,
            patch_size: 14,
            merge_kernel_size: 2,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            transparent_bg_config: None,
            fixed_output_tokens: None,
        }
    }
}

#[derive(Deserialize)]
struct ProcessorFile {
    media_proc_cfg: Option<serde_json::Value>,
}

impl ProcessorConfig {
    /// Reads `preprocessor_config.json` (its `media_proc_cfg`), checked against the tower.
    pub fn parse(bytes: &[u8], tower: &VisionConfig) -> Result<Self, VisionError> {
        let file: ProcessorFile = serde_json::from_slice(bytes).map_err(|e| refuse(PROCESSOR, e.to_string()))?;
        let cfg = file.media_proc_cfg.ok_or_else(|| refuse(PROCESSOR, "no media_proc_cfg".into()))?;
        let c: ProcessorConfig =
            serde_json::from_value(cfg).map_err(|e| refuse(PROCESSOR, format!("media_proc_cfg: {e}")))?;
        c.check(tower)?;
        Ok(c)
    }

    /// The reference's settings for a model that ships no processor file.
    pub fn default_for(tower: &VisionConfig) -> Result<Self, VisionError> {
        let c = ProcessorConfig { patch_size: tower.patch_size, ..ProcessorConfig::default() };
        c.check(tower)?;
        Ok(c)
    }

    fn check(&self, tower: &VisionConfig) -> Result<(), VisionError> {
        if self.patch_size != tower.patch_size || self.merge_kernel_size != tower.merge_kernel_size[0] {
            return Err(refuse(
                PROCESSOR,
                format!(
                    "patch_size {} / merge_kernel_size {} disagree with the tower's {} / {:?}",
                    self.patch_size, self.merge_kernel_size, tower.patch_size, tower.merge_kernel_size
                ),
            ));
        }
        // The tower's rotary table has 512 positions a side: more patches than 512 x 512 could
        // never be run.
        if !(1..=512 * 512).contains(&self.in_patch_limit) || !(1..=4096).contains(&self.patch_limit_on_one_side) {
            return Err(refuse(
                PROCESSOR,
                "in_patch_limit must be 1 to 262,144 and patch_limit_on_one_side 1 to 4,096".into(),
            ));
        }
        if self.fixed_output_tokens.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                PROCESSOR,
                "fixed_output_tokens is not implemented (k3 sizes images by the patch limits)".into(),
            ));
        }
        if self.image_std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || self.image_mean.iter().any(|m| !m.is_finite())
        {
            return Err(refuse(PROCESSOR, "image_std must be positive and image_mean finite".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processor_settings_k3_cannot_honour_are_refused_or_named() {
        let tower = VisionConfig::default();
        let ok = br#"{"media_proc_cfg": {"in_patch_limit": 16384, "patch_limit_on_one_side": 512}}"#;
        let p = ProcessorConfig::parse(ok, &tower).unwrap();
        assert_eq!((p.in_patch_limit, p.image_mean), (16384, [0.5; 3]));
        let fixed = br#"{"media_proc_cfg": {"fixed_output_tokens": 256}}"#;
        assert!(ProcessorConfig::parse(fixed, &tower).unwrap_err().to_string().contains("fixed_output_tokens"));
        let mismatch = br#"{"media_proc_cfg": {"patch_size": 16}}"#;
        assert!(ProcessorConfig::parse(mismatch, &tower).unwrap_err().to_string().contains("patch_size 16"));
        assert!(ProcessorConfig::parse(b"{}", &tower).unwrap_err().to_string().contains("media_proc_cfg"));
        let huge = br#"{"media_proc_cfg": {"in_patch_limit": 18446744073709551615}}"#;
        assert!(ProcessorConfig::parse(huge, &tower).unwrap_err().to_string().contains("in_patch_limit"));
        let bad_std = br#"{"media_proc_cfg": {"image_std": [0.5, 0, 0.5]}}"#;
        assert!(ProcessorConfig::parse(bad_std, &tower).is_err());
    }

    #[test]
    fn sizes_that_would_overflow_are_refused() {
        let v = serde_json::json!({"vt_hidden_size": 1u64 << 40, "vt_intermediate_size": 1u64 << 40});
        let e = VisionConfig::parse(&v, 7168).unwrap_err().to_string();
        assert!(e.contains("vt_hidden_size") && e.contains("larger than"), "{e}");
        assert!(VisionConfig::parse(&serde_json::json!({}), 1 << 30).is_err());
        assert!(VisionConfig::parse(&serde_json::json!({"vt_num_attention_heads": 0}), 7168).is_err());
        assert!(
            VisionConfig::parse(&serde_json::json!({"merge_type": "other"}), 7168)
                .unwrap_err()
                .to_string()
                .contains("merge_type")
        );
    }

    #[test]
    fn a_transparent_image_is_refused_where_the_processor_composites() {
        let tower = VisionConfig { patch_size: 14, ..VisionConfig::default() };
        let bg = br#"{"media_proc_cfg": {"transparent_bg_config": {"pattern": "chessboard"}}}"#;
        let p = ProcessorConfig::parse(bg, &tower).unwrap();
        let mut pic = crate::Picture { width: 28, height: 28, rgb: vec![9; 28 * 28 * 3], had_alpha: true };
        let e = crate::patch_image(&pic, &p).unwrap_err().to_string();
        assert!(e.contains("transparent"), "{e}");
        pic.had_alpha = false;
        assert!(crate::patch_image(&pic, &p).is_ok());
        // Without a background the alpha is dropped, as the reference drops it.
        pic.had_alpha = true;
        assert!(crate::patch_image(&pic, &ProcessorConfig::default_for(&tower).unwrap()).is_ok());
    }
}
