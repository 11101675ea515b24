//! Zero-copy views of stored tensors, over the mapped trunk or a record buffer.

use crate::encoding::{Dtype, Encoding};
use crate::error::{FormatError, Place, Result};
use crate::manifest::TensorEntry;

mod sealed {
    pub trait Sealed {}
}

/// Plain element types a part can be viewed as: every bit pattern is a valid value.
pub trait Element: sealed::Sealed + Copy + 'static {
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: Dtype = Dtype::$d; }
    )*};
}
element!(f32 => F32, half::f16 => F16, half::bf16 => Bf16, i8 => I8, u8 => U8, u16 => U16);

/// One stored part: its bytes and what they hold.
#[derive(Debug, Clone, Copy)]
pub struct PartView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [u64],
    pub bytes: &'a [u8],
}

impl<'a> PartView<'a> {
    /// The part as a slice of `T`, without copying. Fails if the dtype differs or the bytes are
    /// not aligned for `T` (they always are inside a model: parts are 64-byte aligned).
    pub fn typed<T: Element>(&self, place: &Place) -> Result<&'a [T]> {
        if self.dtype != T::DTYPE {
            return Err(FormatError::WrongDtype {
                place: place.clone(),
                part: self.name.to_string(),
                dtype: self.dtype.name(),
                wanted: T::DTYPE.name(),
            });
        }
        // SAFETY: `T` is one of the sealed plain types above, for which every bit pattern is a
        // valid value and which have no padding; `align_to` only yields a properly aligned middle.
        let (head, mid, tail) = unsafe { self.bytes.align_to::<T>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(FormatError::Shape {
                place: place.clone(),
                reason: format!("part `{}` is not aligned or sized for {}", self.name, T::DTYPE.name()),
            });
        }
        Ok(mid)
    }
}

/// A tensor: its encoding, logical shape and stored parts.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub encoding: &'a Encoding,
    pub shape: &'a [u64],
    pub parts: Vec<PartView<'a>>,
}

impl<'a> TensorView<'a> {
    /// Builds a view from a manifest entry over `base`, where part offsets are `base_offset`-relative.
    /// The entry has been validated, so the parts lie inside `base`.
    pub(crate) fn new(entry: &'a TensorEntry, base: &'a [u8], base_offset: u64) -> Self {
        let parts = entry
            .parts
            .iter()
            .map(|p| {
                let start = (p.offset - base_offset) as usize;
                PartView { name: &p.name, dtype: p.dtype, shape: &p.shape, bytes: &base[start..start + p.len as usize] }
            })
            .collect();
        TensorView { name: &entry.name, encoding: &entry.encoding, shape: &entry.shape, parts }
    }

    pub fn part(&self, name: &str) -> Result<&PartView<'a>> {
        self.parts.iter().find(|p| p.name == name).ok_or_else(|| FormatError::Shape {
            place: Place::Tensor(self.name.to_string()),
            reason: format!("{} has no part `{name}`", self.encoding.label()),
        })
    }

    /// A part as a typed slice, e.g. `t.typed::<half::bf16>("data")`.
    pub fn typed<T: Element>(&self, part: &str) -> Result<&'a [T]> {
        self.part(part)?.typed(&Place::Tensor(self.name.to_string()))
    }

    /// Checks the logical shape, for callers that know what they expect.
    pub fn expect_shape(&self, want: &[u64]) -> Result<()> {
        if self.shape == want {
            Ok(())
        } else {
            Err(FormatError::Shape {
                place: Place::Tensor(self.name.to_string()),
                reason: format!("shape is {:?}, expected {want:?}", self.shape),
            })
        }
    }
}

/// The matrices of one expert record.
#[derive(Debug, Clone)]
pub struct ExpertView<'a> {
    pub layer: u32,
    pub expert: u32,
    pub matrices: Vec<TensorView<'a>>,
}

impl<'a> ExpertView<'a> {
    pub fn matrix(&self, name: &str) -> Result<&TensorView<'a>> {
        self.matrices.iter().find(|m| m.name == name).ok_or_else(|| FormatError::Shape {
            place: Place::Expert { layer: self.layer, expert: self.expert },
            reason: format!("no matrix `{name}` in the record"),
        })
    }
}
