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
///
/// # Examples
///
/// ```
/// use kiln_trace::{TakeMode, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let y = x.take_with(&Tensor::scalar(5i32), 0, TakeMode::Fill);
/// assert!(y.item().unwrap().is_nan());
/// ```
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
    /// The window of `sizes` starting at `starts` (one integer scalar tensor per dimension,
    /// all of one dtype), each start clamped so the window fits, as JAX's
    /// `lax.dynamic_slice`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(5, DType::I32);
    /// assert_eq!(x.dynamic_slice(&[&Tensor::scalar(1i32)], &[3]).to_vec::<i32>().unwrap(), [1, 2, 3]);
    /// // The start is clamped so the window fits.
    /// assert_eq!(x.dynamic_slice(&[&Tensor::scalar(4i32)], &[3]).to_vec::<i32>().unwrap(), [2, 3, 4]);
    /// ```
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[usize]) -> Tensor {
        let mut operands = vec![self];
        operands.extend(starts);
        let op = Op::DynamicSlice {
            slice_sizes: sizes.iter().map(|&s| s as i64).collect(),
        };
        apply(op, &operands, None, "dynamic_slice", Loc::caller()).remove(0)
    }

    /// This tensor with the window at `starts` replaced by `update` (of the same rank; starts
    /// clamped so it fits), as JAX's `lax.dynamic_update_slice`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::zeros(DType::I32, [5]);
    /// let u = Tensor::from_vec(vec![7i32, 8], [2]).unwrap();
    /// let y = x.dynamic_update_slice(&u, &[&Tensor::scalar(1i32)]);
    /// assert_eq!(y.to_vec::<i32>().unwrap(), [0, 7, 8, 0, 0]);
    /// ```
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Tensor {
        let mut operands = vec![self, update];
        operands.extend(starts);
        let op = Op::DynamicUpdateSlice {};
        apply(op, &operands, None, "dynamic_update_slice", Loc::caller()).remove(0)
    }

    /// Elements at integer `indices` along `axis`: the result's shape is this shape with `axis`
    /// replaced by the indices' shape. Negative indices count from the end. An index outside
    /// `[-n, n)` is an error when the indices have values (eager mode); under `jit` it takes the
    /// fill value of [`TakeMode::Fill`] (NaN for floats).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![10i32, 20, 30], [3]).unwrap();
    /// let i = Tensor::from_vec(vec![2i32, -1, 0, 0], [2, 2]).unwrap();
    /// let y = x.take(&i, 0);
    /// assert_eq!((y.shape(), y.to_vec::<i32>().unwrap()), (vec![2, 2], vec![30, 30, 10, 10]));
    /// assert!(x.take(&Tensor::scalar(3i32), 0).to_vec::<i32>().is_err());
    /// ```
    #[track_caller]
    pub fn take(&self, indices: &Tensor, axis: isize) -> Tensor {
        let loc = Loc::caller();
        composite("take", loc, || {
            self.take_checked(indices, axis, TakeMode::Fill)
        })
    }

    /// [`Tensor::take`] with out-of-range indices handled by `mode`, eagerly too.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::{TakeMode, Tensor};
    /// let x = Tensor::from_vec(vec![10i32, 20, 30], [3]).unwrap();
    /// let i = Tensor::from_vec(vec![3i32, 5], [2]).unwrap();
    /// assert_eq!(x.take_with(&i, 0, TakeMode::Clip).to_vec::<i32>().unwrap(), [30, 30]);
    /// assert_eq!(x.take_with(&i, 0, TakeMode::Wrap).to_vec::<i32>().unwrap(), [10, 30]);
    /// ```
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

    /// Elements picked along `axis` by `indices`, position by position (NumPy's
    /// `take_along_axis`, PyTorch's `gather`): `indices` has this tensor's rank and its shape
    /// but along `axis`, and the result has the indices' shape, element `[.., i, ..]` being
    /// this tensor's `[.., indices[.., i, ..], ..]`. Negative indices count from the end; one
    /// outside `[-n, n)` is an error when the indices have values (eager mode) and gives the
    /// fill value of [`TakeMode::Fill`] under `jit`. `argsort`'s result sorts a tensor so.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    /// let i = Tensor::from_vec(vec![2i32, 0], [2, 1]).unwrap();
    /// assert_eq!(x.take_along_axis(&i, 1).to_vec::<i32>().unwrap(), [3, 4]);
    /// ```
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Tensor, axis: isize) -> Tensor {
        let loc = Loc::caller();
        composite("take_along_axis", loc, || self.along(indices, axis))
    }

    fn along(&self, indices: &Tensor, axis: isize) -> Tensor {
        const NAME: &str = "take_along_axis";
        let d = match self.axis(axis, NAME) {
            Ok(d) => d,
            Err(t) => return t,
        };
        if let Some(e) = indices.error() {
            return Tensor::failed(e.clone());
        }
        if !indices.dtype().is_int() {
            return self.fail(
                NAME,
                format!("indices must be integers, got {}", ty_str(indices)),
            );
        }
        let (s, si) = (self.shape(), indices.shape());
        let fits = si.len() == s.len() && (0..s.len()).all(|k| k == d || si[k] == s[k]);
        if !fits {
            return self.fail(
                NAME,
                format!(
                    "indices {} must have the shape of {} except along axis {d}",
                    ty_str(indices),
                    ty_str(self)
                ),
            );
        }
        let n = s[d] as i64;
        if let Some(l) = indices.literal()
            && let Some(&i) = l.to_i64s().iter().find(|&&i| i < -n || i >= n)
        {
            return self.fail(
                NAME,
                format!(
                    "index {i} is out of range for axis {d} of {} (valid: {} to {})",
                    ty_str(self),
                    -n,
                    n - 1
                ),
            );
        }
        let idx = indices.cast(DType::I64);
        let zero = Tensor::full(DType::I64, [], 0.0);
        let len = Tensor::full(DType::I64, [], n as f64);
        let idx = idx.lt(&zero).where_(&idx.add(&len), &idx);
        let no = Tensor::full(DType::Pred, [], 0.0);
        let valid = idx.ge(&zero).where_(&idx.lt(&len), &no);
        // Every other dimension is a batching dimension of both: position `[.., i, ..]` reads
        // this tensor at its own coordinates, but at `idx[.., i, ..]` along `d`.
        let r = s.len();
        let others: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
        let op = Op::Gather {
            offset_dims: vec![],
            collapsed_slice_dims: vec![d as i64],
            start_index_map: vec![d as i64],
            index_vector_dim: r as i64,
            slice_sizes: vec![1; r],
            operand_batching_dims: others.clone(),
            start_indices_batching_dims: others,
        };
        let got = apply(op, &[self, &idx], None, NAME, Loc::caller()).remove(0);
        let fill = Tensor::full(self.dtype(), [], fill_value(self.dtype()));
        valid.where_(&got, &fill)
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
            operand_batching_dims: Vec::new(),
            start_indices_batching_dims: Vec::new(),
        };
        apply(op, &[self, indices], None, "take", Loc::caller()).remove(0)
    }
}

/// The value [`TakeMode::Fill`] gives an out-of-range index.
fn fill_value(d: DType) -> f64 {
    match d {
        DType::Pred => 1.0,
        // The most negative value of a signed type, the largest of an unsigned one (as JAX).
        d if d.is_int() && d.is_signed() => d.int_bounds().expect("an integer").0 as f64,
        d if d.is_int() => d.int_bounds().expect("an integer").1 as f64,
        _ => f64::NAN,
    }
}
