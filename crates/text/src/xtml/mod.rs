//! Kimi K3's XTML dialect: elements opened by `<|open|>`, closed by `<|close|>`, their tags ended
//! by `<|sep|>`; tag names and attributes are ordinary text. Rendering, reading calls back and
//! strict calls side by side.

pub(crate) mod calls;
pub(crate) mod render;
pub(crate) mod strict;
