//! A K3 checkpoint's vision side in `config.json`: the tower's `vision_config` and the id the
//! prompt's image positions carry (`media_placeholder_token_id`).

use k3_vision::VisionConfig;

/// The id SGLang's `KimiK3Config` defaults to when the config does not say.
const DEFAULT_PLACEHOLDER: u32 = 163_605;

/// What a model sees images with.
#[derive(Debug, Clone, PartialEq)]
pub struct Vision {
    pub tower: VisionConfig,
    /// Every prompt position of an image carries this id; its embedding row is replaced.
    pub placeholder: u32,
}

impl Vision {
    /// `None` for a config without `vision_config`.
    pub(super) fn parse(
        value: Option<&serde_json::Value>,
        placeholder: Option<u32>,
        hidden: u64,
        vocab: u64,
    ) -> Result<Option<Vision>, String> {
        let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(None) };
        let tower = VisionConfig::parse(value, hidden as usize).map_err(|e| e.to_string())?;
        let placeholder = placeholder.unwrap_or(DEFAULT_PLACEHOLDER);
        if u64::from(placeholder) >= vocab {
            return Err(format!("media_placeholder_token_id {placeholder} is outside the vocabulary of {vocab}"));
        }
        Ok(Some(Vision { tower, placeholder }))
    }
}
