//! Shape operations: reshaping, permuting, squeezing, slicing, indexing, joining, padding,
//! and the index-built tensors `iota` and `eye`.

use crate::Error;
use crate::ops::ty_str;
use crate::promote::promote_types;
use crate::tensor::Tensor;
use crate::trace::apply;
use kiln_ir::{DType, Loc, Op, ShapeDisplay, TensorType};

impl Tensor {
    #[track_caller]
    pub(crate) fn reshape_to(&self, shape: &[usize]) -> Tensor {
        if self.error().is_some() || self.shape() == shape {
            return self.clone();
        }
        self.op1_typed(
            Op::Reshape {},
            TensorType::new(self.dtype(), shape),
            "reshape",
        )
    }

    /// The same elements in another shape; one entry may be -1 (inferred).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(6, DType::I32).reshape(&[2, -1]);
    /// assert_eq!(x.shape(), [2, 3]);
    /// assert!(x.reshape(&[4, -1]).to_vec::<i32>().is_err());
    /// ```
    #[track_caller]
    pub fn reshape(&self, shape: &[isize]) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        let n: usize = self.shape().iter().product();
        let known: usize = shape
            .iter()
            .filter(|&&s| s >= 0)
            .map(|&s| s as usize)
            .product();
        let holes = shape.iter().filter(|&&s| s == -1).count();
        if shape.iter().any(|&s| s < -1)
            || holes > 1
            || (holes == 1 && (known == 0 || !n.is_multiple_of(known)))
            || (holes == 0 && known != n)
        {
            return self.fail(
                "reshape",
                format!(
                    "cannot reshape {} ({n} elements) to {shape:?}",
                    ty_str(self)
                ),
            );
        }
        let shape: Vec<usize> = shape
            .iter()
            .map(|&s| if s == -1 { n / known } else { s as usize })
            .collect();
        self.reshape_to(&shape)
    }

    /// Permutes dimensions: result dimension i is dimension `perm[i]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(6, DType::I32).reshape(&[1, 2, 3]).permute(&[2, 0, 1]);
    /// assert_eq!(x.shape(), [3, 1, 2]);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [0, 3, 1, 4, 2, 5]);
    /// ```
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Tensor {
        self.op1(
            Op::Transpose {
                permutation: perm.iter().map(|&p| p as i64).collect(),
            },
            "permute",
        )
    }
    /// Same as [`Tensor::permute`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap();
    /// assert_eq!(x.transpose(&[1, 0]).to_vec::<i32>().unwrap(), [1, 3, 2, 4]);
    /// ```
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        self.permute(perm)
    }
    /// The `n x n` identity matrix (NumPy's `eye`), built from two iotas, so under a trace
    /// it is computed where it is used.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let i = Tensor::eye(2, DType::F32);
    /// assert_eq!(i.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn eye(n: usize, dtype: DType) -> Tensor {
        let rows = Tensor::iota(DType::I32, &[n, n], 0);
        let cols = Tensor::iota(DType::I32, &[n, n], 1);
        rows.eq(&cols).cast(dtype)
    }
    /// A tensor of `shape` whose elements are their own index along dimension `dim`
    /// (StableHLO's `iota`). Inside a trace it is recorded as an op, so a mask built from it
    /// (a causal mask, say) is computed where it is used rather than stored as a constant.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let cols = Tensor::iota(DType::I32, &[2, 3], 1);
    /// assert_eq!(cols.to_vec::<i32>().unwrap(), [0, 1, 2, 0, 1, 2]);
    /// ```
    #[track_caller]
    pub fn iota(dtype: DType, shape: &[usize], dim: usize) -> Tensor {
        if dim >= shape.len() || dtype == DType::Pred {
            return Tensor::failed(Error::new(
                "iota",
                format!(
                    "expected an integer or float dtype and a dimension below the rank, got \
                     {dtype} {}, dimension {dim}",
                    ShapeDisplay(shape)
                ),
            ));
        }
        let ty = TensorType::new(dtype, shape.to_vec());
        apply(
            Op::Iota {
                iota_dimension: dim as i64,
            },
            &[],
            Some(vec![ty]),
            "iota",
            Loc::caller(),
        )
        .remove(0)
    }

    /// Swaps the last two dimensions.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap().t();
    /// assert_eq!(x.shape(), [3, 2]);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [1, 4, 2, 5, 3, 6]);
    /// ```
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let r = self.rank();
        if r < 2 {
            return self.fail(
                "t",
                format!("t() needs at least 2 dimensions, got {}", ty_str(self)),
            );
        }
        let mut p: Vec<usize> = (0..r).collect();
        p.swap(r - 2, r - 1);
        self.permute(&p)
    }
    /// Removes dimension `axis`, which must have size 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::zeros(DType::F32, [2, 1, 3]);
    /// assert_eq!(x.squeeze(1).shape(), [2, 3]);
    /// assert!(x.squeeze(0).to_vec::<f32>().is_err());
    /// ```
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Tensor {
        let d = match self.axis(axis, "squeeze") {
            Ok(d) => d,
            Err(t) => return t,
        };
        let mut s = self.shape();
        if s[d] != 1 {
            return self.fail(
                "squeeze",
                format!("dimension {d} of {} has size {}, not 1", ty_str(self), s[d]),
            );
        }
        s.remove(d);
        self.reshape_to(&s)
    }
    /// Inserts a dimension of size 1 at `axis` (which may equal the rank).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::zeros(DType::F32, [2, 3]);
    /// assert_eq!(x.unsqueeze(0).shape(), [1, 2, 3]);
    /// assert_eq!(x.unsqueeze(-1).shape(), [2, 3, 1]);
    /// ```
    #[track_caller]
    pub fn unsqueeze(&self, axis: isize) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        let r = self.rank() as isize;
        let d = if axis < 0 { axis + r + 1 } else { axis };
        if d < 0 || d > r {
            return self.fail(
                "unsqueeze",
                format!("axis {axis} is out of range for {}", ty_str(self)),
            );
        }
        let mut s = self.shape();
        s.insert(d as usize, 1);
        self.reshape_to(&s)
    }

    /// Python-style slicing along one axis: `start..end` by `step` (> 0), negative indices from
    /// the end, bounds clamped.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(6, DType::I32);
    /// assert_eq!(x.slice(0, 1, -1, 2).to_vec::<i32>().unwrap(), [1, 3]);
    /// assert_eq!(x.slice(0, -2, 100, 1).to_vec::<i32>().unwrap(), [4, 5]);
    /// ```
    #[track_caller]
    pub fn slice(&self, axis: isize, start: isize, end: isize, step: usize) -> Tensor {
        let d = match self.axis(axis, "slice") {
            Ok(d) => d,
            Err(t) => return t,
        };
        if step == 0 {
            return self.fail("slice", "step must be positive".into());
        }
        let shape = self.shape();
        let n = shape[d] as isize;
        let norm = |i: isize| (if i < 0 { i + n } else { i }).clamp(0, n) as i64;
        let (s, e) = (norm(start), norm(end).max(norm(start)));
        let mut st = vec![0i64; shape.len()];
        let mut lim: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
        let mut steps = vec![1i64; shape.len()];
        st[d] = s;
        lim[d] = e;
        steps[d] = step as i64;
        self.op1(
            Op::Slice {
                start_indices: st,
                limit_indices: lim,
                strides: steps,
            },
            "slice",
        )
    }
    /// Element `i` along axis 0 (negative from the end), dropping that axis.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [3, 2]).unwrap();
    /// assert_eq!(x.index(-1).to_vec::<i32>().unwrap(), [5, 6]);
    /// assert!(x.index(3).to_vec::<i32>().is_err());
    /// ```
    #[track_caller]
    pub fn index(&self, i: isize) -> Tensor {
        let s = self.shape();
        if s.is_empty() {
            return self.fail("index", format!("cannot index a scalar {}", ty_str(self)));
        }
        let n = s[0] as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return self.fail(
                "index",
                format!("index {i} is out of range for {}", ty_str(self)),
            );
        }
        self.slice(0, j, j + 1, 1).squeeze(0)
    }

    /// Joins tensors along `axis`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 2], [1, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![3i32, 4, 5, 6], [2, 2]).unwrap();
    /// let c = Tensor::concat(&[&a, &b], 0);
    /// assert_eq!((c.shape(), c.to_vec::<i32>().unwrap()), (vec![3, 2], vec![1, 2, 3, 4, 5, 6]));
    /// ```
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Tensor {
        let Some(first) = tensors.first() else {
            return Tensor::failed(Error::new("concat", "needs at least one tensor"));
        };
        let d = match first.axis(axis, "concat") {
            Ok(d) => d,
            Err(t) => return t,
        };
        let dtype = tensors
            .iter()
            .filter(|t| t.error().is_none())
            .fold(first.dtype(), |d, t| promote_types(d, t.dtype()));
        let cast: Vec<Tensor> = tensors.iter().map(|t| t.cast(dtype)).collect();
        apply(
            Op::Concatenate {
                dimension: d as i64,
            },
            &cast.iter().collect::<Vec<_>>(),
            None,
            "concat",
            Loc::caller(),
        )
        .remove(0)
    }

    /// Pads each dimension with (before, after) copies of `value` (negative values crop).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3], [3]).unwrap();
    /// assert_eq!(x.pad(&[(1, 2)], 0.0).to_vec::<i32>().unwrap(), [0, 1, 2, 3, 0, 0]);
    /// assert_eq!(x.pad(&[(-1, 0)], 0.0).to_vec::<i32>().unwrap(), [2, 3]);
    /// ```
    #[track_caller]
    pub fn pad(&self, pads: &[(i64, i64)], value: f64) -> Tensor {
        if pads.len() != self.rank() {
            return self.fail(
                "pad",
                format!(
                    "{} (before, after) pairs given for {}",
                    pads.len(),
                    ty_str(self)
                ),
            );
        }
        let op = Op::Pad {
            edge_padding_low: pads.iter().map(|p| p.0).collect(),
            edge_padding_high: pads.iter().map(|p| p.1).collect(),
            interior_padding: vec![0; pads.len()],
        };
        apply(
            op,
            &[self, &self.like_scalar(value)],
            None,
            "pad",
            Loc::caller(),
        )
        .remove(0)
    }
}
