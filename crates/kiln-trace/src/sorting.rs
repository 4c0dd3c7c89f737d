//! Sorting and searching along an axis: [`Tensor::sort`], [`Tensor::argsort`],
//! [`Tensor::sort_with`] and [`Tensor::topk`], each the IR's `sort` with a comparator on one
//! operand's keys; [`Tensor::argmax`] and [`Tensor::argmin`], a reduction to the extreme and
//! one to the first position holding it.
//!
//! Order, as NumPy, PyTorch and JAX sort: ascending or descending; NaN counts as greater than
//! every number (last ascending, first descending); -0 and +0 are equal; equal keys keep their
//! order (every sort here is stable, so `argsort` gives the first of equal keys first). The
//! comparators are the forms the backends sort by keys (a radix sort on the CPU, see
//! `kiln_kernel::sort`).

use crate::composite::composite;
use crate::ops::ty_str;
use crate::tensor::Tensor;
use crate::trace::apply;
use kiln_ir::{Builder, ComparisonDirection as Cmp, DType, Func, Loc, Op, TensorType};

/// The comparator of a sort of operands of `dtypes` by operand `key`'s elements: `a < b`
/// (descending `a > b`), with NaN greatest for float keys.
fn comparator(dtypes: &[DType], key: usize, descending: bool) -> Result<Func, String> {
    let mut c = Builder::new("comparator");
    let mut params = Vec::new();
    for &d in dtypes {
        let t = TensorType::new(d, []);
        params.push((c.param(t.clone()), c.param(t)));
    }
    let (a, b) = params[key];
    let e = |e: kiln_ir::VerifyError| e.to_string();
    let dir = if descending { Cmp::Gt } else { Cmp::Lt };
    let strict = c.compare(a, b, dir).map_err(e)?;
    let out = if dtypes[key].is_float() {
        // Ascending: b is NaN and a is not; descending: a is NaN and b is not.
        let (nan, number) = if descending { (a, b) } else { (b, a) };
        let is_nan = c.compare(nan, nan, Cmp::Ne).map_err(e)?;
        let is_number = c.compare(number, number, Cmp::Eq).map_err(e)?;
        let nan_after = c.binary(Op::And {}, is_nan, is_number).map_err(e)?;
        c.binary(Op::Or {}, strict, nan_after).map_err(e)?
    } else {
        strict
    };
    c.finish(&[out]).map_err(e)
}

/// `x.top_k(k, d)` as a function of `x` (of type `ty`): the positions along `d`, the sort of
/// the keys with them, greatest first, and the first `k` of each slice of both.
fn top_k_func(ty: &TensorType, d: usize, k: usize) -> Result<Func, String> {
    let e = |e: kiln_ir::VerifyError| e.to_string();
    let mut b = Builder::new("top_k");
    let x = b.param(ty.clone());
    let iota = Op::Iota {
        iota_dimension: d as i64,
    };
    let pos = b
        .inst_typed(iota, &[], ty.with_dtype(DType::I32))
        .map_err(e)?;
    let sort = Op::Sort {
        dimension: d as i64,
        is_stable: true,
        comparator: Box::new(comparator(&[ty.dtype, DType::I32], 0, true)?),
    };
    let sorted = b.push(sort, &[x, pos]).map_err(e)?;
    let mut limit: Vec<i64> = ty.shape.iter().map(|&n| n as i64).collect();
    limit[d] = k as i64;
    let prefix = Op::Slice {
        start_indices: vec![0; limit.len()],
        limit_indices: limit.clone(),
        strides: vec![1; limit.len()],
    };
    let vals = b.inst(prefix.clone(), &[sorted[0]]).map_err(e)?;
    let idx = b.inst(prefix, &[sorted[1]]).map_err(e)?;
    b.finish(&[vals, idx]).map_err(e)
}

impl Tensor {
    /// The elements sorted along `axis` (negative counts from the end), ascending or
    /// descending; NaN greatest. Differentiable: the gradient moves back to where each
    /// element came from.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 2.0], [4]).unwrap();
    /// let up = x.sort(0, false).to_vec::<f32>().unwrap();
    /// assert_eq!(&up[..3], [1.0, 2.0, 3.0]);
    /// assert!(up[3].is_nan());
    /// let m = Tensor::from_vec(vec![3i32, 1, 2, 9, 7, 8], [2, 3]).unwrap();
    /// assert_eq!(m.sort(-1, true).to_vec::<i32>().unwrap(), [3, 2, 1, 9, 8, 7]);
    /// ```
    #[track_caller]
    pub fn sort(&self, axis: isize, descending: bool) -> Tensor {
        let loc = Loc::caller();
        composite("sort", loc, || {
            self.sorted("sort", &[], axis, descending, loc)
        })
        .swap_remove(0)
    }

    /// The `i32` positions along `axis` of the elements in sorted order (the positions a
    /// gather along `axis` takes to sort it); stable: among equal keys the first comes first.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![3i32, 1, 2, 1], [4]).unwrap();
    /// assert_eq!(x.argsort(0, false).to_vec::<i32>().unwrap(), [1, 3, 2, 0]);
    /// assert_eq!(x.argsort(0, true).to_vec::<i32>().unwrap(), [0, 2, 1, 3]);
    /// ```
    #[track_caller]
    pub fn argsort(&self, axis: isize, descending: bool) -> Tensor {
        let loc = Loc::caller();
        composite("argsort", loc, || {
            let d = match self.axis(axis, "argsort") {
                Ok(d) => d,
                Err(t) => return t,
            };
            let pos = Tensor::iota(DType::I32, &self.shape(), d);
            self.sorted("argsort", &[&pos], axis, descending, loc)
                .swap_remove(1)
        })
    }

    /// This tensor (the keys) and `values` (each of its shape) sorted together along `axis`
    /// by the keys: the sorted keys, then each value tensor in the keys' order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let keys = Tensor::from_vec(vec![3i32, 1, 2], [3]).unwrap();
    /// let names = Tensor::from_vec(vec![30.0f32, 10.0, 20.0], [3]).unwrap();
    /// let s = keys.sort_with(&[&names], 0, false);
    /// assert_eq!(s[0].to_vec::<i32>().unwrap(), [1, 2, 3]);
    /// assert_eq!(s[1].to_vec::<f32>().unwrap(), [10.0, 20.0, 30.0]);
    /// ```
    #[track_caller]
    pub fn sort_with(&self, values: &[&Tensor], axis: isize, descending: bool) -> Vec<Tensor> {
        let loc = Loc::caller();
        composite("sort_with", loc, || {
            self.sorted("sort_with", values, axis, descending, loc)
        })
    }

    /// The `k` greatest elements along `axis`, greatest first, and their `i32` positions (the
    /// first of equal elements first; NaN counts greatest): JAX's `lax.top_k` along any axis
    /// (JAX's is the last). `k` above the axis's size is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 5.0], [4]).unwrap();
    /// let (values, positions) = x.top_k(3, 0);
    /// assert_eq!(values.to_vec::<f32>().unwrap(), [5.0, 5.0, 3.0]);
    /// assert_eq!(positions.to_vec::<i32>().unwrap(), [1, 3, 2]);
    /// let too_many = x.top_k(5, 0).0.to_vec::<f32>().unwrap_err().to_string();
    /// assert!(too_many.contains("top_k") && too_many.contains("k = 5"));
    /// ```
    #[track_caller]
    pub fn top_k(&self, k: usize, axis: isize) -> (Tensor, Tensor) {
        self.top_k_as(k, axis, "top_k", Loc::caller())
    }

    /// [`Tensor::top_k`] under its earlier name (errors name `topk`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0], [3]).unwrap();
    /// assert_eq!(x.topk(1, 0).0.to_vec::<f32>().unwrap(), x.top_k(1, 0).0.to_vec::<f32>().unwrap());
    /// ```
    #[doc(alias = "top_k")]
    #[track_caller]
    pub fn topk(&self, k: usize, axis: isize) -> (Tensor, Tensor) {
        self.top_k_as(k, axis, "topk", Loc::caller())
    }

    fn top_k_as(&self, k: usize, axis: isize, name: &'static str, loc: Loc) -> (Tensor, Tensor) {
        composite(name, loc, || {
            let d = match self.axis(axis, name) {
                Ok(d) => d,
                Err(t) => return (t.clone(), t),
            };
            let n = self.shape()[d];
            if k > n {
                let t = self.fail(
                    name,
                    format!(
                        "k = {k} is more than the {n} elements along axis {d} of {}",
                        ty_str(self)
                    ),
                );
                return (t.clone(), t);
            }
            if let Some(out) = self.eager_top_k(d, k, name, loc) {
                return out;
            }
            let pos = Tensor::iota(DType::I32, &self.shape(), d);
            let mut s = self.sorted(name, &[&pos], axis, true, loc);
            let idx = s.swap_remove(1).slice(d as isize, 0, k as isize, 1);
            let vals = s.swap_remove(0).slice(d as isize, 0, k as isize, 1);
            (vals, idx)
        })
    }

    /// An eager top-k (`self` a value in host memory) whose sort would be compiled anyway (as
    /// large as [`crate::trace::EAGER_COMPILE_THRESHOLD`] says) and that the kernel layer runs
    /// as a top-k (`kiln_kernel::sort::top_k`: a short prefix of long slices): the program of
    /// the positions, the sort and its leading slices, compiled (once per signature) and run,
    /// so the runtime reads each slice's keys once instead of sorting them whole. `None`
    /// otherwise: the ops run one by one, as under `jit` they are traced.
    fn eager_top_k(&self, d: usize, k: usize, name: &str, loc: Loc) -> Option<(Tensor, Tensor)> {
        if self.is_traced() || self.device() != crate::Device::Cpu {
            return None;
        }
        let ty = self.ty()?;
        // The one-op sort's values: the keys, the positions and both results.
        let sorted = 4 * ty.numel();
        if sorted < crate::trace::EAGER_COMPILE_THRESHOLD {
            return None;
        }
        let f = top_k_func(&ty, d, k).ok()?;
        let sort = f
            .insts
            .iter()
            .position(|i| matches!(i.op, Op::Sort { .. }))?;
        kiln_kernel::sort::top_k(&f, sort)?;
        let mut out = crate::trace::call(&f, &[self], name, loc).into_iter();
        Some((out.next()?, out.next()?))
    }

    /// The `i32` position along `axis` of the greatest element (the first of equal ones; a NaN
    /// counts greatest, as NumPy and PyTorch count it), with `axis` kept as 1 when `keepdims`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, 4.0, 2.0, 0.0], [2, 3]).unwrap();
    /// assert_eq!(x.argmax(1, false).to_vec::<i32>().unwrap(), [1, 0]);
    /// assert_eq!(x.argmax(0, true).shape(), [1, 3]);
    /// ```
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Tensor {
        let loc = Loc::caller();
        composite("argmax", loc, || self.arg_extreme(axis, keepdims, true))
    }

    /// The `i32` position along `axis` of the least element (the first of equal ones; a row
    /// with a NaN gives its first NaN, as NumPy and PyTorch give it), with `axis` kept as 1
    /// when `keepdims`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, 4.0, 2.0, 0.0], [2, 3]).unwrap();
    /// assert_eq!(x.argmin(1, false).to_vec::<i32>().unwrap(), [0, 2]);
    /// ```
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdims: bool) -> Tensor {
        let loc = Loc::caller();
        composite("argmin", loc, || self.arg_extreme(axis, keepdims, false))
    }

    /// The first position along `axis` holding the maximum (`greatest`) or minimum, or a NaN.
    /// Two fused reductions: faster than one `reduce_region` of values and positions, which
    /// the backends expand into a tree of kernels (see `ir-specs/ops/reduce_region.md`).
    fn arg_extreme(&self, axis: isize, keepdims: bool, greatest: bool) -> Tensor {
        let name = if greatest { "argmax" } else { "argmin" };
        let d = match self.axis(axis, name) {
            Ok(d) => d,
            Err(t) => return t,
        };
        let n = self.shape()[d];
        if n == 0 {
            return self.fail(
                name,
                format!("axis {d} of {} is empty: there is no {name}", ty_str(self)),
            );
        }
        let x = self;
        let ext = if greatest {
            x.max(&[d as isize], true)
        } else {
            x.min(&[d as isize], true)
        };
        // Maximum and minimum propagate NaN: a row with a NaN has NaN as its extreme, which
        // no element equals; `x != x` picks the NaNs there.
        let hit = if x.dtype().is_float() {
            let eq = x.eq(&ext);
            let nan = x.ne(x);
            apply(Op::Or {}, &[&eq, &nan], None, name, Loc::caller()).remove(0)
        } else {
            x.eq(&ext)
        };
        let pos = Tensor::iota(DType::I32, &self.shape(), d);
        let none = pos.like_scalar(n as f64);
        hit.where_(&pos, &none).min(&[d as isize], keepdims)
    }

    /// `sort` of this tensor (the keys) and `values` along `axis`.
    fn sorted(
        &self,
        name: &str,
        values: &[&Tensor],
        axis: isize,
        descending: bool,
        loc: Loc,
    ) -> Vec<Tensor> {
        let n = 1 + values.len();
        let d = match self.axis(axis, name) {
            Ok(d) => d,
            Err(t) => return vec![t; n],
        };
        if let Some(v) = values.iter().find(|v| v.shape() != self.shape()) {
            return vec![
                self.fail(
                    name,
                    format!(
                        "the values {} must have the keys' shape {}",
                        ty_str(v),
                        ty_str(self)
                    )
                );
                n
            ];
        }
        let xs: Vec<&Tensor> = std::iter::once(self)
            .chain(values.iter().copied())
            .collect();
        let dtypes: Vec<DType> = xs.iter().map(|t| t.dtype()).collect();
        let cmp = match comparator(&dtypes, 0, descending) {
            Ok(c) => c,
            Err(e) => return vec![self.fail(name, e); n],
        };
        apply(
            Op::Sort {
                dimension: d as i64,
                is_stable: true,
                comparator: Box::new(cmp),
            },
            &xs,
            None,
            name,
            loc,
        )
    }
}
