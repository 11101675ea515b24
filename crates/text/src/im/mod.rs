//! Kimi's `im_` dialect (Kimi-Linear, K2 without a template): `<|im_system|>`, `<|im_user|>`,
//! `<|im_assistant|>` NAME `<|im_middle|>` TEXT `<|im_end|>`, tool calls between
//! `<|tool_call_begin|>` and `<|tool_call_end|>`. Rendering, reading calls back and strict calls
//! side by side.

pub(crate) mod calls;
pub(crate) mod render;
pub(crate) mod strict;
