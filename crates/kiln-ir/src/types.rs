//! Tensor types: a dtype and a static shape.

use crate::DType;
use std::fmt;

/// The type of a tensor value: element type and static shape.
///
/// Text form: `f32[2,3]`; a scalar is `f32[]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimension sizes, outermost first.
    pub shape: Vec<usize>,
}

impl TensorType {
    /// A tensor type from a dtype and a shape.
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar), saturating at `usize::MAX` for a shape too large
    /// to count (which the verifier rejects; see [`TensorType::check_size`]).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Number of elements, or `None` when it exceeds [`MAX_SIZE`].
    pub fn checked_numel(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        nonzero_product(&self.shape)
    }

    /// Size in bytes of the elements (`numel * dtype.bytes()`), or `None` when it exceeds
    /// [`MAX_SIZE`].
    pub fn byte_size(&self) -> Option<usize> {
        self.checked_numel()?
            .checked_mul(self.dtype.bytes())
            .filter(|&b| b as u64 <= MAX_SIZE)
    }

    /// Whether kiln can address a tensor of this type: every dimension, and the product of the
    /// nonzero dimensions times the element width, are at most [`MAX_SIZE`]. So the element
    /// count, the byte size and every stride (in elements or bytes) fit in an `i64`, even for a
    /// tensor with a zero dimension. The error says which size overflows.
    pub fn check_size(&self) -> Result<(), String> {
        if let Some(&d) = self.shape.iter().find(|&&d| d as u64 > MAX_SIZE) {
            return Err(format!("dimension size {d} of {self} overflows i64"));
        }
        let Some(n) = nonzero_product(&self.shape) else {
            return Err(format!("the element count of {self} overflows i64"));
        };
        if n.checked_mul(self.dtype.bytes())
            .is_none_or(|b| b as u64 > MAX_SIZE)
        {
            return Err(format!(
                "the byte size of {self} ({n} elements of {} bytes) overflows i64",
                self.dtype.bytes()
            ));
        }
        Ok(())
    }

    /// The same shape with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }

    /// Row-major strides of the shape, in elements.
    pub fn strides(&self) -> Vec<usize> {
        strides(&self.shape)
    }
}

/// The largest element count, byte size or dimension size a tensor type may have:
/// `i64::MAX`, the size type of generated code and of the IR's integer attributes.
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// The product of the nonzero entries of `shape`, or `None` when it exceeds [`MAX_SIZE`].
fn nonzero_product(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n as u64 <= MAX_SIZE)
}

/// Row-major strides of a shape, in elements. They saturate at `usize::MAX` for a shape the
/// verifier rejects (see [`TensorType::check_size`]).
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Prints a shape as `[2,3]`.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}
