//! Tensor operations at the level users write them, lowered to IR ops with explicit
//! broadcasting. Every entry point is `#[track_caller]`, so errors name the user's line.

use crate::Error;
use crate::composite::{composite, naming};
use crate::promote::{inexact, promote_types, weak_float, weak_int};
use crate::tensor::Tensor;
use crate::trace::{apply, lift_all};
use kiln_ir::{Combiner, ComparisonDirection as Cmp, DType, Loc, Op, ShapeDisplay, TensorType};

pub(crate) fn ty_str(t: &Tensor) -> String {
    t.ty()
        .map(|t| t.to_string())
        .unwrap_or_else(|| "<failed>".into())
}

/// NumPy broadcasting of two shapes.
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
    #[track_caller]
    pub fn to_inexact(&self) -> Tensor {
        self.cast(inexact(self.dtype()))
    }

    /// A floating-point function of this tensor, computed in [`Tensor::to_inexact`]'s dtype.
    #[track_caller]
    fn float_op1(&self, op: Op, name: &str) -> Tensor {
        let loc = Loc::caller();
        apply(op, &[&self.to_inexact()], None, name, loc).remove(0)
    }

    #[track_caller]
    fn op1(&self, op: Op, name: &str) -> Tensor {
        apply(op, &[self], None, name, Loc::caller()).remove(0)
    }

    #[track_caller]
    fn op1_typed(&self, op: Op, ty: TensorType, name: &str) -> Tensor {
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
    fn binary(&self, other: &Tensor, op: Op, name: &str) -> Tensor {
        let d = promote_types(self.dtype(), other.dtype());
        self.binary_in(other, d, op, name)
    }

    /// `op` of the two operands converted to `d`, broadcast to their common shape.
    #[track_caller]
    fn binary_in(&self, other: &Tensor, d: DType, op: Op, name: &str) -> Tensor {
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
    #[track_caller]
    pub fn add(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Add {}, "add")
    }
    /// Elementwise difference with broadcasting.
    #[track_caller]
    pub fn sub(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Subtract {}, "sub")
    }
    /// Elementwise product with broadcasting.
    #[track_caller]
    pub fn mul(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Multiply {}, "mul")
    }
    /// Elementwise true quotient with broadcasting: integer and `pred` operands divide as
    /// `f32` (as `/` does in JAX and PyTorch); [`Tensor::div_trunc`] is integer division.
    #[track_caller]
    pub fn div(&self, o: &Tensor) -> Tensor {
        let d = inexact(promote_types(self.dtype(), o.dtype()));
        self.binary_in(o, d, Op::Divide {}, "div")
    }
    /// Elementwise quotient in the operands' promoted dtype: for integers, rounded toward
    /// zero (StableHLO's `divide`; C's and Rust's `/`).
    #[track_caller]
    pub fn div_trunc(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Divide {}, "div_trunc")
    }
    /// Elementwise remainder with broadcasting, with the sign of the dividend (C's `%`,
    /// StableHLO's `remainder`).
    #[track_caller]
    pub fn rem(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Remainder {}, "rem")
    }
    /// Elementwise power with broadcasting.
    #[track_caller]
    pub fn pow(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Power {}, "pow")
    }
    /// Elementwise power by a constant.
    #[track_caller]
    pub fn powf(&self, p: f64) -> Tensor {
        self.binary(&self.weak_float_scalar(p), Op::Power {}, "pow")
    }
    /// Elementwise maximum with broadcasting.
    #[track_caller]
    pub fn maximum(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Maximum {}, "maximum")
    }
    /// Elementwise minimum with broadcasting.
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
    #[track_caller]
    pub fn eq(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Eq, "eq")
    }
    /// Elementwise `!=`.
    #[track_caller]
    pub fn ne(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Ne, "ne")
    }
    /// Elementwise `<`.
    #[track_caller]
    pub fn lt(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Lt, "lt")
    }
    /// Elementwise `<=`.
    #[track_caller]
    pub fn le(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Le, "le")
    }
    /// Elementwise `>`.
    #[track_caller]
    pub fn gt(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Gt, "gt")
    }
    /// Elementwise `>=`.
    #[track_caller]
    pub fn ge(&self, o: &Tensor) -> Tensor {
        self.cmp(o, Cmp::Ge, "ge")
    }

    /// `on_true` where `self` (a `pred` tensor) holds, else `on_false`, with broadcasting.
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
    #[track_caller]
    pub fn clip(&self, lo: f64, hi: f64) -> Tensor {
        let loc = Loc::caller();
        crate::composite::composite("clip", loc, || {
            self.maximum(&self.like_scalar(lo))
                .minimum(&self.like_scalar(hi))
        })
    }

    /// Elementwise negation.
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        self.op1(Op::Negate {}, "neg")
    }
    /// Elementwise e^x.
    #[track_caller]
    pub fn exp(&self) -> Tensor {
        self.float_op1(Op::Exponential {}, "exp")
    }
    /// Elementwise natural logarithm.
    #[track_caller]
    pub fn log(&self) -> Tensor {
        self.float_op1(Op::Log {}, "log")
    }
    /// Elementwise ln(1 + x).
    #[track_caller]
    pub fn log1p(&self) -> Tensor {
        self.float_op1(Op::LogPlusOne {}, "log1p")
    }
    /// Elementwise e^x - 1.
    #[track_caller]
    pub fn expm1(&self) -> Tensor {
        self.float_op1(Op::ExponentialMinusOne {}, "expm1")
    }
    /// Elementwise hyperbolic tangent.
    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        self.float_op1(Op::Tanh {}, "tanh")
    }
    /// Elementwise square root.
    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        self.float_op1(Op::Sqrt {}, "sqrt")
    }
    /// Elementwise 1 / sqrt(x).
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        self.float_op1(Op::Rsqrt {}, "rsqrt")
    }
    /// Elementwise absolute value.
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        self.op1(Op::Abs {}, "abs")
    }
    /// Elementwise sine.
    #[track_caller]
    pub fn sin(&self) -> Tensor {
        self.float_op1(Op::Sine {}, "sin")
    }
    /// Elementwise cosine.
    #[track_caller]
    pub fn cos(&self) -> Tensor {
        self.float_op1(Op::Cosine {}, "cos")
    }
    /// Elementwise error function.
    #[track_caller]
    pub fn erf(&self) -> Tensor {
        self.float_op1(Op::Erf {}, "erf")
    }
    /// Elementwise floor.
    #[track_caller]
    pub fn floor(&self) -> Tensor {
        self.float_op1(Op::Floor {}, "floor")
    }
    /// Elementwise rounding to nearest, ties to even (as `jnp.round` and `torch.round`).
    #[track_caller]
    pub fn round(&self) -> Tensor {
        self.float_op1(Op::RoundNearestEven {}, "round")
    }
    /// Elementwise rounding to nearest, ties away from zero (C's `round`).
    #[track_caller]
    pub fn round_half_away(&self) -> Tensor {
        self.float_op1(Op::RoundNearestAfz {}, "round_half_away")
    }
    /// Elementwise tangent.
    #[track_caller]
    pub fn tan(&self) -> Tensor {
        self.float_op1(Op::Tan {}, "tan")
    }
    /// Elementwise cube root (negative for negative values).
    #[track_caller]
    pub fn cbrt(&self) -> Tensor {
        self.float_op1(Op::Cbrt {}, "cbrt")
    }
    /// Elementwise arc tangent of `self / o` in the quadrant of the point `(o, self)`, in
    /// `[-π, π]`, with broadcasting; integer operands compute in `f32`.
    #[track_caller]
    pub fn atan2(&self, o: &Tensor) -> Tensor {
        let d = inexact(promote_types(self.dtype(), o.dtype()));
        self.binary_in(o, d, Op::Atan2 {}, "atan2")
    }
    /// Each element rounded to a float format with `exponent_bits` and `mantissa_bits`
    /// (`reduce_precision(x, 8, 7)` rounds f32 values as bf16 would hold them), kept in this
    /// tensor's dtype: values past the format's range become infinite, those below its normal
    /// range zero.
    #[track_caller]
    pub fn reduce_precision(&self, exponent_bits: u32, mantissa_bits: u32) -> Tensor {
        self.float_op1(
            Op::ReducePrecision {
                exponent_bits: exponent_bits as i64,
                mantissa_bits: mantissa_bits as i64,
            },
            "reduce_precision",
        )
    }
    /// Elementwise count of set bits of an integer tensor.
    #[track_caller]
    pub fn popcount(&self) -> Tensor {
        self.op1(Op::Popcnt {}, "popcount")
    }
    /// Elementwise count of zero bits above the highest set bit of an integer tensor (the
    /// width for 0).
    #[track_caller]
    pub fn count_leading_zeros(&self) -> Tensor {
        self.op1(Op::CountLeadingZeros {}, "count_leading_zeros")
    }
    /// Elementwise bitwise and of integer (or logical and of `pred`) tensors, with
    /// broadcasting.
    #[track_caller]
    pub fn bitwise_and(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::And {}, "bitwise_and")
    }
    /// Elementwise bitwise or, with broadcasting.
    #[track_caller]
    pub fn bitwise_or(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Or {}, "bitwise_or")
    }
    /// Elementwise bitwise exclusive or, with broadcasting.
    #[track_caller]
    pub fn bitwise_xor(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Xor {}, "bitwise_xor")
    }
    /// Elementwise bitwise (or logical) not.
    #[track_caller]
    pub fn bitwise_not(&self) -> Tensor {
        self.op1(Op::Not {}, "bitwise_not")
    }
    /// Elementwise left shift of an integer tensor by `o` bits, with broadcasting; shifts
    /// outside `[0, width)` give 0.
    #[track_caller]
    pub fn shift_left(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftLeft {}, "shift_left")
    }
    /// Elementwise logical right shift (zeros fill in); shifts outside `[0, width)` give 0.
    #[track_caller]
    pub fn shift_right_logical(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftRightLogical {}, "shift_right_logical")
    }
    /// Elementwise arithmetic right shift (the top bit fills in, for unsigned types too);
    /// shifts outside `[0, width)` fill every bit with the top one.
    #[track_caller]
    pub fn shift_right_arithmetic(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftRightArithmetic {}, "shift_right_arithmetic")
    }
    /// Elementwise ceiling.
    #[track_caller]
    pub fn ceil(&self) -> Tensor {
        self.float_op1(Op::Ceil {}, "ceil")
    }
    /// Elementwise sign.
    #[track_caller]
    pub fn sign(&self) -> Tensor {
        self.op1(Op::Sign {}, "sign")
    }
    /// Elementwise logistic sigmoid.
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        self.float_op1(Op::Logistic {}, "sigmoid")
    }
    /// Elementwise max(x, 0).
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        self.maximum(&self.like_scalar(0.0))
    }
    /// GELU: with `approximate`, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
    /// computed as x sigmoid(x (a + b x^2)), a = 2 sqrt(2/pi), b = 0.044715 a (the same
    /// function: 0.5 (1 + tanh(u)) = sigmoid(2u), with one exp and one division instead of
    /// tanh's two branches); otherwise 0.5 x (1 + erf(x / sqrt(2))).
    #[track_caller]
    pub fn gelu(&self, approximate: bool) -> Tensor {
        if approximate {
            let a = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
            let inner = self
                .mul(self)
                .mul(&self.like_scalar(a * 0.044715))
                .add(&self.like_scalar(a));
            return self.mul(&self.mul(&inner).sigmoid());
        }
        let half = self.like_scalar(0.5);
        let one = self.like_scalar(1.0);
        let inner = self
            .mul(&self.like_scalar(std::f64::consts::FRAC_1_SQRT_2))
            .erf();
        self.mul(&half).mul(&one.add(&inner))
    }

    /// Converts to another dtype.
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
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Add, "sum")
    }
    /// Sum of every element (a scalar).
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.reduce(&self.all_axes(), false, Combiner::Add, "sum")
    }
    /// Mean over `axes`. Integer and `pred` tensors average as `f32` (see
    /// [`crate::promote`]).
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
    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        self.mean(&self.all_axes(), false)
    }
    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Max, "max")
    }
    /// Minimum over `axes`.
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Tensor {
        self.reduce(axes, keepdims, Combiner::Min, "min")
    }

    /// Softmax along `axis`, computed stably.
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
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        composite("log_softmax", Loc::caller(), || {
            let x = self.to_inexact();
            let m = x.max(&[axis], true).detach();
            let z = x.sub(&m);
            z.sub(&z.exp().sum(&[axis], true).log())
        })
    }

    #[track_caller]
    fn reshape_to(&self, shape: &[usize]) -> Tensor {
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
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        self.permute(perm)
    }
    /// The `n x n` identity matrix (NumPy's `eye`), built from two iotas, so under a trace
    /// it is computed where it is used.
    #[track_caller]
    pub fn eye(n: usize, dtype: DType) -> Tensor {
        let rows = Tensor::iota(DType::I32, &[n, n], 0);
        let cols = Tensor::iota(DType::I32, &[n, n], 1);
        rows.eq(&cols).cast(dtype)
    }
    /// A tensor of `shape` whose elements are their own index along dimension `dim`
    /// (StableHLO's `iota`). Inside a trace it is recorded as an op, so a mask built from it
    /// (a causal mask, say) is computed where it is used rather than stored as a constant.
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

    /// Matrix product with NumPy semantics: batch dimensions broadcast; a 1-D operand is a
    /// vector.
    #[track_caller]
    pub fn matmul(&self, o: &Tensor) -> Tensor {
        self.matmul_as(o, None, "matmul")
    }

    /// [`Tensor::matmul`] with the products and sums computed in `dtype`, a wider type than the
    /// operands' that holds their values (JAX's `preferred_element_type`): `bf16 @ bf16` in
    /// `f32`, `i8 @ i8` in `i32`. The result has that type.
    #[track_caller]
    pub fn matmul_in(&self, o: &Tensor, dtype: DType) -> Tensor {
        self.matmul_as(o, Some(dtype), "matmul_in")
    }

    #[track_caller]
    fn matmul_as(&self, o: &Tensor, preferred: Option<DType>, name: &str) -> Tensor {
        if let Some(e) = self.error().or(o.error()) {
            return Tensor::failed(e.clone());
        }
        let d = promote_types(self.dtype(), o.dtype());
        let (x, o) = (&self.cast(d), &o.cast(d));
        let (ra, rb) = (x.rank(), o.rank());
        if ra == 0 || rb == 0 {
            return self.fail(
                name,
                format!(
                    "matmul needs at least 1-D operands, got {} @ {}",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        }
        let l = lift_all(&[x, o]);
        let a = if ra == 1 {
            l[0].unsqueeze(0)
        } else {
            l[0].clone()
        };
        let b = if rb == 1 {
            l[1].unsqueeze(1)
        } else {
            l[1].clone()
        };
        let (sa, sb) = (a.shape(), b.shape());
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if k != k2 {
            return self.fail(
                name,
                format!(
                    "{} @ {}: contracting dimensions {k} and {k2} differ",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        }
        let Some(batch) = broadcast_shapes(&sa[..sa.len() - 2], &sb[..sb.len() - 2]) else {
            return self.fail(
                name,
                format!(
                    "{} @ {}: batch dimensions do not broadcast",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        };
        let full = |x: &Tensor, r: usize, c: usize| {
            let mut s = batch.clone();
            s.extend([r, c]);
            x.broadcast_to(&s)
        };
        let (a, b) = (full(&a, m, k), full(&b, k, n));
        let nb = batch.len() as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let op = Op::DotGeneral {
            lhs_batching_dimensions: bd.clone(),
            rhs_batching_dimensions: bd,
            lhs_contracting_dimensions: vec![nb + 1],
            rhs_contracting_dimensions: vec![nb],
        };
        let types = preferred.map(|d| {
            let mut shape = batch.clone();
            shape.extend([m, n]);
            vec![TensorType::new(d, shape)]
        });
        let r = apply(op, &[&a, &b], types, name, Loc::caller()).remove(0);
        let r = if rb == 1 { r.squeeze(-1) } else { r };
        if ra == 1 { r.squeeze(-2) } else { r }
    }

    /// 2-D convolution, NCHW input and OIHW weight (PyTorch layout).
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Tensor {
        if self.rank() != 4 || weight.rank() != 4 {
            return self.fail(
                "conv2d",
                format!(
                    "conv2d needs NCHW input and OIHW weight, got {} and {}",
                    ty_str(self),
                    ty_str(weight)
                ),
            );
        }
        let ws = weight.shape();
        if let Some(t) = self.window_check("conv2d", (ws[2], ws[3]), padding, dilation) {
            return t;
        }
        let p = |x: usize| (x as i64, x as i64);
        let op = Op::Convolution {
            window_strides: vec![stride.0 as i64, stride.1 as i64],
            padding: vec![p(padding.0), p(padding.1)],
            lhs_dilation: vec![1, 1],
            rhs_dilation: vec![dilation.0 as i64, dilation.1 as i64],
            feature_group_count: groups as i64,
            input_dims: vec![0, 1, 2, 3],
            kernel_dims: vec![0, 1, 2, 3],
            output_dims: vec![0, 1, 2, 3],
            batch_group_count: 1,
        };
        apply(op, &[self, weight], None, "conv2d", Loc::caller()).remove(0)
    }

    /// An error unless a `window` (dilated by `dilation`) fits in this NCHW input's spatial
    /// dimensions padded by `padding` on each side (PyTorch refuses such windows; the IR would
    /// give an empty result).
    #[track_caller]
    fn window_check(
        &self,
        name: &str,
        window: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Option<Tensor> {
        let s = self.shape();
        let padded = (s[2] + 2 * padding.0, s[3] + 2 * padding.1);
        let span = |k: usize, d: usize| d * k.saturating_sub(1) + 1;
        let (wh, ww) = (span(window.0, dilation.0), span(window.1, dilation.1));
        if wh <= padded.0 && ww <= padded.1 {
            return None;
        }
        Some(self.fail(
            name,
            format!(
                "the {wh}x{ww} window (kernel {}x{}, dilation {}x{}) is larger than the {}x{} \
                 input padded to {}x{} ({})",
                window.0,
                window.1,
                dilation.0,
                dilation.1,
                s[2],
                s[3],
                padded.0,
                padded.1,
                ty_str(self)
            ),
        ))
    }

    #[track_caller]
    fn pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        kind: Combiner,
        name: &str,
    ) -> Tensor {
        if self.rank() != 4 {
            return self.fail(
                name,
                format!("{name} needs an NCHW input, got {}", ty_str(self)),
            );
        }
        if let Some(t) = self.window_check(name, kernel, padding, (1, 1)) {
            return t;
        }
        let init = if kind == Combiner::Max {
            f64::NEG_INFINITY
        } else {
            0.0
        };
        let op = Op::ReduceWindow {
            window_dimensions: vec![1, 1, kernel.0 as i64, kernel.1 as i64],
            window_strides: vec![1, 1, stride.0 as i64, stride.1 as i64],
            base_dilations: vec![1; 4],
            window_dilations: vec![1; 4],
            padding: vec![
                (0, 0),
                (0, 0),
                (padding.0 as i64, padding.0 as i64),
                (padding.1 as i64, padding.1 as i64),
            ],
            kind,
        };
        apply(
            op,
            &[self, &self.like_scalar(init)],
            None,
            name,
            Loc::caller(),
        )
        .remove(0)
    }

    /// 2-D max pooling over NCHW input.
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Tensor {
        self.pool2d(kernel, stride, padding, Combiner::Max, "max_pool2d")
    }

    /// 2-D average pooling over NCHW input (padding counts as zeros in the average).
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Tensor {
        let s = self.pool2d(kernel, stride, padding, Combiner::Add, "avg_pool2d");
        s.div(&self.like_scalar((kernel.0 * kernel.1) as f64))
    }

    /// One-hot encoding of integer `self` over `n` classes, as `dtype`, in a new last axis.
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
