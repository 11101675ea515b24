//! Images in prompts. The chat format writes one placeholder token per image where the image
//! sits; [`expand`] frames each as K3's release does (`<|media_begin|>image WxH<|media_content|>`,
//! one placeholder per position the image takes, `<|media_end|>`: SGLang's
//! `_expand_k3_image_prompt_token_ids`) and says which prompt rows take the image's embeddings.

pub use k3_vision::DecodeLimits;
use k3_vision::decode;

use k3_engine::{Engine, Inserted};
use k3_text::Tokenizer;

use crate::GenerateError;

pub use k3_engine::PromptImage;

/// Decodes an image file's bytes (within `limits`) and computes its prompt rows. The model's
/// side is the caller's to check first, once for all its images ([`Engine::check_sees`]): then a
/// model without eyes says so before any input is read or decoded.
pub fn prompt_image(engine: &Engine<'_>, bytes: &[u8], limits: &DecodeLimits) -> Result<PromptImage, GenerateError> {
    let pic = decode(bytes, limits).map_err(|e| GenerateError::Input(e.to_string()))?;
    Ok(engine.finish_image(engine.start_image(&pic, xxhash_rust::xxh3::xxh3_64(bytes))?))
}

/// The tokenizer has the special tokens images are written with (the chat format's placeholder
/// and the release's framing); gives `<|media_end|>`'s id. Checked when an image is given, so a
/// model that cannot frame one says so then, not at the turn that would use it.
pub fn check_tokenizer(tok: &Tokenizer) -> Result<u32, GenerateError> {
    let names = [k3_text::chat_format::IMAGE_PLACEHOLDER, "<|media_begin|>", "<|media_content|>", "<|media_end|>"];
    if let Some(missing) = names.iter().find(|n| tok.special(n).is_none()) {
        return Err(GenerateError::Input(format!(
            "the tokenizer has no {missing} token: this model cannot be given images"
        )));
    }
    tok.special("<|media_end|>").ok_or_else(|| GenerateError::Input("the tokenizer has no <|media_end|> token".into()))
}

/// `ids` with each placeholder (in order, one per image) expanded into the image's framed span,
/// and where each image's rows go.
pub fn expand(
    tok: &Tokenizer,
    placeholder: u32,
    hidden: usize,
    ids: &[u32],
    images: &[PromptImage],
) -> Result<(Vec<u32>, Vec<Inserted>), GenerateError> {
    let found = ids.iter().filter(|&&t| t == placeholder).count();
    if found != images.len() {
        return Err(GenerateError::Input(format!(
            "the prompt has {found} image placeholders for {} images",
            images.len()
        )));
    }
    let end = check_tokenizer(tok)?;
    let mut out =
        Vec::with_capacity(ids.len() + images.iter().map(|i| i.rows.len() / hidden.max(1) + 16).sum::<usize>());
    let mut inserted = Vec::with_capacity(images.len());
    let mut next = images.iter();
    for &t in ids {
        if t != placeholder {
            out.push(t);
            continue;
        }
        let Some(img) = next.next() else { break };
        out.extend(
            tok.encode_with_specials(&format!("<|media_begin|>image {}x{}<|media_content|>", img.width, img.height)),
        );
        let n = img.rows.len() / hidden.max(1);
        inserted.push(Inserted { at: out.len(), rows: img.rows.clone() });
        out.extend(std::iter::repeat_n(placeholder, n));
        out.push(end);
    }
    Ok((out, inserted))
}

/// A raw prompt (no chat format) with `count` images: where its text spells the model's image
/// placeholder the images go there, in order; with none, they go first (llama.cpp's `mtmd` puts
/// media where its marker is, or first). A count that disagrees is an error.
pub fn place_in_raw(ids: &[u32], placeholder: u32, count: usize) -> Result<Vec<u32>, GenerateError> {
    let found = ids.iter().filter(|&&t| t == placeholder).count();
    match found {
        0 => Ok(std::iter::repeat_n(placeholder, count).chain(ids.iter().copied()).collect()),
        n if n == count => Ok(ids.to_vec()),
        n => Err(GenerateError::Input(format!(
            "the prompt has {n} image placeholders ({}) for {count} images",
            k3_text::chat_format::IMAGE_PLACEHOLDER
        ))),
    }
}
