//! Tensor operations at the level users write them, lowered to IR ops with explicit
//! broadcasting. Every entry point is `#[track_caller]`, so errors name the user's line.

use crate::composite::{composite, naming};
use crate::promote::{inexact, promote_types, weak_float, weak_int};
use crate::tensor::Tensor;
use crate::trace::{apply, lift_all};
use crate::{Device, Error};
use kiln_ir::{Combiner, ComparisonDirection as Cmp, DType, Loc, Op, ShapeDisplay, TensorType};

pub(crate) fn ty_str(t: &Tensor) -> String {
    t.ty()
        .map(|t| t.to_string())
        .unwrap_or_else(|| "<failed>".into())
}

/// NumPy broadcasting of two shapes.
///
/// # Examples
///
/// ```
/// use kiln_trace::ops::broadcast_shapes;
/// assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
/// assert_eq!(broadcast_shapes(&[2], &[3]), None);
/// ```
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let y = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return None;
        };
    }
    Some(out)
}

impl Tensor {
    #[track_caller]
    pub(crate) fn fail(&self, op: &str, msg: String) -> Tensor {
        let (op, loc) = naming(op, Loc::caller());
        Tensor::failed(Error::at(&op, msg, loc))
    }

    /// This tensor converted to the float dtype floating-point functions compute in (itself
    /// for floats, `f32` for integers and `pred`: see [`crate::promote`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2], [2]).unwrap().to_inexact();
    /// assert_eq!(x.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn to_inexact(&self) -> Tensor {
        self.cast(inexact(self.dtype()))
    }

    /// A floating-point function of this tensor, computed in [`Tensor::to_inexact`]'s dtype.
    #[track_caller]
    pub(crate) fn float_op1(&self, op: Op, name: &str) -> Tensor {
        let loc = Loc::caller();
        apply(op, &[&self.to_inexact()], None, name, loc).remove(0)
    }

    #[track_caller]
    pub(crate) fn op1(&self, op: Op, name: &str) -> Tensor {
        apply(op, &[self], None, name, Loc::caller()).remove(0)
    }

    #[track_caller]
    pub(crate) fn op1_typed(&self, op: Op, ty: TensorType, name: &str) -> Tensor {
        apply(op, &[self], Some(vec![ty]), name, Loc::caller()).remove(0)
    }

    /// Normalizes a possibly negative axis.
    #[track_caller]
    pub(crate) fn axis(&self, a: isize, op: &str) -> Result<usize, Tensor> {
        if let Some(e) = self.error() {
            return Err(Tensor::failed(e.clone()));
        }
        let r = self.rank() as isize;
        let n = if a < 0 { a + r } else { a };
        if n < 0 || n >= r.max(0) {
            return Err(self.fail(op, format!("axis {a} is out of range for {}", ty_str(self))));
        }
        Ok(n as usize)
    }

    /// NumPy-style broadcast of this tensor to `shape`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap().broadcast_to(&[2, 2]);
    /// assert_eq!(x.shape(), [2, 2]);
    /// assert_eq!(x.to_vec::<f32>().unwrap(), [1.0, 2.0, 1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        let s = self.shape();
        if s.as_slice() == shape {
            return self.clone();
        }
        match broadcast_shapes(&s, shape) {
            Some(b) if b.as_slice() == shape => {
                let off = shape.len() - s.len();
                let dims: Vec<i64> = (0..s.len()).map(|i| (i + off) as i64).collect();
                self.op1_typed(
                    Op::BroadcastInDim {
                        broadcast_dimensions: dims,
                    },
                    TensorType::new(self.dtype(), shape),
                    "broadcast_to",
                )
            }
            _ => self.fail(
                "broadcast_to",
                format!(
                    "cannot broadcast {} to shape {}",
                    ty_str(self),
                    ShapeDisplay(shape)
                ),
            ),
        }
    }

    /// Same as [`Tensor::broadcast_to`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2], [2, 1]).unwrap().expand(&[2, 3]);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [1, 1, 1, 2, 2, 2]);
    /// ```
    #[track_caller]
    pub fn expand(&self, shape: &[usize]) -> Tensor {
        self.broadcast_to(shape)
    }

    /// A scalar of this tensor's dtype.
    pub(crate) fn like_scalar(&self, x: f64) -> Tensor {
        Tensor::full(self.dtype(), [], x)
    }

    /// A Rust float scalar next to this tensor, weakly typed (see [`crate::promote`]).
    fn weak_float_scalar(&self, x: f64) -> Tensor {
        Tensor::full(weak_float(self.dtype()), [], x)
    }

    /// A Rust integer scalar next to this tensor, weakly typed (see [`crate::promote`]).
    fn weak_int_scalar(&self, x: i32) -> Tensor {
        Tensor::full(weak_int(self.dtype()), [], x as f64)
    }

    /// `op` of the two operands promoted to their common dtype (see [`crate::promote`]),
    /// broadcast to their common shape.
    #[track_caller]
    pub(crate) fn binary(&self, other: &Tensor, op: Op, name: &str) -> Tensor {
        let d = promote_types(self.dtype(), other.dtype());
        self.binary_in(other, d, op, name)
    }

    /// `op` of the two operands converted to `d`, broadcast to their common shape.
    #[track_caller]
    pub(crate) fn binary_in(&self, other: &Tensor, d: DType, op: Op, name: &str) -> Tensor {
        if let Some(e) = self.error().or(other.error()) {
            return Tensor::failed(e.clone());
        }
        let Some(shape) = broadcast_shapes(&self.shape(), &other.shape()) else {
            return self.fail(
                name,
                format!(
                    "cannot broadcast {} and {} together",
                    ty_str(self),
                    ty_str(other)
                ),
            );
        };
        let (x, y) = (self.cast(d), other.cast(d));
        let l = lift_all(&[&x, &y]);
        let (a, b) = (l[0].broadcast_to(&shape), l[1].broadcast_to(&shape));
        apply(op, &[&a, &b], None, name, Loc::caller()).remove(0)
    }

    /// Elementwise sum with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![10.0f32, 20.0], [2]).unwrap();
    /// assert_eq!(a.add(&b).to_vec::<f32>().unwrap(), [11.0, 22.0, 13.0, 24.0]);
    /// ```
    #[track_caller]
    pub fn add(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Add {}, "add")
    }
    /// Elementwise difference with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![5i32, 7], [2]).unwrap();
    /// let b = Tensor::from_vec(vec![2i32, 10], [2]).unwrap();
    /// assert_eq!(a.sub(&b).to_vec::<i32>().unwrap(), [3, -3]);
    /// ```
    #[track_caller]
    pub fn sub(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Subtract {}, "sub")
    }
    /// `self - other * alpha`, with `alpha` a weakly typed Rust scalar (as in `&other *
    /// alpha`): the same elements as those two ops. On eager tensors of one float dtype and
    /// shape (an optimizer's step, `p - lr * g`) it is one pass over them, writing no product
    /// to memory; in a trace the two ops are recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// let g = Tensor::from_vec(vec![10.0f32, -20.0, 0.5], [3]).unwrap();
    /// let step = p.sub_scaled(&g, 0.1);
    /// assert_eq!(step.to_vec::<f32>().unwrap(), (&p - &(&g * 0.1)).to_vec::<f32>().unwrap());
    /// ```
    #[track_caller]
    pub fn sub_scaled(&self, other: &Tensor, alpha: f64) -> Tensor {
        let s = other.weak_float_scalar(alpha);
        if let Some(out) = self
            .eager_scale(other, &s)
            .and_then(|s| crate::eager::sub_scaled(self.literal()?, other.literal()?, s))
        {
            return Tensor::new(out);
        }
        self.sub(&other.mul(&s))
    }

    /// [`Tensor::sub_scaled`] written into this tensor's own storage where nothing else holds
    /// it: an eager `f32` or `f64` tensor on the CPU with no clone or view of it alive (as
    /// PyTorch's `p.add_(g, alpha=-lr)`), so that no buffer is taken for the result. Elsewhere
    /// (shared, other dtypes, traced) it is `sub_scaled`; the elements are the same either way.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// let g = Tensor::from_vec(vec![10.0f32, -20.0, 0.5], [3]).unwrap();
    /// let want = p.sub_scaled(&g, 0.1).to_vec::<f32>().unwrap();
    /// assert_eq!(p.sub_scaled_owned(&g, 0.1).to_vec::<f32>().unwrap(), want);
    /// ```
    #[track_caller]
    pub fn sub_scaled_owned(mut self, other: &Tensor, alpha: f64) -> Tensor {
        let s = other.weak_float_scalar(alpha);
        if let Some(v) = self.eager_scale(other, &s)
            && let Some(g) = other.literal()
            && let Some(p) = self.unshared_literal_mut()
            && crate::eager::sub_scaled_in_place(p, g, v)
        {
            return self;
        }
        self.sub_scaled(other, alpha)
    }

    /// `s` (a weak scalar) in `other`'s dtype, where `self - other * s` runs as one eager pass:
    /// both eager on the CPU, of one float dtype and shape, that `s` does not promote.
    fn eager_scale(&self, other: &Tensor, s: &Tensor) -> Option<f64> {
        let d = other.dtype();
        let eager = !crate::trace::tracing()
            && d.is_float()
            && self.dtype() == d
            && promote_types(d, s.dtype()) == d
            && self.shape() == other.shape()
            && [self, other]
                .iter()
                .all(|t| t.error().is_none() && !t.is_traced() && t.device() == Device::Cpu);
        if !eager {
            return None;
        }
        s.cast(d)
            .literal()
            .and_then(|s| s.to_f64s().first().copied())
    }

    /// Elementwise product with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
    /// assert_eq!(a.mul(&Tensor::scalar(2.0f32)).to_vec::<f32>().unwrap(), [3.0, -4.0]);
    /// ```
    #[track_caller]
    pub fn mul(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Multiply {}, "mul")
    }
    /// Elementwise true quotient with broadcasting: integer and `pred` operands divide as
    /// `f32` (as `/` does in JAX and PyTorch); [`Tensor::div_trunc`] is integer division.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![7i32, -7], [2]).unwrap();
    /// let q = a.div(&Tensor::scalar(2i32));
    /// assert_eq!(q.to_vec::<f32>().unwrap(), [3.5, -3.5]);
    /// ```
    #[track_caller]
    pub fn div(&self, o: &Tensor) -> Tensor {
        let d = inexact(promote_types(self.dtype(), o.dtype()));
        self.binary_in(o, d, Op::Divide {}, "div")
    }
    /// Elementwise quotient in the operands' promoted dtype: for integers, rounded toward
    /// zero (StableHLO's `divide`; C's and Rust's `/`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![7i32, -7], [2]).unwrap();
    /// assert_eq!(a.div_trunc(&Tensor::scalar(2i32)).to_vec::<i32>().unwrap(), [3, -3]);
    /// ```
    #[track_caller]
    pub fn div_trunc(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Divide {}, "div_trunc")
    }
    /// Elementwise remainder with broadcasting, with the sign of the dividend (C's `%`,
    /// StableHLO's `remainder`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![7i32, -7], [2]).unwrap();
    /// assert_eq!(a.rem(&Tensor::scalar(3i32)).to_vec::<i32>().unwrap(), [1, -1]);
    /// ```
    #[track_caller]
    pub fn rem(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Remainder {}, "rem")
    }
    /// Elementwise power with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![2.0f32, 3.0], [2]).unwrap();
    /// let p = Tensor::from_vec(vec![3.0f32, 2.0], [2]).unwrap();
    /// assert_eq!(a.pow(&p).to_vec::<f32>().unwrap(), [8.0, 9.0]);
    /// ```
    #[track_caller]
    pub fn pow(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Power {}, "pow")
    }
    /// Elementwise power by a constant.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![4.0f32, 9.0], [2]).unwrap();
    /// assert_eq!(a.powf(0.5).to_vec::<f32>().unwrap(), [2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn powf(&self, p: f64) -> Tensor {
        self.binary(&self.weak_float_scalar(p), Op::Power {}, "pow")
    }
    /// Elementwise maximum with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 5, -2], [3]).unwrap();
    /// assert_eq!(a.maximum(&Tensor::scalar(0i32)).to_vec::<i32>().unwrap(), [1, 5, 0]);
    /// ```
    #[track_caller]
    pub fn maximum(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Maximum {}, "maximum")
    }
    /// Elementwise minimum with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 5, -2], [3]).unwrap();
    /// assert_eq!(a.minimum(&Tensor::scalar(2i32)).to_vec::<i32>().unwrap(), [1, 2, -2]);
    /// ```
    #[track_caller]
    pub fn minimum(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Minimum {}, "minimum")
    }

    #[track_caller]
    fn cmp(&self, o: &Tensor, dir: Cmp, name: &str) -> Tensor {
        self.binary(
            o,
            Op::Compare {
                comparison_direction: dir,
            },
            name,
        )
    }
    /// Elementwise `==` (a `pred` tensor).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 2, 3], [3]).unwrap();
    /// assert_eq!(a.eq(&Tensor::scalar(2i32)).to_vec::<bool>().unwrap(), [false, true, false]);
    /// ```
    #[track_caller]
    pub fn eq(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Eq, "eq")
    }
    /// Elementwise `!=`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 2, 3], [3]).unwrap();
    /// assert_eq!(a.ne(&Tensor::scalar(2i32)).to_vec::<bool>().unwrap(), [true, false, true]);
    /// ```
    #[track_caller]
    pub fn ne(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Ne, "ne")
    }
    /// Elementwise `<`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// assert_eq!(a.lt(&Tensor::scalar(2.0f32)).to_vec::<bool>().unwrap(), [true, false, false]);
    /// ```
    #[track_caller]
    pub fn lt(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Lt, "lt")
    }
    /// Elementwise `<=`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// assert_eq!(a.le(&Tensor::scalar(2.0f32)).to_vec::<bool>().unwrap(), [true, true, false]);
    /// ```
    #[track_caller]
    pub fn le(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Le, "le")
    }
    /// Elementwise `>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// assert_eq!(a.gt(&Tensor::scalar(2.0f32)).to_vec::<bool>().unwrap(), [false, false, true]);
    /// ```
    #[track_caller]
    pub fn gt(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Gt, "gt")
    }
    /// Elementwise `>=`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// assert_eq!(a.ge(&Tensor::scalar(2.0f32)).to_vec::<bool>().unwrap(), [false, true, true]);
    /// ```
    #[track_caller]
    pub fn ge(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Ge, "ge")
    }

    /// `on_true` where `self` (a `pred` tensor) holds, else `on_false`, with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0], [3]).unwrap();
    /// let y = x.gt(&Tensor::scalar(0.0f32)).where_(&x, &Tensor::scalar(0.0f32));
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 2.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn where_(&self, on_true: &Tensor, on_false: &Tensor) -> Tensor {
        if let Some(e) = self.error().or(on_true.error()).or(on_false.error()) {
            return Tensor::failed(e.clone());
        }
        if self.dtype() != DType::Pred {
            return self.fail(
                "where",
                format!("the condition must be pred, got {}", ty_str(self)),
            );
        }
        let shape = broadcast_shapes(&self.shape(), &on_true.shape())
            .and_then(|s| broadcast_shapes(&s, &on_false.shape()));
        let Some(shape) = shape else {
            return self.fail(
                "where",
                format!(
                    "cannot broadcast {}, {} and {} together",
                    ty_str(self),
                    ty_str(on_true),
                    ty_str(on_false)
                ),
            );
        };
        let d = promote_types(on_true.dtype(), on_false.dtype());
        let (on_true, on_false) = (on_true.cast(d), on_false.cast(d));
        let l = lift_all(&[self, &on_true, &on_false]);
        let (p, t, f) = (
            l[0].broadcast_to(&shape),
            l[1].broadcast_to(&shape),
            l[2].broadcast_to(&shape),
        );
        apply(Op::Select {}, &[&p, &t, &f], None, "where", Loc::caller()).remove(0)
    }

    /// Each element limited to `[lo, hi]` (NumPy's `clip`, PyTorch's `clamp`; the bounds in
    /// this tensor's dtype): NaN stays NaN; `lo > hi` gives `hi` everywhere, as NumPy does.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-5.0f32, 0.5, 5.0], [3]).unwrap();
    /// assert_eq!(x.clip(-1.0, 1.0).to_vec::<f32>().unwrap(), [-1.0, 0.5, 1.0]);
    /// ```
    #[track_caller]
    pub fn clip(&self, lo: f64, hi: f64) -> Tensor {
        let loc = Loc::caller();
        crate::composite::composite("clip", loc, || {
            self.maximum(&self.like_scalar(lo))
                .minimum(&self.like_scalar(hi))
        })
    }

    /// Each element limited to `[lo, hi]` where the bounds are tensors (NumPy's `clip` with
    /// array bounds): this tensor and both bounds broadcast together and promote to one dtype,
    /// as the other binary ops do, so bounds can differ per row or per element. NaN stays NaN;
    /// where `lo > hi` the result is `hi`. Gradients flow to the bounds where they bind.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-5.0f32, 0.5, 5.0, -5.0, 0.5, 5.0], [2, 3]).unwrap();
    /// // One bound per row ([2, 1]) and one per column ([3]).
    /// let lo = Tensor::from_vec(vec![-1.0f32, 0.0], [2, 1]).unwrap();
    /// let hi = Tensor::from_vec(vec![1.0f32, 0.25, 2.0], [3]).unwrap();
    /// let y = x.clip_between(&lo, &hi);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [-1.0, 0.25, 2.0, 0.0, 0.25, 2.0]);
    /// // Bounds that do not broadcast are an error naming both shapes.
    /// let bad = x.clip_between(&Tensor::from_vec(vec![0.0f32; 2], [2]).unwrap(), &hi);
    /// assert!(bad.to_vec::<f32>().unwrap_err().to_string().contains("clip"));
    /// ```
    #[track_caller]
    pub fn clip_between(&self, lo: &Tensor, hi: &Tensor) -> Tensor {
        let loc = Loc::caller();
        crate::composite::composite("clip", loc, || self.maximum(lo).minimum(hi))
    }

    /// Converts to another dtype.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::from_vec(vec![1.7f32, -1.7], [2]).unwrap().cast(DType::I32);
    /// assert_eq!(x.dtype(), DType::I32);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [1, -1]);
    /// ```
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        if self.error().is_some() || self.dtype() == dtype {
            return self.clone();
        }
        self.op1_typed(Op::Convert {}, TensorType::new(dtype, self.shape()), "cast")
    }

    /// The same bits read as another dtype of the same width (JAX's
    /// `lax.bitcast_convert_type`, PyTorch's `Tensor.view(dtype)`): `f32` as `u32`, `f16` as
    /// `i16`. A dtype of another width, or `pred` either way, is an error. Not differentiable.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::from_vec(vec![1.0f32, -0.0], [2]).unwrap();
    /// assert_eq!(x.bitcast(DType::U32).to_vec::<u32>().unwrap(), [0x3f80_0000, 0x8000_0000]);
    /// assert!(x.bitcast(DType::I64).to_vec::<i64>().is_err());
    /// ```
    #[track_caller]
    pub fn bitcast(&self, dtype: DType) -> Tensor {
        let d = self.dtype();
        if self.error().is_some() || d == dtype {
            return self.clone();
        }
        if d.bits() != dtype.bits() || d.is_pred() || dtype.is_pred() {
            return self.fail(
                "bitcast",
                format!("cannot reinterpret {d} as {dtype}: bitcast needs two non-pred dtypes of one width"),
            );
        }
        self.op1_typed(
            Op::BitcastConvert {},
            TensorType::new(dtype, self.shape()),
            "bitcast",
        )
    }

    /// The same values with no gradient flowing back through them (JAX `stop_gradient`,
    /// PyTorch `detach`). Recorded as a bit-preserving round trip through an integer type, which
    /// autodiff treats as constant.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
    /// assert_eq!(x.detach().to_vec::<f32>().unwrap(), [1.5, -2.0]);
    /// ```
    #[track_caller]
    pub fn detach(&self) -> Tensor {
        let d = self.dtype();
        let int = match d {
            DType::F32 => DType::U32,
            DType::F64 => DType::I64,
            DType::F16 | DType::BF16 => return self.cast(DType::F32).detach().cast(d),
            _ => return self.clone(),
        };
        let bits = self.op1_typed(
            Op::BitcastConvert {},
            TensorType::new(int, self.shape()),
            "detach",
        );
        bits.op1_typed(
            Op::BitcastConvert {},
            TensorType::new(d, self.shape()),
            "detach",
        )
    }

    #[track_caller]
    fn reduce(&self, axes: &[isize], keepdims: bool, kind: Combiner, name: &str) -> Tensor {
        let mut dims = Vec::new();
        for &a in axes {
            match self.axis(a, name) {
                Ok(d) if !dims.contains(&(d as i64)) => dims.push(d as i64),
                Ok(_) => return self.fail(name, format!("axis {a} is given twice")),
                Err(t) => return t,
            }
        }
        dims.sort_unstable();
        let d = self.dtype();
        let init = match kind {
            Combiner::Max if d.is_float() => f64::NEG_INFINITY,
            Combiner::Min if d.is_float() => f64::INFINITY,
            // The dtype's bounds through f64: the conversion saturates, so even i64's and u64's
            // extremes come out exact.
            Combiner::Max => d.int_bounds().map_or(0.0, |b| b.0 as f64),
            Combiner::Min => d.int_bounds().map_or(1.0, |b| b.1 as f64),
            _ => 0.0,
        };
        let r = apply(
            Op::Reduce {
                dimensions: dims.clone(),
                kind,
            },
            &[self, &self.like_scalar(init)],
            None,
            name,
            Loc::caller(),
        )
        .remove(0);
        if keepdims {
            let shape: Vec<usize> = self
                .shape()
                .iter()
                .enumerate()
                .map(|(i, &s)| if dims.contains(&(i as i64)) { 1 } else { s })
                .collect();
            r.reshape_to(&shape)
        } else {
            r
        }
    }

    fn all_axes(&self) -> Vec<isize> {
        (0..self.rank() as isize).collect()
    }

    /// Sum over `axes` (all axes when empty is not what you want: use [`Tensor::sum_all`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    /// assert_eq!(x.sum(&[0], false).to_vec::<i32>().unwrap(), [5, 7, 9]);
    /// let rows = x.sum(&[-1], true);
    /// assert_eq!((rows.shape(), rows.to_vec::<i32>().unwrap()), (vec![2, 1], vec![6, 15]));
    /// ```
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Add, "sum")
    }
    /// Sum of every element (a scalar).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap().sum_all();
    /// assert_eq!((x.shape(), x.to_vec::<i32>().unwrap()), (vec![], vec![10]));
    /// ```
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.reduce(&self.all_axes(), false, Combiner::Add, "sum")
    }
    /// Mean over `axes`. Integer and `pred` tensors average as `f32` (see
    /// [`crate::promote`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap();
    /// assert_eq!(x.mean(&[1], false).to_vec::<f32>().unwrap(), [1.5, 3.5]);
    /// ```
    #[track_caller]
    pub fn mean(&self, axes: &[isize], keepdims: bool) -> Tensor {
        composite("mean", Loc::caller(), || {
            let x = self.to_inexact();
            let s = x.reduce(axes, keepdims, Combiner::Add, "mean");
            let shape = self.shape();
            let count: usize = axes
                .iter()
                .filter_map(|&a| self.axis(a, "mean").ok())
                .map(|d| shape[d])
                .product();
            s.div(&x.like_scalar(count as f64))
        })
    }
    /// Mean of every element (a scalar).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], [2, 2]).unwrap();
    /// assert_eq!(x.mean_all().item().unwrap(), 3.0);
    /// ```
    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        self.mean(&self.all_axes(), false)
    }
    /// Maximum over `axes`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 5, 3, 4, 2, 6], [2, 3]).unwrap();
    /// assert_eq!(x.max(&[1], false).to_vec::<i32>().unwrap(), [5, 6]);
    /// assert_eq!(x.max(&[0], true).shape(), [1, 3]);
    /// ```
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Max, "max")
    }
    /// Minimum over `axes`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 5, 3, 4, 2, 6], [2, 3]).unwrap();
    /// assert_eq!(x.min(&[0], false).to_vec::<i32>().unwrap(), [1, 2, 3]);
    /// ```
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Min, "min")
    }

    /// Softmax along `axis`, computed stably.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 1.0, 1000.0, 1000.0], [2, 2]).unwrap();
    /// assert_eq!(x.softmax(-1).to_vec::<f32>().unwrap(), [0.5, 0.5, 0.5, 0.5]);
    /// ```
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        composite("softmax", Loc::caller(), || {
            let x = self.to_inexact();
            let m = x.max(&[axis], true).detach();
            let e = x.sub(&m).exp();
            e.div(&e.sum(&[axis], true))
        })
    }
    /// Log-softmax along `axis`, computed stably.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 0.0, 0.0, 0.0], [4]).unwrap();
    /// let y = x.log_softmax(0).to_vec::<f32>().unwrap();
    /// assert!(y.iter().all(|v| (v + 4.0f32.ln()).abs() < 1e-6));
    /// ```
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        composite("log_softmax", Loc::caller(), || {
            let x = self.to_inexact();
            let m = x.max(&[axis], true).detach();
            let z = x.sub(&m);
            z.sub(&z.exp().sum(&[axis], true).log())
        })
    }

    /// One-hot encoding of integer `self` over `n` classes, as `dtype`, in a new last axis.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let labels = Tensor::from_vec(vec![2i32, 0], [2]).unwrap();
    /// let y = labels.one_hot(3, DType::F32);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn one_hot(&self, n: usize, dtype: DType) -> Tensor {
        if self.error().is_none() && !self.dtype().is_int() {
            return self.fail(
                "one_hot",
                format!("one_hot needs integer labels, got {}", ty_str(self)),
            );
        }
        let classes = Tensor::arange(n, self.dtype());
        let r = self.rank() as isize;
        self.unsqueeze(r).eq(&classes).cast(dtype)
    }
}

/// A binary operator between a tensor and a weakly typed Rust scalar, both ways round.
macro_rules! scalar_binop {
    ($Trait:ident, $method:ident, $call:ident, $S:ty, $weak:ident) => {
        impl std::ops::$Trait<$S> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: $S) -> Tensor {
                self.$call(&self.$weak(o))
            }
        }
        impl std::ops::$Trait<$S> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: $S) -> Tensor {
                (&self).$call(&self.$weak(o))
            }
        }
        impl std::ops::$Trait<&Tensor> for $S {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: &Tensor) -> Tensor {
                o.$weak(self).$call(o)
            }
        }
        impl std::ops::$Trait<Tensor> for $S {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: Tensor) -> Tensor {
                o.$weak(self).$call(&o)
            }
        }
    };
}

macro_rules! binop {
    ($Trait:ident, $method:ident, $call:ident) => {
        impl std::ops::$Trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: &Tensor) -> Tensor {
                self.$call(o)
            }
        }
        impl std::ops::$Trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: Tensor) -> Tensor {
                (&self).$call(&o)
            }
        }
        impl std::ops::$Trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: &Tensor) -> Tensor {
                (&self).$call(o)
            }
        }
        impl std::ops::$Trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, o: Tensor) -> Tensor {
                self.$call(&o)
            }
        }
        scalar_binop!($Trait, $method, $call, f64, weak_float_scalar);
        scalar_binop!($Trait, $method, $call, i32, weak_int_scalar);
    };
}
binop!(Add, add, add);
binop!(Sub, sub, sub);
binop!(Mul, mul, mul);
binop!(Div, div, div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}
