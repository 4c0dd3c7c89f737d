//! Taking elements by integer indices, as NumPy and PyTorch do: negative indices count from the
//! end; an index out of range is an error in eager mode, and under a trace (where indices
//! have no values yet) is handled by a documented [`TakeMode`], never clamped silently.
//! (The IR's `gather` keeps StableHLO's clamping; this is the user-level operation.)

use crate::composite::composite;
use crate::ops::ty_str;
use crate::tensor::Tensor;
use crate::trace::apply;
use kiln_ir::{DType, Loc, Op};

/// What [`Tensor::take_with`] does with an index outside `[-n, n)` for an axis of length `n`
/// (indices in `[-n, 0)` always count from the end), as `jnp.take`'s `mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeMode {
    /// The element is a fill value: NaN for floats, the dtype's minimum for signed integers,
    /// its maximum for `u32`, `true` for `pred` (JAX's choices). The default under a trace.
    Fill,
    /// The index is clamped into `[0, n)`.
    Clip,
    /// The index is taken modulo `n` (NumPy's `wrap`).
    Wrap,
}

impl Tensor {
    /// Elements at integer `indices` along `axis`: the result's shape is this shape with `axis`
    /// replaced by the indices' shape. Negative indices count from the end. An index outside
    /// `[-n, n)` is an error when the indices have values (eager mode); under `jit` it takes the
    /// fill value of [`TakeMode::Fill`] (NaN for floats).
    #[track_caller]
    pub fn take(&self, indices: &Tensor, axis: isize) -> Tensor {
        let loc = Loc::caller();
        composite("take", loc, || {
            self.take_checked(indices, axis, TakeMode::Fill)
        })
    }

    /// [`Tensor::take`] with out-of-range indices handled by `mode`, eagerly too.
    #[track_caller]
    pub fn take_with(&self, indices: &Tensor, axis: isize, mode: TakeMode) -> Tensor {
        let loc = Loc::caller();
        composite("take", loc, || self.take_in(indices, axis, mode))
    }

    fn take_checked(&self, indices: &Tensor, axis: isize, mode: TakeMode) -> Tensor {
        if let (Some(l), Ok(d)) = (indices.literal(), self.axis(axis, "take")) {
            let n = self.shape()[d] as i64;
            if let Some(&i) = l.to_i64s().iter().find(|&&i| i < -n || i >= n) {
                return self.fail(
                    "take",
                    format!(
                        "index {i} is out of range for axis {d} of {} (valid: {} to {})",
                        ty_str(self),
                        -n,
                        n - 1
                    ),
                );
            }
        }
        self.take_in(indices, axis, mode)
    }

    fn take_in(&self, indices: &Tensor, axis: isize, mode: TakeMode) -> Tensor {
        let d = match self.axis(axis, "take") {
            Ok(d) => d,
            Err(t) => return t,
        };
        if indices.error().is_none() && !indices.dtype().is_int() {
            return self.fail(
                "take",
                format!("indices must be integers, got {}", ty_str(indices)),
            );
        }
        let s = self.shape();
        let n = s[d] as f64;
        let it = indices.dtype();
        let signed = it.is_signed();
        let zero = Tensor::full(it, [], 0.0);
        let len = Tensor::full(it, [], n);
        // Negative indices count from the end (u32 indices are never negative).
        let from_end = |i: &Tensor| {
            if signed {
                i.lt(&zero).where_(&i.add(&len), i)
            } else {
                i.clone()
            }
        };
        let idx = match mode {
            TakeMode::Fill | TakeMode::Clip => from_end(indices),
            TakeMode::Wrap => {
                let r = indices.rem(&len);
                if signed {
                    r.lt(&zero).where_(&r.add(&len), &r)
                } else {
                    r
                }
            }
        };
        let got = self.gather_along(&idx, d);
        if mode != TakeMode::Fill {
            return got;
        }
        let valid = if signed {
            let no = Tensor::full(DType::Pred, [], 0.0);
            idx.ge(&zero).where_(&idx.lt(&len), &no)
        } else {
            idx.lt(&len)
        };
        // The validity of each index, shaped to broadcast along the other dimensions.
        let ri = indices.rank();
        let shape: Vec<isize> = (0..s.len() + ri - 1)
            .map(|k| {
                if k >= d && k < d + ri {
                    indices.shape()[k - d] as isize
                } else {
                    1
                }
            })
            .collect();
        let fill = Tensor::full(self.dtype(), [], fill_value(self.dtype()));
        valid.reshape(&shape).where_(&got, &fill)
    }

    /// StableHLO's gather of whole slices at `indices` along `d` (indices clamped into range).
    fn gather_along(&self, indices: &Tensor, d: usize) -> Tensor {
        let s = self.shape();
        let ri = indices.rank();
        let offset_dims: Vec<i64> = (0..d as i64)
            .chain((d + ri) as i64..(s.len() + ri - 1) as i64)
            .collect();
        let mut sizes: Vec<i64> = s.iter().map(|&x| x as i64).collect();
        sizes[d] = 1;
        let op = Op::Gather {
            offset_dims,
            collapsed_slice_dims: vec![d as i64],
            start_index_map: vec![d as i64],
            index_vector_dim: ri as i64,
            slice_sizes: sizes,
        };
        apply(op, &[self, indices], None, "take", Loc::caller()).remove(0)
    }
}

/// The value [`TakeMode::Fill`] gives an out-of-range index.
fn fill_value(d: DType) -> f64 {
    match d {
        DType::Pred => 1.0,
        DType::I8 => i8::MIN as f64,
        DType::I32 => i32::MIN as f64,
        DType::I64 => i64::MIN as f64,
        DType::U32 => u32::MAX as f64,
        DType::U8 => u8::MAX as f64,
        _ => f64::NAN,
    }
}
